"""The handler runtime: takes batches from one queue, runs the user's function on them as
tasks, and settles each message by what the task answered.

Three loops share one asyncio event loop (inside a Ray actor, see :mod:`evq.handlers.cluster`,
or a test's):

- **watch**: one-shot watches of the queue's ``queue:`` key keep the ready count current (a
  change answers the watch; nothing is polled);
- **dispatch**: starts as many tasks as the ready messages, ``max_concurrency`` and the free
  cluster resources allow (:func:`~evq.handlers.plan.more_tasks`), each with one take;
  with nothing ready and nothing running it waits in one long-poll take, so a handler is
  idle at zero tasks and still starts within milliseconds of a put;
- **leases**: extends the leases of tasks that run long (every third of the visibility
  timeout).

When a task answers, each message is settled by its :class:`~evq.handlers.plan.Plan`
(:mod:`evq.handlers.settle`): its puts are made durable first (idempotency keys derived
from the source message), then it is acked, rescheduled or released with a backoff delay.
When the worker running a task dies, its messages are left to their leases and the queue
hands them out again.

:meth:`HandlerRuntime.drain` stops taking, waits up to ``drain_timeout`` for the running
tasks and releases the messages of those still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from actors.clock import Clock, SystemClock
from actors.errors import QueueError
from evq.handlers.api import Handler
from evq.handlers.executor import Executor, TaskFailed, WorkerLost
from evq.handlers.plan import Abandon, Failure, more_tasks, take_size
from evq.handlers.settle import Batch, HandlerStats, Settler, chunks
from evq.handlers.source import Source, Taken

__all__ = ["HandlerRuntime", "HandlerStats"]

log = logging.getLogger(__name__)

LONG_POLL_S = 20.0  # an idle runtime's waiting take
WATCH_WAIT_S = 30.0  # one watch long-poll
MAX_PAUSE_S = 5.0  # longest pause after errors reaching the queue
PARALLEL_TAKES = 4  # takes in flight at once while tasks are being started


class HandlerRuntime:
    """Runs one handler against one queue until drained."""

    def __init__(
        self,
        handler: Handler,
        source: Source,
        executor: Executor,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        long_poll_s: float = LONG_POLL_S,
    ) -> None:
        self.handler = handler
        self.options = handler.options
        self.source = source
        self.executor = executor
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.long_poll_s = long_poll_s
        self.stats = HandlerStats(
            name=handler.name, queue=self.options.queue, transport=source.transport
        )
        self._settler = Settler(handler.name, self.options, source, self.stats, self.rng)
        self._vt = self.options.visibility_timeout or 0.0
        self._running: dict[int, Batch] = {}
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._draining = asyncio.Event()
        self._stopped = asyncio.Event()
        self._idle: asyncio.Future[list[Taken]] | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._drain_task: asyncio.Task[HandlerStats] | None = None

    # ---------------------------------------------------------------- lifecycle

    async def run(self) -> HandlerStats:
        """Handle messages until :meth:`drain` has finished; the final stats."""
        limits = await self._until_answered(self.source.limits)
        if limits is not None:
            self._settler.limits = limits  # its log says what a last failed receive means
        if not self._vt:
            self._vt = limits.visibility_timeout if limits is not None else 30.0
        if self._draining.is_set():
            await self._stopped.wait()
            return self.snapshot()
        self.stats.state = "running"
        self._loops = [
            asyncio.ensure_future(self._watch_loop()),
            asyncio.ensure_future(self._lease_loop()),
        ]
        log.info(
            "handler %s: handling %s (%s, visibility timeout %.1fs)",
            self.handler.name,
            self.options.queue,
            self.source.transport,
            self._vt,
        )
        await self._dispatch_loop()
        await self._stopped.wait()
        return self.snapshot()

    async def drain(self, grace_s: float | None = None) -> HandlerStats:
        """Stop taking; let running tasks finish for up to ``grace_s`` (default the
        handler's ``drain_timeout``), then release what still runs. Idempotent."""
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain(grace_s))
        return await asyncio.shield(self._drain_task)

    async def _drain(self, grace_s: float | None) -> HandlerStats:
        self.stats.state = "draining"
        self._draining.set()
        self._wake.set()
        if self._idle is not None:
            self._idle.cancel()
        wait_s = self.options.drain_timeout if grace_s is None else grace_s
        tasks = [b.task for b in self._running.values() if b.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=wait_s)
        leftover = [b for b in self._running.values() if not b.settled]
        for batch in leftover:
            batch.settled = True
            if batch.running is not None:
                batch.running.cancel()
        if leftover:
            items = [i for b in leftover for i in b.items()]
            log.info("handler %s: releasing %d running message(s)", self.handler.name, len(items))
            await self._settler.release(items, 0.0, drained=True)
            stopping = [b.task for b in leftover if b.task is not None]
            for task in stopping:
                task.cancel()
            await asyncio.gather(*stopping, return_exceptions=True)
        for loop in self._loops:
            loop.cancel()
        for loop in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        with contextlib.suppress(Exception):
            await self.source.close()
        with contextlib.suppress(Exception):
            await self.executor.close()
        self.stats.state = "stopped"
        self._stopped.set()
        return self.snapshot()

    def snapshot(self) -> HandlerStats:
        """The stats now (a copy)."""
        self.stats.in_flight = len(self._running)
        self.stats.in_flight_messages = sum(len(b.taken) for b in self._running.values())
        return msgspec.structs.replace(self.stats)

    # ---------------------------------------------------------------- helpers

    def _error(self, what: str, exc: BaseException) -> None:
        self._settler.error(what, exc)

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake up for a drain."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._draining.wait()

    async def _until_answered(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """Retry ``call`` on queue errors, with growing pauses; None when a drain began."""
        attempt = 0
        while not self._draining.is_set():
            try:
                return await call()
            except QueueError as exc:
                self._error("reaching the queue", exc)
                attempt += 1
                await self._pause(min(MAX_PAUSE_S, 0.1 * 2**attempt))
        return None

    # ---------------------------------------------------------------- watch

    async def _watch_loop(self) -> None:
        version = 0
        failures = 0
        while True:
            try:
                state = await self.source.watch(version, WATCH_WAIT_S)
            except QueueError as exc:
                self._error("watching the queue", exc)
                failures += 1
                await self._pause(min(MAX_PAUSE_S, 0.1 * 2**failures))
                continue
            failures = 0
            if state is None:
                continue
            version = state.version
            self.stats.ready = state.ready
            self.stats.watch_updates += 1
            self._wake.set()

    # ---------------------------------------------------------------- dispatch

    async def _dispatch_loop(self) -> None:
        failures = 0
        while not self._draining.is_set():
            self._wake.clear()
            try:
                started = await self._start_task()
                if not started and not self._running and self.stats.ready <= 0:
                    started = await self._idle_take()
                failures = 0
            except QueueError as exc:
                self._error("taking messages", exc)
                failures += 1
                await self._pause(min(MAX_PAUSE_S, 0.1 * 2**failures))
                continue
            if not started and not self._draining.is_set():
                await self._wake.wait()

    async def _start_task(self) -> bool:
        """Start the tasks that the ready messages and the resources call for, one take
        each; up to ``PARALLEL_TAKES`` takes at once (their writes share a group commit)."""
        ready = self.stats.ready
        if ready <= 0:
            return False
        if more_tasks(ready, len(self._running), None, self.options) <= 0:
            return False
        limit = await self.executor.limit(lambda: len(self._running))
        if self._draining.is_set():
            return False
        more = more_tasks(ready, len(self._running), limit, self.options)
        if more <= 0:
            return False
        size = take_size(ready, more, self.options)
        count = min(more, PARALLEL_TAKES, math.ceil(ready / size))
        takes = (self.source.take(size, 0.0, self._vt) for _ in range(count))
        results = await asyncio.gather(*takes, return_exceptions=True)
        self.stats.takes += count
        got, error = 0, None
        for result in results:
            if isinstance(result, BaseException):
                error = error or result
            elif result:
                self._submit(result)
                got += len(result)
        self.stats.ready = max(0, ready - got) if got else 0  # 0: until the watch says more
        if error is not None and (not got or not isinstance(error, QueueError)):
            raise error
        return got > 0

    async def _idle_take(self) -> bool:
        """Nothing ready, nothing running: wait in one long-poll take."""
        size = self.options.batch_size if self.options.batch else 1
        self._idle = asyncio.ensure_future(self.source.take(size, self.long_poll_s, self._vt))
        try:
            taken = await self._idle
        except asyncio.CancelledError:
            if not self._draining.is_set():
                raise
            return False
        finally:
            self._idle = None
        self.stats.takes += 1
        if taken:
            self._submit(taken)
        return bool(taken)

    def _submit(self, taken: list[Taken]) -> None:
        batch = Batch(next(self._ids), taken, self.clock.now_ms())
        self._running[batch.id] = batch
        self.stats.tasks += 1
        self.stats.taken += len(taken)
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, len(self._running))
        if self._draining.is_set():  # a take that answered while the drain began
            batch.task = asyncio.ensure_future(self._give_back(batch))
            return
        batch.running = self.executor.submit([t.message for t in taken])
        batch.task = asyncio.ensure_future(self._finish(batch))

    async def _give_back(self, batch: Batch) -> None:
        batch.settled = True
        try:
            await self._settler.release(batch.items(), 0.0, drained=True)
        finally:
            self._running.pop(batch.id, None)

    # ---------------------------------------------------------------- settle

    async def _finish(self, batch: Batch) -> None:
        assert batch.running is not None
        n = len(batch.taken)
        try:
            try:
                outcomes: list[Any] = await batch.running.result()
            except WorkerLost as exc:
                outcomes = [Abandon(str(exc) or type(exc).__name__)] * n
            except TaskFailed as exc:
                outcomes = [Failure(f"the task failed: {exc}")] * n
            if not batch.settled:
                await self._settler.settle(batch, outcomes)
        except Exception as exc:  # a settle that failed leaves the messages to their leases
            self._error("settling a batch", exc)
        finally:
            batch.settled = True
            self._running.pop(batch.id, None)
            self._wake.set()

    # ---------------------------------------------------------------- leases

    async def _lease_loop(self) -> None:
        """Extend the leases of tasks running longer than a third of the visibility timeout."""
        period_ms = max(200, int(self._vt * 1000 / 3))
        while True:
            await asyncio.sleep(period_ms / 2000)
            now = self.clock.now_ms()
            for batch in list(self._running.values()):
                if batch.settled or now - batch.touched_ms < period_ms:
                    continue
                await self._touch(batch, now)

    async def _touch(self, batch: Batch, now_ms: int) -> None:
        items = batch.items()
        for chunk in chunks(items):
            try:
                statuses = await self.source.touch(chunk, self._vt)
            except QueueError as exc:
                self._error("extending leases", exc)
                return
            for (mid, _), status in zip(chunk, statuses, strict=True):
                if status == "ok":
                    self.stats.touched += 1
                else:
                    batch.lost.add(mid)
                    self.stats.stale += 1
        batch.touched_ms = now_ms
