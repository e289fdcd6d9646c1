"""The hot commands — put, take, ack, release, touch — from request body to reply document,
with no HTTP in between: aiohttp's routes (:mod:`gateway.native`) and the front door's fast
path (:mod:`gateway.fast`) both call these, so there is one piece of code for what the
commands do, validate and answer. Validation is :mod:`gateway.wire`'s, errors are raised as
:class:`QueueError` and mapped by :mod:`gateway.errors`.

Each function takes the application (for the batchers, the directory, the options), the
queue's name as it appears in the path, the raw body, whether it is msgpack, and whether
bodies go back as bytes (msgpack replies) — and returns the reply document.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from actors.core import commands as cmd
from actors.directory import Directory
from actors.errors import Overloaded, QueueError, QueueNotFound
from actors.settings import QueueSettings, validate_queue_name
from gateway import wire
from gateway.batcher import Batchers

__all__ = [
    "BATCHERS",
    "DIRECTORY",
    "OPTIONS",
    "SHUTTING_DOWN",
    "VERBS",
    "WAITING_TAKES",
    "Options",
    "Verb",
    "waiting_take",
]


class Options(msgspec.Struct, frozen=True, kw_only=True):
    """What the handlers need to know of the server's settings."""

    auto_create: bool = False
    max_waiting_takes: int = 50_000


DIRECTORY = web.AppKey("directory", Directory)
BATCHERS = web.AppKey("batchers", Batchers)
OPTIONS = web.AppKey("options", Options)
WAITING_TAKES = web.AppKey("waiting_takes", list)  # one mutable counter: [n]
SHUTTING_DOWN = web.AppKey("shutting_down", asyncio.Event)

# (app, queue name from the path, body, body is msgpack, reply bodies as bytes) -> document
Verb = Callable[[web.Application, str, bytes, bool, bool], Awaitable[Any]]


async def run(app: web.Application, queue: str, command: object) -> Any:
    """One command on one queue, batched with its neighbours. Raises: QueueError."""
    return await app[BATCHERS].submit(queue, command)


async def put(app: web.Application, name: str, body: bytes, msgpack: bool, binary: bool) -> Any:
    """``POST /v1/queues/{name}/messages``. Raises: QueueError."""
    validate_queue_name(name)
    command = wire.put_command(wire.decode(body, wire.PutIn, msgpack=msgpack))
    try:
        results = await run(app, name, command)
    except QueueNotFound:
        if not app[OPTIONS].auto_create:
            raise
        await app[DIRECTORY].create(name, QueueSettings(fifo=name.endswith(".fifo")), [])
        results = await run(app, name, command)
    return {"results": [{"id": r.id, "status": r.status} for r in results]}


async def take(app: web.Application, name: str, body: bytes, msgpack: bool, binary: bool) -> Any:
    """``POST /v1/queues/{name}/take``: at once when messages are ready; a long poll (one
    call the shard holds until messages are ready) only when there are none. Raises:
    QueueError."""
    validate_queue_name(name)
    command, wait_s = wire.take_command(wire.decode(body, wire.TakeIn, msgpack=msgpack))
    deliveries = await run(app, name, command)
    if not deliveries and wait_s > 0:
        deliveries = await waiting_take(app, name, command, wait_s)
    return {"messages": [wire.delivery_doc(d, binary=binary) for d in deliveries]}


async def waiting_take(app: web.Application, name: str, take: cmd.Take, wait_s: float) -> Any:
    """A long-poll take: one call that the shard holds until messages are ready.

    Raises:
        Overloaded: too many takes waiting in this gateway.
        QueueError: the take's error.
    """
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
        # Also when the client went away (the caller is cancelled): a take left waiting
        # would reserve the next message for nobody.
        shutdown.cancel()
        taking.cancel()
        counter[0] -= 1
    if isinstance(result, QueueError):
        raise result
    return result


def _items(decode_type: type[Any], build: Callable[[Any], object]) -> Verb:
    """A verb on leases (ack, release, touch): per-item results."""

    async def verb(
        app: web.Application, name: str, body: bytes, msgpack: bool, binary: bool
    ) -> Any:
        validate_queue_name(name)
        command = build(wire.decode(body, decode_type, msgpack=msgpack))
        results = await run(app, name, command)
        return {"results": [wire.item_doc(r) for r in results]}

    return verb


ack = _items(wire.AckIn, wire.ack_command)
release = _items(wire.ReleaseIn, wire.release_command)
touch = _items(wire.TouchIn, wire.touch_command)

# The last part of the path, ``POST /v1/queues/{name}/<verb>``, -> the verb.
VERBS: dict[str, Verb] = {
    "messages": put,
    "take": take,
    "ack": ack,
    "release": release,
    "touch": touch,
}
