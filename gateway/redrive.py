"""``POST /v1/queues/{name}/redrive`` (docs/API.md): move a dead-letter queue's messages back
to the queues they came from, or all to one queue (``to``), at most ``rate`` a second, as a
task under ``/v1/tasks`` that can be listed and cancelled.

All of them: the queue's own move task (:mod:`actors.moves`, the mechanism of SQS's
``StartMessageMoveTask``), run in its shard: durable, resumed by a restarted shard, moving
each message with an idempotency key of the task and the message. This gateway's task
follows its progress and passes a cancel on; the move goes on if the gateway dies (its task
then shows ``GatewayLost``; SQS's ``ListMessageMoveTasks`` still shows the move).

Selected ones (``ids``, from a browse): the gateway moves them itself, one at a time, the
same way: read (peek), put into the destination under the same kind of idempotency key (a
rerun after a crash between the put and the delete puts nothing twice, within the
destination's idempotency window), deleted from the dead-letter queue. One that is gone or
reserved meanwhile, or does not say where it came from when no ``to`` is given, is skipped;
the task counts them (``skipped``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
from aiohttp import web

from actors import errors
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.core.decide import MAX_MOVE_RATE
from actors.errors import BadRequest, Conflict, Forbidden, MessageNotFound, QueueError
from actors.moves import moved_copy, source_of
from actors.settings import MAX_BATCH, validate_queue_name
from gateway import hot, native
from gateway.auth import LEVELS, TOKEN
from gateway.tasks import TASKS, Stopped, Task, forwarded, new_id

__all__ = ["REDRIVE", "RedriveIn", "routes"]

REDRIVE = "redrive"
POLL_S = 0.25  # how often the task reads its move's progress

routes = web.RouteTableDef()


class RedriveIn(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v1/queues/{name}/redrive``'s body (all optional)."""

    to: str | None = None
    rate: int | None = None
    ids: list[str] | None = None


@routes.post("/v1/queues/{name}/redrive")
async def redrive(request: web.Request) -> web.Response:
    """Start a redrive of the queue: 202 with its task."""
    if (answer := await forwarded(request)) is not None:
        return answer
    name = native.queue_name(request)
    asked: RedriveIn = (
        await native.body(request, RedriveIn) if await request.read() else RedriveIn()
    )
    app = request.app
    to, rate, ids = _checked(name, asked)
    token = request.get(TOKEN)
    if to is not None and token is not None and token.level(to) < LEVELS["write"]:
        raise Forbidden(f"this token may not put into {to}", queue=to)
    await hot.run(app, name, cmd.Stats())  # QueueNotFound before a task exists
    if to is not None:
        await hot.run(app, to, cmd.Stats())
    tasks = app[TASKS]
    for view in await tasks.views():
        if view["kind"] == REDRIVE and view["state"] == "running" and view["queue"] == name:
            raise Conflict(f"task {view['id']} redrives {name}: cancel it or wait", task=view["id"])
    detail: dict[str, Any] = {"queue": name, "to": to, "rate": rate}
    if ids is not None:
        detail.update(selected=len(ids), skipped=0)
        task = await tasks.start(
            REDRIVE, lambda t: _move_selected(app, t, name, ids), alone=False, **detail
        )
    else:
        task_id = new_id(REDRIVE)
        move: rp.MoveTask = await hot.run(app, name, cmd.StartMove(task_id, to, rate))
        task = await tasks.start(
            REDRIVE, lambda t: _follow(app, t, name), alone=False, task_id=task_id, **detail
        )
        task.progress(0, move.to_move)
    return native.reply(request, {"task": task.id}, 202)


def _checked(name: str, asked: RedriveIn) -> tuple[str | None, int | None, list[str] | None]:
    """``to``, ``rate`` and ``ids`` of a redrive, checked. Raises: BadRequest."""
    to, rate, ids = asked.to, asked.rate, asked.ids
    if to is not None:
        validate_queue_name(to)
        if to == name:
            raise BadRequest("a redrive cannot move a queue's messages to itself")
    if rate is not None and not 1 <= rate <= MAX_MOVE_RATE:
        raise BadRequest(f"rate: 1-{MAX_MOVE_RATE} messages per second")
    if ids is not None:
        ids = list(dict.fromkeys(ids))
        if not 1 <= len(ids) <= MAX_BATCH:
            raise BadRequest(f"ids: 1-{MAX_BATCH} message ids")
    return to, rate, ids


async def _follow(app: web.Application, task: Task, name: str) -> None:
    """The queue's move task, followed until it ends; a cancel passed on to it.

    Raises:
        Stopped: it was cancelled.
        QueueError: it failed (its reason), or the queue went away.
    """
    cancelling = False
    while True:
        await asyncio.sleep(POLL_S)
        if task.cancelled() and not cancelling:
            with contextlib.suppress(Conflict, errors.TaskNotFound):  # it ended meanwhile
                await hot.run(app, name, cmd.CancelMove(task.id))
            cancelling = True
        moves: list[rp.MoveTask] = await hot.run(app, name, cmd.ListMoves())
        move = next((m for m in moves if m.task == task.id), None)
        if move is None:
            raise errors.TaskNotFound(f"queue {name} no longer holds the move", task=task.id)
        task.progress(move.moved, move.to_move)
        if move.status == rp.COMPLETED:
            return
        if move.status == rp.CANCELLED:
            raise Stopped
        if move.status == rp.FAILED:
            raise _failure(move.reason, name)


def _failure(code: str | None, name: str) -> QueueError:
    """The error a failed move's reason (an error code) names."""
    kind = next(
        (
            c
            for c in vars(errors).values()
            if isinstance(c, type) and issubclass(c, QueueError) and c.code == code
        ),
        errors.InternalError,
    )
    return kind(f"the move from {name} failed: {code}", queue=name)


async def _move_selected(app: web.Application, task: Task, name: str, ids: list[str]) -> None:
    """Move the messages ``ids`` one at a time (see the module docstring).

    Raises:
        Stopped: it was cancelled.
        QueueError: a queue failed (the destination gone: QueueNotFound).
    """
    to, rate = task.detail["to"], task.detail["rate"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    task.progress(0, len(ids))
    for i, mid in enumerate(ids):
        if task.cancelled():
            raise Stopped
        if not await _move_one(app, task, name, mid, to):
            task.detail["skipped"] += 1
        task.progress(i + 1, len(ids))
        if rate is not None:
            await asyncio.sleep(max(0.0, started + (i + 1) / rate - loop.time()))


async def _move_one(app: web.Application, task: Task, name: str, mid: str, to: str | None) -> bool:
    """Whether message ``mid`` moved (False: skipped)."""
    try:
        view: rp.MessageView = await hot.run(app, name, cmd.Peek(mid))
    except MessageNotFound:
        return False
    if view.state == "reserved":
        return False
    target = to if to is not None else source_of(view)
    if target is None or target == name:
        return False
    await hot.run(app, target, cmd.Put([moved_copy(task.id, view)], redelivery=True))
    # deleted, or taken, meanwhile: moved all the same (and then maybe handled twice)
    with contextlib.suppress(MessageNotFound, Conflict):
        await hot.run(app, name, cmd.Delete(mid))
    return True
