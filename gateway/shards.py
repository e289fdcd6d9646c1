"""``GET /v1/admin/shards``: the shard count, the placement map's generation, and each
shard's state and queues; ``POST /v1/admin/shards``: resize the running server, queue by
queue, as a task (docs/API.md, "Tasks and administration")."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from actors.errors import BadRequest, Unavailable
from actors.status import ShardStatus
from gateway import native
from gateway.tasks import TASKS, Task, forwarded

MAX_SHARDS = 256  # what a resize may ask for
RESIZE = "resize"
RESTART = "restart"

__all__ = ["routes", "shard_state"]

routes = web.RouteTableDef()


@routes.get("/v1/admin/shards")
async def shards(request: web.Request) -> web.Response:
    """What the shards are and hold now."""
    directory = request.app[native.DIRECTORY]
    statuses = await directory.status(brief=True)
    # by index: reading the statuses may teach this process of shards a resize added, so
    # the second list can name more shards than the first
    names = await directory.names_by_shard()
    docs = []
    for status in statuses:
        queues = names[status.index] if status.index < len(names) else None
        state, reason = shard_state(status)
        doc: dict[str, Any] = {
            "index": status.index,
            "state": state,
            "queues": queues if queues is not None else [],
            "generation": status.generation,
        }
        if reason is not None:
            doc["reason"] = reason
        docs.append(doc)
    generation = max((s.generation for s in statuses), default=0)
    doc = {"count": directory.count, "generation": generation, "shards": docs}
    for kind in (RESIZE, RESTART):
        running = await request.app[TASKS].running_anywhere(kind)
        if running is not None:
            doc["task"] = running["id"]
            doc["moves" if kind == RESIZE else "restarted"] = {
                "done": running["done"],
                "total": running["total"],
            }
    return native.reply(request, doc)


class ResizeIn(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/admin/shards``'s body."""

    count: int


@routes.post("/v1/admin/shards")
async def resize(request: web.Request) -> web.Response:
    """Start a resize to ``count`` shards: 202 with its task."""
    if (answer := await forwarded(request)) is not None:
        return answer
    asked = await native.body(request, ResizeIn)
    if not 1 <= asked.count <= MAX_SHARDS:
        raise BadRequest(f"count: from 1 to {MAX_SHARDS} shards, not {asked.count}")
    directory = request.app[native.DIRECTORY]
    run = getattr(directory, "resize", None)
    if run is None:
        raise Unavailable("this gateway process cannot start shards: ask the server's first one")

    async def work(task: Task) -> None:
        placement = await run(asked.count, progress=task.progress, cancelled=task.cancelled)
        task.detail["generation"] = placement.generation

    task = await request.app[TASKS].start(
        RESIZE, work, exclusive=(RESTART,), count=asked.count, was=directory.count
    )
    return native.reply(request, {"task": task.id}, 202)


@routes.post("/v1/admin/shards/restart")
async def restart(request: web.Request) -> web.Response:
    """Start a rolling restart of every shard: 202 with its task."""
    if (answer := await forwarded(request)) is not None:
        return answer
    if await request.read():
        raise BadRequest("POST /v1/admin/shards/restart takes no body")
    directory = request.app[native.DIRECTORY]
    run = getattr(directory, "restart_shards", None)
    if run is None:
        raise Unavailable("this gateway process cannot start shards: ask the server's first one")

    async def work(task: Task) -> None:
        placement = await run(progress=task.progress, cancelled=task.cancelled)
        task.detail["generation"] = placement.generation

    task = await request.app[TASKS].start(RESTART, work, exclusive=(RESIZE,))
    return native.reply(request, {"task": task.id}, 202)


def shard_state(status: ShardStatus) -> tuple[str, str | None]:
    """A shard's state (starting, recovering, ready or failed) and, when failed, why."""
    if status.log_failed is not None:
        return "failed", f"its log is not written any more: {status.log_failed}"
    if status.disk_full is not None:
        return "failed", f"its disk is full: {status.disk_full}"
    if "*" in status.failed:  # the shard could not be reached (ChannelDirectory.status)
        return "failed", status.failed["*"]
    if status.ready:
        return "ready", None
    if status.recovering or status.log is not None:
        return "recovering", None
    return "starting", None
