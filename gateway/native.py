"""Handlers of the native API (API.md, WIRE.md): parse → command → directory → document.

Thin on purpose: validation happens in :mod:`gateway.wire` (before anything reaches an
actor), errors are raised and mapped by :mod:`gateway.errors`, and every per-queue command
goes through that queue's batcher.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from aiohttp import web

from actors.core import commands as cmd
from actors.errors import BadRequest, Forbidden
from actors.history import MINUTE_MS
from actors.settings import MAX_BATCH, validate_queue_name
from gateway import hot, wire
from gateway.auth import LEVELS, TOKEN
from gateway.errors import MSGPACK, MSGPACK_TYPES, wants_msgpack
from gateway.hot import BATCHERS, DIRECTORY, OPTIONS, SHUTTING_DOWN, WAITING_TAKES, Options

__all__ = [
    "BATCHERS",
    "DIRECTORY",
    "OPTIONS",
    "SHUTTING_DOWN",
    "WAITING_TAKES",
    "Options",
    "routes",
]


BROWSE_LIMIT = 100  # messages per page when the query gives no limit

_json = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()

routes = web.RouteTableDef()


def reply(request: web.Request, doc: Any, status: int = 200) -> web.Response:
    """Encode ``doc`` as the client prefers."""
    if wants_msgpack(request):
        return web.Response(status=status, body=_msgpack.encode(doc), content_type=MSGPACK)
    return web.Response(status=status, body=_json.encode(doc), content_type="application/json")


async def body(request: web.Request, type_: type[Any]) -> Any:
    """The request body decoded into ``type_``. Raises: BadRequest, 413 past the limit."""
    return wire.decode(await request.read(), type_, msgpack=request.content_type in MSGPACK_TYPES)


def queue_name(request: web.Request) -> str:
    """The queue named in the path. Raises: BadRequest."""
    return validate_queue_name(request.match_info["name"])


async def run(request: web.Request, queue: str, command: object) -> Any:
    """One command on one queue, batched with its neighbours. Raises: QueueError."""
    return await hot.run(request.app, queue, command)


# ------------------------------------------------------------------ queues


@routes.put("/v1/queues/{name}")
async def create_queue(request: web.Request) -> web.Response:
    name = queue_name(request)
    settings, given = wire.new_settings(name, await body(request, wire.QueueSettingsIn))
    created, actual = await request.app[DIRECTORY].create(name, settings, given)
    doc = {"name": name, "settings": wire.settings_doc(actual), "created": created}
    return reply(request, doc, 201 if created else 200)


@routes.get("/v1/queues")
async def list_queues(request: web.Request) -> web.Response:
    names = await request.app[DIRECTORY].names()
    token = request.get(TOKEN)  # with auth on: only the queues this token may read
    if token is not None:
        names = [n for n in names if token.level(n) >= 1]
    return reply(request, {"queues": names})


@routes.get("/v1/queues/{name}")
async def describe_queue(request: web.Request) -> web.Response:
    name = queue_name(request)
    return reply(request, wire.description_doc(await run(request, name, cmd.Describe())))


@routes.get("/v1/queues/{name}/history")
async def queue_history(request: web.Request) -> web.Response:
    """The queue's counts a minute at a time over the last hour, and now (actors/history.py):
    ``{"minute_s": 60, "samples": [{"at", "ready", "delayed", "reserved", "enqueued",
    "acked"}]}``, oldest first. Kept by the shard that serves the queue since it began to."""
    name = queue_name(request)
    samples = await request.app[DIRECTORY].history(name)
    return reply(
        request,
        {
            "minute_s": MINUTE_MS // 1000,
            "samples": [
                {
                    "at": s.at_ms / 1000,
                    "ready": s.ready,
                    "delayed": s.delayed,
                    "reserved": s.reserved,
                    "enqueued": s.enqueued,
                    "acked": s.acked,
                }
                for s in samples
            ],
        },
    )


@routes.patch("/v1/queues/{name}")
async def patch_queue(request: web.Request) -> web.Response:
    name = queue_name(request)
    req = await body(request, wire.QueueSettingsIn)
    changes = wire.settings_changes(req)
    if not changes:
        raise BadRequest("no settings to change")
    await run(request, name, cmd.PatchSettings(changes))
    return reply(request, wire.description_doc(await run(request, name, cmd.Describe())))


@routes.delete("/v1/queues/{name}")
async def delete_queue(request: web.Request) -> web.Response:
    await request.app[DIRECTORY].delete(queue_name(request))
    return web.Response(status=204)


@routes.post("/v1/queues/{name}/purge")
async def purge_queue(request: web.Request) -> web.Response:
    return reply(request, {"purged": await run(request, queue_name(request), cmd.Purge())})


@routes.post("/v1/queues/{name}/pause")
async def pause_queue(request: web.Request) -> web.Response:
    """Takes of the queue hand out nothing until it is resumed; puts go on (durable)."""
    return await _pause(request, paused=True)


@routes.post("/v1/queues/{name}/resume")
async def resume_queue(request: web.Request) -> web.Response:
    return await _pause(request, paused=False)


async def _pause(request: web.Request, *, paused: bool) -> web.Response:
    name = queue_name(request)
    if await request.read() not in (b"", b"{}"):
        raise BadRequest("pause and resume take no body")
    return reply(request, {"paused": await run(request, name, cmd.Pause(paused))})


# ------------------------------------------------------------------ messages


async def _hot(request: web.Request, verb: str) -> web.Response:
    """A hot command through aiohttp: the same code as the front door's fast path."""
    doc = await hot.VERBS[verb](
        request.app,
        request.match_info["name"],
        await request.read(),
        request.content_type in MSGPACK_TYPES,
        wants_msgpack(request),
    )
    return reply(request, doc)


@routes.post("/v1/queues/{name}/messages")
async def put_messages(request: web.Request) -> web.Response:
    return await _hot(request, "messages")


@routes.post("/v1/queues/{name}/take")
async def take_messages(request: web.Request) -> web.Response:
    return await _hot(request, "take")


@routes.post("/v1/queues/{name}/ack")
async def ack_messages(request: web.Request) -> web.Response:
    return await _hot(request, "ack")


@routes.post("/v1/queues/{name}/release")
async def release_messages(request: web.Request) -> web.Response:
    return await _hot(request, "release")


@routes.post("/v1/queues/{name}/touch")
async def touch_messages(request: web.Request) -> web.Response:
    return await _hot(request, "touch")


@routes.get("/v1/queues/{name}/messages")
async def browse_messages(request: web.Request) -> web.Response:
    """A page of the messages in one state (``?state=ready|delayed|reserved&limit=N&after=C``;
    order and cursor: actors/core/browse.py)."""
    name = queue_name(request)
    page = await run(request, name, browse_command(request.query))
    binary = wants_msgpack(request)
    messages = [wire.view_doc(v, binary=binary) for v in page.messages]
    return reply(request, {"messages": messages, "next": page.next})


def browse_command(query: Mapping[str, str]) -> cmd.Browse:
    """The Browse command of a query string (the engine checks state and cursor).

    Raises:
        BadRequest: a limit that is not a whole number.
    """
    limit = query.get("limit", str(BROWSE_LIMIT))
    if not limit.isascii() or not limit.isdigit() or len(limit) > 9:
        raise BadRequest(f"limit must be a whole number, 1-{MAX_BATCH}")
    return cmd.Browse(query.get("state", "ready"), int(limit), query.get("after"))


@routes.get("/v1/queues/{name}/messages/{id}")
async def get_message(request: web.Request) -> web.Response:
    name = queue_name(request)
    view = await run(request, name, cmd.Peek(request.match_info["id"]))
    return reply(request, wire.view_doc(view, binary=wants_msgpack(request)))


@routes.patch("/v1/queues/{name}/messages/{id}")
async def patch_message(request: web.Request) -> web.Response:
    name = queue_name(request)
    req = await body(request, wire.MessagePatchIn)
    view = await run(request, name, wire.update_command(request.match_info["id"], req))
    return reply(request, wire.view_doc(view, binary=wants_msgpack(request)))


@routes.delete("/v1/queues/{name}/messages/{id}")
async def delete_message(request: web.Request) -> web.Response:
    name = queue_name(request)
    lease = request.query.get("lease")
    force = request.query.get("force", "false")
    if force not in ("true", "false"):
        raise BadRequest("force is true or false")
    if force == "true":  # a reserved one without its lease: the queue's admins only
        token = request.get(TOKEN)
        if token is not None and token.level(name) < LEVELS["admin"]:
            raise Forbidden(f"deleting a reserved message needs its lease or admin on {name}")
    command = cmd.Delete(request.match_info["id"], lease, force == "true")
    await run(request, name, command)
    return web.Response(status=204)
