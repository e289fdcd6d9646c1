"""Changing the shard count of a stopped server's store (``evq reshard``).

A queue's records sit in the log of the shard its name hashes to, so the shard count cannot
simply change: a shard started with another count would not find its queues' records. The
change goes through snapshots instead, in steps that may be interrupted and run again:

1. open every shard of the old count in this process (recovery, as a server would: deleted
   queues are erased), then close it with a snapshot of every queue: each queue's snapshot
   now holds all of its records;
2. check that every queue's newest snapshot is its last record (else stop: nothing changed);
3. write the layout with ``resharding_to`` and the highest epoch written (from here on, a
   server refuses to start, and running this again resumes at step 4);
4. retire the old shard logs: every segment, live or archived, goes to the archive under
   ``resharded-<epoch>/`` (``archive/<day>/resharded-<epoch>/wal/<shard>/…``), where readers
   of the new logs do not take it for theirs (the new logs number their records from 1
   again); the shards' archive markers go, so the new shards archive each queue's
   snapshot as its baseline before their first archived segment; reports and damaged
   copies stay in ``wal/``;
5. write the layout with the new count; new shard logs claim epochs above the old ones.

The history of the old logs stays in the archive, as the logs were; the pipeline reads the
new logs' history from each queue's snapshot on (``actors/log/archive.py``). The server
must be stopped; on a local disk the logs' locks refuse a reshard while it runs, on an
object store nothing does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from actors.clock import Clock, SystemClock
from actors.core import commands as cmd
from actors.errors import DataError
from actors.log import keys
from actors.log.archive import day_of
from actors.log.layout import Layout, read_layout, write_layout
from actors.log.store import ObjectStore, copy_object
from actors.settings import LogSettings
from actors.shard import QueueShard

__all__ = ["ReshardReport", "describe", "reshard"]

log = logging.getLogger(__name__)


class ReshardReport(msgspec.Struct, kw_only=True):
    """What :func:`reshard` did."""

    before: int | None  # the count the logs were written with (None: no layout yet)
    after: int
    queues: int = 0  # queues snapshotted (with the server's key partitions)
    removed: int = 0  # shard log objects removed
    resumed: bool = False  # an interrupted change was finished


async def reshard(
    store: ObjectStore,
    count: int,
    *,
    log_settings: LogSettings | None = None,
    clock: Clock | None = None,
    say: Callable[[str], None] = lambda text: None,
) -> ReshardReport:
    """Make ``store`` a store of ``count`` shards (see the module's steps).

    Raises:
        DataError: a queue could not be snapshotted up to its last record (nothing changed),
            or the layout does not decode.
        QueueError: the store failed, or a shard's log is in use (a server is running).
    """
    if count < 1:
        raise DataError("the shard count must be at least 1")
    layout = await read_layout(store)
    if layout is None:
        if await store.list(keys.WAL_ROOT):
            raise DataError(f"shard logs under {keys.WAL_ROOT} but no {keys.LAYOUT}")
        await write_layout(store, Layout(shards=count))
        say(f"no shard logs yet: the store will be served with {count} shard(s)")
        return ReshardReport(before=None, after=count)
    report = ReshardReport(before=layout.shards, after=count)
    if layout.resharding_to is None:
        if layout.shards == count:
            say(f"the store is already served with {count} shard(s): nothing to do")
            return report
        epoch = 0
        # the old logs go: snapshots must hold every body (runs.py: nothing spilled)
        whole = msgspec.structs.replace(log_settings or LogSettings(), spill=False)
        for index in range(layout.shards):
            shard = QueueShard(index, layout.shards, store, log_settings=whole, clock=clock)
            say(f"shard {index}/{layout.shards}: recovering")
            await shard.start()
            epoch = max(epoch, shard.wal.epoch)
            say(f"shard {index}/{layout.shards}: snapshotting {len(shard.queues)} queue(s)")
            # A marker record each, so that every queue takes a new snapshot: one with its
            # bodies in it (the shard spills nothing here), as the old logs go.
            for queue in list(shard.queues.values()):
                if queue.state.created:
                    await queue.execute(cmd.Checkpoint())
            await shard.close(snapshot=True)
            _check_snapshotted(shard)
            report.queues += len(shard.queues)
        layout = Layout(
            shards=layout.shards,
            epoch_floor=max(layout.epoch_floor, epoch),
            resharding_to=count,
        )
        await write_layout(store, layout)
    else:
        report.resumed = True
        report.before = layout.shards
        say(f"finishing the change from {layout.shards} to {layout.resharding_to} shard(s)")
        if layout.resharding_to != count:
            raise DataError(
                f"an interrupted change to {layout.resharding_to} shard(s) must be finished "
                f"first: run `evq reshard --shards {layout.resharding_to}`"
            )
    report.removed = await _retire(store, f"resharded-{layout.epoch_floor}", clock)
    await write_layout(store, Layout(shards=count, epoch_floor=layout.epoch_floor))
    say(f"removed {report.removed} shard log object(s); the store now has {count} shard(s)")
    return report


async def _retire(store: ObjectStore, generation: str, clock: Clock | None) -> int:
    """Move every shard-log segment, live or archived, under ``generation`` in the archive,
    and drop the shards' archive markers; return how many live segments went. Runs again
    where it stopped (copies are overwritten, deletions of what is gone are no-ops)."""
    day = day_of((clock or SystemClock()).now_ms())
    removed = 0
    for key in await store.list(keys.WAL_ROOT):
        if not keys.is_wal_segment(key):
            continue  # reports and damaged copies stay, for people
        if await copy_object(store, key, keys.archive_key(f"{generation}/{key}", day)):
            await store.delete(key)
            removed += 1
    for key in await store.list(keys.ARCHIVE_ROOT):
        live = keys.unarchived(key)
        if keys.is_wal_segment(live):
            archived_on = keys.archive_day(key) or day
            retired = keys.archive_key(f"{generation}/{live}", archived_on)
            if await copy_object(store, key, retired):
                await store.delete(key)
        elif key.startswith(keys.ARCHIVE_MARKERS):
            await store.delete(key)
    return removed


def _check_snapshotted(shard: QueueShard) -> None:
    """Every queue of the closed ``shard`` has a snapshot of its last record."""
    missing = [
        name
        for name, queue in shard.queues.items()
        if queue.next_seq > 1 and (not queue.snapshots or queue.snapshots[-1] != queue.next_seq - 1)
    ]
    if missing:
        shown = ", ".join(sorted(missing)[:5])
        raise DataError(
            f"shard {shard.index}: {len(missing)} queue(s) could not be snapshotted up to their "
            f"last record ({shown}); nothing was changed — see the log, then try again"
        )


def describe(report: ReshardReport) -> str:
    """One line for people."""
    before = "no layout" if report.before is None else f"{report.before} shard(s)"
    return (
        f"{before} -> {report.after} shard(s); {report.queues} queue(s) snapshotted, "
        f"{report.removed} log object(s) removed" + (" (resumed)" if report.resumed else "")
    )
