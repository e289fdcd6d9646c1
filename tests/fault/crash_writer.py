"""The child process of the crash test: one queue under heavy concurrent load until killed.

    python -m tests.fault.crash_writer <store-dir> <run> <seed>

Opens (creating or recovering) the queue ``crash`` on a shard over a LocalDirStore (its
local log: preallocated segments appended to, small ones here, so kills also land in
rolls) and runs 64 producers
(puts of 1-10 messages with unique client ids) and 16 consumers (takes, then acks or,
sometimes, releases) until the parent kills it. It reports on stdout, one line each, written
with one ``os.write`` (no buffering, nothing lost to the kill but the line being written):

    ready              the queue is open
    put <id>           the put of <id> was acknowledged (created)
    acking <id>        an ack of <id> is about to be sent (its outcome may never be known)
    ack <id>           the ack of <id> was acknowledged (status ok)
    error <text>       a command failed (never expected: the store does not fail here)

Bodies are a function of the id (:func:`make_body`), so the parent can tell a real body
from garbage. The queue snapshots often, so kills also land in snapshots and pruning.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

from actors.clock import SystemClock
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.errors import QueueError
from actors.ids import RandomIds
from actors.log.store import LocalDirStore
from actors.queue_actor import QueueActor
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard

QUEUE = "crash"
# Leases outlive any test run: a message taken before the kill stays reserved, not redelivered.
SETTINGS = QueueSettings(id_mode="client", visibility_timeout_ms=3_600_000)
LOG_SETTINGS = LogSettings(snapshot_every_records=300, segment_bytes=256 * 1024)
PRODUCERS = 64
CONSUMERS = 16
LIFETIME_S = 60.0  # a child whose parent is gone must not run forever
ID_PATTERN = r"r(\d+)-p(\d+)-(\d+)-(\d+)"


def make_body(mid: str) -> bytes:
    """The body of message ``mid``: sizes from 1 byte to 3 KB, compressible or not."""
    rng = random.Random(mid)
    size = rng.choice((1, 40, 300, 3000))
    head = f"{mid}|".encode()
    if rng.getrandbits(1):
        filler = (head * (size // len(head) + 1))[:size]
    else:
        filler = rng.randbytes(size)
    return head + filler


def emit(lines: list[str]) -> None:
    if lines:
        os.write(1, "".join(f"{line}\n" for line in lines).encode())


async def producer(actor: QueueActor, run: int, p: int, rng: random.Random) -> None:
    n = 0
    while True:
        mids = [f"r{run}-p{p}-{n}-{i}" for i in range(rng.randint(1, 10))]
        n += 1
        batch = cmd.Put([cmd.NewMessage(body=make_body(m), id=m) for m in mids])
        try:
            results = await actor.execute(batch)
        except QueueError as exc:
            emit([f"error put {type(exc).__name__}: {exc}"])
            continue
        emit([f"put {r.id}" if r.status == rp.CREATED else f"error dup {r.id}" for r in results])


async def consumer(actor: QueueActor, rng: random.Random) -> None:
    while True:
        try:
            got = await actor.execute(cmd.Take(max=rng.randint(1, 10)))
        except QueueError as exc:
            emit([f"error take {type(exc).__name__}: {exc}"])
            continue
        if not got:
            await asyncio.sleep(0.002)
            continue
        release = [d for d in got if rng.random() < 0.1]
        ack = [d for d in got if d not in release]
        try:
            if release:
                items = [cmd.ReleaseItem(id=d.id, lease=d.lease) for d in release]
                await actor.execute(cmd.Release(items))
            if ack:
                emit([f"acking {d.id}" for d in ack])
                results = await actor.execute(cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in ack]))
                emit([f"ack {r.id}" for r in results if r.status == rp.OK])
        except QueueError as exc:
            emit([f"error ack {type(exc).__name__}: {exc}"])


async def main(root: str, run: int, seed: int) -> None:
    rng = random.Random(seed)
    shard = QueueShard(
        0,
        1,
        LocalDirStore(root),
        clock=SystemClock(),
        ids=RandomIds(random.Random(seed)),
        log_settings=LOG_SETTINGS,
    )
    await shard.start()
    await shard.create(QUEUE, SETTINGS, [])
    actor = await shard.get(QUEUE)
    emit(["ready"])
    tasks = [
        *(
            asyncio.ensure_future(producer(actor, run, p, random.Random(rng.random())))
            for p in range(PRODUCERS)
        ),
        *(
            asyncio.ensure_future(consumer(actor, random.Random(rng.random())))
            for _ in range(CONSUMERS)
        ),
    ]
    await asyncio.sleep(LIFETIME_S)
    emit(["error timeout: never killed"])
    os._exit(3)  # no cleanup: this process is meant to die abruptly anyway
    del tasks


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
