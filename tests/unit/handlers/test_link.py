"""The worker link and pool (evq/handlers/link.py) with real sockets on 127.0.0.1 and
workers as threads of this process: chunks run and come back in order, a wrong secret is
refused, a dead worker is a lost chunk and is replaced, a worker still starting holds no
chunk, idle workers beyond the warm ones go, a worker that cannot start fails what waits."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from actors import handshake
from evq.handlers.executor import TaskFailed, WorkerLost
from evq.handlers.link import WorkerLink, WorkerPool, WorkerServer
from tests.tap import Tap

SECRET = "s3cret"


def double(messages: Sequence[Any]) -> list[Any]:
    return [m * 2 for m in messages]


class Workers:
    """In-process workers for a pool: ``spawn`` makes one (its server starts when
    ``release`` lets it, as a worker waits for resources), ``kill`` stops it."""

    def __init__(self, run: Any = double, *, held: bool = False, broken: bool = False) -> None:
        self.run = run
        self.held = held
        self.broken = broken
        self.servers: dict[int, WorkerServer] = {}
        self.gates: dict[int, asyncio.Event] = {}
        self.killed: list[int] = []
        self.count = 0

    def spawn(self) -> int:
        self.count += 1
        self.gates[self.count] = asyncio.Event()
        if not self.held:
            self.gates[self.count].set()
        return self.count

    def release(self, worker: int) -> None:
        self.gates[worker].set()

    async def address(self, worker: int) -> tuple[str, int]:
        await self.gates[worker].wait()
        if self.broken:
            raise TaskFailed("ModuleNotFoundError: no module named 'mine'")
        server = self.servers[worker] = WorkerServer(self.run, SECRET, "127.0.0.1")
        return server.address

    def kill(self, worker: int) -> None:
        self.killed.append(worker)
        server = self.servers.get(worker)
        if server is not None:
            server.close()

    def pool(self, **options: Any) -> WorkerPool:
        return WorkerPool(self.spawn, self.address, self.kill, SECRET, **options)


async def test_a_link_runs_chunks_in_a_worker_and_returns_their_outcomes() -> None:
    server = WorkerServer(double, SECRET, "127.0.0.1")
    link = WorkerLink(server.address, SECRET)
    try:
        assert await link.run([1, 2, 3]) == [2, 4, 6]
        assert await link.run(["a"]) == ["aa"]  # the same connection, the next chunk
    finally:
        link.close()
        server.close()


async def test_a_worker_refuses_a_link_without_the_secret() -> None:
    ran: list[Any] = []
    server = WorkerServer(lambda m: ran.extend(m) or [], SECRET, "127.0.0.1")
    link = WorkerLink(server.address, "wrong")
    try:
        with pytest.raises(WorkerLost):
            await link.run([1])
        assert ran == []  # nothing it sent was unpickled, let alone run
    finally:
        link.close()
        server.close()


async def test_a_sealed_link_runs_chunks_and_the_wire_holds_neither_secret_nor_payload() -> None:
    server = WorkerServer(double, SECRET, "127.0.0.1", encrypt=True)
    tap = Tap(server.address)
    link = WorkerLink(await tap.start(), SECRET)
    try:
        assert await link.run(["private-payload"]) == ["private-payload" * 2]
        assert await link.run([3]) == [6]
    finally:
        link.close()
        await asyncio.wait_for(tap.done.wait(), 10)
        server.close()
        tap.close()
    seen = bytes(tap.seen)
    assert len(seen) > 100
    assert SECRET.encode() not in seen
    assert b"private-payload" not in seen


async def test_a_replayed_or_missing_proof_is_refused_by_the_worker() -> None:
    ran: list[Any] = []
    server = WorkerServer(lambda m: ran.extend(m) or [], SECRET, "127.0.0.1")
    # a good handshake, recorded
    reader, writer = await asyncio.open_connection(*server.address)
    size = int.from_bytes(await reader.readexactly(4), "little")
    challenge = await reader.readexactly(size)
    me = handshake.Client(SECRET)
    proof, _, _ = me.answer(challenge[:32], challenge[32:] == b"\x01")
    recorded = (64).to_bytes(4, "little") + me.public + proof
    writer.write(recorded)
    size = int.from_bytes(await reader.readexactly(4), "little")
    me.confirm(await reader.readexactly(size))
    writer.close()
    for attempt in (recorded, b"\x05\x00\x00\x00hello"):  # replayed; not a proof at all
        reader, writer = await asyncio.open_connection(*server.address)
        size = int.from_bytes(await reader.readexactly(4), "little")
        await reader.readexactly(size)
        writer.write(attempt)
        with contextlib.suppress(ConnectionResetError):  # reset: the attempt went unread
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing answered
        writer.close()
    for _ in range(50):
        if server.refused == 2:
            break
        await asyncio.sleep(0.05)
    assert server.refused == 2
    assert ran == []
    server.close()


async def test_a_worker_that_cannot_run_a_chunk_answers_task_failed_and_goes_on() -> None:
    def picky(messages: Sequence[Any]) -> list[Any]:
        if messages == ["bad"]:
            raise MemoryError("out of memory")
        return list(messages)

    server = WorkerServer(picky, SECRET, "127.0.0.1")
    link = WorkerLink(server.address, SECRET)
    try:
        with pytest.raises(TaskFailed, match="MemoryError"):
            await link.run(["bad"])
        assert await link.run(["good"]) == ["good"]
    finally:
        link.close()
        server.close()


async def test_the_pool_runs_chunks_on_few_workers_and_keeps_one_warm() -> None:
    workers = Workers()
    pool = workers.pool(warm=1, idle_s=0.2)
    try:
        chunks = [pool.submit([i]) for i in range(20)]
        assert [await c.result() for c in chunks] == [[2 * i] for i in range(20)]
        assert workers.count <= 20
        await asyncio.sleep(0.6)  # idle: all but the warm one go
        assert pool.workers == 1
        assert len(workers.killed) == workers.count - 1
        before = workers.count
        assert await pool.submit([5]).result() == [10]  # the warm worker takes it
        assert workers.count == before
    finally:
        await pool.close()
    assert sorted(workers.killed) == list(range(1, workers.count + 1))


async def test_a_worker_still_starting_holds_no_chunk() -> None:
    # The first worker cannot be placed yet (no free resources): chunks must not wait for
    # it while another worker is free.
    workers = Workers(held=True)
    pool = workers.pool(warm=2, idle_s=5)
    try:
        first = pool.submit([1])
        await asyncio.sleep(0.05)
        assert workers.count == 1
        second = pool.submit([2])  # a chunk waits, none free: a second worker starts
        assert workers.count == 2
        workers.release(2)  # the second one is placed; the first still waits
        assert await asyncio.wait_for(first.result(), 2) == [2]
        assert await asyncio.wait_for(second.result(), 2) == [4]
    finally:
        await pool.close()


async def test_a_chunk_whose_worker_dies_is_lost_and_the_next_gets_a_new_worker() -> None:
    running = threading.Event()
    stop = threading.Event()

    def hang_on_zero(messages: Sequence[Any]) -> list[Any]:
        if 0 in messages:
            running.set()
            stop.wait(5)
        return list(messages)

    workers = Workers(hang_on_zero)
    pool = workers.pool(warm=1)
    try:
        doomed = pool.submit([0])
        await asyncio.to_thread(running.wait, 5)
        worker = workers.count
        workers.servers[worker].drop()  # the worker's process dies under the chunk
        with pytest.raises(WorkerLost):
            await asyncio.wait_for(doomed.result(), 2)
        assert await asyncio.wait_for(pool.submit([7]).result(), 2) == [7]
        assert workers.count == worker + 1  # a new worker, the dead one let go
        assert worker in workers.killed
    finally:
        stop.set()
        await pool.close()


async def test_a_worker_that_cannot_start_fails_what_waits_for_it() -> None:
    workers = Workers(broken=True)
    pool = workers.pool(warm=1)
    try:
        chunks = [pool.submit([i]) for i in range(3)]
        for chunk in chunks:
            with pytest.raises(TaskFailed, match="ModuleNotFoundError"):
                await asyncio.wait_for(chunk.result(), 2)
        assert pool.workers == 0  # nothing left starting again and again
    finally:
        await pool.close()


async def test_a_cancelled_chunk_is_skipped_and_close_ends_what_still_waits() -> None:
    workers = Workers(held=True)
    pool = workers.pool(warm=1)
    skipped = pool.submit([1])
    skipped.cancel()
    waiting = pool.submit([2])
    await pool.close()
    with pytest.raises(WorkerLost):
        await waiting.result()
    with pytest.raises(asyncio.CancelledError):
        await skipped.result()
