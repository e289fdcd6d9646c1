"""What runs in a worker for one chunk: the user's function over a batch of messages.

Each message gets its own outcome: what the function returned, or a :class:`Failure` when
it raised (one failing message does not fail the others). An ``async`` function runs its
messages concurrently within the task, but those of one FIFO group in order, one after
another; a plain one runs them all one after another. In batch
mode the function is called once with the whole list.

This module is plain Python: the runtime wraps :func:`run_task` with ``ray.remote`` (or runs
it in a thread, in tests), and the tests call it directly.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Sequence
from typing import Any

from evq.handlers.api import Handler, Job
from evq.handlers.plan import Failure, batch_outcomes

__all__ = ["run_task"]

MAX_TRACE = 4000  # characters of a traceback kept for the runtime's log


def _failure(exc: BaseException) -> Failure:
    text = f"{type(exc).__name__}: {exc}"
    trace = "".join(traceback.format_exception(exc))
    return Failure(text[:500], trace[-MAX_TRACE:])


def run_task(handler: Handler, messages: Sequence[Job]) -> list[Any]:
    """Call ``handler`` on ``messages``; one outcome (or Failure) per message, in order."""
    if handler.options.batch:
        return _run_batch(handler, messages)
    if handler.is_async:
        return asyncio.run(_run_async(handler, messages))
    outcomes: list[Any] = []
    for message in messages:
        try:
            outcomes.append(handler.fn(message))
        except Exception as exc:
            outcomes.append(_failure(exc))
    return outcomes


def _run_batch(handler: Handler, messages: Sequence[Job]) -> list[Any]:
    try:
        if handler.is_async:
            result = asyncio.run(handler.fn(list(messages)))
        else:
            result = handler.fn(list(messages))
    except Exception as exc:
        return [_failure(exc)] * len(messages)
    return batch_outcomes(messages, result)


async def _run_async(handler: Handler, messages: Sequence[Job]) -> list[Any]:
    """Messages concurrently, except that those of one FIFO group run one after another,
    in order (a take may hand out a run of one group)."""
    outcomes: list[Any] = [None] * len(messages)
    lanes: dict[object, list[int]] = {}
    for i, message in enumerate(messages):
        lanes.setdefault(i if message.group is None else ("group", message.group), []).append(i)

    async def lane(indexes: list[int]) -> None:
        for i in indexes:
            try:
                outcomes[i] = await handler.fn(messages[i])
            except Exception as exc:
                outcomes[i] = _failure(exc)

    await asyncio.gather(*(lane(indexes) for indexes in lanes.values()))
    return outcomes
