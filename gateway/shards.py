"""``GET /v1/admin/shards``: the shard count, the placement map's generation, and each
shard's state and queues (docs/API.md, "Shard administration")."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from actors.status import ShardStatus
from gateway import native

__all__ = ["routes", "shard_state"]

routes = web.RouteTableDef()


@routes.get("/v1/admin/shards")
async def shards(request: web.Request) -> web.Response:
    """What the shards are and hold now."""
    directory = request.app[native.DIRECTORY]
    statuses = await directory.status(brief=True)
    names = await directory.names_by_shard()
    docs = []
    for status, queues in zip(statuses, names, strict=True):
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
    return native.reply(
        request, {"count": directory.count, "generation": generation, "shards": docs}
    )


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
