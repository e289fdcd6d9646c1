"""``PUT /v1/keys/{key}`` sets a user key (in the shard that holds it); ``GET
/v1/keys/{key}`` reads any key: ``sys:`` keys from this process's hub, the others from their
shard."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from actors.errors import BadRequest, TooLarge
from actors.keyspace import QUEUE_PREFIX, SYS_PREFIX, set_key_command
from gateway import native
from gateway.watches.watchers import HUB, request_key, state_doc

__all__ = ["MAX_VALUE_BYTES", "get_key", "routes", "set_key"]

MAX_VALUE_BYTES = 64 * 1024

routes = web.RouteTableDef()

_json = msgspec.json.Encoder()


class KeyIn(msgspec.Struct, forbid_unknown_fields=True):
    value: Any


@routes.put("/v1/keys/{key:.+}")
async def set_key(request: web.Request) -> web.Response:
    key = request_key(request)
    if key.startswith((SYS_PREFIX, QUEUE_PREFIX)):
        raise BadRequest("sys: and queue: keys are maintained by the server", key=key)
    req = await native.body(request, KeyIn)
    size = len(_json.encode(req.value))
    if size > MAX_VALUE_BYTES:
        raise TooLarge(f"a key's value is at most {MAX_VALUE_BYTES} bytes as JSON", size=size)
    view = await native.run(request, *set_key_command(key, req.value))
    return native.reply(request, {"key": key, "version": view.version})


@routes.get("/v1/keys/{key:.+}")
async def get_key(request: web.Request) -> web.Response:
    key = request_key(request)
    if key.startswith(SYS_PREFIX):
        state = request.app[HUB].state(key)
        doc = state_doc(state) if state else {"key": key, "version": 0, "value": None}
        return native.reply(request, doc)
    view = await request.app[native.DIRECTORY].watch_key(key, -1)
    return native.reply(request, {"key": key, "version": view.version, "value": view.value})
