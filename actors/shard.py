"""A shard: many queues in one process, each an independent :class:`QueueActor`, sharing one
log.

The split, one sentence each: a command's life (admitted, decided, appended, released once
durable) is :mod:`actors.flow`'s; which queues exist and the log's life (recovery, the reload
after a failed write, pruning, compaction) are this module's; what one queue does between
commands is :mod:`actors.queue_actor`'s.

A Ray actor is a whole process (~50 MiB here), so queues share a few shard processes; a
queue lives on the shard the placement map names (:mod:`actors.log.placement`; by default
``placement(name, count)``, a hash), and a shard refuses a queue it does not hold
(``WrongShard``) before any effect. A shard is a plain asyncio class: Ray wraps
it only where it is spawned (:mod:`actors.spawn`), and the tests use it directly.

The shard owns the log its queues write to (:mod:`actors.log.shardlog`: one group commit,
one write and one fsync for all of them). On start it recovers every queue from the queues'
snapshots and the log (:mod:`actors.log.shard_recovery`), so a restarted shard process (or
its replacement on another node) serves its queues again. When a write fails it reads the
log again and sorts out the commands that were waiting (see :meth:`QueueShard._on_failed`).
It prunes the log behind its queues' snapshots, and asks the queues that hold the oldest
segment for snapshots when the log grows past ``LogSettings.retain_records``.

Deleting a queue writes a record that ends its history, then removes its snapshots; a crash
half-way is finished by the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from actors.clock import Clock, SystemClock
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.core.ids import IdSource
from actors.core.state import QueuedMessage, QueueState
from actors.errors import (
    Conflict,
    DataError,
    Fenced,
    Moving,
    NotReady,
    QueueError,
    QueueExists,
    QueueNotFound,
    Unavailable,
    WrongShard,
)
from actors.flow import Call, Entry, Flow, unavailable
from actors.history import Sample
from actors.ids import RandomIds
from actors.keyspace import ShardKeys, is_partition, partition_of
from actors.log import keys
from actors.log.archive import Archive
from actors.log.bodies import Bodies, Readable, inline_runs
from actors.log.device import LogDevice, LogHeld, ObjectLogDevice, open_device
from actors.log.placement import Placement
from actors.log.replay import replay
from actors.log.shard_recovery import (
    SHARD_STREAM,
    OpenedShard,
    Progress,
    SegmentInfo,
    open_shard_log,
    placement,
)
from actors.log.shardlog import Batch, ShardLog
from actors.log.store import DiskFailed, KeyNotFound, ObjectStore, StoreError
from actors.metrics import QueueMetrics
from actors.queue_actor import QueueActor, spilling
from actors.settings import LogSettings, QueueSettings, validate_queue_name
from actors.status import LogWrites, RecoveryReport, ShardReport, ShardStatus

__all__ = ["QueueShard", "placement"]

TIDY_MS = 60_000  # the periodic prune runs at least this often (ms)
CHECKPOINTS_AT_ONCE = 8  # queues refreshing their snapshots for the prune at a time

log = logging.getLogger(__name__)

# Puts a batch of dead letters into a queue that may live on another shard.
Forward = Callable[[str, list[object]], Awaitable[list[Any]]]


def _tombstone(name: str) -> str:
    return f"{keys.queue_prefix(name)}DELETED"


class QueueShard:
    """Hosts the queues that hash to ``index`` out of ``count``, and their log."""

    def __init__(
        self,
        index: int,
        count: int,
        store: ObjectStore,
        *,
        log_settings: LogSettings | None = None,
        clock: Clock | None = None,
        ids: IdSource | None = None,
        forward: Forward | None = None,
        memory_budget_bytes: int | None = None,
        device: LogDevice | None = None,
        progress: Progress | None = None,
        wait_for_log: bool = False,
    ) -> None:
        self.index = index
        # a log locked by another process: wait for it (an older incarnation that Ray
        # replaced, paused or closing: a zombie, which the lock keeps from writing) instead
        # of failing the start (a second server on the same data directory)
        self.wait_for_log = wait_for_log
        self.progress = progress or _ProgressLog(index)
        # Past this resident size, puts are refused (Overloaded) until takes and acks free
        # memory: a full shard answers 429 instead of dying of out-of-memory.
        self.memory = MemoryBudget(memory_budget_bytes)
        self.count = count
        self.store = store
        self.log_settings = log_settings or LogSettings()
        self.clock = clock or SystemClock()
        self.ids = ids or RandomIds()
        self.forward = forward  # set by the spawner: routes dead letters to other shards
        self.device = device or open_device(
            store,
            index,
            clock=self.clock,
            segment_bytes=self.log_settings.segment_bytes,
            roll_after_ms=self.log_settings.segment_roll_ms,
            cache_dir=self.log_settings.segment_cache,
        )
        # A local log, or an object store's with a local copy, reads spilled bodies back;
        # without one, an object store's runs keep them in memory.
        self.bodies = (
            Bodies(self.device, self.log_settings.body_cache_bytes)
            if isinstance(self.device, Readable)
            else None
        )
        if self.bodies is not None:
            self.memory.shed = self.bodies.clear
        self.memory.held = self._messages_held
        self.queues: dict[str, QueueActor] = {}
        # Which shard holds each queue (the store's map, read at start): a queue held elsewhere
        # is refused with WrongShard, before any effect.
        self.placement = Placement(count=count)
        self.arriving: set[str] = set()  # queues the map gives this shard, not yet taken over
        # handover snapshots read ahead of take_over (queue -> its key, the read)
        self._fetched: dict[str, tuple[str, asyncio.Future[tuple[list[str], Any]]]] = {}
        self.wal: ShardLog = ShardLog(self.device, 0, 1)  # replaced by start()
        self.log_ready = asyncio.Event()
        self.report: ShardReport | None = None
        self.reports: list[RecoveryReport] = []  # what recovery found per queue
        self._segments: deque[SegmentInfo] = deque()  # the log's segments, oldest first
        self._written = LogWrites()
        self._deleted: dict[str, int] = {}  # queue -> seq of its deletion record
        self._erased: set[str] = set()  # deleted queues whose objects are gone
        self._stream_seq = 1
        self._ready = False
        self._recovering = 0
        self._failed: dict[str, str] = {}
        self._closed = False
        self._stopped: QueueError | None = None
        self._log_failed: str | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._pruning = False
        self._checkpointing: set[str] = set()
        self._compacted: set[str] = set()  # segments whose bodies were (being) moved
        self._tidying: asyncio.Future[None] | None = None  # the periodic prune
        self.compactions = 0
        self.queue_changes = 0  # queues created and deleted here since start (sys:queues)
        settings = self.log_settings
        self.archive = (
            Archive(store, index, self.clock, retention_days=settings.archive_retention_days)
            if settings.archive
            else None
        )
        self.keys = ShardKeys(self.clock, self._get_app_key, self._get_stats)
        self.flow = Flow(self)  # every command's life, from arrival to reply

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> ShardStatus:
        """Recover the shard's queues from their snapshots and the log; return the status."""
        self._recovering = 1
        log.info("shard %d/%d: recovering", self.index, self.count)
        try:
            opened = await self._open_log_when_there_is_space()
            if self.archive is not None:
                await self.archive.open()
        finally:
            self._recovering = 0
        self._install(opened)
        for name in list(self._deleted):
            await self._erase(name, self._deleted[name])
        for name in opened.tombstoned:
            await self._erase_all(name)
        for queue in self.queues.values():
            if queue.legacy:  # its own version-1 segments go once snapshots cover them
                self._spawn(queue.checkpoint(queue.next_seq - 1))
        for queue in list(self.queues.values()):
            moving = queue.state.moving
            if moving is not None and moving[1] == self.index:  # arrived before a crash
                await queue.execute(cmd.TakeOver(moving[0], moving[2]))
        self._ready = True
        self._tidying = asyncio.ensure_future(self._tidy())
        return self.status()

    async def _tidy(self) -> None:
        """Prune every snapshot interval (a minute at most), as a snapshot does: the log of
        a shard whose queues went idle still shrinks to what they hold."""
        period = min(self.log_settings.snapshot_every_ms, TIDY_MS) / 1000
        while True:
            await asyncio.sleep(period)
            if not self._pruning and self._stopped is None and self.log_ready.is_set():
                self._pruning = True
                self._spawn(self._prune())

    async def _open_log_when_there_is_space(self) -> OpenedShard:
        """Open the log; while its disk has no room for a new segment, or its object store
        fails, wait (recovering, so ``/readyz`` says 503) and try again: a shard started on
        a full disk or a failing store serves once space or the store returns, no restart.

        Raises:
            QueueError: the log cannot be opened for another reason.
        """
        delay = 0.25
        while True:
            cap = 5.0
            try:
                return await self._open_log()
            except QueueError as exc:
                if self._closed:
                    raise
                if isinstance(exc, LogHeld) and self.wait_for_log:
                    why, cap = "its log is held by an older incarnation still running", 1.0
                elif self.device.full() is not None:
                    why = "no space on its disk to start its log"
                elif isinstance(exc, StoreError) and isinstance(self.device, ObjectLogDevice):
                    why = "its object store failed while it started"  # S3 down for a while
                else:
                    raise
                log.error("shard %d: %s (%s); trying again in %.1fs", self.index, why, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, cap)

    async def _open_log(self) -> OpenedShard:
        return await open_shard_log(
            self.store,
            self.device,
            self.index,
            self.count,
            self.clock,
            progress=self.progress,
            max_batch_bytes=self.log_settings.max_batch_bytes,
            prepare=lambda name, state: spilling(state, self, name),
        )

    def _install(self, opened: OpenedShard) -> None:
        """Serve from ``opened``: its queues' states, its log."""
        self.report = opened.report
        self.reports = opened.reports
        self.placement = opened.placement
        self.count = opened.placement.count  # a resize since this shard was spawned changed it
        wal = opened.wal
        wal.on_durable = self.flow.durable
        wal.on_broken = self._on_broken
        wal.on_failed = self._on_failed
        self.wal = wal
        self._segments = deque(opened.segments)
        self._deleted = dict(opened.deleted)
        self._erased -= set(self._deleted)
        self._stream_seq = opened.stream_seq
        for name, recovered in opened.queues.items():
            queue = self.queues.get(name)
            if queue is None:
                queue = QueueActor(
                    name,
                    self,
                    recovered.state,
                    recovered.next_seq,
                    snapshots=recovered.snapshots,
                    legacy=recovered.legacy,
                )
                self._attach(queue)
            else:
                queue.reloaded(recovered.state, recovered.next_seq, recovered.snapshots)
        for name, queue in self.queues.items():
            if name not in opened.queues:  # created in a write that did not land
                queue.reloaded(QueueState(), self._deleted.get(name, 0) + 1, [])
            elif queue.state.moving is not None and queue.state.moving[1] != self.index:
                queue.stop(_moving(queue))  # handed over, the map not yet written
        # What recovery decoded and let go (snapshots' records, between the arrays made
        # from them) goes back to the system: else it stays in the heap's holes.
        _malloc_trim()
        self.log_ready.set()

    def _new_queue(self, name: str, state: QueueState, next_seq: int) -> QueueActor:
        return QueueActor(name, self, state, next_seq)

    def _attach(self, queue: QueueActor) -> None:
        if not is_partition(queue.name):  # key partitions have no queue: key of their own
            queue.listener = self.keys
        self.queues[queue.name] = queue
        queue.start()

    def status(self, brief: bool = False) -> ShardStatus:
        """Readiness and recovery reports (``brief``: without each queue's report, for
        probes and scrapes: a shard of many queues has as many reports)."""
        return ShardStatus(
            self.index,
            self._ready,
            sum(1 for n, q in self.queues.items() if q.state.created and not is_partition(n)),
            self._recovering,
            [] if brief else list(self.reports),
            self._failed,
            self.report,
            LogWrites(
                self._written.blocks,
                self._written.records,
                self._written.bytes,
                len(self._segments),
            ),
            self._log_failed,
            self.device.full(),
            self.placement.generation,
            self.placement.count,
            self.placement.span,
            self.queue_changes,
        )

    async def close(self, *, snapshot: bool = True) -> None:
        """Close every queue: finish writes, snapshot (unless told not to), stop timers; let
        go of the log."""
        self._closed = True
        if self._tidying is not None:
            self._tidying.cancel()
        self.keys.close()
        await asyncio.gather(*(q.close(snapshot=snapshot) for q in self.queues.values()))
        with contextlib.suppress(QueueError):
            await self.wal.drain()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.device.close()

    # ---------------------------------------------------------------- the log

    def written(self, batch: Batch) -> None:
        """``batch`` is durable (the flow releases its replies): count the block, note the
        segment it went to and the last record of each of its queues there."""
        written = self._written
        written.blocks += 1
        written.records += batch.count
        written.bytes += batch.size
        info = self._segments[-1] if self._segments else None
        if info is None or info.key != batch.segment:
            info = SegmentInfo(batch.segment, batch.first_lsn)
            self._segments.append(info)
        info.bytes += batch.length
        for name, first, records in batch.groups.values():
            info.queues[name] = first + len(records) - 1

    def _on_broken(self, exc: QueueError) -> None:
        """A write failed: decide nothing more until the log has been read again."""
        self.log_ready.clear()

    def _on_failed(self, failed: Batch, later: list[Batch], exc: QueueError) -> None:
        """Every write has settled after a failure: fail what the failed write held, then
        read the log again and sort out the rest (see :meth:`_reload`)."""
        if isinstance(exc, Fenced):
            log.error("shard %d: fenced, stopping: %s", self.index, exc)
            self._stop(exc, [*failed.entries, *(e for b in later for e in b.entries)])
            return
        if isinstance(exc, DiskFailed):
            self._fail_log(exc, failed.entries, [e for b in later for e in b.entries])
            return
        log.error("shard %d: log write failed, reading the log again: %s", self.index, exc)
        for entry in failed.entries:
            if entry.last_seq:
                entry.fail(unavailable(entry.queue.name))
        unsure = [e for e in failed.entries if not e.last_seq]  # read-only: decide again
        unsure.extend(e for b in later for e in b.entries)
        self._spawn(self._reload(unsure))

    def _stop(self, error: QueueError, entries: list[Entry]) -> None:
        """Serve nothing more: every queue stops with ``error``, and so do ``entries``."""
        self._stopped = error
        for queue in self.queues.values():
            queue.stop(error)
        for entry in entries:
            entry.fail(error)
        self.log_ready.set()  # waiters see that their queue stopped

    def _fail_log(self, exc: DiskFailed, failed: list[Entry], later: list[Entry]) -> None:
        """The log's disk failed an fsync (or a write): stop for good. Nothing is retried and
        the log is not read again here: after a failed fsync the page cache may show data
        the disk does not hold, so only a new process can tell what is durable (the device
        logged the errno already). Commands whose events were in the failed write may or may
        not have happened; the others did not."""
        errno = exc.fields.get("errno")
        self._log_failed = (
            f"shard {self.index}: {exc.message}; restart the shard to recover from its log"
        )
        log.error(
            "shard %d: its log failed (errno %s): every queue of the shard stops; "
            "restart the shard process or the server to recover from the log",
            self.index,
            errno,
        )
        error = Unavailable(self._log_failed, shard=self.index, errno=errno)
        for entry in failed:
            if entry.last_seq:
                entry.fail(unavailable(entry.queue.name))
        self._stop(error, [*failed, *later])

    async def _reload(self, unsure: list[Entry]) -> None:
        """Rebuild every queue's state from the log; then release the commands whose events
        the log holds, and decide again those whose events it does not."""
        delay = 0.05
        while self._stopped is None and not self._closed:
            failed = getattr(self.device, "failed", None)
            if isinstance(failed, DiskFailed):  # the disk failed meanwhile: no reading again
                self._fail_log(failed, [], unsure)
                return
            try:
                opened = await self._open_log()
                break
            except QueueError as exc:
                log.error("shard %d: reload failed (%s); retrying in %.2fs", self.index, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        else:
            for entry in unsure:
                entry.fail(self._stopped or NotReady(f"shard {self.index} is shutting down"))
            return
        self._install(opened)
        self.flow.settle_after_reload(unsure)

    def snapshot_taken(self, queue: QueueActor) -> None:
        """A queue has a new snapshot: drop the segments that snapshots now cover; keep room
        in the memory budget for its next one."""
        self.memory.reserve(queue.name, queue.snapshot_bytes)
        if not self._pruning:
            # Marked now, not when the task starts: two snapshots in one turn of the loop
            # would otherwise start two prunes, and the second would drop from the list a
            # segment it never deleted (a gap the next recovery stops at).
            self._pruning = True
            self._spawn(self._prune())

    async def _prune(self) -> None:
        """Delete the oldest segments while every record in them is covered by two snapshots
        of its queue (or its queue is gone); when too much of the log is kept, ask the queues
        that hold its oldest segment for snapshots. Runs as the only prune
        (``_pruning``, set by :meth:`snapshot_taken`)."""
        try:
            segments = self._segments
            while len(segments) > 1 and segments[0].key != self.device.active():
                if self._pinning(segments[0]):
                    break
                if self._holds_bodies(segments[1].first_lsn):
                    self._refresh(segments[1].first_lsn)
                    self._maybe_compact()
                    break
                if self.archive is not None:
                    await self._archive(segments[0].key)  # durable before the deletion
                await self.device.delete(segments[0].key)
                self._compacted.discard(segments.popleft().key)
            archive = self.archive
            if archive is not None and archive.sweep_due() and await archive.sweep(self._owns):
                await self._archive_baselines()
            if segments and segments[0].key != self.device.active():
                # The queues whose records keep the oldest segment take snapshots when the
                # log holds too many records, or when theirs are older than the snapshot
                # interval: an idle queue takes none by itself (they follow writes).
                settings = self.log_settings
                over = self.wal.next_lsn - segments[0].first_lsn > settings.retain_records
                now = self.clock.now_ms()
                for name, seq in self._pinning(segments[0]).items():
                    queue = self.queues.get(name)
                    if queue is None or name in self._checkpointing:
                        continue
                    if over or now - queue.snapshot_at_ms >= settings.snapshot_every_ms:
                        self._start_checkpoint(queue, seq)
        except QueueError as exc:  # pruning is retried at the next snapshot
            log.error("shard %d: pruning the log failed: %s", self.index, exc)
        finally:
            self._pruning = False

    async def _archive(self, key: str) -> None:
        """Copy a segment into the archive; the first time, each queue's baseline before it.
        Raises: QueueError (the segment is kept live)."""
        assert self.archive is not None
        if not self.archive.started:
            await self._archive_baselines()
            await self.archive.start()
        try:
            data = await self.device.read(key)
        except KeyNotFound:
            return  # gone already: a deletion that was not listed as done
        await self.archive.keep(key, data)

    async def _archive_baselines(self) -> None:
        """Copy each queue's oldest snapshot into the archive: where its archived history
        can start (actors/log/archive.py). Raises: QueueError."""
        assert self.archive is not None
        for name, queue in list(self.queues.items()):
            if queue.snapshots:
                key = keys.snapshot_key(name, queue.snapshots[0])
                try:
                    data = await self.store.get(key)
                except KeyNotFound:
                    continue  # pruned meanwhile: a newer one follows at the next sweep
                await self.archive.keep(key, data)

    def _owns(self, queue: str) -> bool:
        return self.placement.shard_of(queue) == self.index

    def elsewhere(self, name: str) -> QueueError | None:
        """The refusal of a command for queue ``name`` when the map puts it on another shard
        (None: it is this shard's)."""
        shard = self.placement.shard_of(name)
        if shard == self.index:
            if name in self.arriving:
                return Moving(f"queue {name} is arriving on shard {self.index}", queue=name)
            return None
        return WrongShard(
            f"queue {name} is on shard {shard}, not {self.index} "
            f"(placement generation {self.placement.generation})",
            queue=name,
            shard=shard,
            generation=self.placement.generation,
        )

    def _refresh(self, end_lsn: int) -> None:
        """Queues whose kept snapshots alone read bodies before ``end_lsn`` (taken or moved
        since) take new ones: at once if they are from before this process (nobody knows
        where those read), else once they are older than the snapshot interval (a busy
        queue's own next snapshots catch up by themselves; an idle one's never would, as a
        queue snapshots after its own writes only)."""
        now, every = self.clock.now_ms(), self.log_settings.snapshot_every_ms
        for name, queue in self.queues.items():
            if len(self._checkpointing) >= CHECKPOINTS_AT_ONCE:
                return  # the rest at the next prunes, which these snapshots start
            if (
                name not in self._checkpointing
                and (queue.floors_unknown or now - queue.snapshot_at_ms >= every)
                and queue.reads_old_bodies(end_lsn)
            ):
                self._start_checkpoint(queue, queue.next_seq - 1)

    def _maybe_compact(self) -> None:
        """Compact the oldest segments, which only bodies still queued keep (runs.py): when
        the segments that would go but for them are more than ``compact_over`` times those
        bodies' bytes, each queue that reads some writes them again further on (``BodiesMoved``) and
        takes snapshots that read them there, and the next prune deletes the segments.
        Crash-safe as it goes: a segment stays until no state and no kept snapshot reads
        from it (:meth:`_holds_bodies`)."""
        over = self.log_settings.compact_over
        if over <= 0:
            return
        prefix: list[SegmentInfo] = []  # covered by snapshots, not being written
        for info in list(self._segments)[:-1]:
            if info.key == self.device.active() or self._pinning(info):
                break
            prefix.append(info)
        keys = {info.key for info in prefix}
        if not keys or keys & self._compacted:
            return  # once: segments still kept after their move wait for snapshots
        limit = sum(info.bytes for info in prefix) / over
        live, readers = 0, []
        for queue in self.queues.values():
            found = queue.bodies_in(keys)
            if found:
                live += found
                readers.append(queue)
                if live >= limit:
                    return
        if readers:
            self._compacted |= keys
            self._spawn(self._compact(keys, readers))

    async def _compact(self, segments: set[str], queues: list[QueueActor]) -> None:
        moved = 0
        try:
            for queue in queues:
                moved += await queue.move_bodies(segments)
            self.compactions += 1
            log.info("shard %d: compaction moved %d bodies", self.index, moved)
        except QueueError as exc:  # the segments stay; the next prune tries again
            log.error("shard %d: compaction failed: %s", self.index, exc)
            self._compacted -= segments

    def _holds_bodies(self, end_lsn: int) -> bool:
        """Whether a queue may still read spilled bodies from a block before ``end_lsn``."""
        for queue in self.queues.values():
            floor = queue.body_floor
            if floor is not None and floor < end_lsn:
                return True
        return False

    def _pinning(self, segment: SegmentInfo) -> dict[str, int]:
        """The queues whose records in ``segment`` are not yet covered by two snapshots, and
        the last such record of each. A deleted queue pins too until its objects are erased:
        its deletion record must outlive its snapshots."""
        pins = {}
        for name, seq in segment.queues.items():
            if name == SHARD_STREAM or name in self._erased:
                continue
            queue = self.queues.get(name)
            if queue is None or queue.snapshot_floor < seq:
                pins[name] = seq
        return pins

    def _start_checkpoint(self, queue: QueueActor, upto: int) -> None:
        self._checkpointing.add(queue.name)  # at once: the next caller in this turn sees it
        self._spawn(self._checkpoint(queue, upto))

    async def _checkpoint(self, queue: QueueActor, upto: int) -> None:
        try:
            await queue.checkpoint(upto)
        except QueueError as exc:
            log.error("shard %d: checkpoint of queue %s failed: %s", self.index, queue.name, exc)
        finally:
            self._checkpointing.discard(queue.name)

    # ---------------------------------------------------------------- queues

    async def create(
        self, name: str, settings: QueueSettings, given: list[str]
    ) -> tuple[bool, QueueSettings]:
        """Create ``name`` (True), or find it with matching settings (False).

        Only the settings named in ``given`` must match an existing queue's.

        Raises:
            QueueExists: it exists and a given setting differs.
            BadRequest: invalid name or settings.
        """
        validate_queue_name(name, internal=True)
        settings.validate(name)
        self._check_open()
        queue = self.queues.get(name)
        if queue is None and (wrong := self.elsewhere(name)) is not None:
            raise wrong
        if queue is not None and queue.state.created:
            # Asked through the queue, so the answer waits until its creation is durable.
            existing = (await queue.execute(cmd.Describe())).settings
            differ = [f for f in given if getattr(existing, f) != getattr(settings, f)]
            if differ:
                raise QueueExists(f"queue {name} exists with other {', '.join(differ)}", queue=name)
            return False, existing
        if queue is None:
            queue = self._new_queue(name, QueueState(), self._deleted.get(name, 0) + 1)
            self._attach(queue)
        created = await queue.execute(cmd.Create(name, settings))
        self._deleted.pop(name, None)
        self._erased.discard(name)
        if created:  # created here: nothing to recover
            self.queue_changes += 1
            self._forget_report(name)
            self.reports.append(RecoveryReport(queue=name, epoch=self.wal.epoch))
        return bool(created), queue.state.settings

    async def delete(self, name: str) -> None:
        """Delete the queue: a record that ends its history, then its snapshots.

        Raises:
            QueueNotFound: no such queue.
        """
        queue = await self.get(name)
        await queue.execute(cmd.Drop())
        del self.queues[name]
        await queue.close(snapshot=False)
        self.memory.reserve(name, 0)
        self._deleted[name] = queue.next_seq - 1
        self._forget_report(name)
        await self._erase(name, queue.next_seq - 1)
        self.keys.queue_gone(name)
        self.queue_changes += 1

    # ---------------------------------------------------------------- handover

    async def hand_over(self, name: str, to: int, generation: int) -> str:
        """Hand queue ``name`` to shard ``to`` (placement generation ``generation``): its
        last record here (``QueueHandedOver``, durable: from then on it serves nothing, and
        a restart replays that), then a snapshot of it holding its bodies, read by the
        shard taking it over. Its waiting takes answer empty. Again after a crash or for a
        second caller: the same snapshot. Returns the snapshot's key.

        Raises:
            QueueError: no such queue here, handed elsewhere already, or the log failed.
        """
        queue = await self.get(name)
        moving = queue.state.moving
        if moving is None:
            await queue.execute(cmd.HandOver(self.index, to, generation))
        elif moving[1:] != (to, generation):
            raise Conflict(
                f"queue {name} is being handed to shard {moving[1]} at generation {moving[2]}",
                queue=name,
            )
        queue.stop(_moving(queue))
        await queue.settled()
        if queue.state.read is not None:  # bodies in this shard's log: into the snapshot
            await inline_runs(queue.state, name, self.device.read)
            queue.state.read = None
        key = await queue.snapshot(final=True) or keys.snapshot_key(name, queue.next_seq - 1)
        log.info("shard %d: queue %s handed to shard %d (%s)", self.index, name, to, key)
        return key

    async def take_back(self, name: str, generation: int | None = None) -> None:
        """Call off a handover of queue ``name`` whose map was not written: it serves here
        again (``QueueTakenOver`` in this log). With ``generation``, only the handover for
        that generation of the map (another coordinator's is not this caller's to call off).

        Raises:
            QueueError: no such queue here, or the log failed.
        """
        queue = self.queues.get(name)
        if queue is None or queue.state.moving is None:
            return
        source, _, fenced_for = queue.state.moving
        if generation is not None and fenced_for != generation:
            return
        generation = fenced_for
        queue.stopped = None
        await queue.execute(cmd.TakeOver(source, generation))
        queue.start()

    def placed(self, placement: Placement) -> list[str]:
        """Serve by ``placement`` (a newer map): queues handed over that it gives other
        shards leave (their commands are refused, WrongShard), queues it gives this one that
        are not here yet wait for :meth:`take_over` (Moving).

        Returns the strays: queues held here, not handed over, that the map gives another
        shard (created here under the map before it, while a resize wrote its first map).
        They are still served here; the resize pins them here in its next generation."""
        if placement.generation < self.placement.generation:
            return self.strays()
        before, self.placement = self.placement, placement
        self.count = placement.count
        # the queues it gives this shard that the last did not (one moved back to its hash's
        # shard leaves the map's table: compare both maps' answers)
        named = set(before.queues) | set(placement.queues)
        self.arriving |= {
            n
            for n in named
            if placement.shard_of(n) == self.index and before.shard_of(n) != self.index
        }
        gone = [
            n
            for n, q in self.queues.items()
            if placement.shard_of(n) != self.index and q.state.moving is not None
        ]
        for name in gone:
            queue = self.queues.pop(name)
            if queue.stopped is None:
                queue.stop(_moving(queue))
            self._spawn(queue.close(snapshot=False))
            refusal = self.elsewhere(name)
            if refusal is not None:  # its keys' watchers go on watching on its new shard
                self.keys.moved(name, refusal)
        self.arriving = {n for n in self.arriving if placement.shard_of(n) == self.index}
        self.arriving -= set(self.queues)
        # reads ahead for handovers this map does not make (a coordinator that lost the map)
        self._fetched = {n: f for n, f in self._fetched.items() if n in self.arriving}
        return self.strays()

    def arrivals(self) -> list[str]:
        """Queues the map gives this shard that it has not taken over yet (a handover whose
        coordinator stopped after writing the map), sorted."""
        return sorted(self.arriving)

    def strays(self) -> list[str]:
        """Queues held here, not handed over, that the map gives another shard (sorted)."""
        return sorted(
            n
            for n, q in self.queues.items()
            if q.state.moving is None and self.placement.shard_of(n) != self.index
        )

    async def fetch(self, name: str, key: str) -> None:
        """Read the snapshot a handover of queue ``name`` to this shard wrote (``key``)
        ahead of :meth:`take_over` (while the coordinator writes the map, which the
        take-over waits for). A failed read is read again there."""
        if name in self.queues:
            return
        read = asyncio.ensure_future(self._read_handed(name, key))
        self._fetched[name] = (key, read)
        with contextlib.suppress(QueueError):
            await asyncio.shield(read)

    async def _read_handed(self, name: str, key: str | None) -> tuple[list[str], Any]:
        """The queue's snapshot ``key`` read (no listing: nothing follows a handover's
        snapshot), or without a key its objects listed and replayed; with the keys used."""
        if key is None:
            listing = await self.store.list(keys.queue_prefix(name))
            return listing, await replay(self.store, name, listing=listing)
        data = await self.store.get(key)
        return [key], await replay(self.store, name, listing=[key], known={key: data})

    async def _drop_older_snapshots(self, name: str, seq: int) -> None:
        """Delete queue ``name``'s snapshots older than ``seq``, its handover's: they came
        before records in its old shard's log, which this shard cannot replay, so they are
        of no use here (its own snapshots, and their prune, start from ``seq``)."""
        try:
            for key in await self.store.list(keys.snapshot_prefix(name)):
                with contextlib.suppress(DataError):
                    if keys.seq_of(key) < seq:
                        await self.store.delete(key)
        except QueueError as exc:  # left for a later handover's or deletion's clean-up
            log.warning("shard %d: queue %s: old snapshots kept: %s", self.index, name, exc)

    async def take_over(self, name: str, key: str | None = None) -> bool:
        """Serve queue ``name``, handed to this shard: from its newest snapshot (the one
        its handover wrote: ``key``, read ahead by :meth:`fetch` if asked), with
        ``QueueTakenOver`` in this log. False: here already.

        Raises:
            WrongShard: the map does not give it to this shard.
            QueueError: its snapshot cannot be read, or the log failed.
        """
        queue = self.queues.get(name)
        fetched = self._fetched.pop(name, None)
        if queue is None:
            wrong = self.elsewhere(name)
            if isinstance(wrong, WrongShard):
                raise wrong
            read = None
            if fetched is not None and fetched[0] == key:
                with contextlib.suppress(QueueError):
                    read = await fetched[1]
            listing, replayed = read or await self._read_handed(name, key)
            state = replayed.state
            if state.moving is None or state.moving[1] != self.index:
                raise Conflict(f"queue {name} was not handed to shard {self.index}", queue=name)
            snapshots = []
            for k in listing:
                if k.startswith(keys.snapshot_prefix(name)):
                    with contextlib.suppress(DataError):
                        snapshots.append(keys.seq_of(k))
            queue = QueueActor(name, self, state, replayed.last_seq + 1, snapshots=snapshots)
            if key is not None:  # the handover's snapshot holds its bodies: no snapshot due
                queue.reads_no_bodies(keys.seq_of(key))
            self._attach(queue)
        self.arriving.discard(name)
        moving = queue.state.moving
        if moving is None:
            return False
        await queue.execute(cmd.TakeOver(moving[0], moving[2]))
        if key is not None:
            self._spawn(self._drop_older_snapshots(name, keys.seq_of(key)))
        return True

    def _forget_report(self, name: str) -> None:
        self.reports = [r for r in self.reports if r.queue != name]

    async def _erase(self, name: str, upto: int) -> None:
        """Remove the objects of queue ``name`` up to its deletion record ``upto``: its
        snapshots (not those of a queue of the same name created since), reports, and
        version-1 segments. The deletion record may be pruned from then on."""
        snap = keys.snapshot_prefix(name)
        for key in await self.store.list(keys.queue_prefix(name)):
            if key.startswith(snap) and keys.seq_of(key) > upto:
                continue
            await self.store.delete(key)
        if name in self._deleted:
            self._erased.add(name)

    async def _erase_all(self, name: str) -> None:
        """Finish a version-1 deletion: every object of the queue, the tombstone last."""
        tomb = _tombstone(name)
        for key in await self.store.list(keys.queue_prefix(name)):
            if key != tomb:
                await self.store.delete(key)
        await self.store.delete(tomb)

    def held(self) -> list[tuple[str, bool]]:
        """Every queue this shard holds, the server's own key partitions too (what a resize
        places), sorted, each with whether it is fenced for a handover not published yet."""
        return sorted(
            (n, q.state.moving is not None) for n, q in self.queues.items() if q.state.created
        )

    async def names(self) -> list[str]:
        """The queues this shard serves (not the server's own key partitions)."""
        return sorted(n for n, q in self.queues.items() if q.state.created and not is_partition(n))

    async def get(self, name: str) -> QueueActor:
        """The queue actor for ``name``.

        Raises:
            QueueNotFound: no such queue.
            NotReady: the shard is still recovering or is closing.
        """
        queue = self.queues.get(name)
        if queue is not None and queue.state.created:
            return queue
        self._check_open()
        if not self._ready:
            raise NotReady(f"shard {self.index} is still recovering", queue=name)
        validate_queue_name(name, internal=True)
        if queue is None and (wrong := self.elsewhere(name)) is not None:
            raise wrong
        if is_partition(name):  # key partitions come into being when first used
            await self.create(name, QueueSettings(), [])
            return self.queues[name]
        if queue is not None:
            return queue  # being created: its commands wait for the creation's write
        raise QueueNotFound("no such queue", queue=name)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _check_open(self) -> None:
        if self._closed:
            raise NotReady(f"shard {self.index} is shutting down")
        if self._stopped is not None:
            raise self._stopped

    # ---------------------------------------------------------------- commands

    # The shard's face to the data channel and Ray; the flow does the work (actors/flow.py).

    async def execute_many(self, name: str, commands: list[object]) -> list[Any]:
        """Run commands on queue ``name`` in order; each result is a reply or a QueueError."""
        return await self.flow.run_batch([(name, c) for c in commands])

    async def run_batch(self, items: Sequence[tuple[str, object]]) -> list[Any]:
        """See :meth:`Flow.run_batch`."""
        return await self.flow.run_batch(items)

    def begin(self, items: Sequence[tuple[str, object]]) -> Call | None:
        """See :meth:`Flow.begin`."""
        return self.flow.begin(items)

    @property
    def serving(self) -> bool:
        """Recovered, its log readable (not reloading), not closing."""
        return self._ready and self.log_ready.is_set() and not self._closed

    def full(self) -> str | None:
        """Why puts are refused because the log's disk is full (None: it is not)."""
        return self.device.full()

    def over_budget(self) -> bool:
        return self.memory.over()

    def _messages_held(self) -> int:
        """Messages in this shard's queues now (ready, delayed and leased)."""
        return sum(
            q.state.n_ready + q.state.n_delayed + q.state.n_reserved for q in self.queues.values()
        )

    def budget_use(self) -> str:
        """What the memory budget counted at its last reading (for a refusal's message)."""
        return self.memory.use()

    def admit(self, put: cmd.Put) -> None:
        self.memory.admit(put)

    def keys_set(self, views: list[rp.KeyView]) -> None:
        for view in views:
            self.keys.key_set(view)

    async def take(self, name: str, command: cmd.Take, wait_s: float) -> list[Any]:
        """A take that waits up to ``wait_s`` for messages.

        Raises:
            QueueError: as QueueActor.take.
        """
        queue = await self.get(name)
        return await queue.take(command, wait_s)

    async def metrics(self) -> list[QueueMetrics]:
        """Every queue's figures now (not the key partitions)."""
        return [q.metrics() for n, q in sorted(self.queues.items()) if not is_partition(n)]

    async def history(self, name: str) -> list[Sample]:
        """Queue ``name``'s counts a minute at a time over the last hour (actors/history.py).

        Raises:
            QueueError: as :meth:`get` (no such queue, elsewhere, not ready).
        """
        return (await self.get(name)).history_view()

    # ---------------------------------------------------------------- watch keys

    async def watch_key(self, key: str, version: int) -> rp.KeyView:
        """The key's state once its version is past ``version`` (see actors.keyspace).

        Raises:
            BadRequest: an invalid key.
        """
        return await self.keys.watch(key, version)

    async def _get_app_key(self, key: str) -> rp.KeyView:
        [result] = await self.execute_many(partition_of(key), [cmd.GetKey(key)])
        if isinstance(result, QueueError):
            raise result
        return result

    async def _get_stats(self, name: str) -> rp.StatsView | None:
        try:
            queue = await self.get(name)
        except QueueNotFound:
            return None
        return await queue.execute(cmd.Stats())

    # ---------------------------------------------------------------- dead letters

    async def route_dead_letters(
        self, source: str, target: str, letters: list[QueuedMessage]
    ) -> None:
        """Put dead letters into ``target``, idempotently (a retry finds them there)."""
        await self.redeliver(target, [_redelivery(source, m) for m in letters])

    async def redeliver(self, target: str, messages: list[cmd.NewMessage]) -> None:
        """Put messages from another queue into ``target`` (``Put.redelivery``), on this
        shard or through the shard that holds it.

        Raises:
            QueueError: ``target`` does not exist or cannot be reached.
        """
        put = cmd.Put(messages, redelivery=True)
        if self._owns(target) or self.forward is None:
            [result] = await self.execute_many(target, [put])
        else:
            [result] = await self.forward(target, [put])
        if isinstance(result, QueueError):
            raise result


class _ProgressLog:
    """Logs replay progress of a large log, at most every few seconds."""

    EVERY_S = 5.0

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self._last = time.perf_counter()  # a rate limit, not state time

    def __call__(self, done: int, total: int, records: int) -> None:
        now = time.perf_counter()
        if now - self._last >= self.EVERY_S or (done == total and total > 100):
            self._last = now
            log.info(
                "shard %d: replayed %d/%d segments, %d records", self.shard, done, total, records
            )


class MemoryBudget:
    """This process's resident memory against a budget, read at most every 200 ms; the
    puts let in since the last reading count too (their bodies and ``MESSAGE_OVERHEAD``
    each), so one batch of up to 1000 puts decided between two readings stops at the budget.
    So does room for each queue's next snapshot (twice its last snapshot object: the object
    while its compressed parts are joined, then again as it is read back), which a queue
    writes whatever the load, and room for the puts the gateways can have on their way in
    (``in_flight``: a shard holds them before it can refuse them).

    Over the budget, it first drops the cache of bodies read back from the log, hands the
    allocator's free memory back to the system
    (``malloc_trim``: microseconds when nothing was freed, ~75 ms once after 400 MB were)
    and reads again: glibc keeps freed message
    bodies resident in the arena of the thread that allocated them (a Ray async actor's
    event loop has a thread of its own), so a shard drained of its messages would otherwise
    stay "over" and refuse puts for good.

    Python's own allocator and its dicts keep much of what drained messages held, which no
    trim returns: so from the first reading over the budget (the mark), the messages the
    shard stopped holding since (``held``) count as free room inside the process, each at
    what a message held then cost on average (the growth since the lowest reading, over the
    messages held; at most ``MESSAGE_OVERHEAD``), but never more than the resident size
    holds beyond the lowest reading and the messages still held. A drained shard takes puts
    again into the memory its messages left, and a refilled one refuses at the same size as
    before (past the mark's messages, it is marked anew).

    That second bound, not "the share less all the resident size gave back since the mark":
    a shard marked in a flood of big puts holds more than its messages explain (the puts'
    buffers, on their way in), and its messages' share is capped at ``MESSAGE_OVERHEAD``.
    When the flood ends the buffers go back to the system; counting that as its drained
    messages' memory gone too left a drained shard over its budget for good, refusing puts
    with nothing left to drain (CI, the overload test, twice)."""

    def __init__(self, budget_bytes: int | None) -> None:
        self.budget = budget_bytes
        self._checked = 0.0
        self._resident = 0  # at the last reading
        self._admitted = 0  # bytes of the puts let in since
        self._snapshots: dict[str, int] = {}  # queue: its last snapshot object's size
        self._reserved = 0  # room for the next snapshots: twice their sum
        self.in_flight: Callable[[], int] = lambda: 0  # bytes of puts that may be on their way
        self.shed: Callable[[], None] = lambda: None  # drops caches (spilled bodies read back)
        self._room = 0  # at the last reading: the reserve and what may be in flight
        self._in_flight = 0  # at the last reading
        self.held: Callable[[], int] = lambda: 0  # messages the shard holds now
        self._mark: tuple[int, int, float] | None = None  # resident, held, bytes per message
        self._lowest: int | None = None  # the lowest resident size read
        self._free = 0  # at the last reading: what drained messages left, not given back
        self._held = 0  # messages held at the last reading (once over the budget)

    def over(self) -> bool:
        if self.budget is None:
            return False
        now = time.perf_counter()  # a rate limit on /proc reads, not state time
        if now - self._checked >= 0.2:
            refusing = self._used() > self.budget
            self._checked = now
            self._admitted = 0
            self._in_flight = self.in_flight()
            self._room = self._reserved + self._in_flight
            self._resident = resident_bytes()
            # Refusing since the last reading, or over now: what the allocator keeps free
            # must not count (a shard just under its budget with drained messages' memory
            # kept would otherwise let in only the headroom's worth every 200 ms).
            if refusing or self._resident + self._room > self.budget:
                self.shed()
                _malloc_trim()
                self._resident = resident_bytes()
            self._free = self._freed(refusing)
        return self._used() > self.budget

    def _used(self) -> int:
        """What counts against the budget: the last reading, less what drained messages
        left free in it, and what was let in since."""
        return self._resident - self._free + self._admitted + self._room

    def _freed(self, refusing: bool) -> int:
        """Bytes the messages drained since the mark left inside the process: their share
        less what the resident size has given back since (0: never over). ``refusing``:
        puts were refused since the last reading."""
        assert self.budget is not None
        resident, mark = self._resident, self._mark
        if self._lowest is None or resident < self._lowest:
            self._lowest = resident
        if mark is None and not refusing and resident + self._room <= self.budget:
            return 0  # never over: the queues need not be counted
        held = self._held = self.held()
        if mark is not None and held <= mark[1]:
            _, then, each = mark
            drained = (then - held) * each
            beyond = resident - self._lowest - held * each
            return max(0, int(min(drained, beyond)))
        # Over for the first time, or refilled past the mark's messages: mark here.
        top = resident if mark is None else max(mark[0], resident)
        each = min(MESSAGE_OVERHEAD, (top - self._lowest) / held) if held else 0.0
        self._mark = (top, held, each)
        return 0

    def use(self) -> str:
        """The last reading, in MiB: what counted against the budget."""
        mib = 1 << 20
        used = self._used()
        kept = self._room - self._in_flight
        mark = self._mark
        held = (
            f"; {self._held} messages held, {mark[1]} when first over at "
            f"{mark[0] / mib:.0f} MiB ({mark[2]:.0f} B each)"
            if mark is not None
            else ""
        )
        return (
            f"{used / mib:.0f} of {(self.budget or 0) / mib:.0f} MiB: "
            f"{self._resident / mib:.0f} resident, {self._free / mib:.0f} of it free "
            f"(left by drained messages), {self._admitted / mib:.0f} let in since, "
            f"{kept / mib:.0f} kept for the next snapshots, "
            f"{self._in_flight / mib:.0f} for puts on their way{held}"
        )

    def reserve(self, queue: str, snapshot_bytes: int) -> None:
        """``queue``'s last snapshot object was ``snapshot_bytes`` (0: it is gone)."""
        before = self._snapshots.pop(queue, 0)
        if snapshot_bytes:
            self._snapshots[queue] = snapshot_bytes
        self._reserved += 2 * (snapshot_bytes - before)

    def admit(self, put: cmd.Put) -> None:
        """Count a put let in, until the next reading sees what it holds."""
        if self.budget is not None:
            self._admitted += sum(len(m.body) + MESSAGE_OVERHEAD for m in put.messages)


# What a queued message holds beyond its body (its state and index entries; the engine's
# target, loadtest/RESULTS.md "Engine micro-benchmark"), for MemoryBudget.admit.
MESSAGE_OVERHEAD = 400


def _malloc_trim() -> None:
    """Give the C allocator's free memory back to the system (glibc; elsewhere nothing)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc(0)


_libc: Any = None  # malloc_trim, found on first use (False: this libc has none)


def tune_allocator() -> bool:
    """Make buffers of 1 MiB and more (log segments read for the archive, frames of puts,
    snapshot parts) go to mmap, and back to the system when freed; return whether the C
    allocator took it (glibc; elsewhere nothing). Left alone, glibc raises its mmap
    threshold after the first such buffer is freed and serves later ones from the arena of
    the thread that asks, which keeps them: a shard's RSS grew in 16-MiB steps, one per
    store thread that had read a segment (the 1-hour soak, loadtest/RESULTS.md). Once per
    shard process."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 20))


_M_MMAP_THRESHOLD = -3  # glibc's malloc.h

# The cyclic collector's thresholds in a shard: a young collection every 100,000 allocations
# (not 700), an older one every 50 of those. Left at CPython's defaults, a shard holding a
# queue of 100k+ runs spent ~12 % of its time in collections started by a put's small
# allocations, and full collections held puts for up to ~250 ms (loadtest/RESULTS.md, "The
# cyclic collector"). Gateways keep the defaults: a refused request's exception holds its
# body in a cycle until a collection, and under 10x overload a gateway collecting this
# rarely grew ~50 MiB past its bound (tests/integration/test_overload.py).
SHARD_COLLECTOR_THRESHOLDS = (100_000, 50, 50)


def tune_collector(thresholds: tuple[int, int, int] | None = None) -> None:
    """Move every object alive now (the imported modules, Ray's and aiohttp's state) out of
    the cyclic collector's sight (they are still freed when their count drops), so that each
    collection walks only what came after; with ``thresholds``, collect that often. Once per
    serving process, after its imports."""
    gc.collect()
    gc.freeze()
    if thresholds is not None:
        gc.set_threshold(*thresholds)


def resident_bytes() -> int:
    """This process's resident set size."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _redelivery(source: str, m: QueuedMessage) -> cmd.NewMessage:
    """The dead-letter copy of ``m``: the same id (see ``Put.redelivery``), body, attributes
    and group, plus where and when it came from (``evq.source_queue``, ``evq.source_id``,
    ``evq.sent_at``: when it was first put, kept over further moves); an idempotency key so
    that routing twice puts it once."""
    attributes = m.attributes or {}
    provenance = {
        cmd.SOURCE_QUEUE: source,
        cmd.SOURCE_ID: str(m.id),
        cmd.SENT_AT: attributes.get(cmd.SENT_AT, m.enqueued_at_ms),
    }
    return cmd.NewMessage(
        body=m.body,
        id=str(m.id),
        idempotency_key=f"dlq:{source}:{m.seq}",
        group=m.group,
        attributes={**attributes, **provenance},
    )


def _moving(queue: QueueActor) -> Moving:
    moving = queue.state.moving
    to = moving[1] if moving is not None else -1
    return Moving(f"queue {queue.name} is being handed to shard {to}", queue=queue.name)
