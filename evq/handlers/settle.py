"""Settling a task's messages once it has answered, and the runtime's counters.

Each message's :class:`~evq.handlers.plan.Plan` is carried out in order: every cascade
put is made durable first (with the idempotency key derived from the source message), and
only then the message is acked, rescheduled or released with its backoff delay. A put that
fails turns its source message into a failure (released with backoff, to be handled again:
the repeated puts are duplicates). Calls that fail are counted and logged; the messages
they concerned come back when their leases expire.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors.core.events import MAX_REASON_BYTES
from actors.errors import QueueError
from evq.handlers.api import MAX_BATCH, HandlerOptions, Job, Send
from evq.handlers.executor import Running
from evq.handlers.plan import (
    Abandon,
    Again,
    Done,
    GiveBack,
    Plan,
    backoff_delay,
    plan_outcome,
)
from evq.handlers.source import Item, Limits, Source, Taken

__all__ = ["Batch", "HandlerStats", "Settler", "chunks"]

log = logging.getLogger(__name__)


class HandlerStats(msgspec.Struct, kw_only=True):
    """What a runtime has done so far, and what it is doing."""

    name: str
    queue: str
    transport: str
    state: str = "starting"  # running, draining, stopped
    ready: int = 0  # the queue's ready count, as last watched
    in_flight: int = 0  # tasks running
    in_flight_messages: int = 0
    peak_in_flight: int = 0
    tasks: int = 0
    takes: int = 0
    taken: int = 0
    acked: int = 0
    released: int = 0  # failures and retries, released with a delay
    rescheduled: int = 0
    abandoned: int = 0  # left to their leases (a worker died)
    drained: int = 0  # released by a drain
    stale: int = 0  # leases found stale when settling or extending
    touched: int = 0  # lease extensions
    put_created: int = 0
    put_duplicate: int = 0
    watch_updates: int = 0
    errors: int = 0
    last_error: str | None = None


@dataclass(eq=False)
class Batch:
    """One task's messages while it runs."""

    id: int
    taken: list[Taken]
    touched_ms: int
    running: Running | None = None
    task: asyncio.Task[None] | None = None
    settled: bool = False
    lost: set[str] = field(default_factory=set)  # ids whose lease went stale

    def items(self) -> list[Item]:
        return [(t.message.id, t.lease) for t in self.taken if t.message.id not in self.lost]


def chunks(items: Sequence[Any], size: int = MAX_BATCH) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class Settler:
    """Carries out plans against the queue and counts what happened in ``stats``."""

    def __init__(
        self,
        name: str,
        options: HandlerOptions,
        source: Source,
        stats: HandlerStats,
        rng: random.Random,
    ) -> None:
        self.name = name
        self.limits: Limits | None = None  # the queue's, once the runtime has asked
        self.options = options
        self.source = source
        self.stats = stats
        self.rng = rng

    def error(self, what: str, exc: BaseException) -> None:
        """Count and log a failed call."""
        self.stats.errors += 1
        self.stats.last_error = f"{what}: {type(exc).__name__}: {exc}"
        log.warning("handler %s: %s", self.name, self.stats.last_error)

    def _plans(self, batch: Batch, outcomes: list[Any]) -> list[Plan]:
        draw = self.rng.random()  # one jitter per task: its failures come back together
        backoff = self.options.backoff
        plans = []
        for t, outcome in zip(batch.taken, outcomes, strict=True):
            if isinstance(outcome, Abandon):
                plans.append(Plan(outcome))
            else:
                plans.append(plan_outcome(t.message, outcome, backoff, draw))
        return plans

    async def settle(self, batch: Batch, outcomes: list[Any]) -> None:
        """Carry out what ``outcomes`` (one per message of ``batch``) mean."""
        plans = self._plans(batch, outcomes)
        failed = await self._cascade(batch, plans)
        batch.settled = True  # no more lease extensions: the final calls follow
        acks: list[Item] = []
        releases: dict[tuple[float, str | None], list[Item]] = {}
        agains: list[tuple[Item, Again]] = []
        for t, plan in zip(batch.taken, plans, strict=True):
            final, error = plan.final, plan.error
            if t.message.id in failed:
                error = failed[t.message.id]
                final = GiveBack(self._backoff(t.message))
            if error is not None:
                self._failed(t.message, error, final)
            item = (t.message.id, t.lease)
            if t.message.id in batch.lost:
                continue
            if isinstance(final, Done):
                acks.append(item)
            elif isinstance(final, GiveBack):
                key = (round(final.delay, 3), reason_of(error))
                releases.setdefault(key, []).append(item)
            elif isinstance(final, Again):
                agains.append((item, final))
            else:
                self.stats.abandoned += 1
        calls = [self._ack(acks)]
        calls += [self.release(i, d, reason=r) for (d, r), i in releases.items()]
        calls += [self._again(item, again) for item, again in agains]
        await asyncio.gather(*calls)

    def _backoff(self, message: Job) -> float:
        return backoff_delay(self.options.backoff, message.receive_count, self.rng.random())

    def _failed(self, message: Job, error: str, final: object) -> None:
        log.warning(
            "handler %s: message %s (receive %d) failed: %s%s",
            self.name,
            message.id,
            message.receive_count,
            error,
            self._next(message, final),
        )

    def _next(self, message: Job, final: object) -> str:
        """What becomes of a released message, for the log."""
        if not isinstance(final, GiveBack):
            return ""
        limits = self.limits
        last = limits.max_receives if limits is not None else None
        if limits is not None and last is not None and message.receive_count >= last:
            # Its last delivery: the queue gives up on it as it is released.
            where = limits.dead_letter_queue
            gone = f"moves to {where}" if where is not None else "is dropped"
            return f"; that was its last receive (max_receives {last}): it {gone}"
        return f"; again in {final.delay:.2f}s"

    async def _cascade(self, batch: Batch, plans: list[Plan]) -> dict[str, str]:
        """Make every put durable; the ids of source messages whose puts failed, and why."""
        by_queue: dict[str, list[tuple[str, str, Send]]] = {}
        for t, plan in zip(batch.taken, plans, strict=True):
            for key, put in plan.puts:
                by_queue.setdefault(put.queue, []).append((t.message.id, key, put))
        failed: dict[str, str] = {}
        if not by_queue:
            return failed

        async def put_all(queue: str, entries: list[tuple[str, str, Send]]) -> None:
            for chunk in chunks(entries):
                try:
                    statuses = await self.source.put(queue, [(k, p) for _, k, p in chunk])
                except QueueError as exc:
                    self.error(f"putting into {queue}", exc)
                    for mid, _, _ in chunk:
                        failed[mid] = f"put into {queue} failed: {exc.code}: {exc.message}"
                    continue
                for status in statuses:
                    if status == "duplicate":
                        self.stats.put_duplicate += 1
                    else:
                        self.stats.put_created += 1

        await asyncio.gather(*(put_all(q, e) for q, e in by_queue.items()))
        return failed

    async def _ack(self, items: list[Item]) -> None:
        for chunk in chunks(items):
            try:
                statuses = await self.source.ack(chunk)
            except QueueError as exc:
                self.error("acking", exc)
                continue
            self._count(statuses, "acked")

    async def release(
        self, items: list[Item], delay: float, *, drained: bool = False, reason: str | None = None
    ) -> None:
        """Give messages back, ready after ``delay`` s (``drained``: counted as such), with
        why they failed (``reason``: kept with them, shown by peek and browse)."""
        for chunk in chunks(items):
            try:
                statuses = await self.source.release(chunk, delay, reason)
            except QueueError as exc:
                self.error("releasing", exc)
                continue
            self._count(statuses, "drained" if drained else "released")

    async def _again(self, item: Item, again: Again) -> None:
        try:
            status = await self.source.reschedule(item, again.delay, again.at)
        except QueueError as exc:
            self.error("rescheduling", exc)
            return
        self._count([status], "rescheduled")

    def _count(self, statuses: list[str], what: str) -> None:
        ok = sum(1 for s in statuses if s == "ok")
        setattr(self.stats, what, getattr(self.stats, what) + ok)
        self.stats.stale += len(statuses) - ok


def reason_of(error: str | None) -> str | None:
    """A handler's error as a release's reason: at most ``MAX_REASON_BYTES`` of UTF-8."""
    if error is None:
        return None
    return error.encode()[:MAX_REASON_BYTES].decode(errors="ignore")
