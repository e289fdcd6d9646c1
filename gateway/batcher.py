"""Adaptive batching of commands toward their shard.

A call to a shard costs a frame each way and a wake-up in two processes, so the gateway
never makes one per request. Per shard (all its queues together: they share one group
commit there, so commands for many queues ride in one frame and one write): send at once when
nothing is in flight — a lone client never waits on a timer; while a call is in flight,
gather; open a second parallel call once the gathered commands pass a threshold; never more
than a few calls in flight, each with at most ``max_batch`` commands and about
``max_batch_bytes`` of put bodies (a shard decodes a whole frame before it can refuse its
puts: 1000 puts of 50 KB were 50 MB in one frame, twice in the shard's memory); refuse
(429) past a bound of waiting commands instead of growing without limit. Each caller gets
exactly its own command's result, success or error.

A shard over its memory budget refuses puts; for ``SHED_S`` after such a refusal the gateway
refuses that shard's puts itself (the same 429), instead of sending each one's bodies to a
shard that would decode them only to refuse them (under 10x overload, ~500 MB/s of them).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from actors.channel import CALLS_IN_FLIGHT, PUT_BYTES_PER_CALL
from actors.core import commands as cmd
from actors.errors import Moving, Overloaded, QueueError, Unavailable, WrongShard
from actors.log.placement import MovingWait, follow_refusal

__all__ = ["BatchStats", "Batcher", "Batchers"]

log = logging.getLogger(__name__)

Send = Callable[[list[object]], Awaitable[list[Any]]]
# Send now, if that can be done without waiting (the shard's connection is open): the results
# (or the QueueError that failed them all) go to the callback as they arrive. False: not
# sent, use Send.
Start = Callable[[list[object], Callable[[Any], None]], bool]

# How long a shard's memory-budget refusal of a put stands for its other puts in this gateway
# (the shard reads its memory at most every 200 ms).
SHED_S = 0.1


class BatchStats:
    """Calls toward shards: how many, how many commands, how long they took."""

    __slots__ = ("calls", "commands", "seconds", "sizes")

    BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)

    def __init__(self) -> None:
        self.calls = 0
        self.commands = 0
        self.seconds = 0.0
        self.sizes = [0] * len(self.BUCKETS)  # calls per batch-size bucket (upper bounds)

    def record(self, size: int, seconds: float) -> None:
        """One call of ``size`` commands that took ``seconds``."""
        self.calls += 1
        self.commands += size
        self.seconds += seconds
        for i, bound in enumerate(self.BUCKETS):
            if size <= bound:
                self.sizes[i] += 1
                break

    def summary(self) -> str:
        """A line for the log."""
        if not self.calls:
            return "no calls"
        return (
            f"{self.calls} calls, {self.commands / self.calls:.1f} commands each, "
            f"{1000 * self.seconds / self.calls:.2f} ms each"
        )


class Batcher:
    """Gathers commands for one queue and sends them in batches."""

    def __init__(
        self,
        send: Send,
        *,
        max_in_flight: int = CALLS_IN_FLIGHT,
        split_at: int = 128,
        max_batch: int = 1000,
        max_batch_bytes: int = PUT_BYTES_PER_CALL,
        size: Callable[[object], int] | None = None,
        max_waiting: int = 20_000,
        on_idle: Callable[[], None] | None = None,
        stats: BatchStats | None = None,
        start: Start | None = None,
    ) -> None:
        self._send = send
        self._start = start
        self.max_in_flight = max_in_flight
        self.split_at = split_at
        self.max_batch = max_batch
        self.max_batch_bytes = (
            max_batch_bytes  # with ``size``: of a batch (one command may pass it)
        )
        self._size = size
        self.max_waiting = max_waiting
        self._on_idle = on_idle
        self._waiting: list[tuple[object, asyncio.Future[Any]]] = []
        self._in_flight = 0
        self.stats = stats if stats is not None else BatchStats()

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing in flight."""
        return not self._waiting and not self._in_flight

    async def submit(self, command: object) -> Any:
        """Run ``command`` in some batch; return its reply.

        Raises:
            QueueError: the command's error; Overloaded when too many commands wait.
        """
        if len(self._waiting) >= self.max_waiting:
            raise Overloaded("too many commands waiting for this queue; retry shortly")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((command, fut))
        if self._in_flight == 0 or (
            self._in_flight < self.max_in_flight and len(self._waiting) >= self.split_at
        ):
            self._launch()
        result = await fut
        if isinstance(result, QueueError):
            raise result
        return result

    def _launch(self) -> None:
        count = min(self.max_batch, len(self._waiting))
        if self._size is not None:
            total = 0
            for i in range(count):
                total += self._size(self._waiting[i][0])
                if total > self.max_batch_bytes and i:
                    count = i
                    break
        batch = self._waiting[:count]
        del self._waiting[:count]
        self._in_flight += 1
        started = time.perf_counter()
        if self._start is not None:
            # Sent in this step, answered from the reply's arrival: no task to start and no
            # loop turn between the reply and the callers' futures.
            try:
                sent = self._start(
                    [c for c, _ in batch], lambda results: self._finish(batch, results, started)
                )
            except Exception as exc:
                self._finish(batch, exc, started)
                return
            if sent:
                return
        asyncio.get_running_loop().create_task(self._call(batch, started))

    async def _call(self, batch: list[tuple[object, asyncio.Future[Any]]], started: float) -> None:
        try:
            results: list[Any] | Exception = await self._send([c for c, _ in batch])
        except asyncio.CancelledError:
            self._finish(batch, Unavailable("the call to the shard was cancelled"), started)
            raise
        except Exception as exc:
            results = exc
        self._finish(batch, results, started)

    def _finish(
        self,
        batch: list[tuple[object, asyncio.Future[Any]]],
        results: list[Any] | Exception,
        started: float,
    ) -> None:
        """A call's results (or what failed it) to its callers; the next calls out."""
        self._in_flight -= 1
        n = len(batch)
        if isinstance(results, list) and len(results) != n:
            results = Unavailable(f"a shard answered {len(results)} results for {n}")
        if isinstance(results, QueueError):
            results = [results] * n
        elif isinstance(results, Exception):
            log.error("batch call failed", exc_info=results)
            results = [Unavailable(f"the queue's shard could not be reached: {results!r}")] * n
        self.stats.record(n, time.perf_counter() - started)
        for (_, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)
        if self._start is not None:
            # Called from the reply's arrival, before this step's other connections are
            # read: the next batch goes out a turn later, with their commands in it (sent
            # at once, take-and-ack ran ~20 % slower: batches of fewer commands).
            asyncio.get_running_loop().call_soon(self._relaunch)
        else:
            self._relaunch()

    def _relaunch(self) -> None:
        while self._waiting and self._in_flight < self.max_in_flight:
            self._launch()
        if self.idle and self._on_idle is not None:
            self._on_idle()


class Batchers:
    """One batcher per shard, created on first use and dropped when idle; each command goes
    to the batcher of its queue's shard as a ``(queue, command)`` item."""

    def __init__(
        self,
        send: Callable[[int, list[tuple[str, object]]], Awaitable[list[Any]]],
        shard_of: Callable[[str], int],
        start: Callable[[int, list[tuple[str, object]], Callable[[Any], None]], bool] | None = None,
        reroute: Callable[[str, WrongShard], bool] | None = None,
        **options: Any,
    ) -> None:
        self._send = send
        self._reroute = reroute  # learns from a refusal where a queue is (Directory.reroute)
        self._start = start  # see Start: sends without a task where the directory can
        self._shard_of = shard_of
        self._options = options
        self._batchers: dict[int, Batcher] = {}
        self._shedding: dict[int, tuple[float, Overloaded]] = {}  # shard: until, its refusal
        self.stats = BatchStats()  # over every shard

    def __len__(self) -> int:
        return len(self._batchers)

    async def submit(self, queue: str, command: object) -> Any:
        """Run ``command`` on ``queue`` through its shard's batcher; a command a shard
        refused because the queue is elsewhere (no effect) is resent there, one refused
        because the queue is moving there is sent again in a moment. After ``MAX_HOPS``
        refusals in a row (shards that disagree: one was given the newest map, another not
        yet) each resend waits a moment too, as for a move.

        Raises:
            QueueError: the command's error.
        """
        hops = 0
        moving = MovingWait()
        while True:
            try:
                return await self._submit(queue, command)
            except WrongShard as exc:
                hops += 1
                learnt = self._reroute is not None and self._reroute(queue, exc)
                if not await follow_refusal(learnt, hops, moving):
                    raise
            except Moving:  # being handed over (no effect): its new shard serves it soon
                if not await moving.again():
                    raise

    async def _submit(self, queue: str, command: object) -> Any:
        shard = self._shard_of(queue)
        put = type(command) is cmd.Put
        if put and shard in self._shedding:
            until, refusal = self._shedding[shard]
            if time.perf_counter() < until:  # a rate limit, not state time
                raise Overloaded(refusal.message, **{**refusal.fields, "queue": queue})
            del self._shedding[shard]
        batcher = self._batchers.get(shard)
        if batcher is None:
            batcher = self._batchers[shard] = Batcher(
                lambda items: self._send(shard, items),  # type: ignore[arg-type]
                size=_body_bytes,
                on_idle=lambda: self._drop(shard),
                stats=self.stats,
                start=(None if self._start is None else functools.partial(self._start, shard)),
                **self._options,
            )
        try:
            return await batcher.submit((queue, command))
        except Overloaded as exc:
            if put and exc.fields.get("memory_budget"):
                self._shedding[shard] = (time.perf_counter() + SHED_S, exc)
            raise

    def _drop(self, shard: int) -> None:
        batcher = self._batchers.get(shard)
        if batcher is not None and batcher.idle:
            del self._batchers[shard]


def _body_bytes(item: object) -> int:
    """The bytes of message bodies a ``(queue, command)`` item carries: a put's (a shard
    holds a whole frame and its decoded bodies before it can refuse them), else 0."""
    command = item[1]  # type: ignore[index]
    if type(command) is cmd.Put:
        return sum(len(m.body) for m in command.messages)
    return 0
