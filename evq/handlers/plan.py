"""The runtime's decisions, free of I/O: how long a failed message waits, how many tasks to
run, how big a take is, and what to do with each message once its task has answered.

Everything here is a function of its arguments (randomness comes in as a number drawn by the
caller), so the runtime around it stays a thin shell and these rules are tested exhaustively.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evq.handlers.api import Backoff, HandlerOptions, Job, Reschedule, Retry, Send

__all__ = [
    "DONE",
    "Abandon",
    "Again",
    "Done",
    "Failure",
    "GiveBack",
    "Plan",
    "backoff_delay",
    "batch_outcomes",
    "cascade_key",
    "more_tasks",
    "plan_outcome",
    "resource_limit",
    "take_size",
]

MAX_KEY = 256  # characters of an idempotency key (the queue's limit)


# ------------------------------------------------------------------ outcomes


@dataclass(frozen=True, slots=True)
class Failure:
    """What a task reports for a message whose call raised (or could not run)."""

    error: str
    trace: str = ""


@dataclass(frozen=True, slots=True)
class Done:
    """Done: delete the message."""


DONE = Done()


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Give the message back, active again after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True, slots=True)
class Again:
    """Periodic work: a new activation time instead of an ack."""

    delay: float | None = None
    at: float | None = None


@dataclass(frozen=True, slots=True)
class Abandon:
    """Leave the lease to expire: the queue hands the message out again by itself (the
    worker that ran it is gone, so nothing is known about what it did)."""

    reason: str


Final = Done | GiveBack | Again | Abandon


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with one message: put ``puts`` (all durable first), then ``final``."""

    final: Final
    puts: tuple[tuple[str, Send], ...] = ()  # (idempotency key, message)
    error: str | None = None


def backoff_delay(backoff: Backoff, receive_count: int, draw: float) -> float:
    """Seconds before the next try of a message that failed on its ``receive_count``-th
    delivery; ``draw`` in [0, 1) picks the jitter."""
    exponent = max(0, receive_count - 1)
    try:
        full = backoff.base * backoff.factor**exponent
    except OverflowError:
        full = math.inf
    delay = min(backoff.cap, full)
    return max(0.0, delay * (1.0 - backoff.jitter * draw))


def cascade_key(source: str, message_id: str, index: int) -> str:
    """The idempotency key of the ``index``-th put made while handling ``message_id`` of
    ``source``: the same every time that message is handled, so a repeat is a duplicate."""
    key = f"{source}:{message_id}:{index}"
    if len(key) <= MAX_KEY:
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def plan_outcome(message: Job, outcome: Any, backoff: Backoff, draw: float) -> Plan:
    """What a handler's result (or :class:`Failure`) means for ``message``."""
    if outcome is None:
        return Plan(DONE)
    if isinstance(outcome, Failure):
        return _retry(message, backoff, draw, outcome.error)
    if isinstance(outcome, Retry):
        delay = outcome.delay
        if delay is None:
            delay = backoff_delay(backoff, message.receive_count, draw)
        return Plan(GiveBack(delay))
    items = list(outcome) if isinstance(outcome, list | tuple) else [outcome]
    puts = [i for i in items if isinstance(i, Send)]
    again = [i for i in items if isinstance(i, Reschedule)]
    if len(puts) + len(again) != len(items) or len(again) > 1:
        wrong = next((i for i in items if not isinstance(i, Send | Reschedule)), None)
        what = type(wrong).__name__ if wrong is not None else "two Reschedules"
        error = (
            f"TypeError: the handler returned {what}; expected None, Send, Reschedule, Retry "
            "or a list of Send (with at most one Reschedule)"
        )
        return _retry(message, backoff, draw, error)
    keyed = tuple(
        (p.key or cascade_key(message.queue, message.id, i), p) for i, p in enumerate(puts)
    )
    final: Final = DONE if not again else Again(again[0].delay, again[0].at)
    return Plan(final, keyed)


def _retry(message: Job, backoff: Backoff, draw: float, error: str) -> Plan:
    return Plan(GiveBack(backoff_delay(backoff, message.receive_count, draw)), error=error)


def batch_outcomes(messages: Sequence[Job], result: Any) -> list[Any]:
    """One outcome per message from what a batch function returned.

    ``None`` acks all; a sequence gives one outcome per message, in order; a mapping gives
    outcomes by message id (the others are acked). Anything else fails the batch.
    """
    n = len(messages)
    if result is None:
        return [None] * n
    if isinstance(result, Mapping):
        return [result.get(m.id) for m in messages]
    if isinstance(result, list | tuple) and len(result) == n:
        return list(result)
    if isinstance(result, list | tuple):
        error = f"ValueError: the batch handler returned {len(result)} outcomes for {n} messages"
    else:
        error = (
            f"TypeError: the batch handler returned {type(result).__name__}; expected None, "
            "a list with one outcome per message, or a dict by message id"
        )
    return [Failure(error)] * n


# ------------------------------------------------------------------ sizing


def more_tasks(ready: int, in_flight: int, limit: int | None, options: HandlerOptions) -> int:
    """How many more tasks to start now.

    Enough for the ready messages (one per message, or one per ``batch_size`` in batch mode),
    at most ``max_concurrency`` in flight, and at most ``limit`` in flight (the tasks the
    cluster's free resources hold; None: unbounded). One task may always run, even without
    room: Ray queues it until resources free up, so a handler never stalls on a full cluster.
    """
    if ready <= 0:
        return 0
    wanted = ready if not options.batch else math.ceil(ready / options.batch_size)
    ceiling = options.max_concurrency
    if limit is not None:
        ceiling = min(ceiling, max(limit, 1))
    return max(0, min(wanted, ceiling - in_flight))


def resource_limit(
    available: Mapping[str, float], need: Mapping[str, float], held: int
) -> int | None:
    """Tasks of this handler the cluster holds: the ``held`` ones running plus as many as
    fit in the ``available`` resources, each needing ``need`` (None: it needs nothing)."""
    needed = {k: v for k, v in need.items() if v > 0}
    if not needed:
        return None
    fit = min(math.floor(available.get(k, 0.0) / v + 1e-9) for k, v in needed.items())
    return held + max(0, fit)


def take_size(ready: int, tasks: int, options: HandlerOptions) -> int:
    """Messages for the next take: the ready ones spread over the ``tasks`` about to start
    (per-message mode: more tasks, smaller batches), at most ``batch_size``."""
    if options.batch:
        return options.batch_size
    share = math.ceil(max(ready, 1) / max(tasks, 1))
    return max(1, min(options.batch_size, share))
