"""A FAKE evq server for wire-level tests of the client — not the real server.

It speaks just enough of gateway/WIRE.md (JSON and msgpack) to exercise every client
method, keeps everything in memory, and can inject faults per endpoint: an error status
(with Retry-After), a connection dropped before handling, or one dropped after handling
(the reply is lost, the effect stays). It records every request it sees.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

JSON = "application/json"
MSGPACK = "application/msgpack"
Handler = Callable[[web.Request, Any], Awaitable[web.StreamResponse]]


@dataclass
class Fault:
    """One injected failure: ``status`` (with ``code`` / ``retry_after``) or a dropped link."""

    status: int | None = None
    code: str = "Overloaded"
    retry_after: str | None = None
    drop: str | None = None  # "before": not handled; "after": handled, reply lost


@dataclass
class Seen:
    """One request as the fake saw it."""

    endpoint: str
    method: str
    path: str
    payload: Any
    headers: dict[str, str]
    peer: Any


@dataclass
class FakeMessage:
    id: str
    body: bytes
    activate_at: float
    enqueued_at: float
    attributes: dict[str, str] | None = None
    group: str | None = None
    receive_count: int = 0
    lease: str | None = None
    lease_expires_at: float = 0.0

    def state(self, now: float) -> str:
        if self.lease is not None and self.lease_expires_at > now:
            return "reserved"
        return "delayed" if self.activate_at > now else "ready"


@dataclass
class FakeQueue:
    name: str
    settings: dict[str, Any]
    messages: dict[str, FakeMessage] = field(default_factory=dict)
    idem: dict[str, str] = field(default_factory=dict)  # idempotency key -> id


DEFAULTS: dict[str, Any] = {
    "id_mode": "server",
    "visibility_timeout": 30,
    "max_receives": None,
    "dead_letter_queue": None,
    "retention": 345600,
    "max_message_bytes": 8388608,
    "fifo": False,
    "delay": 0,
    "idempotency_window": 900,
    "content_based_dedup": False,
    "max_messages": None,
}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str = "") -> None:
        super().__init__(message or code)
        self.status, self.code, self.message = status, code, message or code


class FakeServer:
    """In-memory stand-in for the gateway; ``app`` is its aiohttp application."""

    def __init__(self) -> None:
        self.queues: dict[str, FakeQueue] = {}
        self.keys: dict[str, tuple[int, Any]] = {}
        self.key_changed = asyncio.Condition()
        self.faults: dict[str, list[Fault]] = {}
        self.seen: list[Seen] = []
        self.ready = True
        self._transports: set[Any] = set()
        self._ids = itertools.count(1000)
        self.app = web.Application()
        r = self.app.router
        route = self._route
        r.add_get("/healthz", route("health", self.health))
        r.add_get("/readyz", route("ready", self.readyz))
        r.add_get("/v1/queues", route("list_queues", self.list_queues))
        r.add_put("/v1/queues/{q}", route("create_queue", self.create_queue))
        r.add_get("/v1/queues/{q}", route("get_queue", self.get_queue))
        r.add_patch("/v1/queues/{q}", route("update_queue", self.update_queue))
        r.add_delete("/v1/queues/{q}", route("delete_queue", self.delete_queue))
        r.add_post("/v1/queues/{q}/purge", route("purge", self.purge))
        r.add_post("/v1/queues/{q}/messages", route("put", self.put))
        r.add_post("/v1/queues/{q}/take", route("take", self.take))
        r.add_post("/v1/queues/{q}/ack", route("ack", self.ack))
        r.add_post("/v1/queues/{q}/release", route("release", self.release))
        r.add_post("/v1/queues/{q}/touch", route("touch", self.touch))
        r.add_get("/v1/queues/{q}/messages/{id}", route("get_message", self.get_message))
        r.add_patch("/v1/queues/{q}/messages/{id}", route("update_message", self.update_message))
        r.add_delete("/v1/queues/{q}/messages/{id}", route("delete_message", self.delete_message))
        r.add_put("/v1/keys/{key}", route("set_key", self.set_key))
        r.add_get("/v1/keys/{key}", route("get_key", self.get_key))
        r.add_get("/v1/watch/{key}", route("watch", self.watch))

    def inject(self, endpoint: str, *faults: Fault) -> None:
        """Fail the next calls of ``endpoint``, one fault each, in order."""
        self.faults.setdefault(endpoint, []).extend(faults)

    async def close_connections(self) -> None:
        """Close every connection the server has seen, as an idle keep-alive timeout would."""
        for transport in self._transports:
            transport.close()
        self._transports.clear()

    def calls(self, endpoint: str) -> list[Seen]:
        """Requests seen for ``endpoint`` (injected failures included)."""
        return [s for s in self.seen if s.endpoint == endpoint]

    # ------------------------------------------------------------ plumbing

    def _route(self, endpoint: str, handler: Handler) -> Callable[[web.Request], Awaitable[Any]]:
        async def serve(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            msgpack = request.content_type == MSGPACK
            payload = (msgspec.msgpack if msgpack else msgspec.json).decode(raw) if raw else None
            peer = request.transport.get_extra_info("peername") if request.transport else None
            self._transports.add(request.transport)
            self.seen.append(
                Seen(
                    endpoint, request.method, request.path_qs, payload, dict(request.headers), peer
                )
            )
            fault = self.faults.get(endpoint, [None]).pop(0) if self.faults.get(endpoint) else None
            if fault is not None and fault.drop == "before":
                return self._drop(request)
            if fault is not None and fault.status is not None:
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                return self._reply(request, _error(fault.code), fault.status, headers)
            try:
                response = await handler(request, payload)
            except ApiError as e:
                response = self._reply(request, _error(e.code, e.message), e.status)
            if fault is not None and fault.drop == "after":
                return self._drop(request)
            return response

        return serve

    @staticmethod
    def _drop(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()
        return web.Response(status=500)

    @staticmethod
    def _wants_msgpack(request: web.Request) -> bool:
        accept = request.headers.get("Accept", "")
        return MSGPACK in accept or (request.content_type == MSGPACK and "json" not in accept)

    def _reply(
        self,
        request: web.Request,
        doc: Any,
        status: int = 200,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        if doc is None:
            return web.Response(status=status, headers=headers)
        if self._wants_msgpack(request):
            body, ctype = msgspec.msgpack.encode(doc), MSGPACK
        else:
            body, ctype = msgspec.json.encode(doc), JSON
        return web.Response(status=status, body=body, content_type=ctype, headers=headers)

    def _queue(self, request: web.Request) -> FakeQueue:
        q = self.queues.get(request.match_info["q"])
        if q is None:
            raise ApiError(404, "QueueNotFound", f"no queue {request.match_info['q']!r}")
        return q

    def _message(self, q: FakeQueue, mid: str) -> FakeMessage:
        m = q.messages.get(mid)
        if m is None:
            raise ApiError(404, "MessageNotFound", f"no message {mid!r}")
        return m

    # ------------------------------------------------------------ service

    async def health(self, request: web.Request, _p: Any) -> web.Response:
        return self._reply(request, {"status": "ok"})

    async def readyz(self, request: web.Request, _p: Any) -> web.Response:
        if self.ready:
            return self._reply(request, {"status": "ready"})
        return self._reply(request, {"status": "recovering"}, 503)

    # ------------------------------------------------------------ queues

    def _info(self, q: FakeQueue) -> dict[str, Any]:
        now = time.time()
        states = [m.state(now) for m in q.messages.values()]
        stats = {s: states.count(s) for s in ("ready", "delayed", "reserved")}
        return {"name": q.name, "settings": q.settings, "stats": {**stats, "total": len(states)}}

    async def list_queues(self, request: web.Request, _p: Any) -> web.Response:
        return self._reply(request, {"queues": sorted(self.queues)})

    async def create_queue(self, request: web.Request, p: Any) -> web.Response:
        name = request.match_info["q"]
        p = p or {}
        if unknown := set(p) - set(DEFAULTS):
            raise ApiError(400, "BadRequest", f"unknown fields {sorted(unknown)}")
        q = self.queues.get(name)
        if q is not None:
            if any(q.settings[k] != v for k, v in p.items()):
                raise ApiError(409, "QueueExists", f"queue {name!r} has other settings")
            return self._reply(request, {"name": name, "settings": q.settings, "created": False})
        q = self.queues[name] = FakeQueue(name, {**DEFAULTS, **p})
        return self._reply(request, {"name": name, "settings": q.settings, "created": True}, 201)

    async def get_queue(self, request: web.Request, _p: Any) -> web.Response:
        return self._reply(request, self._info(self._queue(request)))

    async def update_queue(self, request: web.Request, p: Any) -> web.Response:
        q = self._queue(request)
        q.settings.update(p or {})
        return self._reply(request, self._info(q))

    async def delete_queue(self, request: web.Request, _p: Any) -> web.Response:
        del self.queues[self._queue(request).name]
        return self._reply(request, None, 204)

    async def purge(self, request: web.Request, _p: Any) -> web.Response:
        q = self._queue(request)
        n = len(q.messages)
        q.messages.clear()
        return self._reply(request, {"purged": n})

    # ------------------------------------------------------------ messages

    async def put(self, request: web.Request, p: Any) -> web.Response:
        q = self._queue(request)
        now = time.time()
        results = []
        for item in p["messages"]:
            key = item.get("idempotency_key")
            if key is not None and key in q.idem:
                results.append({"id": q.idem[key], "status": "duplicate"})
                continue
            mid = item.get("id") or str(next(self._ids))
            at = item.get("activate_at") or now + (item.get("delay") or q.settings["delay"])
            body = _body_in(item)
            if mid in q.messages:  # a client id again: the same body is a retry
                if q.messages[mid].body != body:
                    raise ApiError(409, "Conflict", f"message {mid!r} exists with another body")
                results.append({"id": mid, "status": "duplicate"})
                continue
            q.messages[mid] = FakeMessage(
                mid, body, at, now, item.get("attributes"), item.get("group")
            )
            if key is not None:
                q.idem[key] = mid
            results.append({"id": mid, "status": "created"})
        return self._reply(request, {"results": results})

    async def take(self, request: web.Request, p: Any) -> web.Response:
        q = self._queue(request)
        deadline = time.time() + (p.get("wait") or 0)
        while True:
            now = time.time()
            ready = [m for m in q.messages.values() if m.state(now) == "ready"]
            if ready or now >= deadline:
                break
            await asyncio.sleep(0.01)
        taken = []
        vt = p.get("visibility_timeout") or q.settings["visibility_timeout"]
        for m in sorted(ready, key=lambda m: m.activate_at)[: p.get("max", 1)]:
            m.lease, m.lease_expires_at = secrets.token_hex(8), now + vt
            m.receive_count += 1
            taken.append({**self._view(m, now, binary=self._wants_msgpack(request))})
            del taken[-1]["state"]
            taken[-1]["lease"] = m.lease
        return self._reply(request, {"messages": taken})

    def _lease_items(self, request: web.Request, p: Any, act: Callable[..., Any]) -> Any:
        q = self._queue(request)
        now = time.time()
        results = []
        for item in p["items"]:
            m = q.messages.get(item["id"])
            if m is None:
                results.append({"id": item["id"], "status": "not_found"})
            elif m.lease != item["lease"] or m.lease_expires_at <= now:
                results.append({"id": item["id"], "status": "stale_lease"})
            else:
                results.append({"id": m.id, "status": "ok", **(act(q, m, item, now) or {})})
        return self._reply(request, {"results": results})

    async def ack(self, request: web.Request, p: Any) -> web.Response:
        return self._lease_items(request, p, lambda q, m, _i, _n: q.messages.pop(m.id) and None)

    async def release(self, request: web.Request, p: Any) -> web.Response:
        def act(_q: FakeQueue, m: FakeMessage, item: dict[str, Any], now: float) -> None:
            m.lease = None
            m.activate_at = item.get("activate_at") or now + (item.get("delay") or 0)

        return self._lease_items(request, p, act)

    async def touch(self, request: web.Request, p: Any) -> web.Response:
        def act(q: FakeQueue, m: FakeMessage, item: dict[str, Any], now: float) -> dict[str, Any]:
            vt = item.get("visibility_timeout") or q.settings["visibility_timeout"]
            m.lease_expires_at = now + vt
            return {"lease_expires_at": m.lease_expires_at}

        return self._lease_items(request, p, act)

    def _view(self, m: FakeMessage, now: float, *, binary: bool) -> dict[str, Any]:
        state = m.state(now)
        return {
            "id": m.id,
            "state": state,
            **_body_out(m.body, binary),
            "activate_at": m.activate_at,
            "enqueued_at": m.enqueued_at,
            "receive_count": m.receive_count,
            "lease_expires_at": m.lease_expires_at if state == "reserved" else None,
            "attributes": m.attributes,
            "group": m.group,
        }

    async def get_message(self, request: web.Request, _p: Any) -> web.Response:
        m = self._message(self._queue(request), request.match_info["id"])
        return self._reply(request, self._view(m, time.time(), binary=self._wants_msgpack(request)))

    def _check_lease(self, m: FakeMessage, lease: str | None, now: float) -> None:
        if m.state(now) == "reserved":
            if lease is None:
                raise ApiError(409, "Conflict", "the message is reserved: give its lease")
            if lease != m.lease:
                raise ApiError(409, "StaleLease", "not the current lease")

    async def update_message(self, request: web.Request, p: Any) -> web.Response:
        m = self._message(self._queue(request), request.match_info["id"])
        now = time.time()
        self._check_lease(m, p.get("lease"), now)
        if "body" in p or "body_b64" in p:
            m.body = _body_in(p)
        if "delay" in p or "activate_at" in p:
            m.activate_at = p.get("activate_at") or now + p["delay"]
            m.lease, m.receive_count = None, 0
        return self._reply(request, self._view(m, now, binary=self._wants_msgpack(request)))

    async def delete_message(self, request: web.Request, _p: Any) -> web.Response:
        q = self._queue(request)
        m = self._message(q, request.match_info["id"])
        self._check_lease(m, request.query.get("lease"), time.time())
        del q.messages[m.id]
        return self._reply(request, None, 204)

    # ------------------------------------------------------------ keys

    async def set_key(self, request: web.Request, p: Any) -> web.Response:
        key = request.match_info["key"]
        version = self.keys.get(key, (0, None))[0] + 1
        self.keys[key] = (version, p["value"])
        async with self.key_changed:
            self.key_changed.notify_all()
        return self._reply(request, {"key": key, "version": version})

    async def get_key(self, request: web.Request, _p: Any) -> web.Response:
        key = request.match_info["key"]
        version, value = self.keys.get(key, (0, None))
        return self._reply(request, {"key": key, "version": version, "value": value})

    async def watch(self, request: web.Request, _p: Any) -> web.Response:
        key = request.match_info["key"]
        seen = int(request.query.get("version", "0"))
        timeout = float(request.query.get("timeout", "30"))

        def past() -> bool:
            return self.keys.get(key, (0, None))[0] > seen

        async with self.key_changed:
            try:
                await asyncio.wait_for(self.key_changed.wait_for(past), timeout)
            except TimeoutError:
                return self._reply(request, None, 204)
        version, value = self.keys[key]
        return self._reply(request, {"key": key, "version": version, "value": value})


def _error(code: str, message: str = "") -> dict[str, Any]:
    return {"error": {"code": code, "message": message or code}}


def _body_in(item: dict[str, Any]) -> bytes:
    if "body_b64" in item:
        return base64.b64decode(item["body_b64"])
    body = item["body"]
    return body.encode() if isinstance(body, str) else bytes(body)


def _body_out(body: bytes, binary: bool) -> dict[str, Any]:
    if binary:
        return {"body": body}
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_b64": base64.b64encode(body).decode()}
