"""One queue as a running thing: the engine, its log, its timers. A plain asyncio class.

Commands run one at a time, in arrival order (the event loop is the serial command stream):
each is decided and applied at once, so the next command sees its effects, and its events
join the log writer's current batch. Its reply — even an error — is released only when every
event decided before it is durable, so no reply ever tells of a change a crash could lose.

If a write fails, the commands whose events it held fail with ``Unavailable`` (their outcome
is unknown: an ambiguous write may have landed). The queue then reloads its state from the
log — so the in-memory state is again exactly what is durable — and decides again every
command that was waiting behind the failed write. If the write failed because a newer
incarnation owns the log, every waiting command fails with ``Fenced`` and this incarnation
stops serving.

A timer sleeps until the engine's next due transition (activation, lease expiry, retention)
and wakes whoever waits for changes; there is no periodic scan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from actors.clock import Clock
from actors.core import commands as cmd
from actors.core.decide import execute as execute_command
from actors.core.events import MessagesReleased, MessagesTaken, QueueCreated
from actors.core.ids import IdSource
from actors.core.state import Message, QueueState
from actors.errors import Fenced, NotReady, QueueError, Unavailable
from actors.log.recovery import open_log
from actors.log.replay import Progress, RecoveryReport
from actors.log.snapshots import encode_state, prune, write_snapshot
from actors.log.store import ObjectStore
from actors.log.writer import Batch, GroupCommitWriter
from actors.metrics import QueueCounters, QueueMetrics
from actors.settings import LogSettings

__all__ = ["DeadLetterRouter", "QueueActor"]

log = logging.getLogger(__name__)

# Hands dead letters of a queue to its dead-letter queue; must be idempotent per message.
DeadLetterRouter = Callable[[str, str, list[Message]], Awaitable[None]]


class _ProgressLog:
    """Logs replay progress of a large log, at most every few seconds."""

    EVERY_S = 5.0

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self._last = time.perf_counter()  # a rate limit, not state time

    def __call__(self, done: int, total: int, records: int) -> None:
        now = time.perf_counter()
        if now - self._last >= self.EVERY_S or (done == total and total > 100):
            self._last = now
            log.info(
                "queue %s: replayed %d/%d segments, %d records", self.queue, done, total, records
            )


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


class _Entry:
    """A command waiting for its reply to become true (durable)."""

    __slots__ = ("command", "error", "future", "has_events", "reply", "started")

    def __init__(self, command: object, future: asyncio.Future[Any]) -> None:
        self.command = command
        self.future = future
        self.started = time.perf_counter()  # for the time-to-durable histogram
        self.reply: Any = None
        self.error: QueueError | None = None
        self.has_events = False

    def release(self) -> None:
        """Give the caller its outcome."""
        if self.future.done():
            return
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.reply)

    def fail(self, error: QueueError) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class QueueActor:
    """A queue that serves commands durably. ``open`` it, ``execute`` commands, ``close`` it."""

    def __init__(
        self,
        name: str,
        store: ObjectStore,
        *,
        clock: Clock,
        ids: IdSource,
        log_settings: LogSettings | None = None,
        dead_letter_router: DeadLetterRouter | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.name = name
        self.store = store
        self.clock = clock
        self.ids = ids
        self.log_settings = log_settings or LogSettings()
        self.dead_letter_router = dead_letter_router
        self.progress = progress or _ProgressLog(name)
        self.state = QueueState()
        self.report: RecoveryReport | None = None
        self.listeners: list[Callable[[QueueActor], None]] = []
        self._writer: GroupCommitWriter | None = None
        self._ready = asyncio.Event()
        self._stopped: QueueError | None = None
        self._timer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self._snapshotting = False
        self._snapshot_seq = 0
        self._snapshot_at_ms = 0
        self._routing = False
        self._takers: deque[asyncio.Future[bool]] = deque()  # long-poll takes, oldest first
        self.counters = QueueCounters()

    # ---------------------------------------------------------------- lifecycle

    async def open(self, create: cmd.Create | None = None) -> RecoveryReport:
        """Recover the queue from its log (creating it if ``create`` is given and there is
        no log yet) and start serving.

        Raises:
            QueueNotFound: no log and no ``create``.
            QueueError: ``create`` is invalid, or the store failed.
        """
        await self.open_or_create(create)
        if create is not None:
            await self.execute(create)  # same settings → no event; other settings → QueueExists
        return self.report  # type: ignore[return-value]

    async def open_or_create(self, create: cmd.Create | None) -> RecoveryReport:
        """Like :meth:`open`, but an existing queue opens whatever its settings.

        Raises:
            QueueNotFound: no log and no ``create``.
            QueueError: ``create`` is invalid, or the store failed.
        """
        event = None
        if create is not None:
            create.settings.validate(create.name)
            event = QueueCreated(self.clock.now_ms(), create.name, create.settings)
        await self._load(event)
        return self.report  # type: ignore[return-value]

    async def _load(self, create: QueueCreated | None = None) -> None:
        opened = await open_log(
            self.store,
            self.name,
            self.clock,
            create=create,
            progress=self.progress,
            writer_options={"max_batch_bytes": self.log_settings.max_batch_bytes},
        )
        self.state = opened.state
        self.report = opened.report
        self._snapshot_seq = opened.snapshot_seq
        self._snapshot_at_ms = self.clock.now_ms()
        opened.writer.on_durable = self._on_durable
        opened.writer.on_broken = self._on_broken
        opened.writer.on_failed = self._on_failed
        self._writer = opened.writer
        self._ready.set()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().create_task(self._timer_loop())
        self._changed()

    async def close(self, *, snapshot: bool = True) -> None:
        """Stop taking commands, finish the writes in flight, snapshot, stop the timer."""
        if self._stopped is None:
            self._stopped = NotReady(f"queue {self.name} is shutting down", queue=self.name)
        self._wake_takers(len(self._takers))  # they retry, see _stopped, and fail
        if self._writer is not None and self._writer.failed is None:
            with contextlib.suppress(QueueError):
                await self._writer.drain()
                if snapshot and self._writer.durable_seq > self._snapshot_seq:
                    await self.snapshot()
        for task in [self._timer, *self._background]:
            if task is not None:
                task.cancel()
        for task in [self._timer, *self._background]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, QueueError):
                    await task
        self._timer = None

    @property
    def epoch(self) -> int:
        """This incarnation's epoch (0 before open)."""
        return self._writer.epoch if self._writer is not None else 0

    @property
    def writer(self) -> GroupCommitWriter | None:
        """The log writer (for metrics and tests)."""
        return self._writer

    # ---------------------------------------------------------------- commands

    async def execute(self, command: object) -> Any:
        """Run one command; return its reply once it is durable.

        Raises:
            QueueError: the command's own error, or Unavailable / Fenced / NotReady.
        """
        await self._wait_ready()
        return await self._submit(command)

    async def execute_many(self, commands: list[object]) -> list[Any]:
        """Run commands in order in one go; each result is a reply or a QueueError."""
        await self._wait_ready()
        futures = [self._submit(c) for c in commands]
        results = await asyncio.gather(*futures, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, QueueError):
                raise r
        return results

    async def _wait_ready(self) -> None:
        while True:
            if self._stopped is not None:
                raise self._stopped
            if self._ready.is_set():
                return
            await self._ready.wait()

    def _submit(self, command: object) -> asyncio.Future[Any]:
        entry = _Entry(command, asyncio.get_running_loop().create_future())
        self._decide(entry)
        return entry.future

    def _decide(self, entry: _Entry) -> None:
        """Decide and apply now; release the reply when everything before it is durable."""
        writer = self._writer
        assert writer is not None
        try:
            events, entry.reply = execute_command(
                self.state, entry.command, self.clock.now_ms(), self.ids
            )
        except QueueError as exc:
            events, entry.error = [], exc
        if events:
            entry.has_events = True
            self._count(events, entry.reply)
            batch = writer.append(events)
            self._wake.set()
        else:
            batch = writer.last_batch()
        if batch is None:
            entry.release()
        else:
            batch.entries.append(entry)

    # ---------------------------------------------------------------- log callbacks

    def _count(self, events: list[Any], reply: Any) -> None:
        counters = self.counters
        for event in events:
            kind = type(event)
            if kind is MessagesTaken:
                counters.taken += len(event.ids)
                for delivery in reply:
                    counters.receives.observe(delivery.receive_count)
            elif kind is MessagesReleased:
                counters.released += len(event.ids)

    def metrics(self) -> QueueMetrics:
        """This queue's figures now (for /metrics)."""
        s, c, w = self.state, self.counters, self._writer
        now = self.clock.now_ms()
        oldest = s.oldest_ready_ms()
        return QueueMetrics(
            queue=self.name,
            ready=s.n_ready,
            delayed=s.n_delayed,
            reserved=s.n_reserved,
            oldest_ready_age_s=None if oldest is None else max(0, now - oldest) / 1000,
            enqueued=s.enqueued_total,
            acked=s.acked_total,
            dead_lettered=s.dead_lettered,
            expired=s.expired_total,
            purged=s.purged_total,
            taken=c.taken,
            released=c.released,
            receives=c.receives,
            durable=c.durable,
            log_bytes=w.bytes_written if w is not None else 0,
            log_segments=w.segments_written if w is not None else 0,
            snapshot_age_s=(now - self._snapshot_at_ms) / 1000 if self._snapshot_at_ms else None,
            recovery_s=(self.report.duration_ms / 1000) if self.report is not None else 0.0,
        )

    def _on_durable(self, batch: Batch) -> None:
        now = time.perf_counter()
        durable = self.counters.durable
        for entry in batch.entries:
            if entry.has_events:
                durable.observe(now - entry.started)
            entry.release()
        self._changed()
        self._maybe_snapshot()

    def _on_broken(self, exc: QueueError) -> None:
        """A write failed: decide nothing more until the log has been reloaded."""
        self._ready.clear()

    def _on_failed(self, failed: Batch, later: list[Batch], exc: QueueError) -> None:
        """Every write has settled after a failure: fail what the failed write held, then
        reload and sort out the rest (see :meth:`_reload`)."""
        if isinstance(exc, Fenced):
            log.error("queue %s: fenced, stopping: %s", self.name, exc)
            self._stopped = exc
            for entry in [*failed.entries, *(e for b in later for e in b.entries)]:
                entry.fail(exc)
            self._ready.set()  # waiters see _stopped
            return
        log.error("queue %s: log write failed, reloading: %s", self.name, exc)
        lost = Unavailable(
            f"queue {self.name}: the log write failed; the command may or may not have happened",
            queue=self.name,
        )
        for entry in failed.entries:
            if entry.has_events:
                entry.fail(lost)
        unsure = [Batch(failed.first_seq)]  # the failed batch's read-only commands
        unsure[0].entries = [e for e in failed.entries if not e.has_events]
        self._spawn(self._reload([*unsure, *later]))

    async def _reload(self, unsure: list[Batch]) -> None:
        """Rebuild the state from the log; then release the commands of batches the log
        holds, and decide again those of batches it does not."""
        delay = 0.05
        while self._stopped is None:
            try:
                await self._load()
                break
            except QueueError as exc:
                log.error("queue %s: reload failed (%s); retrying in %.2fs", self.name, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        entries = [e for b in unsure for e in b.entries]
        if self._stopped is not None:
            for entry in entries:
                entry.fail(self._stopped)
            return
        durable = self.report.last_seq if self.report is not None else 0
        for batch in unsure:
            for entry in batch.entries:
                if batch.payloads and batch.last_seq <= durable:
                    entry.release()  # it landed: its reply is true
                else:
                    entry.has_events, entry.reply, entry.error = False, None, None
                    self._decide(entry)

    # ---------------------------------------------------------------- time and changes

    def _changed(self) -> None:
        """The durable state changed: wake the timer and waiting takes, route dead letters,
        tell listeners."""
        self._wake.set()
        if self._takers and self.state.n_ready:
            self._wake_takers(self.state.n_ready)
        if self.state.outbox and not self._routing:
            self._spawn(self._route_dead_letters())
        for listener in self.listeners:
            listener(self)

    def _wake_takers(self, count: int) -> None:
        """Wake up to ``count`` waiting takes, oldest first (no herd on every change)."""
        while self._takers and count > 0:
            fut = self._takers.popleft()
            if not fut.done():
                fut.set_result(True)
                count -= 1

    async def take(self, command: cmd.Take, wait_s: float = 0.0) -> list[Any]:
        """Take messages; with ``wait_s``, wait up to that long for some to be ready.

        Raises:
            QueueError: as :meth:`execute`.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            taken = await self.execute(command)
            remaining = deadline - loop.time()
            if taken or remaining <= 0:
                return taken  # type: ignore[no-any-return]
            if self.state.n_ready and self._stopped is None:
                # A put became durable while this take's empty answer waited for an earlier
                # write: the wake-up already went by. Look again instead of sleeping.
                await asyncio.sleep(0)
                continue
            fut: asyncio.Future[bool] = loop.create_future()
            self._takers.append(fut)
            alarm = loop.call_later(remaining, _resolve, fut, False)
            try:
                await fut
            finally:
                alarm.cancel()
                if not fut.done():
                    fut.cancel()

    async def _timer_loop(self) -> None:
        """Sleep until the next due transition (or a change), then advance the clock."""
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            due = self.state.next_due_ms()
            alarm = None
            if due is not None:
                delay = max(0.0, (due - self.clock.now_ms()) / 1000)
                alarm = loop.call_later(delay, self._wake.set)
            try:
                await self._wake.wait()  # not wait_for: its cancellation can hang on 3.11
            finally:
                if alarm is not None:
                    alarm.cancel()
            if self._ready.is_set() and self._stopped is None:
                before = self.state.transitions
                self.state.advance(self.clock.now_ms())
                if self.state.transitions != before:
                    self._changed()

    async def _route_dead_letters(self) -> None:
        """Hand the outbox to the dead-letter queue until it is empty, retrying with backoff
        while that queue is unreachable (its shard recovering or restarting): a dead letter
        must not wait for this queue's next change to move on."""
        self._routing = True
        delay = 0.2
        try:
            while self.state.outbox and self._stopped is None:
                letters = list(self.state.outbox.values())
                target = self.state.settings.dead_letter_queue
                try:
                    if target is not None and self.dead_letter_router is not None:
                        await self.dead_letter_router(self.name, target, letters)
                    elif target is not None:
                        raise Unavailable(f"no router for dead-letter queue {target}")
                    await self.execute(cmd.ConfirmDeadLetters([m.seq for m in letters]))
                    delay = 0.2
                except QueueError as exc:
                    if self._stopped is not None:
                        return
                    log.warning(
                        "queue %s: dead-letter routing failed (%s); retrying in %.1fs",
                        self.name,
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30.0)
        finally:
            self._routing = False

    # ---------------------------------------------------------------- snapshots

    def _maybe_snapshot(self) -> None:
        writer = self._writer
        if writer is None or self._snapshotting or self._stopped is not None:
            return
        since = writer.durable_seq - self._snapshot_seq
        due_by_time = (
            self.clock.now_ms() - self._snapshot_at_ms >= self.log_settings.snapshot_every_ms
        )
        if since >= self.log_settings.snapshot_every_records or (since > 0 and due_by_time):
            self._spawn(self._snapshot_in_background())

    async def _snapshot_in_background(self) -> None:
        try:
            await self.snapshot()
        except QueueError as exc:  # the log stays valid without it; the next one will retry
            log.error("queue %s: snapshot failed: %s", self.name, exc)

    async def snapshot(self) -> str | None:
        """Write a snapshot of the state as of the last decided event, once that is durable,
        verify it, and prune what it makes unnecessary; return its key (None: not written).

        Raises:
            QueueError: the log or the store failed.
        """
        writer = self._writer
        if writer is None or self._snapshotting:
            return None
        self._snapshotting = True
        try:
            seq = writer.next_seq - 1
            data = encode_state(self.state, writer.epoch, seq)
            batch = writer.last_batch()
            if batch is not None:
                await batch.wait()
            key = await write_snapshot(self.store, self.name, seq, data)
            if key is not None:
                self._snapshot_seq = max(self._snapshot_seq, seq)
                self._snapshot_at_ms = self.clock.now_ms()
                await prune(self.store, self.name)
            return key
        finally:
            self._snapshotting = False

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
