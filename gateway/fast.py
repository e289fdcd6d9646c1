"""The hot commands over HTTP/1.1 without aiohttp's request machinery.

A connection whose first request is ``POST /v1/queues/…`` is handed by the front door
(:mod:`gateway.door`) to :class:`FastHttp`, which parses each request with httptools (the
llhttp parser), serves ``POST /v1/queues/{name}/{messages|take|ack|release|touch}`` through
the same functions as aiohttp's routes (:mod:`gateway.hot`: :mod:`gateway.wire`'s validation,
:mod:`gateway.errors`' error table), with the same auth, limits and metrics, and writes the
reply itself. The first request it does not serve — any other route, a query string or a
percent-encoded path, chunked bodies, ``Expect``, HTTP/1.0, an upgrade, a head too long for
it — goes back to the door with every byte not yet consumed, and from there to aiohttp (or a
watch), so every other route and every error of those stays aiohttp's. A head that is not
HTTP (llhttp refuses it: two lengths, a length and chunked, bytes a header may not hold) is
answered 400 here and counted against its sender (:mod:`gateway.penalty`).

One request is served at a time per connection: a pipelining client's next request waits in
the buffer until the reply before it is written, so replies keep their order. While a
request is served, the connection stops reading once ``PIPELINE_BUFFER`` bytes wait behind
it (TCP then holds the client back), and reads again once they are served. Replies the
client does not read fill the socket's buffers, then the transport's past its high-water
mark: then nothing more is served until they drain (``pause_writing``). A client that
pipelines without reading its replies thus costs the gateway the requests those buffers
answer, and holds at most ``PIPELINE_BUFFER``, one read and one reply more.

A client that hangs up cancels its request (a waiting take must not reserve a message for
nobody); one that hangs up while reading is paused, with that much pipelined behind its
request, is noticed once the request is answered. A request that fails unexpectedly is
answered 500, and the connection goes on.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import time
from email.utils import formatdate
from typing import Any

import httptools
import msgspec
from aiohttp import web

from actors.clock import SystemClock
from actors.errors import QueueError
from gateway import limits
from gateway.auth import AUTH, Denial, authorize, presented, retry_after
from gateway.errors import (
    MAX_BODY,
    MSGPACK,
    MSGPACK_TYPES,
    RETRY_AFTER_S,
    prefers_msgpack,
    retry_seconds,
    status_of,
)
from gateway.hot import VERBS
from gateway.metrics import METRICS

__all__ = ["FAST", "PREFIX", "Fast", "FastHttp", "Malformed", "may_be_fast"]

log = logging.getLogger(__name__)

PREFIX = b"POST /v1/queues/"  # what a fast connection's first request starts with
HEAD_LIMIT = 8192  # a longer head is aiohttp's to refuse
PIPELINE_BUFFER = 256 * 1024  # bytes read ahead of the request being served, at most
PIPELINED_TURNS = 2  # pipelined requests served at once per process (Turns)
# A request that is coming (head or body) must make progress: REQUEST_S without
# PROGRESS_BYTES more of it and it is answered 408 and the connection closed (a slowloris
# holds a connection for that long, not for ever).
REQUEST_S = 30.0
PROGRESS_BYTES = 1024
_PATH = re.compile(rb"/v1/queues/([A-Za-z0-9_.-]{1,100})/(messages|take|ack|release|touch)")
# Each verb's route as aiohttp names it (metrics and auth rules), built once.
_ROUTE = {verb: f"/v1/queues/{{name}}/{verb}" for verb in VERBS}
_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    408: b"Request Timeout",
    409: b"Conflict",
    413: b"Payload Too Large",
    429: b"Too Many Requests",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}
_json = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()


_date: list[Any] = [b"", -1]


def http_date(now_ms: int) -> bytes:
    """The ``Date`` header's value, made once a second."""
    second = now_ms // 1000
    if second != _date[1]:
        _date[0], _date[1] = formatdate(second, usegmt=True).encode(), second
    return _date[0]


class Fast:
    """What the fast path of one gateway process shares."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.clock = SystemClock()
        self.turns = Turns(PIPELINED_TURNS)

    def date(self) -> bytes:
        """The Date header's value now."""
        return http_date(self.clock.now_ms())


FAST = web.AppKey("fast", Fast)


class Turns:
    """Turns for pipelined requests: at most ``slots`` of them served at once in a process.

    A pipelined request is one that was already waiting when the reply before it on its
    connection was written: a client that reads each reply before it sends the next request
    (every HTTP client we know of) never has one, and never waits for a turn. A client that
    pipelines (one that never reads its replies, above all) is served a few requests at a
    time, however many connections it opens, instead of the whole gateway's time: 20 such
    connections put the other clients' p99 at 2.6-3.8 times a quiet server's without turns
    (loadtest/RESULTS.md)."""

    __slots__ = ("free", "waiting")

    def __init__(self, slots: int) -> None:
        self.free = slots
        self.waiting: collections.deque[FastHttp] = collections.deque()

    def ask(self, connection: FastHttp) -> bool:
        """A turn for ``connection`` now (True), or once one is free (False: it waits, and
        :meth:`done` gives it one)."""
        if self.free > 0:
            self.free -= 1
            return True
        self.waiting.append(connection)
        return False

    def done(self) -> None:
        """A turn ends: the connection waiting longest gets it (if any still wants it)."""
        self.free += 1
        while self.free > 0 and self.waiting:
            connection = self.waiting.popleft()
            self.free -= 1
            if not connection.granted():
                self.free += 1


class _Head:
    """What the parser saw of one request head (httptools' callbacks)."""

    __slots__ = ("accept", "authorization", "content_type", "done", "length", "other", "url")

    def __init__(self) -> None:
        self.url = b""
        self.content_type = b""
        self.accept = b""
        self.authorization = b""
        self.length: bytes | None = None
        self.other = False  # a header the fast path does not handle (Expect, chunked…)
        self.done = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self.other = self.other or self.length is not None
            self.length = value.strip()
        elif name == b"content-type":
            self.content_type = value.split(b";", 1)[0].strip().lower()
        elif name == b"accept":
            self.accept = value
        elif name == b"authorization":
            self.authorization = value
        elif name in (b"expect", b"transfer-encoding", b"upgrade"):
            self.other = True

    def on_headers_complete(self) -> None:
        self.done = True


class FastHttp(asyncio.Protocol):
    """One connection served by the fast path (see the module docstring)."""

    def __init__(self, fast: Fast, doorway: Any) -> None:
        self.fast = fast
        self.app = fast.app
        self.doorway = doorway  # gateway.door.Doorway: where what we do not serve goes
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.closing = False
        self.paused = False  # reading paused: PIPELINE_BUFFER bytes wait behind a request
        # The client does not read its replies: they fill the transport past its high-water
        # mark. Nothing more is served (nor read, past PIPELINE_BUFFER) until they drain.
        self.blocked = False
        self.pipelined = False  # the next request came before the reply to the last one
        self.turn = False  # the request served holds one of the Turns
        self.queued = False  # waiting for a turn
        self._timer: asyncio.TimerHandle | None = None  # a request coming: its deadline
        self._mark = 0  # how much of it had come when the deadline was set

    # ---------------------------------------------------------------- the connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.app[limits.FAST_CONNECTIONS].add(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.task is None:
            self._next()
            self._watch()
        self._flow()

    def _watch(self) -> None:
        """Set, move or drop the deadline of the request that is coming (if one is)."""
        coming = (
            self.task is None
            and not (self.blocked or self.queued)
            and bool(self.buf)
            and self.transport is not None
        )
        if not coming:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        if self._timer is None or len(self.buf) - self._mark >= PROGRESS_BYTES:
            if self._timer is not None:
                self._timer.cancel()
            self._mark = len(self.buf)
            self._timer = asyncio.get_running_loop().call_later(REQUEST_S, self._too_slow)

    def _too_slow(self) -> None:
        """The request coming made no progress for REQUEST_S: 408, and close."""
        self._timer = None
        transport = self.transport
        if transport is None or self.task is not None or not self.buf:
            return
        self._offended(transport, 408, "RequestTimeout", "the request came too slowly", "too_slow")

    def _flow(self) -> None:
        """Read while no request is served (the one in the buffer may still be coming) or
        while less than ``PIPELINE_BUFFER`` waits behind the one served; else pause."""
        transport = self.transport
        if transport is None:
            return
        busy = self.task is not None or self.blocked or self.queued
        full = busy and len(self.buf) >= PIPELINE_BUFFER
        if full != self.paused:
            self.paused = full
            if full:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def pause_writing(self) -> None:
        self.blocked = True
        self._watch()
        self._flow()

    def resume_writing(self) -> None:
        self.blocked = False
        if self.task is None and self.transport is not None and not self.closing:
            self._next()
            self._watch()
        self._flow()

    def eof_received(self) -> bool:
        return False  # the client hung up: close, and cancel its request (as aiohttp does)

    def connection_lost(self, exc: Exception | None) -> None:
        self.app[limits.FAST_CONNECTIONS].discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.task is not None:
            self.task.cancel()  # the client went away: so does its request
        self.transport = None

    def close(self) -> None:
        """Close once the request in flight (if any) is answered (graceful shutdown)."""
        self.closing = True
        if self.task is None and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close now (the end of a graceful shutdown's wait)."""
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------------- requests

    def _next(self) -> None:
        """Serve the next request in the buffer (a pipelined one in its turn), or wait for
        more bytes."""
        if not self.buf or self.blocked or self.queued or self.task is not None:
            return
        turns = self.fast.turns
        if self.pipelined and not self.turn:
            if not turns.ask(self):
                self.queued = True
                return
            self.turn = True
        self._start()
        if self.task is None and self.turn:  # nothing started (a request still coming…)
            self.turn = False
            turns.done()

    def granted(self) -> bool:
        """A turn came (:class:`Turns`): whether it was taken, to serve the next request."""
        self.queued = False
        if self.transport is None or self.closing or self.blocked or self.task is not None:
            return False
        self.turn = True
        self._start()
        if self.task is None:
            self.turn = False
            return False
        self._watch()
        self._flow()
        return True

    def _start(self) -> None:
        """Start serving the request in the buffer if it is whole; hand the connection back
        to the door if it is not ours to serve."""
        buf = self.buf
        if not may_be_fast(buf):
            self._give_back()
            return
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > HEAD_LIMIT:
                self._give_back()
            return
        if end + 4 > HEAD_LIMIT:
            self._give_back()  # aiohttp's limits decide (it may be one long header too many)
            return
        try:
            head, route = self._parse(bytes(buf[: end + 4]))
        except Malformed as exc:
            self._malformed(str(exc))
            return
        if route is None:
            self._give_back()
            return
        size = route[2]
        if size > self.app[MAX_BODY]:
            self._give_back()  # aiohttp answers 413 and reads what it must
            return
        start = end + 4
        if len(buf) - start < size:
            return  # the body is still coming
        with memoryview(buf) as view:  # one copy of the body, not two (it may be 90 MiB)
            body = bytes(view[start : start + size])
        del buf[: start + size]
        assert head is not None
        self.task = asyncio.get_running_loop().create_task(self._serve(route, head, body))

    def _parse(self, raw: bytes) -> tuple[_Head | None, tuple[str, str, int, bool] | None]:
        """The head and the route (queue, verb, body size, keep-alive), or no route when
        the fast path does not serve this request."""
        head = _Head()
        parser = httptools.HttpRequestParser(head)
        try:
            parser.feed_data(raw)
        except httptools.HttpParserUpgrade:
            # an upgrade (Connection: Upgrade with Upgrade:) is not an HttpParserError: it
            # escaped here and dropped the connection unanswered (found by loadtest/fuzz.py)
            return None, None
        except httptools.HttpParserError as exc:
            # Not HTTP as llhttp reads it (aiohttp's parser is llhttp too, as strict): both
            # a Content-Length and a Transfer-Encoding, two lengths, bytes a header may not
            # hold. Answered here, at a fraction of what handing it to aiohttp cost.
            raise Malformed(_llhttp_reason(exc)) from None
        if not head.done or head.other or parser.get_method() != b"POST":
            return None, None
        if parser.get_http_version() != "1.1" or parser.should_upgrade():
            return None, None
        found = _PATH.fullmatch(head.url)
        if found is None or not (head.length or b"0").isdigit():
            return None, None
        keep_alive = parser.should_keep_alive()
        size = int(head.length or 0)
        return head, (found.group(1).decode(), found.group(2).decode(), size, keep_alive)

    def _malformed(self, reason: str) -> None:
        """The request in the buffer is not HTTP: 400, close, and count it against the
        sender (gateway/penalty.py)."""
        transport = self.transport
        if transport is None:
            return
        self.closing = True
        self.buf.clear()
        message = f"malformed HTTP request: {reason}"
        self._offended(transport, 400, "BadRequest", message, "malformed", reason)

    def _offended(
        self,
        transport: asyncio.Transport,
        status: int,
        code: str,
        message: str,
        offence: str,
        detail: str = "",
    ) -> None:
        """Answer a request that failed as HTTP with ``status``, close, and count it against
        its sender (gateway/penalty.py)."""
        body = _json.encode({"error": {"code": code, "message": message}})
        transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (status, _REASONS[status], len(body), body)
        )
        transport.close()
        limits.offend(self.app, limits.peer_address(transport), offence, detail)

    def _give_back(self) -> None:
        """Not ours to serve: the door (and aiohttp) take the connection from here, with
        every byte not consumed yet."""
        transport, self.transport = self.transport, None
        self.app[limits.FAST_CONNECTIONS].discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if transport is not None and self.paused:
            self.paused = False
            transport.resume_reading()  # aiohttp reads from here on
        if transport is not None and not transport.is_closing():
            data, self.buf = bytes(self.buf), bytearray()
            self.doorway.reopen(transport, data, fast=False)

    async def _serve(self, route: tuple[str, str, int, bool], head: _Head, body: bytes) -> None:
        queue, verb, _, keep_alive = route
        started = time.perf_counter()  # for the latency histogram, as aiohttp's middleware
        msgpack = head.content_type in _MSGPACK
        binary = prefers_msgpack(head.accept.decode("latin-1"), head.content_type.decode("latin-1"))
        try:
            status, payload, extra = await self._answer(queue, verb, head, body, msgpack, binary)
        except asyncio.CancelledError:
            return  # the client hung up
        except Exception:
            # Whatever failed, the client gets an answer and the connection goes on to the
            # next request: it must not stay busy (or paused) with nothing left to wake it.
            log.exception("unhandled error in POST /v1/queues/%s/%s", queue, verb)
            status, payload, extra = 500, _INTERNAL[binary], b""
        finally:
            self.task = None
            if self.turn:
                self.turn = False
                self.fast.turns.done()
        self._write(status, payload, binary, extra, keep_alive)
        self.app[METRICS].observe(_ROUTE[verb], "POST", status, time.perf_counter() - started)
        if self.transport is not None and not self.closing:
            self.pipelined = bool(self.buf)
            self._next()
            self._watch()
            self._flow()

    async def _answer(
        self, queue: str, verb: str, head: _Head, body: bytes, msgpack: bool, binary: bool
    ) -> tuple[int, bytes, bytes]:
        """Status, encoded document, extra header lines."""
        app = self.app
        auth = app.get(AUTH)
        if auth is not None and auth.enabled:
            token = presented(head.authorization.decode("latin-1") or None, None)
            path = f"/v1/queues/{queue}/{verb}"
            verdict = authorize(auth, "POST", _ROUTE[verb], path, token, queue)
            if isinstance(verdict, Denial):
                return _denied(verdict, binary)
        refused = limits.refuse(app, self._held())
        if refused is not None:
            exc, close = refused
            self.closing = self.closing or close
            return _error(exc, binary)
        counter = app[limits.IN_FLIGHT]
        counter[0] += 1
        try:
            doc = await VERBS[verb](app, queue, body, msgpack, binary)
        except QueueError as exc:
            return _error(exc, binary)
        except Exception:
            log.exception("unhandled error in POST /v1/queues/%s/%s", queue, verb)
            return 500, _INTERNAL[binary], b""
        finally:
            counter[0] -= 1
        return 200, _encode(doc, binary), b""

    def _held(self) -> int:
        return limits.connections(self.app, self.doorway.server)

    def _write(self, status: int, payload: bytes, binary: bool, extra: bytes, keep: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        close = self.closing or not keep
        head = _HEAD % (
            status,
            _REASONS.get(status, b"Error"),
            MSGPACK.encode() if binary else b"application/json",
            len(payload),
            self.fast.date(),
            extra,
            b"Connection: close\r\n" if close else b"",
        )
        if len(payload) > _JOINED_UP_TO:
            transport.write(head)  # a large reply is not copied once more to join its head
            transport.write(payload)
        else:
            transport.write(head + payload)
        if close:
            self.closing = True  # serve nothing pipelined after it (RFC 9112, 9.6)
            transport.close()


_MSGPACK = {t.encode() for t in MSGPACK_TYPES}
_JOINED_UP_TO = 1 << 20  # replies up to this size go out with their head in one write
_HEAD = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nDate: %s\r\n%s%s\r\n"


class Malformed(Exception):
    """A request head llhttp refuses (its reason as the message)."""


def _llhttp_reason(exc: Exception) -> str:
    """llhttp's reason, without the bytes it quotes (they are the sender's)."""
    text = str(exc.args[0] if exc.args else exc)
    return text.split(":", 1)[0].strip()[:100] or type(exc).__name__


def may_be_fast(data: bytes | bytearray) -> bool:
    """Whether ``data`` is, or may still become, a request the fast path could serve."""
    start = bytes(data[: len(PREFIX)])
    return PREFIX.startswith(start) if len(start) < len(PREFIX) else start == PREFIX


def _encode(doc: Any, binary: bool) -> bytes:
    return _msgpack.encode(doc) if binary else _json.encode(doc)


_INTERNAL_DOC = {"error": {"code": "InternalError", "message": "internal error"}}
_INTERNAL = {False: msgspec.json.encode(_INTERNAL_DOC), True: msgspec.msgpack.encode(_INTERNAL_DOC)}


def _error(exc: QueueError, binary: bool) -> tuple[int, bytes, bytes]:
    status = status_of(exc)
    extra = b""
    if status in RETRY_AFTER_S:
        wait = retry_seconds(exc)
        extra = b"Retry-After: %d\r\n" % (RETRY_AFTER_S[status] if wait is None else wait)
    return status, _encode({"error": {"code": exc.code, "message": exc.message}}, binary), extra


def _denied(denial: Denial, binary: bool) -> tuple[int, bytes, bytes]:
    extra = b""
    if denial.status == 401:
        extra += b'WWW-Authenticate: Bearer realm="evq"\r\n'
    if denial.wait is not None:
        extra += b"Retry-After: %s\r\n" % retry_after(denial.wait).encode()
    elif denial.status in RETRY_AFTER_S:
        extra += b"Retry-After: %d\r\n" % RETRY_AFTER_S[denial.status]
    doc = {"error": {"code": denial.code, "message": denial.message}}
    return denial.status, _encode(doc, binary), extra
