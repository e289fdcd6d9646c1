"""The crash test: SIGKILL a queue under load, recover, and check nothing acknowledged is lost.

A child process (``tests/fault/crash_writer.py``) serves one queue on a LocalDirStore with
64 producers and 16 consumers and prints a line for every acknowledged reply. The parent
kills it at a random moment, then recovers the log and checks:

- every acknowledged put is there, unless an ack of it was sent;
- every acknowledged ack is gone;
- every message there is one a producer sent, with exactly the body it sent;
- the log decodes cleanly: no damage anywhere (a killed process's writes are whole in the page
  cache; only the preallocated zeros follow the last block), every snapshot verifies;
- the queue works after recovery (put, take, ack) and recovers again to the same state.

Each round kills a child twice on the same store: the second child recovers from the
first crash (and may itself be killed while recovering). Seeds are drawn per run (set
EVQ_CRASH_SEED to repeat one) and are part of every assertion message.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.core.ids import SequentialIds
from actors.core.snapshot import decode_snapshot, logical
from actors.log import keys
from actors.log.codec import decode_snapshot_object
from actors.log.device import LocalLogDevice
from actors.log.shard_recovery import read_shard
from actors.log.store import LocalDirStore
from actors.log.wal import scan_segment
from actors.queue_actor import QueueActor
from actors.shard import QueueShard
from tests.fault.actor_support import state_view
from tests.fault.crash_writer import ID_PATTERN, QUEUE, make_body

pytestmark = [pytest.mark.fault, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 5
BASE_SEED = int(os.environ.get("EVQ_CRASH_SEED") or secrets.randbits(31))


@dataclass
class Acknowledged:
    """What the children said was acknowledged, over all their runs."""

    puts: set[str] = field(default_factory=set)
    acking: set[str] = field(default_factory=set)
    acks: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def read(self, text: str) -> None:
        for line in text.split("\n")[:-1]:  # a last line without its newline was cut short
            verb, _, rest = line.partition(" ")
            if verb == "put":
                self.puts.add(rest)
            elif verb == "acking":
                self.acking.add(rest)
            elif verb == "ack":
                self.acks.add(rest)
            elif verb == "error":
                self.errors.append(rest)


async def run_and_kill(root: Path, run: int, seed: int, delay: float, after_ready: bool) -> str:
    """Start a child on ``root``, SIGKILL it ``delay`` s after it is ready (or started);
    return its stdout."""
    out_path, err_path = root.parent / f"run{run}.out", root.parent / f"run{run}.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.fault.crash_writer",
            str(root),
            str(run),
            str(seed),
            cwd=REPO,
            stdout=out,
            stderr=err,
        )
        try:
            if after_ready:
                deadline = time.monotonic() + 30
                while b"ready\n" not in out_path.read_bytes():
                    assert proc.returncode is None, f"the child died: {err_path.read_text()}"
                    assert time.monotonic() < deadline, "the child never got ready"
                    await asyncio.sleep(0.01)
            await asyncio.sleep(delay)
            assert proc.returncode is None, f"the child exited early: {err_path.read_text()}"
            proc.send_signal(signal.SIGKILL)
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
    # 255: asyncio's child watcher found the status already reaped ("Unknown child process
    # pid", seen in the fresh-clone suite); the child was running just before the SIGKILL
    assert proc.returncode in (-signal.SIGKILL, 255), err_path.read_text()
    return out_path.read_text()


async def check_log(store: LocalDirStore, ctx: str) -> None:
    """Every segment of the shard log decodes in full, each continuing the one before: a
    killed process leaves whole blocks (the page cache outlives it) and preallocated zeros."""
    objects = await store.list("")
    assert not [k for k in objects if "/damaged/" in k], f"{ctx}: objects were set aside"
    device = LocalLogDevice(store, 0)
    segments = await device.segments()
    lsn = None
    for i, (first, key) in enumerate(segments):
        read = scan_segment(await device.read(key))
        ends = ("clean", "zeros") if i + 1 == len(segments) else ("clean",)
        assert read.end in ends, f"{ctx}: {key}: {read.end} {read.reason}"
        assert read.header.first_lsn == first
        assert lsn is None or first == lsn, f"{ctx}: {key} does not continue LSN {lsn}"
        lsn = read.next_lsn
    for key in await store.list(keys.snapshot_prefix(QUEUE)):
        _, seq, body = decode_snapshot_object(await store.get(key))
        assert seq == keys.seq_of(key)
        assert decode_snapshot(body).name == QUEUE
    queues, report = await read_shard(store, device, 0, 1)
    assert report.clean, f"{ctx}: {report}"
    assert queues[QUEUE].report.clean, f"{ctx}: {queues[QUEUE].report}"


async def open_queue(store: LocalDirStore, clock: ManualClock) -> QueueActor:
    shard = QueueShard(0, 1, store, clock=clock, ids=SequentialIds())
    await shard.start()
    assert shard.report is not None
    assert shard.report.clean, shard.report
    return await shard.get(QUEUE)


async def check_recovery(root: Path, said: Acknowledged, ctx: str) -> None:
    assert not said.errors, f"{ctx}: the child reported errors: {said.errors[:5]}"
    store = LocalDirStore(root)
    try:
        await check_log(store, ctx)
        actor = await open_queue(store, ManualClock())
        try:
            present = {str(m.id): m for m in logical(actor.state).messages}
            lost = said.puts - present.keys() - said.acking
            assert not lost, f"{ctx}: {len(lost)} acknowledged puts lost, e.g. {sorted(lost)[:5]}"
            back = said.acks & present.keys()
            assert not back, f"{ctx}: {len(back)} acknowledged acks undone: {sorted(back)[:5]}"
            for mid, m in present.items():
                assert re.fullmatch(ID_PATTERN, mid), f"{ctx}: a message no one put: {mid!r}"
                assert m.body == make_body(mid), f"{ctx}: {mid} has a body no one sent"
            assert not actor.state.outbox
            stats = await actor.execute(cmd.Stats())
            assert stats.total == len(present)
            assert stats.enqueued == stats.total + stats.acked, f"{ctx}: {stats}"
        finally:
            await actor.host.close(snapshot=False)  # type: ignore[attr-defined]
    finally:
        await store.close()


async def check_still_works(root: Path, ctx: str) -> None:
    """Put, take and ack after the crash; then a second recovery gives the same state."""
    clock = ManualClock(time.time_ns() // 1_000_000 + 1000)
    store = LocalDirStore(root)
    try:
        actor = await open_queue(store, clock)
        try:
            mids = [f"after-{i}" for i in range(20)]
            news = [cmd.NewMessage(body=make_body(m), id=m) for m in mids]
            assert await actor.execute(cmd.Put(news)) == [rp.PutResult(m, rp.CREATED) for m in mids]
            ready = (await actor.execute(cmd.Stats())).ready
            got = await actor.execute(cmd.Take(max=30))
            assert len(got) == min(30, ready)
            acks = await actor.execute(cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in got[:10]]))
            assert all(r.status == rp.OK for r in acks), acks
            clock.advance(1)
            expected = state_view(actor.state, clock.now_ms())
        finally:
            await actor.host.close()  # type: ignore[attr-defined]
        again = await open_queue(store, clock)
        try:
            assert state_view(again.state, clock.now_ms()) == expected, ctx
            for m in mids:
                if not any(d.id == m for d in got[:10]):
                    assert (await again.execute(cmd.Peek(m))).body == make_body(m)
        finally:
            await again.host.close()  # type: ignore[attr-defined]
        await check_log(store, ctx)
    finally:
        await store.close()


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_a_killed_queue_loses_nothing_it_acknowledged(round_: int, tmp_path: Path) -> None:
    seed = BASE_SEED + round_
    rng = random.Random(seed)
    root = tmp_path / "store"
    said = Acknowledged()
    # First a kill under full load; then a second child recovers that crash and is killed
    # too, possibly while it is still recovering.
    for run, after_ready, delay in [
        (0, True, rng.uniform(0.2, 2.0)),
        (1, False, rng.uniform(0.0, 1.5)),
    ]:
        since = "ready" if after_ready else "start"
        ctx = f"EVQ_CRASH_SEED={seed} run {run}, killed {delay:.2f}s after {since}"
        said.read(await run_and_kill(root, run, seed * 10 + run, delay, after_ready))
        if run == 0:
            assert said.puts, f"{ctx}: nothing was acknowledged before the kill"
        await check_recovery(root, said, ctx)
    await check_still_works(root, f"EVQ_CRASH_SEED={seed}")
