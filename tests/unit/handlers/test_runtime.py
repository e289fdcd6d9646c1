"""The handler runtime against real queues in this process (``LocalDirectory`` shards on an
in-memory store) with tasks in threads (``LocalExecutor``): no Ray, real time, short
timeouts. The same runtime runs on Ray in tests/integration/test_handlers.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from actors.core import commands as cmd
from actors.core import replies as rp
from actors.directory import LocalDirectory
from actors.errors import QueueError, Unavailable
from actors.log.stores import open_store
from actors.settings import QueueSettings
from evq.handlers import Backoff, Handler, HandlerOptions, Job, Reschedule, Send
from evq.handlers.executor import LocalExecutor
from evq.handlers.runtime import HandlerRuntime, HandlerStats
from evq.handlers.source import DirectorySource, Source

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def directory() -> AsyncIterator[LocalDirectory]:
    d = LocalDirectory(open_store("memory://"), count=2)
    await d.start()
    await until(lambda: _all_ready(d), what="shards ready")
    try:
        yield d
    finally:
        await d.close()


async def _all_ready(d: LocalDirectory) -> bool:
    return all(s.ready for s in await d.status())


async def create(d: LocalDirectory, name: str, **settings: Any) -> None:
    await d.create(name, QueueSettings(**settings), [])


async def put(d: LocalDirectory, queue: str, bodies: list[bytes], **extra: Any) -> list[str]:
    [results] = await d.execute_many(
        queue, [cmd.Put([cmd.NewMessage(body=b, **extra) for b in bodies])]
    )
    return [r.id for r in results]


async def stats(d: LocalDirectory, queue: str) -> rp.StatsView:
    [view] = await d.execute_many(queue, [cmd.Stats()])
    return view  # type: ignore[no-any-return]


async def until(check: Callable[[], Any], within: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + within
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.02)


class Running:
    """A runtime started in the background, drained at the end of the test."""

    def __init__(self, runtime: HandlerRuntime) -> None:
        self.runtime = runtime
        self.task = asyncio.ensure_future(runtime.run())

    @property
    def stats(self) -> HandlerStats:
        return self.runtime.snapshot()

    async def drain(self, grace_s: float | None = None) -> HandlerStats:
        final = await self.runtime.drain(grace_s)
        await self.task
        return final


@pytest.fixture
async def start(directory: LocalDirectory) -> AsyncIterator[Callable[..., Running]]:
    started: list[Running] = []

    def run(handler: Handler, wrap: Callable[[Source], Source] | None = None) -> Running:
        source: Source = DirectorySource(handler.options.queue, directory, transport="local")
        if wrap is not None:
            source = wrap(source)
        running = Running(HandlerRuntime(handler, source, LocalExecutor(handler)))
        started.append(running)
        return running

    yield run
    for running in started:
        await running.drain(0)


def make(fn: Callable[..., Any], queue: str, **options: Any) -> Handler:
    options.setdefault("num_cpus", 0)
    return Handler(fn, HandlerOptions(queue=queue, **options))


# ------------------------------------------------------------------ tests


async def test_every_message_is_handled_and_acked_once(directory, start) -> None:
    await create(directory, "work")
    ids = await put(directory, "work", [b"m%d" % i for i in range(60)])
    seen: list[str] = []
    running = start(make(lambda m: seen.append(m.id), "work", batch_size=7, max_concurrency=3))
    await until(lambda: running.stats.acked == 60, what="60 acks")
    assert sorted(seen) == sorted(ids)
    queue = await stats(directory, "work")
    assert (queue.total, queue.acked) == (0, 60)
    assert running.stats.released == running.stats.stale == running.stats.errors == 0


async def test_a_failing_message_is_retried_with_backoff_then_dead_lettered(
    directory, start, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="evq.handlers")
    await create(directory, "dead")
    await create(directory, "flaky", max_receives=3, dead_letter_queue="dead")
    [mid] = await put(directory, "flaky", [b"poison"])
    attempts: list[tuple[int, float]] = []

    def fail(message: Job) -> None:
        attempts.append((message.receive_count, time.monotonic()))
        raise RuntimeError("smtp down")

    backoff = Backoff(base=0.2, factor=2.0, cap=10, jitter=0.0)
    running = start(make(fail, "flaky", backoff=backoff))
    await until(lambda: stats(directory, "dead"), what="the dead-letter queue")
    await until(lambda: _total(directory, "dead"), what="a dead letter")
    assert [n for n, _ in attempts] == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.19
    assert gaps[1] >= 0.39
    assert (await stats(directory, "flaky")).total == 0
    [letter] = await directory.execute_many("dead", [cmd.PeekReady(10)])
    assert letter[0].body == b"poison"
    assert letter[0].attributes["evq.source_id"] == mid
    # why it failed, each time, went with it into the dead-letter queue
    failures = letter[0].attributes["evq.failures"]
    assert [reason for _, reason in failures] == ["RuntimeError: smtp down"] * 3
    assert running.stats.released == 3
    assert running.stats.acked == 0
    # The log says what becomes of each failure: retried twice, then dead-lettered.
    failures = [r.getMessage() for r in caplog.records if "failed: RuntimeError" in r.getMessage()]
    assert [f.split("; ", 1)[1] for f in failures] == [
        "again in 0.20s",
        "again in 0.40s",
        "that was its last receive (max_receives 3): it moves to dead",
    ]


async def test_a_message_out_of_receives_without_a_dead_letter_queue_is_logged_dropped(
    directory, start, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="evq.handlers")
    await create(directory, "once", max_receives=1)
    await put(directory, "once", [b"poison"])

    def fail(message: Job) -> None:
        raise RuntimeError("no")

    running = start(make(fail, "once"))
    await until(lambda: running.stats.released == 1, what="the release")

    async def dropped() -> bool:
        return (await stats(directory, "once")).total == 0

    await until(dropped, what="the drop")
    [failure] = [r.getMessage() for r in caplog.records if "failed: RuntimeError" in r.getMessage()]
    assert failure.endswith("; that was its last receive (max_receives 1): it is dropped")


async def _total(d: LocalDirectory, queue: str) -> int:
    return (await stats(d, queue)).total


async def test_the_lease_of_a_long_task_is_extended(directory, start) -> None:
    await create(directory, "slow", visibility_timeout_ms=600)
    await put(directory, "slow", [b"big job"])
    receives: list[int] = []

    def slow(message: Job) -> None:
        receives.append(message.receive_count)
        time.sleep(1.6)

    running = start(make(slow, "slow"))
    await until(lambda: running.stats.acked == 1, what="the ack")
    assert receives == [1]  # never handed out again while it ran
    assert running.stats.touched >= 2
    assert running.stats.stale == 0


class LoseFirstAcks:
    """A source whose first ack of each message never arrives (the connection breaks), as
    if the runtime died right after the put: the lease has to expire."""

    def __init__(self, inner: Source) -> None:
        self.inner = inner
        self.lost: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def ack(self, items: list[tuple[str, str]]) -> list[str]:
        fresh = [mid for mid, _ in items if mid not in self.lost]
        if fresh:
            self.lost.update(fresh)
            raise Unavailable("the connection broke before the ack")
        return await self.inner.ack(items)


async def test_a_crash_between_put_and_ack_puts_nothing_twice(directory, start) -> None:
    await create(directory, "send", visibility_timeout_ms=500)
    await create(directory, "report")
    await put(directory, "send", [b"a", b"b", b"c", b"d", b"e"])
    calls: list[str] = []

    def forward(message: Job) -> Send:
        calls.append(message.id)
        return Send("report", message.body.upper())

    running = start(make(forward, "send", batch_size=2), wrap=LoseFirstAcks)
    await until(lambda: running.stats.acked == 5, what="every source message acked")
    # each handled twice at least: before the "crash" and after it (a loaded machine may
    # let a 500 ms lease run out mid-batch, and hand one out once more: a put again too)
    assert len(set(calls)) == 5
    assert all(calls.count(mid) >= 2 for mid in set(calls))
    assert running.stats.put_created == 5
    assert running.stats.put_duplicate == len(calls) - 5
    report = await stats(directory, "report")
    assert report.total == 5
    [views] = await directory.execute_many("report", [cmd.PeekReady(10)])
    assert sorted(v.body for v in views) == [b"A", b"B", b"C", b"D", b"E"]
    assert (await stats(directory, "send")).total == 0


async def test_a_put_that_fails_keeps_the_source_message(directory, start) -> None:
    await create(directory, "orders")
    await put(directory, "orders", [b"o1"])
    receives: list[int] = []

    def cascade(message: Job) -> Send:
        receives.append(message.receive_count)
        return Send("no-such-queue", message.body)

    backoff = Backoff(base=0.1, jitter=0)
    running = start(make(cascade, "orders", backoff=backoff))
    try:
        await until(lambda: len(receives) >= 2, what="a second delivery")
    except AssertionError as exc:
        # Seen once in ~20 runs beside two busy loops, not understood yet: say where it stood.
        [ready] = await directory.execute_many("orders", [cmd.PeekReady(10)])
        raise AssertionError(
            f"{exc}; receives {receives}; runtime {running.stats}; queue "
            f"{await stats(directory, 'orders')}; ready {ready}"
        ) from None
    assert receives[:2] == [1, 2]
    assert running.stats.acked == 0
    assert "QueueNotFound" in (running.stats.last_error or "")
    assert (await stats(directory, "orders")).total == 1


async def test_a_periodic_handler_reschedules_instead_of_acking(directory, start) -> None:
    await create(directory, "cron", id_mode="client")
    await put(directory, "cron", [b"digest"], id="digest")
    runs: list[tuple[float, int]] = []

    def digest(message: Job) -> Reschedule:
        runs.append((time.monotonic(), message.receive_count))
        return Reschedule(0.3)

    running = start(make(digest, "cron"))
    await until(lambda: len(runs) >= 4, what="four runs")
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(runs)]
    assert all(0.28 <= g < 1.0 for g in gaps), gaps
    assert all(n == 1 for _, n in runs)  # a reschedule starts the receive count again
    assert running.stats.acked == 0
    assert running.stats.rescheduled >= 3
    view = (await directory.execute_many("cron", [cmd.Peek("digest")]))[0]
    assert view.state in ("delayed", "ready", "reserved")


async def test_concurrency_follows_depth_and_falls_to_zero(directory, start) -> None:
    await create(directory, "depth")
    gate = threading.Event()

    def work(message: Job) -> None:
        time.sleep(0.15)

    running = start(make(work, "depth", batch_size=2, max_concurrency=4))
    samples: list[int] = []

    async def sample() -> None:
        while not gate.is_set():
            samples.append(running.stats.in_flight)
            await asyncio.sleep(0.01)

    sampler = asyncio.ensure_future(sample())
    await put(directory, "depth", [b"one"])
    await until(lambda: running.stats.acked == 1, what="the first message")
    assert max(samples) == 1
    await put(directory, "depth", [b"m%d" % i for i in range(40)])
    await until(lambda: running.stats.acked == 41, what="41 acks")
    assert max(samples) == 4
    await until(lambda: running.stats.in_flight == 0, what="no task left")
    takes = running.stats.takes
    await asyncio.sleep(0.5)
    gate.set()
    await sampler
    assert running.stats.takes == takes  # idle: one waiting take, no polling
    assert samples[-1] == 0


async def test_drain_lets_running_tasks_finish_and_takes_no_more(directory, start) -> None:
    await create(directory, "mail")
    await put(directory, "mail", [b"m%d" % i for i in range(5)])

    def send(message: Job) -> None:
        time.sleep(0.4)

    running = start(make(send, "mail", batch_size=1, max_concurrency=3))
    await until(lambda: running.stats.in_flight == 3, what="three running")
    final = await running.drain(5.0)
    assert final.state == "stopped"
    assert (final.acked, final.drained, final.in_flight) == (3, 0, 0)
    queue = await stats(directory, "mail")
    assert (queue.ready, queue.reserved) == (2, 0)


async def test_drain_releases_what_outlasts_its_grace(directory, start) -> None:
    await create(directory, "stuck")
    await put(directory, "stuck", [b"forever"])
    gate = threading.Event()
    running = start(make(lambda m: gate.wait(10), "stuck"))
    await until(lambda: running.stats.in_flight == 1, what="running")
    try:
        final = await running.drain(0.2)
    finally:
        gate.set()
    assert (final.drained, final.acked, final.in_flight) == (1, 0, 0)
    queue = await stats(directory, "stuck")
    assert (queue.ready, queue.reserved) == (1, 0)


async def test_batch_mode_hands_the_function_lists(directory, start) -> None:
    await create(directory, "stats")
    await put(directory, "stats", [b"e%d" % i for i in range(12)])
    sizes: list[int] = []

    def bulk(messages: list[Job]) -> None:
        sizes.append(len(messages))

    running = start(make(bulk, "stats", batch=True, batch_size=5))
    await until(lambda: running.stats.acked == 12, what="12 acks")
    assert sum(sizes) == 12
    assert max(sizes) <= 5


async def test_queue_errors_are_survived_and_reported(directory, start) -> None:
    running = start(make(lambda m: None, "later", visibility_timeout=5))
    await until(lambda: running.stats.errors >= 1, what="an error")
    assert "QueueNotFound" in (running.stats.last_error or "")
    await create(directory, "later")
    await put(directory, "later", [b"x"])
    await until(lambda: running.stats.acked == 1, within=15, what="the ack once it exists")


def test_queue_error_is_the_root_of_what_sources_raise() -> None:
    assert issubclass(Unavailable, QueueError)
