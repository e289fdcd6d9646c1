"""A snapshot encoded in a forked child (actors/log/forked.py): the child's bytes are what the
function gives there, from the memory as it was at the fork; the parent's loop runs on
meanwhile; a child that fails, is killed or is cancelled is an error, never a wrong answer,
and leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from actors.errors import InternalError
from actors.log.forked import can_fork, encode_forked, one_child

pytestmark = pytest.mark.skipif(not can_fork(), reason="a platform without fork")  # not Linux


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # reaped: no child of that id any more
    return False


async def test_the_child_encodes_the_memory_as_it_was_at_the_fork() -> None:
    state = {"messages": [b"m%d" % i for i in range(100_000)]}

    def encode() -> bytes:
        return b"|".join(state["messages"])

    expected = encode()
    async with one_child():
        child = encode_forked(encode)
        state["messages"].append(b"after the fork")  # the parent goes on changing it
        state["messages"][0] = b"changed"
        got = await child
    assert got == expected
    assert b"after the fork" not in got


async def test_the_loop_runs_while_the_child_works() -> None:
    ticks = 0
    done = asyncio.Event()

    async def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            await asyncio.sleep(0.01)
            ticks += 1

    def slow() -> bytes:
        until = time.monotonic() + 1.0
        n = 0
        while time.monotonic() < until:  # a second of CPU, in the child
            n += 1
        return b"x" * (3 << 20)  # more than the pipe and a read hold at once

    ticker = asyncio.create_task(tick())
    async with one_child():
        got = await encode_forked(slow)
    done.set()
    await ticker
    assert got == b"x" * (3 << 20)
    # inline, a second of CPU would have let the ticker run at most once or twice
    assert ticks >= 20, ticks


async def test_a_child_that_raises_or_is_killed_is_an_error() -> None:
    def fails() -> bytes:
        raise ValueError("no")

    def killed() -> bytes:
        os.kill(os.getpid(), signal.SIGKILL)
        return b""

    async with one_child():
        with pytest.raises(InternalError, match="exit code 1"):
            await encode_forked(fails)
        with pytest.raises(InternalError, match="killed by signal 9"):
            await encode_forked(killed)


async def test_a_cancelled_wait_kills_the_child_and_reaps_it() -> None:
    def forever() -> bytes:
        while True:
            time.sleep(1)

    pids: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            pids.append(pid)
        return pid

    os.fork = fork  # type: ignore[assignment]  # to learn the child's id
    try:
        waiting = asyncio.create_task(encode_forked(forever))  # forks at once
        await asyncio.sleep(0.2)
    finally:
        os.fork = real_fork  # type: ignore[assignment]
    [pid] = pids
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    for _ in range(200):  # the reader thread reaps it as soon as the kill lands
        if _gone(pid):
            break
        await asyncio.sleep(0.05)  # another thread reaps it: no event
    assert _gone(pid)


async def test_one_child_at_a_time() -> None:
    order: list[str] = []

    async def snapshot(name: str) -> None:
        async with one_child():
            order.append(f"{name} forks")
            await encode_forked(lambda: time.sleep(0.3) or b"")
            order.append(f"{name} done")

    await asyncio.gather(snapshot("a"), snapshot("b"))
    assert order == ["a forks", "a done", "b forks", "b done"]


async def test_a_child_still_at_work_after_its_time_is_killed() -> None:
    def stuck() -> bytes:
        while True:
            time.sleep(1)

    started = time.monotonic()
    async with one_child():
        with pytest.raises(InternalError, match=r"did not finish within 0\.3 s"):
            await encode_forked(stuck, timeout_s=0.3)
    assert time.monotonic() - started < 10  # killed and reaped, not waited for
