"""Opening a queue's log: replay, set damage aside, take a new epoch, report.

:func:`open_log` is what a new incarnation of a queue runs before it serves anything:

1. replay the newest valid snapshot and the segments after it (:func:`replay`);
2. if anything was discarded, write a snapshot of what was kept and move the damaged objects
   to ``damaged/`` — in that order, so a crash in between repeats the same recovery;
3. claim a new epoch by writing a ``WriterStarted`` segment at the next sequence number
   with ``put_if_absent`` — fencing every older incarnation; if another incarnation wrote
   there first, start again from 1;
4. store the recovery report under ``reports/<epoch>.json`` and log it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

import msgspec

from actors.clock import Clock
from actors.core.events import Event, QueueCreated, WriterStarted
from actors.core.state import QueueState
from actors.errors import QueueError, QueueNotFound, Unavailable
from actors.log import keys
from actors.log.replay import Progress, RecoveryReport, replay
from actors.log.snapshots import encode_state, write_snapshot
from actors.log.store import KeyNotFound, ObjectStore
from actors.log.writer import GroupCommitWriter

__all__ = ["OpenedLog", "open_log"]

log = logging.getLogger(__name__)

_CLAIM_ATTEMPTS = 8


class OpenedLog(msgspec.Struct):
    """A recovered queue, ready to serve: its state, its writer (holding the new epoch)."""

    state: QueueState
    writer: GroupCommitWriter
    report: RecoveryReport
    snapshot_seq: int  # seq of the newest snapshot now in the store (0: none)


async def open_log(
    store: ObjectStore,
    queue: str,
    clock: Clock,
    *,
    create: QueueCreated | None = None,
    progress: Progress | None = None,
    writer_options: dict[str, object] | None = None,
) -> OpenedLog:
    """Recover ``queue`` and take ownership of its log.

    With ``create``, a queue without any log object is created with that event; without it,
    such a queue raises QueueNotFound.

    Raises:
        QueueNotFound: no log for the queue and nothing to create it with.
        Unavailable: the store failed, or other incarnations kept winning the claim.
    """
    last_error: QueueError | None = None
    for attempt in range(_CLAIM_ATTEMPTS):
        replayed = await replay(store, queue, progress=progress)
        state, report = replayed.state, replayed.report
        if not state.created and create is None:
            if replayed.found and replayed.damaged:
                log.error("queue %s: nothing valid survived recovery", queue)
            raise QueueNotFound("no such queue", queue=queue)
        epoch = replayed.max_epoch + 1
        report.epoch = epoch
        snapshot_seq = report.snapshot_seq
        if replayed.damaged:
            snapshot_seq = await _set_damage_aside(
                store, queue, replayed.damaged, state, epoch, report
            )
        writer = GroupCommitWriter(
            store, queue, epoch, report.last_seq + 1, **(writer_options or {})
        )
        now = max(clock.now_ms(), state.clock_ms)
        claim: list[Event] = [WriterStarted(now, epoch, secrets.randbits(62) + 1)]
        if not state.created and create is not None:
            claim.append(QueueCreated(max(now, create.at_ms), create.name, create.settings))
        try:
            await writer.append_and_wait(claim)
        except QueueError as exc:
            # Another incarnation claimed first, or our claim's outcome is unknown: either
            # way the log must be read again before deciding anything.
            last_error = exc
            log.info("queue %s: epoch %d could not claim the log (%s); retrying", queue, epoch, exc)
            await asyncio.sleep(min(0.05 * 2**attempt, 2.0))
            continue
        for event in claim:
            state.apply(event)
        await _store_report(store, queue, report)
        return OpenedLog(state, writer, report, snapshot_seq)
    raise Unavailable(
        f"queue {queue}: could not claim the log in {_CLAIM_ATTEMPTS} attempts: {last_error}"
    )


async def _set_damage_aside(
    store: ObjectStore,
    queue: str,
    damaged: list[str],
    state: QueueState,
    epoch: int,
    report: RecoveryReport,
) -> int:
    """Snapshot what was kept, then move each damaged object to ``damaged/``.

    Returns the sequence number of the snapshot now covering the log (0 if none needed).

    Raises:
        Unavailable: the snapshot could not be written and verified.
    """
    seq = report.last_seq
    snapshots = [k for k in damaged if k.startswith(keys.snapshot_prefix(queue))]
    segments = [k for k in damaged if k not in snapshots]
    await _move_aside(store, snapshots, epoch)  # segments still hold what they covered
    if segments and state.created:
        # Capture the kept prefix before its damaged segment goes: a crash after this point
        # recovers from this snapshot, a crash before it repeats this same recovery.
        key = await write_snapshot(store, queue, seq, encode_state(state, epoch, seq))
        if key is None:
            raise Unavailable(f"queue {queue}: the repair snapshot did not verify")
    await _move_aside(store, segments, epoch)
    log.warning("queue %s: moved %d damaged object(s) aside", queue, len(damaged))
    return seq if segments and state.created else report.snapshot_seq


async def _move_aside(store: ObjectStore, damaged: list[str], epoch: int) -> None:
    for key in damaged:
        try:
            data = await store.get(key)
        except KeyNotFound:
            continue
        await store.put(keys.damaged_key(key, epoch), data)
        await store.delete(key)


async def _store_report(store: ObjectStore, queue: str, report: RecoveryReport) -> None:
    data = msgspec.json.encode(report)
    try:
        await store.put(keys.report_key(queue, report.epoch), data)
    except QueueError as exc:  # the report is for people; losing it must not stop the queue
        log.error("queue %s: could not store the recovery report: %s", queue, exc)
    level = logging.INFO if report.clean else logging.WARNING
    log.log(level, "queue %s recovered: %s", queue, data.decode())
