"""Logs for the pipeline tests, written by the real engine and log writer.

:func:`write_busy_log` drives queues of two :class:`~actors.shard.QueueShard`s (each with
its shard log, placed as the server places queues) over a ``LocalDirStore`` with a manual
clock: puts, takes, acks, releases, touches, reschedules, deletes, lease expiry, dead
letters routed to a dead-letter queue, a purge, retention expiry, and a three-stage cascade
whose moves carry idempotency keys derived from the source message (one move repeated after
a lost ack, as a crash would). The queues of a shard interleave in its log. Its expected
numbers are the live queues' own ``Stats`` replies.

:func:`write_bad_log` writes histories the audit must object to. Smaller logs for the
layouts and damage of format 2 are in ``tests/pipeline/layouts.py``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core import events as ev
from actors.core.ids import SequentialIds
from actors.core.snapshot import decode_snapshot, encode_snapshot
from actors.log import keys
from actors.log.codec import decode_snapshot_object, encode_snapshot_object
from actors.log.shard_recovery import placement
from actors.log.store import LocalDirStore
from actors.log.wal import decode_groups, decode_record, encode_block, encode_record, scan_segment
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard

START_MS = 1_700_000_000_000
SECOND = 1000
MINUTE = 60 * SECOND
CASCADE = ["stage1", "stage2", "stage3"]
# No snapshots by time (the manual clock moves minutes at once): the logs keep every
# segment, so sums over the history can be checked against the engine's counters. Small
# segments: a shard log has several.
WHOLE_HISTORY = LogSettings(snapshot_every_ms=10**12, segment_bytes=16 * 1024)
SHARDS = 2  # orders, orders-dlq and the cascade on shard 0; scratch and shortlived on 1


@dataclass
class BusyLog:
    """A log on disk and what the engine says about it."""

    root: Path
    now_ms: int
    stats: dict[str, dict[str, Any]]  # queue -> the engine's Stats reply at now_ms
    notes: dict[str, Any] = field(default_factory=dict)


def new(body: str, **kw: Any) -> cmd.NewMessage:
    """A message with a text body."""
    return cmd.NewMessage(body=body.encode(), **kw)


class Driver:
    """Runs commands on the queues of shards (each on its own, as the server places them)
    and moves the manual clock."""

    def __init__(self, shards: list[QueueShard], clock: ManualClock) -> None:
        self.shards = shards
        self.clock = clock

    def shard(self, queue: str) -> QueueShard:
        return self.shards[placement(queue, len(self.shards))]

    async def run(self, queue: str, command: object) -> Any:
        [result] = await self.shard(queue).execute_many(queue, [command])
        if isinstance(result, Exception):
            raise result
        return result

    async def put(self, queue: str, *messages: cmd.NewMessage) -> list[str]:
        results = await self.run(queue, cmd.Put(list(messages)))
        return [r.id for r in results]

    async def take(self, queue: str, n: int, vt_ms: int | None = None) -> list[Any]:
        return await self.run(queue, cmd.Take(max=n, visibility_timeout_ms=vt_ms))  # type: ignore[no-any-return]

    async def ack(self, queue: str, *deliveries: Any) -> None:
        await self.run(queue, cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in deliveries]))

    async def release(self, queue: str, *deliveries: Any, delay_ms: int | None = None) -> None:
        items = [cmd.ReleaseItem(id=d.id, lease=d.lease, delay_ms=delay_ms) for d in deliveries]
        await self.run(queue, cmd.Release(items))

    async def stats(self, queue: str) -> dict[str, Any]:
        view = await self.run(queue, cmd.Stats())
        return msgspec.structs.asdict(view)  # type: ignore[no-any-return]

    def tick(self, ms: int) -> None:
        self.clock.advance(ms)


async def _orders(d: Driver) -> None:
    """A work queue with a dead-letter queue: most messages are acked, some retried, some
    dead-lettered after three deliveries, one deleted, one rescheduled, some delayed."""
    await d.put("orders", *[new(f"order {i}") for i in range(20)])
    await d.put(
        "orders", new("later", delay_ms=5 * MINUTE), new("much later", delay_ms=30 * MINUTE)
    )
    d.tick(2 * SECOND)
    batch = await d.take("orders", 8)
    await d.ack("orders", *batch[:5])
    await d.release("orders", batch[5], delay_ms=20 * SECOND)
    touched = batch[6]
    await d.run(
        "orders",
        cmd.Touch(
            [cmd.TouchItem(id=touched.id, lease=touched.lease, visibility_timeout_ms=90_000)]
        ),
    )
    # batch[7] is left to expire (visibility 10 s)
    d.tick(45 * SECOND)
    batch = await d.take("orders", 6)
    await d.ack("orders", *batch[:4])
    await d.run("orders", cmd.Delete(id=batch[4].id, lease=batch[4].lease))
    await d.run("orders", cmd.Reschedule(id=batch[5].id, lease=batch[5].lease, delay_ms=2 * MINUTE))
    d.tick(MINUTE)
    # A poison message: taken and never acked until it is dead-lettered (max_receives 3).
    await d.put("orders", new("poison"))
    for _ in range(3):
        got = await d.take("orders", 50)
        poison = [m for m in got if m.body == b"poison"]
        await d.ack("orders", *[m for m in got if m.body != b"poison"][:3])
        assert poison, "the poison message is handed out again after its lease"
        d.tick(15 * SECOND)
    await d.put("orders", new("after poison"))  # a write: dead letters get routed now
    d.tick(3 * MINUTE)
    got = await d.take("orders", 50)
    await d.ack("orders", *got[: len(got) // 2])


async def _cascade(d: Driver) -> None:
    """Messages move stage1 → stage2 → stage3: put into the next stage with the key
    ``<stage>:<id>``, then ack. One ack is lost (a crash): the move is repeated later and
    the next stage answers 'duplicate'."""
    await d.put(CASCADE[0], *[new(f"item {i}") for i in range(6)])
    crashed = False
    for _ in range(3):
        d.tick(20 * SECOND)
        for i, stage in enumerate(CASCADE):
            for m in await d.take(stage, 10, vt_ms=30 * SECOND):
                if i + 1 < len(CASCADE):
                    nxt = CASCADE[i + 1]
                    await d.put(nxt, new(m.body.decode() + " >", idempotency_key=f"{stage}:{m.id}"))
                    if not crashed:
                        crashed = True
                        continue  # crash before the ack: it comes back and moves again
                await d.ack(stage, m)
        d.tick(20 * SECOND)


async def _scratch(d: Driver) -> None:
    """A queue that is purged, and one whose messages run out of retention."""
    await d.put("scratch", *[new(f"tmp {i}") for i in range(7)])
    d.tick(10 * SECOND)
    await d.run("scratch", cmd.Purge())
    await d.put("scratch", new("survivor"))
    await d.put("shortlived", *[new(f"brief {i}") for i in range(4)])
    d.tick(3 * MINUTE)  # retention is 2 minutes
    await d.put("shortlived", new("fresh"))


def _create(name: str, **settings: Any) -> cmd.Create:
    return cmd.Create(name, QueueSettings(**settings))


async def write_busy_log(root: Path) -> BusyLog:
    """Write the busy log under ``root``; see the module docstring."""
    store = LocalDirStore(root)
    clock = ManualClock(START_MS)
    shards = [
        QueueShard(i, SHARDS, store, clock=clock, ids=SequentialIds(), log_settings=WHOLE_HISTORY)
        for i in range(SHARDS)
    ]
    for shard in shards:
        await shard.start()
    d = Driver(shards, clock)
    for command in [
        _create("orders-dlq"),
        _create(
            "orders",
            visibility_timeout_ms=10_000,
            max_receives=3,
            dead_letter_queue="orders-dlq",
            retention_ms=24 * 3600 * 1000,
        ),
        *[_create(stage, visibility_timeout_ms=30_000) for stage in CASCADE],
        _create("scratch"),
        _create("shortlived", retention_ms=2 * MINUTE),
    ]:
        await d.shard(command.name).create(command.name, command.settings, [])
    await _orders(d)
    await _cascade(d)
    await _scratch(d)
    d.tick(30 * SECOND)
    await _routed(shards)
    now = clock.now_ms()
    names = [n for shard in shards for n in await shard.names()]
    stats = {q: await d.stats(q) for q in names}
    for shard in shards:
        await shard.close()
    await store.close()
    return BusyLog(root, now, stats)


async def _routed(shards: list[QueueShard]) -> None:
    """Wait until every dead letter has been handed to its dead-letter queue."""
    for _ in range(500):
        if not any(q.state.outbox for shard in shards for q in shard.queues.values()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("dead letters were not routed")


# ------------------------------------------------------------------ logs made to fail the audit


async def write_bad_log(root: Path) -> dict[str, Any]:
    """Queues whose histories the audit must object to; returns what each should report."""
    store = LocalDirStore(root)
    clock = ManualClock(START_MS)
    shard = QueueShard(0, 1, store, clock=clock, ids=SequentialIds(), log_settings=WHOLE_HISTORY)
    await shard.start()
    d = Driver([shard], clock)
    for name, settings in [
        ("vanish", {}),
        ("redeliver", {"visibility_timeout_ms": 5_000}),
        ("src", {}),
        ("dst", {"idempotency_window_ms": 1_000}),
        ("removed", {}),
        ("fanout", {}),
        ("outputs", {}),
    ]:
        await shard.create(name, QueueSettings(**settings), [])
    # vanish: m2 is put (acknowledged) and later disappears from a snapshot, no event.
    ids = await d.put("vanish", new("keep"), new("will vanish"), new("acked"))
    got = await d.take("vanish", 3)
    await d.ack("vanish", *[m for m in got if m.body == b"acked"])
    await d.release("vanish", *[m for m in got if m.body != b"acked"])
    vanish_queue = shard.queues["vanish"]
    snap_key = await vanish_queue.snapshot()
    await d.put("vanish", new("after the snapshot"))
    # redeliver: one message handed out four times.
    await d.put("redeliver", new("again and again"))
    for _ in range(4):
        await d.take("redeliver", 1)
        d.tick(6 * SECOND)
    # cascade src → dst: one move lost (acked, never put), one duplicated (put twice under
    # the same key, the second after dst's idempotency window), one fine.
    src_ids = await d.put("src", new("fine"), new("lost"), new("twice"))
    got = {m.body: m for m in await d.take("src", 3)}
    await d.put("dst", new("fine", idempotency_key=f"src:{got[b'fine'].id}"))
    await d.put("dst", new("twice", idempotency_key=f"src:{got[b'twice'].id}"))
    d.tick(2 * SECOND)
    await d.put("dst", new("twice", idempotency_key=f"src:{got[b'twice'].id}"))
    await d.ack("src", *got.values())
    # fanout → outputs: the handler runtime's keys, two outputs of one message (fine).
    await d.put("fanout", new("split me"))
    [m] = await d.take("fanout", 1)
    await d.put("outputs", new("half 1", idempotency_key=f"fanout:{m.id}:0"))
    await d.put("outputs", new("half 2", idempotency_key=f"fanout:{m.id}:1"))
    await d.ack("fanout", m)
    # removed: a message that was put, taken and acked; its put is cut out of the log below.
    removed_ids = await d.put("removed", new("one"), new("two"))
    got = await d.take("removed", 2)
    await d.ack("removed", *got)
    d.tick(SECOND)
    now = clock.now_ms()
    # Closed without snapshots at shutdown, so the tampered one stays the newest.
    await shard.close(snapshot=False)
    _drop_from_snapshot(root, snap_key, ids[1])
    _drop_put_item(root, "removed", removed_ids[1])
    await store.close()
    return {
        "now_ms": now,
        "vanished": ("vanish", ids[1]),
        "redelivered": "redeliver",
        "cascade_lost": ("src", src_ids[1]),
        "cascade_duplicated": ("src", src_ids[2]),
        "removed": ("removed", removed_ids[1]),
    }


def _drop_from_snapshot(root: Path, key: str | None, mid: str) -> None:
    """Rewrite a snapshot object (with the codec) without message ``mid``."""
    assert key is not None
    path = root / key
    epoch, seq, body = decode_snapshot_object(path.read_bytes())
    snap = decode_snapshot(body)
    snap.messages = [m for m in snap.messages if str(m.id) != mid]
    path.write_bytes(encode_snapshot_object(epoch, seq, encode_snapshot(snap)))


def _drop_put_item(root: Path, queue: str, mid: str) -> None:
    """Re-encode the shard-log segment holding the put of ``mid`` without that message (same
    records, same sequence numbers: the log still checks, the message is just not in it)."""
    for path in sorted((root / keys.wal_prefix(0)).glob("*.seg")):
        data = path.read_bytes()
        blocks, found = [], False
        for block in scan_segment(data).blocks:
            groups = []
            for name, first, raw in decode_groups(block):
                events = [decode_record(r) for r in raw]
                if name == queue:
                    events = [_without(e, mid) for e in events]
                    found = found or events != [decode_record(r) for r in raw]
                groups.append((name, first, [encode_record(e) for e in events]))
            blocks.append(encode_block(block.epoch, block.first_lsn, groups))
        if found:
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data[:32] + b"".join(blocks))
            os.replace(tmp, path)
            return
    raise AssertionError(f"no put of {mid} in {queue}")


def _without(e: ev.Event, mid: str) -> ev.Event:
    if isinstance(e, ev.MessagesPut) and any(str(it.id) == mid for it in e.items):
        return ev.MessagesPut(e.at_ms, [it for it in e.items if str(it.id) != mid])
    return e
