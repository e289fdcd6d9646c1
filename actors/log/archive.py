"""The archive: the history the live log prunes, kept in the same store (FORMAT.md, "Archive").

A shard prunes a segment of its log once two snapshots of every queue cover its records.
Before the segment goes, the shard copies it here, byte for byte, under
``archive/<day>/<its key>`` (``day``: the UTC date it was archived, YYYYMMDD). Readers
(:mod:`pipeline.logread`) read the archive and the live log as one history: a segment found
in both (a crash came between the copy and the deletion) is read once.

- **Crash-safe.** The copy is created with ``put_if_absent``, durable when it returns (a local
  store fsyncs it and its directory); only then is the live segment deleted. Archiving again
  after a crash finds the copy and checks that it holds the same bytes.
- **Baselines.** A queue's archived records are only of use from a state on: its
  ``QueueCreated`` record, or a snapshot. A shard that starts archiving a log whose
  beginning is gone (a deployment from before the archive) first copies each queue's oldest
  snapshot as a baseline, then writes its marker ``archive/shards/<shard>``.
- **Retention.** ``retention_days`` (None: forever, the default) removes the shard's days
  older than that, once a day; each queue's oldest snapshot is copied again as its new
  baseline, so the history kept starts at a state.
- **Segments as they are**, not Parquet: a copy needs no decoding, every reader of the live
  log reads the archive unchanged, the format keeps its golden files and old readers, and
  the pipeline's ``archive`` job still writes Parquet for analysts who want it.

Archiving runs in the shard's background prune, beside the hot path, through the store's
own threads.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from actors.clock import Clock
from actors.errors import DataError
from actors.log import keys
from actors.log.store import KeyNotFound, ObjectStore

__all__ = ["Archive", "day_of"]

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
_SWEEP_BACK_DAYS = 400  # how far back the first sweep of an incarnation looks for old days


def day_of(now_ms: int) -> str:
    """The UTC date of ``now_ms`` as the archive names days: YYYYMMDD."""
    return dt.datetime.fromtimestamp(now_ms / 1000, dt.UTC).strftime("%Y%m%d")


class Archive:
    """One shard's side of the archive."""

    def __init__(
        self, store: ObjectStore, shard: int, clock: Clock, *, retention_days: int | None
    ) -> None:
        self.store = store
        self.shard = shard
        self.clock = clock
        self.retention_days = retention_days
        self.started = False  # the shard's marker is there: its queues have baselines
        self._swept_day: str | None = None  # the newest day a sweep removed up to
        self._swept_on: str | None = None  # the day the last sweep ran

    async def open(self) -> None:
        """Learn whether this shard archived before. Raises: StoreError."""
        try:
            await self.store.get(keys.archive_marker_key(self.shard))
            self.started = True
        except KeyNotFound:
            self.started = False

    async def start(self) -> None:
        """Write the marker: the shard's queues have their baselines (the shard copied them
        just before). Raises: StoreError."""
        await self.store.put(keys.archive_marker_key(self.shard), b"evq archive\n")
        self.started = True

    async def keep(self, key: str, data: bytes) -> None:
        """Archive object ``key`` with bytes ``data``.

        Raises:
            StoreError: the store failed (the caller keeps the live object).
            DataError: the archive holds other bytes under that name today.
        """
        archived = keys.archive_key(key, day_of(self.clock.now_ms()))
        if await self.store.put_if_absent(archived, data):
            return
        if await self.store.get(archived) != data:
            raise DataError(f"{archived} holds other bytes than {key}: not pruning it")

    def sweep_due(self) -> bool:
        """Whether a retention sweep is due (at most one a day)."""
        return self.retention_days is not None and self._swept_on != day_of(self.clock.now_ms())

    async def sweep(self, owns: Callable[[str], bool]) -> int:
        """Remove this shard's archived days older than the retention: its segments, and the
        archived snapshots of the queues it ``owns``; return how many objects went.

        Raises:
            StoreError: the store failed (the next sweep tries again).
        """
        assert self.retention_days is not None
        now = self.clock.now_ms()
        cutoff = now - self.retention_days * DAY_MS
        oldest = self._swept_day or day_of(cutoff - _SWEEP_BACK_DAYS * DAY_MS)
        removed = 0
        day_ms = cutoff - DAY_MS
        while (day := day_of(day_ms)) > oldest:
            removed += await self._remove_day(day, owns)
            day_ms -= DAY_MS
        self._swept_day = day_of(cutoff - DAY_MS)
        self._swept_on = day_of(now)
        if removed:
            log.info("shard %d: archive retention removed %d objects", self.shard, removed)
        return removed

    async def _remove_day(self, day: str, owns: Callable[[str], bool]) -> int:
        """Two listings a day: the shard's segments, and every queue's snapshots."""
        doomed = await self.store.list(keys.archive_key(keys.wal_prefix(self.shard), day))
        for key in await self.store.list(keys.archive_key(keys.ROOT, day)):
            try:
                mine = owns(keys.queue_of(keys.unarchived(key)))
            except DataError:
                continue  # not a queue's object: nothing this shard put there
            if mine:
                doomed.append(key)
        for key in doomed:
            await self.store.delete(key)
        return len(doomed)
