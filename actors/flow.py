"""A command's life in a shard, in one place: admitted, decided, appended to the shard's log,
and its reply released once the log holds it (or decided again after a failed write).

Who owns what, one sentence each:

- :class:`Flow` (here) owns a command from its arrival in a shard to its reply;
- the shard (:mod:`actors.shard`) owns which queues exist and the log's life: recovery, the
  reload after a failed write, pruning and compaction;
- a queue (:mod:`actors.queue_actor`) owns what one queue does between commands: its alarm,
  waiting takes, dead letters, snapshots and the placing of its runs in the log.

A put's walk: the data channel hands :meth:`Flow.begin` a frame's ``(queue, command)``
items; each is admitted (its queue exists and serves; the memory budget and the log's disk
let puts in) and decided at once by the engine (:func:`actors.core.decide.execute`); its
events join the log's current batch (:meth:`ShardLog.append`) and its queue notes them
(``decided``); the reply waits on the batch. When the batch and every one before it are
durable, :meth:`Flow.durable` releases every reply riding on it, has the shard account for
the block, and tells each queue of the batch (``durable``). One future per call resolves
once all of its replies are released: a frame of many commands costs one wake-up.

A reply, even an error, is released only when every event its queue decided before it is
durable: no reply tells of a change that a crash could lose.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from actors.clock import Clock
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.core.decide import execute
from actors.core.ids import IdSource
from actors.core.state import QueueState
from actors.errors import Overloaded, QueueError, QueueNotFound, Unavailable
from actors.keyspace import is_partition
from actors.log.shardlog import Batch, ShardLog
from actors.settings import validate_queue_name

__all__ = ["Call", "Entry", "Flow", "FlowQueue", "FlowShard", "unavailable"]

log = logging.getLogger(__name__)


class Call:
    """The results of one call of one or more commands, in order; its future resolves once
    every command's reply is released. One future per call, not per command: a batch of
    commands from a gateway costs one wake-up."""

    __slots__ = ("first", "future", "pending", "results", "then")

    def __init__(self, size: int) -> None:
        self.future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.pending = size
        self.results: list[Any] = [None] * size
        self.then: Callable[[list[Any]], None] | None = None
        # What must happen before anyone learns the results (the watchers of the keys the
        # call set are told before its reply goes out).
        self.first: Callable[[list[Any]], None] | None = None
        if not size:
            self.future.set_result(self.results)

    def settle(self, index: int, value: Any) -> None:
        self.results[index] = value
        self.pending -= 1
        if not self.pending and not self.future.done():
            if self.first is not None:
                self._then(self.first)
            self.future.set_result(self.results)
            if self.then is not None:
                self._then(self.then)

    def on_done(self, then: Callable[[list[Any]], None]) -> None:
        """Call ``then(results)`` once every reply is released, in the same step (now if
        they are): the channel writes a gateway's reply frame from the log's release of the
        block, not a loop turn later from the future's callback."""
        if self.future.done():
            self._then(then)
        else:
            self.then = then

    def _then(self, then: Callable[[list[Any]], None]) -> None:
        try:
            then(self.results)
        except Exception:  # the log's release goes on for the other calls of the block
            log.exception("a call's reply failed")


class Entry:
    """A command waiting for its reply to become true (durable)."""

    __slots__ = (
        "call",
        "command",
        "done",
        "error",
        "index",
        "last_seq",
        "queue",
        "reply",
        "started",
    )

    def __init__(self, queue: FlowQueue, command: object, call: Call, index: int) -> None:
        self.queue = queue
        self.command = command
        self.call = call
        self.index = index
        self.started = time.perf_counter()  # for the time-to-durable histogram
        self.reply: Any = None
        self.error: QueueError | None = None
        self.last_seq = 0  # the sequence number of its last event (0: it has none)
        self.done = False

    def release(self) -> None:
        """Give the caller its outcome."""
        if not self.done:
            self.done = True
            self.call.settle(self.index, self.error if self.error is not None else self.reply)

    def fail(self, error: QueueError) -> None:
        if not self.done:
            self.done = True
            self.call.settle(self.index, error)


class FlowQueue(Protocol):
    """What the flow needs of a queue (:class:`actors.queue_actor.QueueActor`)."""

    name: str
    state: QueueState
    next_seq: int
    durable_seq: int
    stopped: QueueError | None

    @property
    def last_batch(self) -> Batch | None:
        """The newest batch holding this queue's events that is not yet durable."""
        ...

    def decided(self, events: list[Any], reply: Any, batch: Batch, size: int) -> None:
        """Its ``events`` (``size`` bytes of records) went into ``batch``."""
        ...

    def durable(self, batch: Batch, last_seq: int, now_ms: int) -> None:
        """``batch``, with its events up to ``last_seq``, is durable."""
        ...

    def observe_durable(self, entry: Entry, now: float) -> None:
        """``entry``'s events are durable (``now``: ``time.perf_counter()``)."""
        ...

    async def wait_ready(self) -> None:
        """Until the queue may decide. Raises: QueueError."""
        ...


class FlowShard(Protocol):
    """What the flow needs of its shard (:class:`actors.shard.QueueShard`)."""

    index: int
    clock: Clock
    ids: IdSource
    wal: ShardLog
    log_ready: asyncio.Event
    queues: Any  # dict[str, QueueActor]

    @property
    def serving(self) -> bool:
        """Recovered, its log readable, not closing."""
        ...

    def full(self) -> str | None:
        """Why puts are refused because the log's disk is full (None: it is not)."""
        ...

    def over_budget(self) -> bool:
        """Whether the shard is over its memory budget."""
        ...

    def admit(self, put: cmd.Put) -> None:
        """Count ``put`` against the memory budget."""
        ...

    def budget_use(self) -> str:
        """What the memory budget counted at its last reading."""
        ...

    def written(self, batch: Batch) -> None:
        """``batch`` is durable: account for the block (segments, counters)."""
        ...

    def keys_set(self, views: list[rp.KeyView]) -> None:
        """Application keys were set durably: tell their watchers."""
        ...

    def elsewhere(self, name: str) -> QueueError | None:
        """The refusal of a command for queue ``name`` when another shard holds it."""
        ...

    async def get(self, name: str) -> Any:
        """The queue ``name`` (created on first use for a key partition). Raises: QueueError."""
        ...


class Flow:
    """Runs commands on a shard's queues: admission, decision, release once durable."""

    def __init__(self, shard: FlowShard) -> None:
        self.shard = shard

    # ---------------------------------------------------------------- arrival

    def begin(self, items: Sequence[tuple[str, object]]) -> Call | None:
        """Decide every item now; return the call whose future resolves with the results
        once they are durable, or None when something must be awaited first (a key
        partition to create, recovery, a reload): then use :meth:`run_batch`."""
        shard = self.shard
        if not shard.serving:
            return None
        queues = shard.queues
        call = Call(len(items))
        full = shard.full()
        keys = False
        for index, (name, command) in enumerate(items):
            queue = queues.get(name)
            if queue is None or not queue.state.created:
                if is_partition(name) and queue is None:
                    return None  # created on first use (await shard.get())
                error = _missing(name, queue, shard)
                if error is not None:
                    call.settle(index, error)
                    continue
                assert queue is not None
            if queue.stopped is not None:
                call.settle(index, queue.stopped)
            elif type(command) is cmd.Put and not self._let_in(command, full):
                call.settle(index, self._refused(name, full))
            else:
                self.decide(Entry(queue, command, call, index))
                keys = keys or type(command) is cmd.SetKey
        if keys:
            publish = functools.partial(self._publish_keys, items)
            if call.future.done():
                publish(call.results)
            else:
                call.first = publish  # before the reply, which leaves in the same step
        return call

    async def run_batch(self, items: Sequence[tuple[str, object]]) -> list[Any]:
        """Run ``(queue, command)`` items in one go — in order within each queue, all in one
        group commit when they write; each result is a reply or a QueueError."""
        call = self.begin(items)
        if call is not None:
            return await call.future
        results = []  # a queue to create first, or the log is reloading: one by one
        for name, command in items:
            try:
                queue = await self.shard.get(name)
                results += await self._run(queue, [command])
            except QueueError as exc:
                results.append(exc)
        return results

    async def execute_many(self, queue: FlowQueue, commands: list[object]) -> list[Any]:
        """Run commands on ``queue`` in order in one go (the shard's own commands: creation,
        dead letters, snapshots' markers, moves); each result is a reply or a QueueError.

        Raises:
            QueueError: the queue stopped serving (Fenced, NotReady), or its log was not
                back in time after a failed write (Unavailable).
        """
        await queue.wait_ready()
        call = Call(len(commands))
        for index, command in enumerate(commands):
            self.decide(Entry(queue, command, call, index))
        return await call.future

    async def _run(self, queue: FlowQueue, commands: list[object]) -> list[Any]:
        """Commands on one queue (the memory budget and a full disk refuse puts)."""
        full = self.shard.full()
        if (full or self.shard.over_budget()) and any(type(c) is cmd.Put for c in commands):
            others = [c for c in commands if type(c) is not cmd.Put]
            done = iter(await self.execute_many(queue, others) if others else [])
            results = [
                self._refused(queue.name, full) if type(c) is cmd.Put else next(done)
                for c in commands
            ]
        else:
            results = await self.execute_many(queue, commands)
        self._publish_keys([(queue.name, c) for c in commands], results)
        return results

    def _let_in(self, put: cmd.Put, full: str | None) -> bool:
        """Whether a put may go in now (then it counts against the memory budget)."""
        if full is not None or self.shard.over_budget():
            return False
        self.shard.admit(put)
        return True

    def _refused(self, name: str, full: str | None = None) -> QueueError:
        """Why a put is refused: the log's disk is full (503, Retry-After), or the shard is
        over its memory budget (429)."""
        index = self.shard.index
        if full is not None:
            return Unavailable(full, queue=name, shard=index)
        return Overloaded(
            f"shard {index} is over its memory budget ({self.shard.budget_use()}); "
            "take and ack messages, or retry later",
            queue=name,
            memory_budget=True,
        )

    def _publish_keys(self, items: Sequence[tuple[str, object]], results: list[Any]) -> None:
        views = [
            result
            for (_, command), result in zip(items, results, strict=True)
            if type(command) is cmd.SetKey and isinstance(result, rp.KeyView)
        ]
        if views:
            self.shard.keys_set(views)

    # ---------------------------------------------------------------- decision

    def decide(self, entry: Entry) -> None:
        """Decide and apply now; its events join the log's current batch; release the reply
        when everything its queue decided before it is durable."""
        queue = entry.queue
        shard = self.shard
        try:
            events, entry.reply = execute(
                queue.state, entry.command, shard.clock.now_ms(), shard.ids
            )
        except QueueError as exc:
            events, entry.error = [], exc
        batch: Batch | None
        if events:
            wal = shard.wal
            batch = wal.append(queue.name, queue.next_seq, events)
            queue.decided(events, entry.reply, batch, wal.appended_bytes)
            entry.last_seq = queue.next_seq - 1
        else:
            batch = queue.last_batch
        if batch is None:
            entry.release()
        else:
            batch.entries.append(entry)

    # ---------------------------------------------------------------- durability

    def durable(self, batch: Batch) -> None:
        """``batch`` and every batch before it are durable (the log's ``on_durable``):
        release the replies riding on it, account for the block, tell its queues."""
        now = time.perf_counter()
        for entry in batch.entries:
            if entry.last_seq:
                entry.queue.observe_durable(entry, now)
            entry.release()
        shard = self.shard
        shard.written(batch)
        queues = shard.queues
        now_ms = shard.clock.now_ms()
        for name, first, records in batch.groups.values():
            queue = queues.get(name)
            if queue is not None:
                queue.durable(batch, first + len(records) - 1, now_ms)

    def settle_after_reload(self, unsure: list[Entry]) -> None:
        """The shard read its log again after a failed write: release the commands whose
        events the log holds (their replies are true), decide the others again."""
        for entry in unsure:
            if entry.last_seq and entry.last_seq <= entry.queue.durable_seq:
                entry.release()
            else:
                entry.reply, entry.error, entry.last_seq = None, None, 0
                self.decide(entry)


def _missing(name: str, queue: object | None, shard: FlowShard) -> QueueError | None:
    """Why ``name`` cannot take commands (None: it is being created; they wait)."""
    if queue is not None:
        return None
    try:
        validate_queue_name(name, internal=True)
    except QueueError as exc:
        return exc
    return shard.elsewhere(name) or QueueNotFound("no such queue", queue=name)


def unavailable(queue: str) -> Unavailable:
    """The error of a command whose write failed: it may or may not have happened."""
    return Unavailable(
        f"queue {queue}: the log write failed; the command may or may not have happened",
        queue=queue,
    )
