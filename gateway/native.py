"""Handlers of the native API (API.md, WIRE.md): parse → command → directory → document.

Thin on purpose: validation happens in :mod:`gateway.wire` (before anything reaches an
actor), errors are raised and mapped by :mod:`gateway.errors`, and every per-queue command
goes through that queue's batcher.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from aiohttp import web

from actors.core import commands as cmd
from actors.errors import BadRequest, Overloaded, QueueError, QueueNotFound
from actors.settings import QueueSettings, validate_queue_name
from gateway import wire
from gateway.auth import TOKEN
from gateway.batcher import Batchers
from gateway.directory import Directory
from gateway.errors import MSGPACK, wants_msgpack

__all__ = ["BATCHERS", "DIRECTORY", "OPTIONS", "Options", "routes"]


class Options(msgspec.Struct, frozen=True, kw_only=True):
    """What the handlers need to know of the server's settings."""

    auto_create: bool = False
    max_waiting_takes: int = 50_000


DIRECTORY = web.AppKey("directory", Directory)
BATCHERS = web.AppKey("batchers", Batchers)
OPTIONS = web.AppKey("options", Options)
WAITING_TAKES = web.AppKey("waiting_takes", list)  # one mutable counter: [n]
SHUTTING_DOWN = web.AppKey("shutting_down", asyncio.Event)

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
    msgpack = request.content_type in (MSGPACK, "application/x-msgpack")
    return wire.decode(await request.read(), type_, msgpack=msgpack)


def queue_name(request: web.Request) -> str:
    """The queue named in the path. Raises: BadRequest."""
    return validate_queue_name(request.match_info["name"])


async def run(request: web.Request, queue: str, command: object) -> Any:
    """One command on one queue, batched with its neighbours. Raises: QueueError."""
    return await request.app[BATCHERS].submit(queue, command)


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


# ------------------------------------------------------------------ messages


@routes.post("/v1/queues/{name}/messages")
async def put_messages(request: web.Request) -> web.Response:
    name = queue_name(request)
    command = wire.put_command(await body(request, wire.PutIn))
    try:
        results = await run(request, name, command)
    except QueueNotFound:
        if not request.app[OPTIONS].auto_create:
            raise
        await request.app[DIRECTORY].create(name, QueueSettings(fifo=name.endswith(".fifo")), [])
        results = await run(request, name, command)
    return reply(request, {"results": [{"id": r.id, "status": r.status} for r in results]})


@routes.post("/v1/queues/{name}/take")
async def take_messages(request: web.Request) -> web.Response:
    name = queue_name(request)
    take, wait_s = wire.take_command(await body(request, wire.TakeIn))
    if wait_s <= 0:
        deliveries = await run(request, name, take)
    else:
        deliveries = await _waiting_take(request, name, take, wait_s)
    binary = wants_msgpack(request)
    return reply(request, {"messages": [wire.delivery_doc(d, binary=binary) for d in deliveries]})


async def _waiting_take(request: web.Request, name: str, take: cmd.Take, wait_s: float) -> Any:
    """A long-poll take: one call that the shard holds until messages are ready.

    Raises:
        Overloaded: too many takes waiting in this gateway.
        QueueError: the take's error.
    """
    app = request.app
    counter = app[WAITING_TAKES]
    if counter[0] >= app[OPTIONS].max_waiting_takes:
        raise Overloaded("too many takes are waiting; retry shortly")
    counter[0] += 1
    shutdown = asyncio.ensure_future(app[SHUTTING_DOWN].wait())
    taking = asyncio.ensure_future(app[DIRECTORY].take(name, take, wait_s))
    try:
        done, _ = await asyncio.wait({taking, shutdown}, return_when=asyncio.FIRST_COMPLETED)
        if taking not in done:
            return []  # the server is going down: answer "nothing yet"
        result = taking.result()
    finally:
        # Also when the client went away (the handler is cancelled): a take left waiting
        # would reserve the next message for nobody.
        shutdown.cancel()
        taking.cancel()
        counter[0] -= 1
    if isinstance(result, QueueError):
        raise result
    return result


@routes.post("/v1/queues/{name}/ack")
async def ack_messages(request: web.Request) -> web.Response:
    name = queue_name(request)
    results = await run(request, name, wire.ack_command(await body(request, wire.AckIn)))
    return reply(request, {"results": [wire.item_doc(r) for r in results]})


@routes.post("/v1/queues/{name}/release")
async def release_messages(request: web.Request) -> web.Response:
    name = queue_name(request)
    results = await run(request, name, wire.release_command(await body(request, wire.ReleaseIn)))
    return reply(request, {"results": [wire.item_doc(r) for r in results]})


@routes.post("/v1/queues/{name}/touch")
async def touch_messages(request: web.Request) -> web.Response:
    name = queue_name(request)
    results = await run(request, name, wire.touch_command(await body(request, wire.TouchIn)))
    return reply(request, {"results": [wire.item_doc(r) for r in results]})


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
    await run(request, name, cmd.Delete(request.match_info["id"], lease))
    return web.Response(status=204)
