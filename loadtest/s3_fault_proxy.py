"""A fault-injecting HTTP proxy for an S3-protocol server (moto's, in the tests): everything
passes through byte for byte, except the requests a rule picks, which get a fault.

Faults (``Rule.fault``):

- ``internal_error``: answer 500 with S3's ``InternalError`` XML body; not forwarded.
- ``slow_down``: answer 503 with S3's ``SlowDown`` XML body (and ``Retry-After`` if
  ``retry_after_s`` is set); not forwarded.
- ``hang``: read the request, forward nothing, answer nothing for ``hold_s`` seconds (longer
  than the client's timeout), then reset the connection.
- ``reset_upload``: pass on the request head and ``reset_after`` bytes of its body (a
  fraction of it when below 1), then reset both TCP connections (RST): the server sees an
  upload cut short, the client a connection reset.
- ``lost_answer``: forward the request, let the server answer, and lose the answer: reset
  the connection at once (``then="reset"``), after holding it ``hold_s``
  (``then="hang"``), or answer 500 or 503 instead (``then="internal_error"`` or
  ``"slow_down"``, as a load balancer whose backend timed out after writing).
- ``reset_download``: forward the request, pass on the answer's head and ``reset_after`` of
  its body, then reset the connection: a GET cut short.

A rule matches on the method (``"*"``: any), a regular expression searched in the request
path (``/bucket/key``), and optionally on being conditional (``If-None-Match`` or
``If-Match`` present). It fires ``times`` times (``None``: without end), each match with
``probability``, drawn from a ``random.Random(seed)``. The first rule that fires wins.

In-process (the tests)::

    proxy = FaultProxy("http://127.0.0.1:5000", seed=7)
    await proxy.start()                       # or: proxy.start_in_thread() from sync code
    proxy.add(Rule("lost_answer", method="PUT", key=r"/wal/", conditional=True))
    ...  # point the S3 client's endpoint at proxy.url
    proxy.injected                            # [Injected(fault, method, path), ...]
    await proxy.close()                       # or: proxy.stop_thread()

From another process, over HTTP on the proxy's own port (no bucket starts with ``_``)::

    POST   /_faults/rules  {"fault": "slow_down", "method": "PUT", "times": 3}  -> the rule
    PUT    /_faults/rules  {"seed": 1, "rules": [{...}, ...]}   replace the plan
    DELETE /_faults/rules                                        clear it
    GET    /_faults        {"rules": [...], "injected": [...], "requests": N}

    .venv/bin/python loadtest/s3_fault_proxy.py --upstream http://127.0.0.1:5000 --port 9000

evq behind it: ``evq serve --store s3://bucket/prefix --endpoint <proxy url>``; segment PUTs
match ``key=r"/wal/\\d{4}/\\d{20}\\.seg$"``. ``EVQ_S3_REQUEST_TIMEOUT_MS`` and
``EVQ_S3_RETRY_TIMEOUT_MS`` shorten what a hang costs (10 s and 15 s by default).

Plain HTTP/1.1 only (no TLS, no ``Expect: 100-continue``), one upstream connection per
client connection. Standard library only, so a tool can import it as a sibling module.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import random
import re
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["FAULTS", "FaultProxy", "Injected", "Rule"]

FAULTS = ("internal_error", "slow_down", "hang", "reset_upload", "lost_answer", "reset_download")
_THEN = ("reset", "hang", "internal_error", "slow_down")  # what lost_answer does instead
CONTROL = "/_faults"
_CHUNK = 64 * 1024
_ERRORS = {
    "internal_error": (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
    "slow_down": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}


@dataclass
class Rule:
    """Which requests get which fault, how often."""

    fault: str
    method: str = "*"
    key: str = ""  # a regular expression searched in the request's (unquoted) path
    conditional: bool | None = None  # True: only If-None-Match/If-Match requests; False: none
    times: int | None = 1  # None: every match
    probability: float = 1.0
    hold_s: float = 30.0  # hang, and lost_answer with then="hang"
    reset_after: float = 0.5  # reset_upload/_download: body bytes first (a fraction if < 1)
    then: str = "reset"  # lost_answer: "reset", "hang", "internal_error" or "slow_down"
    retry_after_s: int | None = None  # slow_down: a Retry-After header
    fired: int = 0

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; expected one of {FAULTS}")
        if self.then not in _THEN:
            raise ValueError(f"then must be one of {_THEN}, not {self.then!r}")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError("probability must be within [0, 1]")
        self.method = self.method.upper()
        self._key = re.compile(self.key)

    def matches(self, method: str, path: str, conditional: bool) -> bool:
        """Whether the request is one this rule is about (not whether it fires)."""
        if self.times is not None and self.fired >= self.times:
            return False
        if self.method not in ("*", method):
            return False
        if self.conditional is not None and self.conditional != conditional:
            return False
        return self._key.search(path) is not None

    def as_dict(self) -> dict[str, Any]:
        """The rule as JSON-ready fields (what the control endpoint answers)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class Injected:
    """One fault that fired."""

    fault: str
    method: str
    path: str


@dataclass
class _Request:
    method: str
    target: str
    head: bytes  # request line and headers, as received
    headers: dict[str, str]  # lower-cased names
    path: str = field(init=False)

    def __post_init__(self) -> None:
        self.path = unquote(urlsplit(self.target).path)

    @property
    def conditional(self) -> bool:
        return "if-none-match" in self.headers or "if-match" in self.headers

    def body_length(self) -> int | None:
        """Content-Length; None for a chunked body."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            return None
        return int(self.headers.get("content-length", "0") or 0)


class _Closed(Exception):
    """A peer closed the connection mid-message."""


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial.strip():
            raise _Closed from None
        return None
    except (asyncio.LimitOverrunError, ConnectionError):
        raise _Closed from None


def _parse_headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


async def _copy(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None, n: int | None
) -> None:
    """Copy ``n`` bytes (None: up to EOF) from ``reader`` to ``writer`` (None: drop them)."""
    while n is None or n > 0:
        data = await reader.read(_CHUNK if n is None else min(n, _CHUNK))
        if not data:
            if n is None:
                return
            raise _Closed
        if n is not None:
            n -= len(data)
        if writer is not None:
            writer.write(data)
            await writer.drain()


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None) -> None:
    """Copy a chunked body as it is, up to its last chunk and trailers."""
    while True:
        line = await reader.readuntil(b"\r\n")
        if writer is not None:
            writer.write(line)
        if int(line.split(b";", 1)[0].strip(), 16) == 0:
            break
        await _copy(reader, writer, int(line.split(b";", 1)[0].strip(), 16) + 2)  # and CRLF
    while True:  # trailers, then an empty line
        line = await reader.readuntil(b"\r\n")
        if writer is not None:
            writer.write(line)
        if line == b"\r\n":
            break
    if writer is not None:
        await writer.drain()


async def _relay_body(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter | None,
    headers: dict[str, str],
    *,
    until_eof: bool = False,
) -> None:
    """Copy one message body (Content-Length, chunked, or up to EOF) from ``reader`` to
    ``writer`` (None: read and drop it)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        await _copy_chunked(reader, writer)
    elif "content-length" in headers:
        await _copy(reader, writer, int(headers["content-length"]))
    elif until_eof:
        await _copy(reader, writer, None)


async def _send(
    reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, headers: dict[str, str]
) -> bool:
    """Relay a request body upstream; False if the upstream stopped taking it."""
    try:
        await _relay_body(reader, up_writer, headers)
        await up_writer.drain()
    except (ConnectionError, _Closed):
        return False
    return True


def _part(rule: Rule, length: int) -> int:
    """How many of ``length`` body bytes pass before a reset."""
    part = int(length * rule.reset_after) if rule.reset_after < 1 else int(rule.reset_after)
    return min(part, length)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close the connection with a TCP RST (SO_LINGER 0), as a crashed peer or middlebox."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _error_response(fault: str, rule: Rule, request: _Request, n: int) -> bytes:
    status, reason, code, message = _ERRORS[fault]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{request.path}</Resource><RequestId>FAULT{n:08d}</RequestId></Error>"
    ).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/xml",
        f"Content-Length: {len(body)}",
        f"x-amz-request-id: FAULT{n:08d}",
    ]
    if fault == "slow_down" and rule.retry_after_s is not None:
        head.append(f"Retry-After: {rule.retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class FaultProxy:
    """The proxy: ``url`` in front of ``upstream``, with a plan of :class:`Rule`."""

    def __init__(
        self, upstream: str, *, host: str = "127.0.0.1", port: int = 0, seed: int = 0
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream = (parts.hostname, parts.port)
        self.host = host
        self.port = port
        self.seed = seed
        self.rules: list[Rule] = []
        self.injected: list[Injected] = []
        self.requests = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()  # the plan is changed from other threads too
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._numbers = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        """The endpoint to give the S3 client."""
        return f"http://{self.host}:{self.port}"

    # ---------------------------------------------------------------- the plan

    def add(self, rule: Rule) -> Rule:
        """Add ``rule`` after the others; returns it (its ``fired`` counts up)."""
        with self._lock:
            self.rules.append(rule)
        return rule

    def plan(self, rules: list[Rule], seed: int | None = None) -> None:
        """Replace every rule (and reseed the draws, if ``seed`` is given)."""
        with self._lock:
            self.rules = list(rules)
            if seed is not None:
                self.seed = seed
                self._random = random.Random(seed)

    def clear(self) -> None:
        """No more faults: pass everything through."""
        self.plan([])

    def fired(self, fault: str | None = None) -> int:
        """How many faults (of kind ``fault``) fired so far."""
        with self._lock:
            return sum(1 for i in self.injected if fault in (None, i.fault))

    def _pick(self, request: _Request) -> Rule | None:
        with self._lock:
            self.requests += 1
            for rule in self.rules:
                if not rule.matches(request.method, request.path, request.conditional):
                    continue
                if rule.probability < 1.0 and self._random.random() >= rule.probability:
                    continue
                rule.fired += 1
                self.injected.append(Injected(rule.fault, request.method, request.path))
                return rule
        return None

    # ---------------------------------------------------------------- running

    async def start(self) -> None:
        """Listen (on a free port unless one was given)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def start_in_thread(self) -> FaultProxy:
        """Run the proxy on an event loop of its own in a daemon thread; returns self."""
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.run_until_complete(self.start())
            started.set()
            loop.run_forever()
            loop.run_until_complete(self.close())
            loop.close()

        self._thread = threading.Thread(target=run, name="s3-fault-proxy", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def stop_thread(self) -> None:
        """Stop a proxy started with :meth:`start_in_thread`."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    # ---------------------------------------------------------------- connections

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    break
                line, headers = _parse_headers(head)
                method, target, _ = [*line.split(" ", 2), "", ""][:3]
                request = _Request(method.upper(), target, head, headers)
                if request.path.startswith(CONTROL):
                    await self._control(request, reader, writer)
                    continue
                rule = self._pick(request)
                if rule is not None and rule.fault in ("internal_error", "slow_down", "hang"):
                    if not await self._fault(rule, request, reader, writer):
                        return
                    continue
                if upstream is None:
                    upstream = await asyncio.open_connection(*self.upstream)
                if rule is not None and rule.fault == "reset_upload":
                    await self._reset_upload(rule, request, reader, writer, upstream[1])
                    return
                keep = await self._forward(request, reader, writer, upstream, drop=rule)
                if not keep:
                    return
        except (_Closed, ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            if upstream is not None:
                upstream[1].transport.abort()
            writer.transport.abort()
            self._conns.discard(task)

    async def _fault(
        self,
        rule: Rule,
        request: _Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer with an error, or hang; False if the connection is done."""
        await _relay_body(reader, None, request.headers)  # the whole request, forwarded nowhere
        if rule.fault in _ERRORS:
            writer.write(_error_response(rule.fault, rule, request, next(self._numbers)))
            await writer.drain()
            return True
        await self._hold(reader, rule.hold_s)  # hang: silent until the client gives up
        _reset(writer)
        return False

    async def _reset_upload(
        self,
        rule: Rule,
        request: _Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        """Pass on the head and part of the body, then reset both connections."""
        up_writer.write(request.head)
        with contextlib.suppress(_Closed):
            await _copy(reader, up_writer, _part(rule, request.body_length() or 0))
        await up_writer.drain()
        await asyncio.sleep(0.05)  # let the server start on the body before the reset
        _reset(up_writer)
        _reset(writer)

    @staticmethod
    async def _hold(reader: asyncio.StreamReader, seconds: float) -> None:
        """Wait ``seconds``, or until the client closes its end."""
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(seconds):
                while await reader.read(_CHUNK):
                    pass

    async def _forward(
        self,
        request: _Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        *,
        drop: Rule | None,
    ) -> bool:
        """Send the request upstream and relay the answer (or lose it, for lost_answer);
        False if the connection is done."""
        up_reader, up_writer = upstream
        up_writer.write(request.head)
        # The body goes up while the answer is awaited: a server may answer before it has
        # read the body (a 412 to a conditional PUT) and then close.
        sending = asyncio.ensure_future(_send(reader, up_writer, request.headers))
        try:
            head = await _read_head(up_reader)
            if head is None:
                raise _Closed
            status_line, headers = _parse_headers(head)
            status = int(status_line.split(" ", 2)[1])
            bodiless = request.method == "HEAD" or status in (204, 304) or status < 200
            framed = "content-length" in headers or "chunked" in headers.get(
                "transfer-encoding", ""
            )
            if drop is not None and drop.fault == "reset_download":
                writer.write(head)
                await _copy(up_reader, writer, _part(drop, int(headers.get("content-length", 0))))
                _reset(writer)
                return False
            target = None if drop is not None else writer
            if target is not None:
                target.write(head)
            if not bodiless:
                await _relay_body(up_reader, target, headers, until_eof=not framed)
            # Whether the whole request went up: if not, the rest of it is still unread
            # on the client's connection, which therefore cannot carry another request.
            sent = sending.done() and sending.result()
        finally:
            sending.cancel()
        reusable = sent and (framed or bodiless) and headers.get("connection") != "close"
        if drop is None:
            await writer.drain()
            return reusable
        if drop.then in _ERRORS:
            writer.write(_error_response(drop.then, drop, request, next(self._numbers)))
            await writer.drain()
            return reusable
        if drop.then == "hang":
            await self._hold(reader, drop.hold_s)
        _reset(writer)
        return False

    # ---------------------------------------------------------------- control

    async def _control(
        self, request: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        body = bytearray()
        length = request.body_length() or 0
        if length:
            body += await reader.readexactly(length)
        status, answer = 200, self._handle(request.method, request.path, bytes(body))
        if isinstance(answer, str):
            status, answer = 400, {"error": answer}
        data = json.dumps(answer).encode()
        writer.write(
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Bad Request'}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    def _handle(self, method: str, path: str, body: bytes) -> dict[str, Any] | str:
        """A control request's answer (a str: the request is wrong)."""
        try:
            data = json.loads(body) if body else {}
            if path == f"{CONTROL}/rules" and method == "POST":
                return self.add(Rule(**data)).as_dict()
            if path == f"{CONTROL}/rules" and method == "PUT":
                self.plan([Rule(**r) for r in data.get("rules", [])], data.get("seed"))
            elif path == f"{CONTROL}/rules" and method == "DELETE":
                self.clear()
            elif path != CONTROL or method != "GET":
                return f"no control {method} {path}"
        except (TypeError, ValueError) as e:
            return str(e)
        with self._lock:
            return {
                "rules": [r.as_dict() for r in self.rules],
                "injected": [dataclasses.asdict(i) for i in self.injected],
                "requests": self.requests,
                "seed": self.seed,
            }


def main() -> None:
    """Run a proxy until interrupted (the plan is set over HTTP, see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--upstream", required=True, help="http://host:port of the S3 server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    async def run() -> None:
        proxy = FaultProxy(args.upstream, host=args.host, port=args.port, seed=args.seed)
        await proxy.start()
        print(json.dumps({"url": proxy.url, "upstream": args.upstream}), flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await proxy.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    main()
