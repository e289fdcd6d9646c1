"""Move tasks, the shell's half: a queue moves its ready messages to other queues.

This is how a dead-letter queue is redriven (SQS ``StartMessageMoveTask``). The engine keeps
the task's durable record (``StartMove`` … ``EndMove`` in :mod:`actors.core.decide`); the
queue that holds the task runs :func:`run_move` while the record says RUNNING or CANCELLING,
in its shard, so a gateway that dies takes nothing with it. A shard that restarts finds the
record in the recovered state and runs the task on from there.

One step takes up to a batch of ready messages under a short lease, puts them into their
destination (each back to the queue it was dead-lettered from, unless the task names one),
acknowledges them here, and records the count. A put carries an idempotency key per task
and message, so a step that is cut off after the put and before the ack puts nothing twice
when its messages come back and are moved again (within the destination's window). The
messages keep their id (when the destination does not have it), body, attributes, group
and first-put time; their dead-letter provenance is dropped.

A message that does not say where it came from (it was put into the queue directly) has
nowhere to go back to: it is given back and left. The task ends COMPLETED when it has moved
as many messages as were ready when it started, or finds nothing more to move; CANCELLED
when it was asked to stop; FAILED when the destination does not exist (the reason is the
error's code).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from actors.core import commands as cmd
from actors.core import replies as rp
from actors.core.state import QueueState
from actors.errors import QueueError, QueueNotFound

__all__ = ["BATCH", "MoveHost", "moved_copy", "run_move", "source_of"]

log = logging.getLogger(__name__)

BATCH = 100  # messages per step
LEASE_MS = 60_000  # what a step took comes back this soon if the step is cut off
_MAX_PAUSE_S = 30.0


class MoveHost(Protocol):
    """What a move task needs of its queue."""

    name: str
    state: QueueState
    stopped: QueueError | None

    async def execute(self, command: object) -> Any:
        """Run one command on this queue; its reply once durable. Raises: QueueError."""
        ...


Redeliver = Callable[[str, list[cmd.NewMessage]], Awaitable[None]]


def moved_copy(task: str, d: rp.Delivery | rp.MessageView) -> cmd.NewMessage:
    """What ``d`` becomes in its destination: the same id, body, group and attributes, less
    its dead-letter provenance but with its first-put time."""
    attributes = {k: v for k, v in (d.attributes or {}).items() if k not in cmd.PROVENANCE}
    attributes[cmd.SENT_AT] = (d.attributes or {}).get(cmd.SENT_AT, d.enqueued_at_ms)
    return cmd.NewMessage(
        body=d.body,
        id=d.id,
        idempotency_key=f"move:{task}:{d.id}",
        group=d.group,
        attributes=attributes,
    )


def source_of(d: rp.Delivery | rp.MessageView) -> str | None:
    """The queue a dead letter came from (None: it does not say)."""
    source = (d.attributes or {}).get(cmd.SOURCE_QUEUE)
    return source if isinstance(source, str) else None


def _target(task: rp.MoveTask, d: rp.Delivery) -> str | None:
    return task.destination if task.destination is not None else source_of(d)


class _Pace:
    """At most ``rate`` messages per second, on the event loop's clock."""

    def __init__(self, rate: int | None) -> None:
        self.rate = rate
        self.loop = asyncio.get_running_loop()
        self.started = self.loop.time()
        self.count = 0

    def allowance(self) -> int:
        """Messages for the next step: a tenth of a second's worth, spread evenly."""
        return BATCH if self.rate is None else min(BATCH, max(1, self.rate // 10))

    async def after(self, n: int) -> None:
        self.count += n
        if self.rate is not None:
            due = self.started + self.count / self.rate
            await asyncio.sleep(max(0.0, due - self.loop.time()))


async def run_move(queue: MoveHost, redeliver: Redeliver) -> None:
    """Run the queue's active move task until it ends, or until the queue stops serving
    (a restart runs it on)."""
    active = queue.state.active_move
    if active is None:
        return
    task = active.task
    pace = _Pace(active.rate)
    left: set[str] = set()  # ids given back: they have nowhere to go
    pause = 0.2
    while queue.stopped is None:
        current = queue.state.active_move
        if current is None or current.task != task:
            return
        try:
            status = await _step(queue, redeliver, current, pace, left)
            pause = 0.2
        except QueueNotFound as exc:
            status, reason = rp.FAILED, exc.code
            log.warning("queue %s: move task %s failed: %s", queue.name, task, exc)
            await queue.execute(cmd.EndMove(task, status, reason))
            return
        except QueueError as exc:
            if queue.stopped is not None:
                return
            log.warning("queue %s: move task %s: %s; again in %.1fs", queue.name, task, exc, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, _MAX_PAUSE_S)
            continue
        if status is not None:
            await queue.execute(cmd.EndMove(task, status))
            return


async def _step(
    queue: MoveHost, redeliver: Redeliver, task: rp.MoveTask, pace: _Pace, left: set[str]
) -> str | None:
    """One batch moved; the status the task ends with, or None to go on.

    Raises:
        QueueError: a queue could not be reached (QueueNotFound: the destination is gone).
    """
    if task.status == rp.CANCELLING:
        return rp.CANCELLED
    wanted = min(pace.allowance(), task.to_move - task.moved)
    if wanted <= 0:
        return rp.COMPLETED
    taken: list[rp.Delivery] = await queue.execute(cmd.Take(wanted, LEASE_MS, mover=True))
    by_target: dict[str, list[rp.Delivery]] = {}
    stay: list[rp.Delivery] = []
    for d in taken:
        target = _target(task, d)
        if target is None or target == queue.name:
            stay.append(d)
        else:
            by_target.setdefault(target, []).append(d)
    try:
        for target, deliveries in by_target.items():
            await redeliver(target, [moved_copy(task.task, d) for d in deliveries])
    except QueueError:
        await _give_back(queue, taken)
        raise
    await _give_back(queue, stay)  # behind the others: they come up again last
    seen_before = all(d.id in left for d in stay)
    left.update(d.id for d in stay)
    done = [d for ds in by_target.values() for d in ds]
    if done:
        await queue.execute(cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in done]))
        await queue.execute(cmd.MoveProgress(task.task, task.moved + len(done)))
    elif seen_before:
        return rp.COMPLETED  # nothing ready, or only what has nowhere to go
    await pace.after(len(taken))
    return None


async def _give_back(queue: MoveHost, deliveries: list[rp.Delivery]) -> None:
    if deliveries:
        items = [cmd.ReleaseItem(id=d.id, lease=d.lease) for d in deliveries]
        await queue.execute(cmd.Release(items))
