"""A swarm of one-shot watchers against ``evq serve`` (issue 5).

Opens N watchers (WebSocket ``/v1/ws`` by default, or long polls ``GET /v1/watch/{key}``) on
one or more keys, spread over P client processes and several 127.0.0.x source addresses (so
neither the 20k descriptors of a process nor the ~28k ephemeral ports of an address run out),
arms them, changes the keys and measures:

- **connect rate**: watchers connected per second (handshake done), and the time until all
  are armed (WebSocket: a ``ping`` sent after the ``watch`` came back as ``pong``, so the
  server has armed the key; long poll: the watch request is written, then ``--settle`` s);
- **server memory per watcher**: the RSS of every server process (the evq main process and
  its gateway workers, ``python -m gateway.workers``) summed before connecting and after all
  watchers are armed, the difference divided by the watchers armed;
- **idle cost**: server CPU while the watchers are connected and nothing changes;
- **a key nobody watches**: bursts of changes on unwatched keys with no watcher connected
  and again with all connected (PUT rate, server CPU meanwhile; medians of
  ``--unwatched-repeats``);
- **latency of one change** (``--singles`` times, each once the server is idle again):
  p50/p99/max over all watchers of the time from the PUT (sent, and answered) to the
  watcher's arrival, taken twice: the kernel's receive timestamp of the event at the
  watcher's socket (``SO_TIMESTAMPNS``: what the server achieved, whatever the client's
  scheduling) and the moment the client process handled it;
- **a burst** of ``--burst`` changes per key (PUTs as fast as the server takes them,
  ``--put-concurrency`` at once): PUT rate and latency, the time from the last PUT answered
  until every watcher holds the final version, how many events the watchers got
  (coalescing);
- **correctness**: every watcher must end with the key's final version (as ``GET
  /v1/keys/{key}`` tells); the count of those that did not, of lost connections and errors.

Every watcher follows the one-shot protocol: after each event it arms the key again with the
version it got. The client is lean (non-blocking sockets driven by the event loop's
``add_reader``, a minimal WebSocket client of its own: no transport, protocol or task per
connection, one ``send`` per re-arm); its CPU is reported next to the server's, the kernel
timestamps show when the server delivered independently of the client, and
``--client-nice 19`` is a control for how much the client on the same cores slows the
server. Times are taken with the system-wide clocks, so they compare across processes.

``--profile-memory`` instead holds ``-n`` watchers on one server process of each kind (a raw
asyncio WebSocket server, a bare aiohttp one, evq's gateway app) and breaks the memory per
connection down by object type and by allocation site (tracemalloc).

Against a running server (its main process and workers are found by the listening port,
or name the main process with ``--server-pid``)::

    .venv/bin/python loadtest/watch_swarm.py --url http://127.0.0.1:8700 -n 10000

Or let the tool start ``evq serve`` itself on a fresh temporary data directory, and stop it
at the end (SIGTERM; the exit code must be 0)::

    .venv/bin/python loadtest/watch_swarm.py --serve --workers 7 -n 100000 --burst 1000
    .venv/bin/python loadtest/watch_swarm.py --profile-memory -n 10000

The human-readable table goes to stdout, followed by the JSON summary (also written to
``--json-out``); progress goes to stderr. Every phase is bounded in time and the whole run by
``--max-seconds``. Exit status: 0 when every watcher ended at the final version (and a server
started here stopped with 0), 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import math
import multiprocessing as mp
import os
import platform
import random
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import msgspec
import psutil
from served import EvqServe, free_port, session_pids

ROOT = Path(__file__).resolve().parents[1]
IP_BIND_ADDRESS_NO_PORT = 24  # Linux: choose the source port at connect(), per 4-tuple
SO_TIMESTAMPNS = 35  # Linux: the kernel's receive time of the data, with recvmsg
_TIMESPEC = struct.Struct("qq")
_LINGER_RESET = struct.pack("ii", 1, 0)  # close with RST
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
KIB = 1024
MIB = 1024 * 1024

# Watcher states
CONNECTING, OPEN, ARMED, CLOSED = 0, 1, 2, 3
# Shared per-process counters (progress), refreshed by each client process twice a second
C_CONNECTED, C_ARMED, C_FAILED, C_LOST, C_EVENTS, C_ERRORS = range(6)
N_COUNTERS = 6


def now() -> float:
    """The system-wide monotonic clock (comparable across processes on Linux)."""
    return time.monotonic()


class ServerMsg(msgspec.Struct):
    """What the client reads of a server message (the value is skipped)."""

    op: str
    key: str | None = None
    version: int | None = None
    code: str | None = None
    message: str | None = None


class KeyDoc(msgspec.Struct):
    key: str
    version: int


_ws_decoder = msgspec.json.Decoder(ServerMsg)
_key_decoder = msgspec.json.Decoder(KeyDoc)


# ====================================================================== client side


class SwarmSpec(msgspec.Struct, frozen=True):
    """What one client process is told."""

    index: int
    host: str
    port: int
    mode: str  # "ws" | "poll"
    keys: list[str]
    sources: list[str]
    connect_concurrency: int
    connect_timeout_s: float
    retries: int
    poll_timeout_s: float
    deadline: float  # monotonic time after which the process exits on its own
    nice: int = 0  # added niceness (a control: does the client slow the server down?)


def ws_client_frame(payload: bytes, opcode: int = 1) -> bytes:
    """One masked, final client frame (RFC 6455 requires clients to mask)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    else:
        head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    mask = random.randbytes(4)
    rep = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(rep, "big")).to_bytes(n, "big")
    return head + mask + masked


class Watcher:
    """One watcher connection on a raw non-blocking socket.

    The event loop calls :meth:`readable` when data is there (``add_reader``: no transport,
    no protocol object, no task); it reads with ``recvmsg`` to get the kernel's receive
    timestamp of the data (``SO_TIMESTAMPNS``, CLOCK_REALTIME) next to the time this process
    handled it (monotonic). Writes are small and go straight to ``send``; what the kernel does
    not take at once waits for ``add_writer``.
    """

    __slots__ = (
        "buf",
        "events",
        "fd",
        "k_event",
        "kidx",
        "opened",
        "out",
        "sock",
        "state",
        "swarm",
        "t_event",
        "version",
    )

    def __init__(self, swarm: Swarm, kidx: int, version: int) -> None:
        self.swarm = swarm
        self.kidx = kidx
        self.version = version
        self.t_event = 0.0  # monotonic: when this process handled the latest event
        self.k_event = 0.0  # realtime: when the kernel received it
        self.events = 0
        self.state = CONNECTING
        self.sock: socket.socket | None = None
        self.fd = -1
        self.opened: asyncio.Future[None] | None = None
        self.buf = b""
        self.out = b""  # bytes the kernel did not take yet

    def start(self, sock: socket.socket) -> None:
        """The TCP connection is up: say hello and listen."""
        self.sock = sock
        self.fd = sock.fileno()
        self.swarm.loop.add_reader(self.fd, self.readable)
        self.write(self.hello())

    def hello(self) -> bytes:
        raise NotImplementedError

    def received(self, data: bytes, t: float, k: float) -> None:
        raise NotImplementedError

    def readable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            data, anc, _, _ = sock.recvmsg(262144, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.lost(exc)
            return
        if not data:
            self.lost(None)
            return
        k = 0.0
        for level, kind, stamp in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = _TIMESPEC.unpack_from(stamp)
                k = sec + nsec * 1e-9
        self.received(data, now(), k)

    def write(self, data: bytes) -> None:
        sock = self.sock
        if sock is None:
            return
        if self.out:
            self.out += data
            return
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self.lost(exc)
            return
        if sent < len(data):
            self.out = data[sent:]
            self.swarm.loop.add_writer(self.fd, self._flush)

    def _flush(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            sent = sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.lost(exc)
            return
        self.out = self.out[sent:]
        if not self.out:
            self.swarm.loop.remove_writer(self.fd)

    def lost(self, exc: Exception | None) -> None:
        was = self.state
        self.close()
        self._fail_open(ConnectionError(f"connection lost: {exc or 'closed by the server'}"))
        if was in (OPEN, ARMED) and not self.swarm.closing:
            self.swarm.lost(self, was)

    def _fail_open(self, exc: Exception) -> None:
        if self.opened is not None and not self.opened.done():
            self.opened.set_exception(exc)

    def _set_open(self) -> None:
        if self.opened is not None and not self.opened.done():
            self.opened.set_result(None)

    def close(self) -> None:
        """Close at once with a reset (no TIME_WAIT left on this machine's ports)."""
        self.state = CLOSED
        sock, self.sock = self.sock, None
        if sock is None:
            return
        loop = self.swarm.loop
        loop.remove_reader(self.fd)
        if self.out:
            loop.remove_writer(self.fd)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        sock.close()


class WsWatcher(Watcher):
    """A WebSocket watcher: handshake, ``watch`` + ``ping``; each event → ``watch`` again."""

    __slots__ = ("accept",)

    def __init__(self, swarm: Swarm, kidx: int, version: int) -> None:
        super().__init__(swarm, kidx, version)
        self.accept = b""

    def hello(self) -> bytes:
        key = base64.b64encode(random.randbytes(16))
        self.accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
        return (
            b"GET /v1/ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
            % (self.swarm.host_header, key)
        )

    def received(self, data: bytes, t: float, k: float) -> None:
        if self.buf:
            data = self.buf + data
            self.buf = b""
        if self.state == CONNECTING:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self.buf = data
                return
            head, data = data[:end], data[end + 4 :]
            if not head.startswith(b"HTTP/1.1 101") or self.accept not in head:
                self.swarm.note_error(f"handshake: {head[:40]!r}")
                self._fail_open(ConnectionError(f"handshake refused: {head[:40]!r}"))
                self.close()
                return
            self.state = OPEN
            self._set_open()
            self.send_watch(self.version, ping=True)
        pos, n = 0, len(data)
        while n - pos >= 2:
            b0, ln, hl = data[pos], data[pos + 1] & 0x7F, 2
            if ln == 126:
                if n - pos < 4:
                    break
                ln, hl = int.from_bytes(data[pos + 2 : pos + 4], "big"), 4
            elif ln == 127:
                if n - pos < 10:
                    break
                ln, hl = int.from_bytes(data[pos + 2 : pos + 10], "big"), 10
            if n - pos < hl + ln:
                break
            self._frame(b0 & 0x0F, data[pos + hl : pos + hl + ln], t, k)
            pos += hl + ln
        if pos < n:
            self.buf = data[pos:]

    def _frame(self, opcode: int, payload: bytes, t: float, k: float) -> None:
        if opcode == 1:
            msg = _ws_decoder.decode(payload)
            if msg.op == "event":
                assert msg.version is not None
                self.swarm.on_event(self, msg.version, t, k)
                self.send_watch(msg.version)
            elif msg.op == "pong":
                if self.state == OPEN:
                    self.state = ARMED
                    self.swarm.armed()
            else:
                self.swarm.note_error(f"{msg.op}: {msg.code}: {msg.message}")
        elif opcode == 8:
            code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            self.swarm.note_error(f"closed by the server with code {code}")
            self.lost(None)
        elif opcode == 9:  # a protocol ping: answer pong
            self.write(ws_client_frame(payload, 10))

    def send_watch(self, version: int, ping: bool = False) -> None:
        frame = ws_client_frame(self.swarm.watch_json[self.kidx] % version)
        if ping:
            frame += ws_client_frame(b'{"op":"ping","id":1}')
        self.write(frame)


class PollWatcher(Watcher):
    """A long-poll watcher on one keep-alive HTTP/1.1 connection.

    The first request asks with version 0 (answered at once: the key exists), which opens
    the watcher; from then on each answer's version is asked past again, and a 204 (the
    poll timed out) is asked again with the same version.
    """

    __slots__ = ()

    def __init__(self, swarm: Swarm, kidx: int, version: int) -> None:
        super().__init__(swarm, kidx, 0)

    def hello(self) -> bytes:
        return self.request(0)

    def request(self, version: int) -> bytes:
        return self.swarm.poll_request[self.kidx] % version

    def received(self, data: bytes, t: float, k: float) -> None:
        buf = self.buf + data if self.buf else data
        self.buf = b""
        while buf:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end]
            length = _content_length(head)
            if len(buf) < end + 4 + length:
                break
            body = buf[end + 4 : end + 4 + length]
            buf = buf[end + 4 + length :]
            self._response(int(head[9:12]), body, t, k)
        self.buf = buf

    def _response(self, status: int, body: bytes, t: float, k: float) -> None:
        if self.sock is None:
            return
        if status == 200:
            version = _key_decoder.decode(body).version
            if self.state == CONNECTING:
                self.version = version
                self.state = ARMED
                self.swarm.armed()
                self._set_open()
            else:
                self.swarm.on_event(self, version, t, k)
            self.write(self.request(self.version))
        elif status == 204:
            self.write(self.request(self.version))
        else:
            self.swarm.note_error(f"long poll answered {status}: {body[:80]!r}")
            if self.state == CONNECTING:
                self._fail_open(ConnectionError(f"answered {status}"))
                self.close()
                return
            self.swarm.loop.call_later(0.5, self._again)

    def _again(self) -> None:
        self.write(self.request(self.version))


def _content_length(head: bytes) -> int:
    i = head.lower().find(b"\r\ncontent-length:")
    if i < 0:
        return 0
    j = head.find(b"\r\n", i + 2)
    return int(head[i + 17 : j if j > 0 else len(head)])


class Swarm:
    """The watchers of one client process."""

    def __init__(self, spec: SwarmSpec, counters: Any) -> None:
        self.spec = spec
        self.counters = [0] * N_COUNTERS
        self.shared = counters  # this process's slice of the shared progress array
        self.watchers: list[Watcher] = []
        self.host_header = f"{spec.host}:{spec.port}".encode()
        self.watch_json = [
            b'{"op":"watch","key":%s,"version":%%d}' % json.dumps(k).encode() for k in spec.keys
        ]
        self.poll_request = [
            (
                f"GET /v1/watch/{k}?version=%d&timeout={spec.poll_timeout_s:g} HTTP/1.1\r\n"
                f"Host: {spec.host}:{spec.port}\r\n\r\n"
            ).encode()
            for k in spec.keys
        ]
        self.errors: Counter[str] = Counter()
        self.closing = False
        self.targets: dict[int, int] = {}
        self.behind = 0
        self.reached: asyncio.Future[None] | None = None
        self._sources = itertools.cycle(spec.sources)
        self.t_last_armed = 0.0
        self.loop = asyncio.get_running_loop()

    # -------------------------------------------------------------- events

    def on_event(self, w: Watcher, version: int, t: float, k: float) -> None:
        old = w.version
        if version > old:
            w.version = version
        w.t_event = t
        w.k_event = k
        w.events += 1
        self.counters[C_EVENTS] += 1
        target = self.targets.get(w.kidx) if self.targets else None
        if target is not None and old < target <= version:
            self.behind -= 1
            if self.behind == 0 and self.reached is not None and not self.reached.done():
                self.reached.set_result(None)

    def lost(self, w: Watcher, was: int) -> None:
        self.counters[C_LOST] += 1
        if was == ARMED:
            self.counters[C_ARMED] -= 1
        target = self.targets.get(w.kidx) if self.targets else None
        if target is not None and w.version < target:
            self.behind -= 1
            if self.behind == 0 and self.reached is not None and not self.reached.done():
                self.reached.set_result(None)

    def note_error(self, what: str) -> None:
        self.counters[C_ERRORS] += 1
        self.errors[what[:120]] += 1

    def publish_counters(self) -> None:
        for i, v in enumerate(self.counters):
            self.shared[i] = v

    # -------------------------------------------------------------- connecting

    async def connect(
        self, n: int, first_index: int, version: int, timeout_s: float
    ) -> dict[str, Any]:
        """Open ``n`` watchers (indices ``first_index``…: key ``index % len(keys)``), then
        wait until each is armed; the (monotonic) times when the last was connected and
        the last armed."""
        sem = asyncio.Semaphore(self.spec.connect_concurrency)
        deadline = now() + timeout_s

        async def one(i: int) -> None:
            async with sem:
                await self._connect_one(i, version)

        await asyncio.gather(*(one(first_index + i) for i in range(n)))
        t_connected = now()
        while any(w.state == OPEN for w in self.watchers) and now() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # (an event per watcher would cost more than this poll)
        return {
            "t_connected": t_connected,
            "t_armed": self.t_last_armed or t_connected,
            "counters": list(self.counters),
        }

    def armed(self) -> None:
        self.counters[C_ARMED] += 1
        self.t_last_armed = now()

    async def _connect_one(self, index: int, version: int) -> None:
        kind = WsWatcher if self.spec.mode == "ws" else PollWatcher
        loop = asyncio.get_running_loop()
        reason = ""
        for attempt in range(self.spec.retries + 1):
            if self.closing:
                return
            w = kind(self, index % len(self.spec.keys), version)
            w.opened = loop.create_future()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(False)
                sock.bind((next(self._sources), 0))
                async with asyncio.timeout(self.spec.connect_timeout_s):
                    await loop.sock_connect(sock, (self.spec.host, self.spec.port))
                    w.start(sock)
                    await w.opened
            except (OSError, TimeoutError, ConnectionError) as exc:
                reason = f"{type(exc).__name__}: {exc}"[:120] or type(exc).__name__
                if w.sock is None:
                    sock.close()
                w.close()
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            w.opened = None
            self.watchers.append(w)
            self.counters[C_CONNECTED] += 1
            return
        self.counters[C_FAILED] += 1
        self.errors[f"connect: {reason}"] += 1

    # -------------------------------------------------------------- waiting

    async def wait_versions(self, targets: dict[int, int], timeout_s: float) -> dict[str, Any]:
        """Wait until every live watcher holds at least its key's target version.

        Returns the arrival times (of the event that brought the version; the targets are
        the newest versions, so it is the watcher's last event) and how many fell short.
        """
        live = [w for w in self.watchers if w.state != CLOSED]
        self.targets = dict(targets)
        self.behind = sum(1 for w in live if w.version < self.targets[w.kidx])
        self.reached = asyncio.get_running_loop().create_future()
        if self.behind > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.reached, timeout_s)
        self.targets = {}
        times, stamps = array.array("d"), array.array("d")
        short = 0
        for w in self.watchers:
            if w.state != CLOSED and w.version >= targets[w.kidx]:
                times.append(w.t_event)
                stamps.append(w.k_event)
            else:
                short += 1
        return {"times": times.tobytes(), "stamps": stamps.tobytes(), "short": short}

    def summary(self) -> dict[str, Any]:
        """Final versions per key and how many watchers hold each."""
        per_key: dict[int, Counter[int]] = {}
        closed = 0
        for w in self.watchers:
            if w.state == CLOSED:
                closed += 1
            per_key.setdefault(w.kidx, Counter())[w.version] += 1
        return {
            "versions": {k: dict(c) for k, c in per_key.items()},
            "closed": closed,
            "watchers": len(self.watchers),
            "errors": dict(self.errors.most_common(10)),
            "counters": list(self.counters),
        }

    def close(self) -> None:
        self.closing = True
        for w in self.watchers:
            w.close()


def client_main(spec: SwarmSpec, conn: Any, counters: Any) -> None:
    """Entry point of a client process: answer the coordinator's calls until told to stop."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator decides when to stop
    if spec.nice:
        os.nice(spec.nice)
    asyncio.run(_client_loop(spec, conn, counters))


async def _client_loop(spec: SwarmSpec, conn: Any, counters: Any) -> None:
    loop = asyncio.get_running_loop()
    swarm = Swarm(spec, counters)
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    parent = os.getppid()

    def read() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = None
            loop.call_soon_threadsafe(inbox.put_nowait, msg)
            if msg is None or msg.get("op") == "stop":
                return

    threading.Thread(target=read, daemon=True).start()

    async def tick() -> None:
        while True:
            swarm.publish_counters()
            if now() > spec.deadline or os.getppid() != parent:
                inbox.put_nowait(None)  # over time, or the coordinator is gone
            await asyncio.sleep(0.5)

    ticker = asyncio.ensure_future(tick())
    tasks: set[asyncio.Task[None]] = set()
    while True:
        msg = await inbox.get()
        if msg is None or msg["op"] == "stop":
            break
        task = asyncio.ensure_future(_serve_call(swarm, conn, msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    ticker.cancel()
    for task in tasks:
        task.cancel()
    swarm.close()
    swarm.publish_counters()
    await asyncio.sleep(0.1)


async def _serve_call(swarm: Swarm, conn: Any, msg: dict[str, Any]) -> None:
    op = msg["op"]
    if op == "connect":
        result = await swarm.connect(msg["n"], msg["first"], msg["version"], msg["timeout"])
    elif op == "wait":
        targets = {int(k): v for k, v in msg["targets"].items()}
        result = await swarm.wait_versions(targets, msg["timeout"])
    elif op == "summary":
        result = swarm.summary()
    elif op == "counters":
        result = list(swarm.counters)
    elif op == "close":
        swarm.close()
        result = {}
    else:
        result = {"error": f"unknown op {op}"}
    conn.send({"id": msg["id"], "result": result})


# ====================================================================== coordinator


class Client:
    """The coordinator's handle on one client process (calls over a pipe)."""

    def __init__(self, spec: SwarmSpec, counters: Any, ctx: Any) -> None:
        self.spec = spec
        self.counters = counters
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=client_main, args=(spec, child, counters), daemon=True)
        self.proc.start()
        child.close()
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._lock = threading.Lock()

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        def read() -> None:
            while True:
                try:
                    msg = self.conn.recv()
                except (EOFError, OSError):
                    return
                loop.call_soon_threadsafe(self._answer, msg)

        threading.Thread(target=read, daemon=True).start()

    def _answer(self, msg: dict[str, Any]) -> None:
        fut = self._calls.pop(msg["id"], None)
        if fut is not None and not fut.done():
            fut.set_result(msg["result"])

    async def call(self, op: str, timeout_s: float, **args: Any) -> Any:
        call_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        with self._lock:
            self.conn.send({"op": op, "id": call_id, **args})
        return await asyncio.wait_for(fut, timeout_s)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        with contextlib.suppress(OSError, BrokenPipeError), self._lock:
            self.conn.send({"op": "stop"})
        self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        return self.proc.exitcode


# ---------------------------------------------------------------------- server


def serve_process(args: argparse.Namespace, workdir: Path) -> EvqServe:
    """``evq serve`` started by the tool: own session, fresh data dir, SIGTERM at the end."""
    extra = ["--workers", str(args.workers)]
    if args.max_watchers:
        extra += ["--max-watchers", str(args.max_watchers)]
    if args.shards:
        extra += ["--shards", str(args.shards)]
    extra += args.serve_arg
    return EvqServe(workdir / "data", workdir / "evq-serve.log", extra, port=args.port or None)


def server_processes(port: int, main_pid: int | None) -> list[psutil.Process]:
    """The evq main process and its gateway workers (children running gateway.workers)."""
    if main_pid is None:
        listeners = {
            c.pid
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
        }
        if not listeners:
            raise SystemExit(f"no process listens on port {port}; name it with --server-pid")
        mains = [p for p in listeners if psutil.Process(p).ppid() not in listeners]
        main_pid = mains[0]
    main = psutil.Process(main_pid)
    workers = [
        c for c in main.children() if "gateway.workers" in " ".join(_cmdline(c)) and c.is_running()
    ]
    return [main, *workers]


def _cmdline(p: psutil.Process) -> list[str]:
    with contextlib.suppress(psutil.Error):
        return p.cmdline()
    return []


def rss(procs: Iterable[psutil.Process]) -> list[int]:
    out = []
    for p in procs:
        try:
            out.append(p.memory_info().rss)
        except psutil.Error:
            out.append(0)
    return out


def cpu_seconds(procs: Iterable[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def fd_count(p: psutil.Process) -> int:
    try:
        return p.num_fds()
    except psutil.Error:
        return -1


# ---------------------------------------------------------------------- HTTP


class Http:
    """A small keep-alive HTTP/1.1 client for the coordinator's PUTs and GETs.

    One connection per concurrent caller; requests on it go one after another. Lean on
    purpose (the coordinator shares two cores with the server and the swarm).
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        data = head.encode() + b"\r\n" + (body or b"")
        while self._idle:  # a kept-alive connection the server may have closed meanwhile
            reader, writer = self._idle.pop()
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                return await self._exchange(reader, writer, data)
            writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return await self._exchange(reader, writer, data)

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
    ) -> tuple[int, bytes]:
        writer.write(data)
        status_line = await reader.readline()
        if not status_line:
            writer.close()
            raise ConnectionError("the server closed the connection")
        length, close = 0, False
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        body = await reader.readexactly(length) if length else b""
        if close:
            writer.close()
        else:
            self._idle.append((reader, writer))
        return int(status_line.split()[1]), body

    async def json(self, method: str, path: str, doc: Any = None) -> Any:
        body = None if doc is None else json.dumps(doc).encode()
        status, data = await self.request(method, path, body)
        if status != 200:
            raise RuntimeError(f"{method} {path}: {status} {data[:200]!r}")
        return json.loads(data)

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


# ---------------------------------------------------------------------- statistics


def pct(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values (nan when empty)."""
    if not sorted_values:
        return math.nan
    k = max(0, math.ceil(p / 100 * len(sorted_values)) - 1)
    return sorted_values[k]


def dist_ms(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {
        "p50_ms": round(pct(s, 50) * 1000, 1),
        "p99_ms": round(pct(s, 99) * 1000, 1),
        "max_ms": round(s[-1] * 1000, 1) if s else math.nan,
        "min_ms": round(s[0] * 1000, 1) if s else math.nan,
    }


def median(values: list[float]) -> float:
    s = sorted(v for v in values if not math.isnan(v))
    if not s:
        return math.nan
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the run


class Run:
    """One swarm run: the phases in order, the figures collected in ``self.out``."""

    def __init__(self, args: argparse.Namespace, clients: list[Client], shared: Any) -> None:
        self.args = args
        self.clients = clients
        self.shared = shared
        self.http = Http(args.host, args.port)
        self.keys: list[str] = args.key_list
        self.server: list[psutil.Process] = []
        self.client_procs = [psutil.Process(c.proc.pid) for c in clients]
        self.out: dict[str, Any] = {}

    # -------------------------------------------------------------- helpers

    def totals(self) -> list[int]:
        t = [0] * N_COUNTERS
        for i in range(len(self.clients)):
            for j in range(N_COUNTERS):
                t[j] += self.shared[i * N_COUNTERS + j]
        return t

    async def counts(self) -> list[int]:
        """The clients' counters, exact (the shared ones lag up to half a second)."""
        t = [0] * N_COUNTERS
        for counters in await self.all_clients("counters", 30):
            for j, v in enumerate(counters):
                t[j] += v
        return t

    async def all_clients(self, op: str, timeout_s: float, **args: Any) -> list[Any]:
        return await asyncio.gather(*(c.call(op, timeout_s, **args) for c in self.clients))

    def session(self) -> list[psutil.Process]:
        """Every process of a server started here (Ray and its shards too)."""
        if self.args.serve_proc is None:
            return []
        out = []
        for pid in session_pids(self.args.serve_proc.pid):
            with contextlib.suppress(psutil.Error):
                out.append(psutil.Process(pid))
        return out

    def cpu_mark(self) -> tuple[float, float, float, float]:
        return (
            now(),
            cpu_seconds(self.server),
            cpu_seconds(self.client_procs),
            cpu_seconds(self.session()),
        )

    def cpu_since(self, mark: tuple[float, float, float, float]) -> dict[str, float]:
        t, s, c, w = mark
        wall = now() - t
        server, client = cpu_seconds(self.server) - s, cpu_seconds(self.client_procs) - c
        doc = {
            "wall_s": round(wall, 3),
            "server_cpu_s": round(server, 3),
            "client_cpu_s": round(client, 3),
            "server_cores": round(server / wall, 3) if wall > 0 else math.nan,
            "client_cores": round(client / wall, 3) if wall > 0 else math.nan,
        }
        if self.args.serve_proc is not None:
            doc["whole_server_cpu_s"] = round(cpu_seconds(self.session()) - w, 3)
        return doc

    async def put(self, key: str, i: int) -> Put:
        return await _put(self.http, key, i)

    async def version_of(self, key: str) -> int:
        return int((await self.http.json("GET", f"/v1/keys/{key}"))["version"])

    async def burst(self, keys: list[str], count: int) -> dict[str, Any]:
        """``count`` PUTs per key, ``--put-concurrency`` at once, for at most
        ``--burst-max-seconds``; the final versions, PUT rate and latency."""
        jobs = iter([(k, i) for i in range(count) for k in keys])
        final = {k: 0 for k in keys}
        last = Put(0, 0.0, 0.0, 0.0, 0.0)
        failed = 0
        put_s: list[float] = []
        stop_at = now() + self.args.burst_max_seconds

        async def lane() -> None:
            nonlocal last, failed
            lane_http = Http(self.args.host, self.args.port)
            try:
                for key, i in jobs:
                    if now() > stop_at:
                        break
                    try:
                        done = await _put(lane_http, key, i)
                    except (RuntimeError, OSError, ConnectionError):
                        failed += 1
                        continue
                    put_s.append(done.t_answered - done.t_sent)
                    final[key] = max(final[key], done.version)
                    if done.t_answered > last.t_answered:
                        last = done
            finally:
                lane_http.close()

        async def progress() -> None:
            t0 = now()
            while True:
                await asyncio.sleep(self.args.progress_every * 5)
                n = len(put_s)
                log(f"  {n} PUTs answered in {now() - t0:.0f} s ({n / (now() - t0):.1f}/s)")

        mark = self.cpu_mark()
        ticker = asyncio.ensure_future(progress())
        try:
            await asyncio.gather(*(lane() for _ in range(self.args.put_concurrency)))
        finally:
            ticker.cancel()
        cpu = self.cpu_since(mark)
        puts = len(put_s)
        return {
            "puts": puts,
            "planned": count * len(keys),
            "failed": failed,
            "seconds": cpu["wall_s"],
            "puts_per_s": round(puts / cpu["wall_s"], 1) if cpu["wall_s"] > 0 else math.nan,
            "put_latency": dist_ms(put_s),
            "cpu": cpu,
            "final": final,
            "last": last,
        }

    # -------------------------------------------------------------- phases

    async def run(self) -> dict[str, Any]:
        args = self.args
        await self.setup_keys()
        self.server = server_processes(args.port, args.server_pid)
        self.out["server_processes"] = [
            {"pid": p.pid, "role": "main" if i == 0 else "gateway worker"}
            for i, p in enumerate(self.server)
        ]
        log(f"server: {len(self.server)} process(es) {[p.pid for p in self.server]}")
        if args.unwatched_burst:
            await self.burst([f"{args.key_prefix}warm-up"], min(200, args.unwatched_burst))
            self.out["unwatched_none"] = await self.unwatched("no watcher connected")
        await asyncio.sleep(1.0)
        rss_before = rss(self.server)
        await self.connect()
        await asyncio.sleep(args.settle)
        rss_after = rss(self.server)
        await self.memory(rss_before, rss_after)
        self.out["idle"] = await self.idle()
        if args.unwatched_burst:
            self.out["unwatched_connected"] = await self.unwatched("all watchers connected")
        self.out["single"] = await self.singles()
        if args.burst:
            self.out["burst"] = await self.watched_burst()
        self.out["correctness"] = await self.correctness()
        return self.out

    async def setup_keys(self) -> None:
        for i, key in enumerate(self.keys):
            await self.put(key, -1 - i)  # the key exists: version >= 1
        self.out["initial_versions"] = {k: await self.version_of(k) for k in self.keys}

    async def connect(self) -> None:
        args = self.args
        n, p = args.n, len(self.clients)
        shares = [n // p + (1 if i < n % p else 0) for i in range(p)]
        firsts = list(itertools.accumulate([0, *shares[:-1]]))
        version = max(self.out["initial_versions"].values())
        log(f"connecting {n} {args.mode} watchers from {p} client process(es)…")
        t0 = now()
        mark = self.cpu_mark()
        calls = [
            asyncio.ensure_future(
                c.call(
                    "connect",
                    args.phase_timeout + 10,
                    n=s,
                    first=f,
                    version=version,
                    timeout=args.phase_timeout,
                )
            )
            for c, s, f in zip(self.clients, shares, firsts, strict=True)
        ]
        progress: list[dict[str, Any]] = []
        pending = set(calls)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=args.progress_every)
            connected, armed, failed, lost, _, errors = self.totals()
            elapsed = now() - t0
            progress.append({"t": round(elapsed, 1), "connected": connected, "armed": armed})
            log(
                f"  {elapsed:6.1f} s: {connected} connected, {armed} armed, {failed} failed, "
                f"{lost} lost, {errors} errors ({connected / max(elapsed, 1e-9):.0f}/s)"
            )
        results = [c.result() for c in calls]  # raises the clients' errors here
        connected, armed, failed, lost, _, errors = await self.counts()
        t_connected = max(r["t_connected"] for r in results) - t0
        t_armed = max(r["t_armed"] for r in results) - t0
        self.out["connect"] = {
            "watchers": n,
            "connected": connected,
            "armed": armed,
            "failed": failed,
            "lost": lost,
            "connect_seconds": round(t_connected, 2),
            "connect_rate_per_s": round(connected / t_connected, 1) if t_connected else math.nan,
            "armed_seconds": round(t_armed, 2),
            "cpu": self.cpu_since(mark),
            "progress": progress,
        }
        log(
            f"  {connected} connected in {t_connected:.2f} s ({connected / t_connected:.0f}/s), "
            f"{armed} armed after {t_armed:.2f} s"
        )

    async def memory(self, before: list[int], after: list[int]) -> None:
        armed = (await self.counts())[C_ARMED]
        delta = sum(after) - sum(before)
        self.out["memory"] = {
            "rss_before_mib": round(sum(before) / MIB, 1),
            "rss_after_mib": round(sum(after) / MIB, 1),
            "delta_mib": round(delta / MIB, 1),
            "watchers": armed,
            "per_watcher_kib": round(delta / armed / KIB, 2) if armed else math.nan,
            "per_process": [
                {
                    "pid": p.pid,
                    "rss_before_mib": round(b / MIB, 1),
                    "rss_after_mib": round(a / MIB, 1),
                    "fds": fd_count(p),
                }
                for p, b, a in zip(self.server, before, after, strict=True)
            ],
        }
        log(
            f"  server RSS {sum(before) / MIB:.0f} → {sum(after) / MIB:.0f} MiB: "
            f"{self.out['memory']['per_watcher_kib']} KiB per watcher"
        )

    async def idle(self) -> dict[str, Any]:
        mark = self.cpu_mark()
        await asyncio.sleep(self.args.idle_seconds)
        cpu = self.cpu_since(mark)
        log(f"  idle {cpu['wall_s']:.0f} s: server {cpu['server_cores']:.3f} cores")
        return cpu

    async def unwatched(self, label: str) -> dict[str, Any]:
        """Bursts on keys nobody watches (a new key each time): PUT rate and CPU."""
        args = self.args
        runs = []
        events0 = (await self.counts())[C_EVENTS]
        for r in range(args.unwatched_repeats):
            key = f"{args.key_prefix}unwatched-{random.randbytes(4).hex()}"
            result = await self.burst([key], args.unwatched_burst)
            result.pop("last")
            result.pop("final")
            runs.append(result)
            cpu = result["cpu"]
            log(
                f"unwatched key, {label}, {r + 1}/{args.unwatched_repeats}: {result['puts']} "
                f"PUTs in {result['seconds']:.2f} s ({result['puts_per_s']:.0f}/s); CPU s: "
                f"gateway {cpu['server_cpu_s']:.2f}, whole server {cpu.get('whole_server_cpu_s')}"
            )
        cpus = [r["cpu"] for r in runs]
        return {
            "runs": runs,
            "median_puts_per_s": median([r["puts_per_s"] for r in runs]),
            "median_seconds": median([r["seconds"] for r in runs]),
            "median_gateway_cpu_s": median([c["server_cpu_s"] for c in cpus]),
            "median_whole_server_cpu_s": median(
                [c.get("whole_server_cpu_s", math.nan) for c in cpus]
            ),
            "events": (await self.counts())[C_EVENTS] - events0,  # must be 0
        }

    async def quiet(self, limit_s: float = 120.0) -> float:
        """Wait until the server processes are idle (< 0.05 cores over half a second), so a
        change is measured alone and not behind the re-arms of the previous one."""
        t0 = now()
        while now() - t0 < limit_s:
            mark = self.cpu_mark()
            await asyncio.sleep(0.5)
            if self.cpu_since(mark)["server_cores"] < 0.05:
                break
        return now() - t0

    async def singles(self) -> dict[str, Any]:
        runs = []
        for r in range(self.args.singles):
            await asyncio.sleep(self.args.single_pause)
            await self.quiet()
            events0 = (await self.counts())[C_EVENTS]
            mark = self.cpu_mark()
            done = await asyncio.gather(*(self.put(k, 10_000 + r) for k in self.keys))
            targets = {i: d.version for i, d in enumerate(done)}
            last = max(done, key=lambda d: d.t_answered)
            results = await self.all_clients(
                "wait", self.args.wait_timeout + 30, targets=targets, timeout=self.args.wait_timeout
            )
            cpu = self.cpu_since(mark)
            times, stamps = _arrays(results, "times"), _arrays(results, "stamps")
            first = min(done, key=lambda d: d.t_sent)
            d = {
                # the kernel's receive time at the watcher's socket (what the server did) and
                # the time the client process handled it, after the PUT was sent and answered
                "arrived_sent": dist_ms([k - first.w_sent for k in stamps]),
                "handled_sent": dist_ms([t - first.t_sent for t in times]),
                "arrived_answered": dist_ms([k - last.w_answered for k in stamps]),
                "handled_answered": dist_ms([t - last.t_answered for t in times]),
                "reached": len(times),
                "short": sum(x["short"] for x in results),
                "put_ms": round((last.t_answered - first.t_sent) * 1000, 1),
                "events": (await self.counts())[C_EVENTS] - events0,
                "cpu": cpu,
            }
            runs.append(d)
            a, h = d["arrived_sent"], d["handled_sent"]
            log(
                f"one change {r + 1}/{self.args.singles} (ms after the PUT was sent): in the "
                f"socket p50 {a['p50_ms']} / p99 {a['p99_ms']} / max {a['max_ms']}, handled "
                f"p50 {h['p50_ms']} / p99 {h['p99_ms']} / max {h['max_ms']}; PUT answered after "
                f"{d['put_ms']}; {d['reached']} reached, {d['short']} short; CPU s gateway "
                f"{cpu['server_cpu_s']:.2f}, client {cpu['client_cpu_s']:.2f}"
            )
        return {
            "runs": runs,
            "median": {
                f"{side}_{q}": round(median([r[side][q] for r in runs]), 1)
                for side in ("arrived_sent", "handled_sent", "arrived_answered", "handled_answered")
                for q in ("p50_ms", "p99_ms", "max_ms")
            },
        }

    async def watched_burst(self) -> dict[str, Any]:
        args = self.args
        log(f"burst of {args.burst} changes per key on {len(self.keys)} watched key(s)")
        events0 = (await self.counts())[C_EVENTS]
        mark = self.cpu_mark()
        b = await self.burst(self.keys, args.burst)
        targets = {i: b["final"][k] for i, k in enumerate(self.keys)}
        results = await self.all_clients(
            "wait", args.wait_timeout + 30, targets=targets, timeout=args.wait_timeout
        )
        cpu = self.cpu_since(mark)
        last: Put = b.pop("last")
        times, stamps = _arrays(results, "times"), _arrays(results, "stamps")
        handled = dist_ms([t - last.t_answered for t in times])
        b.update(
            reached=len(times),
            short=sum(x["short"] for x in results),
            all_at_final_after_last_put_ms=handled["max_ms"],
            to_final_handled=handled,
            to_final_arrived=dist_ms([k - last.w_answered for k in stamps]),
            events=(await self.counts())[C_EVENTS] - events0,
            cpu_whole=cpu,
        )
        b["events_per_watcher"] = round(b["events"] / max(1, self.args.n), 1)
        log(
            f"  {b['puts']} PUTs in {b['seconds']:.1f} s ({b['puts_per_s']:.0f}/s); all at the "
            f"final version {handled['max_ms']:.0f} ms after the last PUT; "
            f"{b['events_per_watcher']} events per watcher; {b['short']} short"
        )
        return b

    async def correctness(self) -> dict[str, Any]:
        finals = {k: await self.version_of(k) for k in self.keys}
        summaries = await self.all_clients("summary", 60)
        at_final = not_final = closed = watchers = 0
        errors: Counter[str] = Counter()
        for s in summaries:
            watchers += s["watchers"]
            closed += s["closed"]
            errors.update(s["errors"])
            for kidx, versions in s["versions"].items():
                final = finals[self.keys[int(kidx)]]
                for version, count in versions.items():
                    if int(version) == final:
                        at_final += count
                    else:
                        not_final += count
        _, _, failed, lost, events, n_errors = await self.counts()
        doc = {
            "final_versions": finals,
            "watchers_requested": self.args.n,
            "watchers_connected": watchers,
            "at_final_version": at_final,
            "not_at_final_version": not_final + (self.args.n - watchers),
            "connect_failures": failed,
            "lost_connections": lost,
            "errors": n_errors,
            "error_kinds": dict(errors.most_common(10)),
            "events_total": events,
            "ok": at_final == self.args.n,
        }
        log(f"correctness: {at_final}/{self.args.n} at the final version; {lost} lost")
        return doc


class Put(NamedTuple):
    """One PUT of a key: its version and when it was sent and answered."""

    version: int
    t_sent: float  # monotonic
    t_answered: float  # monotonic
    w_sent: float  # wall clock (to compare with the kernel's receive timestamps)
    w_answered: float  # wall clock


async def _put(http: Http, key: str, i: int) -> Put:
    t_sent, w_sent = now(), time.time()
    doc = await http.json("PUT", f"/v1/keys/{key}", {"value": {"i": i}})
    return Put(int(doc["version"]), t_sent, now(), w_sent, time.time())


def _arrays(results: list[dict[str, Any]], name: str) -> list[float]:
    out: list[float] = []
    for r in results:
        a = array.array("d")
        a.frombytes(r[name])
        out.extend(a)
    return out


# ---------------------------------------------------------------------- output


def table(doc: dict[str, Any]) -> str:
    """The summary as aligned "label  text" lines."""
    rows: list[tuple[str, str]] = []

    def add(label: str, text: str) -> None:
        rows.append((label, text))

    m, cfg = doc["machine"], doc["config"]
    add("machine", f"{m['nproc']} cores, {m['mem_total_gib']} GiB, load {m['load_start']}")
    add(
        "swarm",
        f"{cfg['n']} {cfg['mode']} watchers on {cfg['keys']} key(s), {cfg['procs']} client "
        f"processes, {cfg['sources']} source addresses",
    )
    srv = doc.get("server", {})
    add("server", f"{srv.get('url')} ({len(doc.get('server_processes', []))} processes)")
    add(
        "latencies",
        "p50/p99/max in ms from the PUT sent, to the kernel's receive time at the "
        "watcher's socket (in the socket) and to the client process handling it (handled)",
    )
    for name, fmt in _ROWS:
        if name in doc:
            for label, text in fmt(doc[name]):
                add(label, text)
    if "failure" in doc:
        add("FAILED", doc["failure"])
    width = max(len(a) for a, _ in rows)
    return "\n".join(f"{a:<{width}}  {b}" for a, b in rows)


def _connect_rows(c: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (
            "connect",
            f"{c['connected']} in {c['connect_seconds']} s = {c['connect_rate_per_s']}/s; "
            f"{c['armed']} armed after {c['armed_seconds']} s; failed {c['failed']}, "
            f"lost {c['lost']}",
        )
    ]


def _memory_rows(mem: dict[str, Any]) -> list[tuple[str, str]]:
    text = f"{mem['rss_before_mib']} → {mem['rss_after_mib']} MiB: "
    return [("server RSS", text + f"{mem['per_watcher_kib']} KiB per watcher")]


def _idle_rows(i: dict[str, Any]) -> list[tuple[str, str]]:
    text = f"gateway {i['server_cores']} cores, client {i['client_cores']} cores"
    return [("idle", text + f" over {i['wall_s']} s")]


def _unwatched_rows(label: str) -> Any:
    def rows(u: dict[str, Any]) -> list[tuple[str, str]]:
        n = len(u["runs"])
        text = f"median of {n}: {u['runs'][0]['puts']} PUTs in {u['median_seconds']} s "
        text += f"({u['median_puts_per_s']}/s); CPU s gateway {u['median_gateway_cpu_s']}"
        if not math.isnan(u["median_whole_server_cpu_s"]):
            text += f", whole server incl. Ray {u['median_whole_server_cpu_s']}"
        return [(label, text + f"; {u['events']} events")]

    return rows


def _single_rows(sg: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for r in sg["runs"]:
        a, h, x = r["arrived_sent"], r["handled_sent"], r["handled_answered"]
        text = f"in the socket {a['p50_ms']}/{a['p99_ms']}/{a['max_ms']}, handled {h['p50_ms']}/"
        text += f"{h['p99_ms']}/{h['max_ms']} ms (p99 {x['p99_ms']} after the answer; PUT "
        text += f"{r['put_ms']} ms); {r['reached']} reached, {r['short']} short; CPU s gateway "
        out.append(
            ("one change", text + f"{r['cpu']['server_cpu_s']}, client {r['cpu']['client_cpu_s']}")
        )
    m = sg["median"]
    text = f"in the socket {m['arrived_sent_p50_ms']}/{m['arrived_sent_p99_ms']}/"
    text += f"{m['arrived_sent_max_ms']}, handled {m['handled_sent_p50_ms']}/"
    text += f"{m['handled_sent_p99_ms']}/{m['handled_sent_max_ms']} ms after the PUT was sent"
    out.append(("one change, median", text))
    return out


def _burst_rows(b: dict[str, Any]) -> list[tuple[str, str]]:
    text = f"{b['puts']} PUTs in {b['seconds']} s ({b['puts_per_s']}/s, PUT p50/p99 "
    text += f"{b['put_latency']['p50_ms']}/{b['put_latency']['p99_ms']} ms); all at the final "
    text += f"version {b['all_at_final_after_last_put_ms']} ms after the last PUT; "
    return [("burst", text + f"{b['events_per_watcher']} events/watcher")]


def _correct_rows(k: dict[str, Any]) -> list[tuple[str, str]]:
    text = f"{k['at_final_version']}/{k['watchers_requested']} at the final version; "
    text += f"{k['not_at_final_version']} not; lost {k['lost_connections']}; "
    return [("correctness", text + f"errors {k['errors']}")]


_ROWS: list[tuple[str, Any]] = [
    ("connect", _connect_rows),
    ("memory", _memory_rows),
    ("idle", _idle_rows),
    ("unwatched_none", _unwatched_rows("unwatched key, none connected")),
    ("unwatched_connected", _unwatched_rows("unwatched key, all connected")),
    ("single", _single_rows),
    ("burst", _burst_rows),
    ("correctness", _correct_rows),
    ("server_stop", lambda d: [("server stop", json.dumps(d))]),
]


# ---------------------------------------------------------------------- memory profile
#
# Where does a WebSocket watcher's memory go in one server process? The server side runs in a
# fresh interpreter (``--profile-server``), serves either a bare aiohttp WebSocket endpoint or
# evq's gateway app, and adds two routes: ``/_profile/mark`` (collect, remember the baseline)
# and ``/_profile/report`` (the difference: RSS, Python objects by type with their sizes,
# and with ``--trace`` the tracemalloc allocation sites).

PROFILE_KEY = "profile-key"


def profile_server_main(argv: list[str]) -> int:
    """``--profile-server KIND PORT CONTROL_PORT [--trace]``: the server side of
    ``--profile-memory``: watchers on PORT, ``/_profile/*`` on CONTROL_PORT."""
    kind, port, control, trace = argv[0], int(argv[1]), int(argv[2]), "--trace" in argv
    if trace:
        import tracemalloc

        tracemalloc.start(1)
    workdir = Path(tempfile.mkdtemp(prefix="watch-profile-"))
    try:
        asyncio.run(_profile_serve(kind, port, control, trace, workdir))
    except KeyboardInterrupt:
        pass
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


async def _profile_serve(kind: str, port: int, control: int, trace: bool, workdir: Path) -> None:
    from aiohttp import web

    marks: dict[str, Any] = {}

    async def mark(request: web.Request) -> web.Response:
        marks.update(_profile_sample(trace))
        return web.json_response({"rss": marks["rss"]})

    async def report(request: web.Request) -> web.Response:
        n = int(request.query["n"])
        top = int(request.query.get("top", "20"))
        return web.json_response(_profile_diff(marks, _profile_sample(trace), n, top))

    async def gc_stats(request: web.Request) -> web.Response:
        import gc

        return web.json_response([s["collections"] for s in gc.get_stats()])

    ctl = web.Application()
    ctl.router.add_get("/_profile/gc", gc_stats)
    ctl.router.add_get("/_profile/mark", mark)
    ctl.router.add_get("/_profile/report", report)
    runners = [web.AppRunner(ctl, access_log=None)]
    if kind == "lean":
        loop = asyncio.get_running_loop()
        server = await loop.create_server(LeanWs, "127.0.0.1", port, backlog=4096)
    else:
        if kind == "gateway":  # as evq serve runs it: through the front door
            from gateway.door import DoorRunner

            runners.append(DoorRunner(_profile_gateway_app(workdir), access_log=None))
        else:
            runners.append(web.AppRunner(_profile_bare_app(), access_log=None))
    for runner, p in zip(runners, (control, port), strict=False):
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", p, backlog=4096).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    if kind == "lean":
        server.close()
    for runner in runners:
        await runner.cleanup()


class LeanWs(asyncio.Protocol):
    """The least a WebSocket watcher needs on an asyncio server: handshake, unmask frames,
    answer ``ping`` ops (a measure of what a connection costs without aiohttp's machinery)."""

    __slots__ = ("buf", "open", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        buf = self.buf + data if self.buf else data
        if not self.open:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            i = buf.lower().find(b"sec-websocket-key:")
            key = buf[i + 18 : buf.find(b"\r\n", i)].strip()
            accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
            self.transport.write(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n" % accept
            )
            self.open, buf = True, buf[end + 4 :]
        while len(buf) >= 6:
            ln, hl = buf[1] & 0x7F, 2
            if ln == 126:
                ln, hl = int.from_bytes(buf[2:4], "big"), 4
            if len(buf) < hl + 4 + ln:
                break
            mask, payload = buf[hl : hl + 4], buf[hl + 4 : hl + 4 + ln]
            rep = (mask * (ln // 4 + 1))[:ln]
            text = (int.from_bytes(payload, "big") ^ int.from_bytes(rep, "big")).to_bytes(ln, "big")
            if b'"ping"' in text:
                self.transport.write(b"\x81\x14" + b'{"op":"pong","id":1}')
            buf = buf[hl + 4 + ln :]
        self.buf = buf


def _profile_bare_app() -> Any:
    from aiohttp import WSMsgType, web

    async def ws_handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=False, max_msg_size=64 * 1024)
        await ws.prepare(request)
        async for msg in ws:
            if msg.type is WSMsgType.TEXT and '"ping"' in msg.data:
                await ws.send_str('{"op":"pong","id":1}')
        return ws

    app = web.Application()
    app.router.add_get("/v1/ws", ws_handler)
    return app


def _profile_gateway_app(workdir: Path) -> Any:
    from actors.directory import LocalDirectory
    from actors.log.stores import open_store
    from gateway.app import make_app

    return make_app(LocalDirectory(open_store(str(workdir)), count=1))


def _profile_sample(trace: bool) -> dict[str, Any]:
    import gc

    t0 = time.perf_counter()
    gc.collect()
    gc_ms = (time.perf_counter() - t0) * 1000
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for obj in gc.get_objects():
        if isinstance(obj, Counter):  # the profiler's own samples
            continue
        name = f"{type(obj).__module__}.{type(obj).__qualname__}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj)
    sample: dict[str, Any] = {
        "rss": psutil.Process().memory_info().rss,
        "gc_ms": gc_ms,
        "counts": counts,
        "sizes": sizes,
    }
    if trace:
        import tracemalloc

        mine = tracemalloc.Filter(False, __file__)  # not this profiler's own samples
        sample["snapshot"] = tracemalloc.take_snapshot().filter_traces([mine])
    return sample


def _profile_diff(a: dict[str, Any], b: dict[str, Any], n: int, top: int) -> dict[str, Any]:
    counts = b["counts"] - a["counts"]
    sizes = b["sizes"] - a["sizes"]
    doc: dict[str, Any] = {
        "connections": n,
        "rss_per_conn_kib": round((b["rss"] - a["rss"]) / n / KIB, 2),
        "gc_objects_per_conn": round(sum(counts.values()) / n, 1),
        "full_gc_ms": {"before": round(a["gc_ms"], 1), "after": round(b["gc_ms"], 1)},
        "gc_bytes_per_conn_kib": round(sum(sizes.values()) / n / KIB, 2),
        "by_type": [
            {
                "type": name,
                "per_conn": round(counts[name] / n, 2),
                "bytes_per_conn": round(size / n),
            }
            for name, size in sizes.most_common(top)
        ],
    }
    if "snapshot" in b:
        diff = b["snapshot"].compare_to(a["snapshot"], "lineno")
        doc["traced_per_conn_kib"] = round(sum(d.size_diff for d in diff) / n / KIB, 2)
        doc["by_line"] = [
            {
                "where": f"{_short_path(d.traceback[0].filename)}:{d.traceback[0].lineno}",
                "bytes_per_conn": round(d.size_diff / n),
                "blocks_per_conn": round(d.count_diff / n, 2),
            }
            for d in sorted(diff, key=lambda d: -d.size_diff)[:top]
        ]
        by_file = b["snapshot"].compare_to(a["snapshot"], "filename")
        doc["by_file"] = [
            {"file": _short_path(d.traceback[0].filename), "bytes_per_conn": round(d.size_diff / n)}
            for d in sorted(by_file, key=lambda d: -d.size_diff)[:top]
        ]
    return doc


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3", str(ROOT) + "/"):
        i = path.find(marker)
        if i >= 0:
            return path[i + len(marker) :].lstrip("/")
    return path


def profile_memory(args: argparse.Namespace) -> int:
    """``--profile-memory``: each kind of server plain and under tracemalloc, one at a time."""
    if args.n > 15_000:
        raise SystemExit("--profile-memory: at most 15,000 watchers (one server process)")
    results: dict[str, Any] = {"machine": machine(), "watchers": args.n}
    deadline = now() + args.max_seconds
    for kind in args.profile_kinds.split(","):
        for trace in (False, True):
            if now() > deadline:
                break
            name = kind + (" + tracemalloc" if trace else "")
            log(f"profile: {name}, {args.n} WebSocket watchers")
            results[name] = _profile_one(args, kind, trace, deadline)
    print(profile_table(results, args.profile_top))
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    return 0


def _profile_one(args: argparse.Namespace, kind: str, trace: bool, deadline: float) -> Any:
    args.host, args.port, args.control_port = "127.0.0.1", free_port(), free_port()
    args.key_list, args.mode = [PROFILE_KEY], "ws"
    args.profile_kind, args.profile_trace = kind, trace
    command = [sys.executable, str(Path(__file__).resolve()), "--profile-server", kind]
    command += [str(args.port), str(args.control_port), *(["--trace"] if trace else [])]
    server = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
    ctx = mp.get_context("fork")
    shared = ctx.RawArray("q", args.procs * N_COUNTERS)
    clients = start_clients(args, ctx, shared, deadline)
    try:
        coro = _profile_coordinate(args, clients, server)
        return asyncio.run(asyncio.wait_for(coro, max(1.0, deadline - now())))
    finally:
        for c in clients:
            c.stop()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


async def _profile_coordinate(
    args: argparse.Namespace, clients: list[Client], server: subprocess.Popen[bytes]
) -> Any:
    loop = asyncio.get_running_loop()
    for c in clients:
        c.listen(loop)
    http = Http(args.host, args.control_port)
    t_end = now() + 60
    while True:  # the server is up
        if server.poll() is not None or now() > t_end:
            raise RuntimeError("the profile server did not start")
        with contextlib.suppress(OSError, ConnectionError, asyncio.IncompleteReadError):
            status, _ = await http.request("GET", "/_profile/gc")
            if status == 200:
                break
        await asyncio.sleep(0.3)
    puts = args.profile_puts if args.profile_kind == "gateway" and not args.profile_trace else 0
    before: list[dict[str, Any]] = []
    if puts:
        await _profile_puts(args, http, server.pid, min(200, puts))  # warm up
        before = [await _profile_puts(args, http, server.pid, puts) for _ in range(3)]
    await http.json("GET", "/_profile/mark")
    p = len(clients)
    shares = [args.n // p + (1 if i < args.n % p else 0) for i in range(p)]
    firsts = list(itertools.accumulate([0, *shares[:-1]]))
    timeout = args.phase_timeout
    results = await asyncio.gather(
        *(
            c.call("connect", timeout + 10, n=n, first=f, version=0, timeout=timeout)
            for c, n, f in zip(clients, shares, firsts, strict=True)
        )
    )
    armed = sum(r["counters"][C_ARMED] for r in results)
    log(f"  {armed} armed; settling {args.settle} s")
    await asyncio.sleep(args.settle)
    doc = await http.json("GET", f"/_profile/report?n={armed}&top={args.profile_top}")
    if puts:
        after = [await _profile_puts(args, http, server.pid, puts) for _ in range(3)]
        doc["unwatched_puts"] = {"none": before, "connected": after}
    await asyncio.gather(*(c.call("close", 30) for c in clients))
    http.close()
    return doc


async def _profile_puts(args: argparse.Namespace, ctl: Http, pid: int, n: int) -> dict[str, Any]:
    """``n`` PUTs on a key nobody watches, 16 at once: time, the server's CPU and its
    garbage collections per generation meanwhile."""
    key = f"unwatched-{random.randbytes(4).hex()}"
    proc = psutil.Process(pid)
    gc0 = await ctl.json("GET", "/_profile/gc")
    cpu0, t0 = cpu_seconds([proc]), now()
    jobs = iter(range(n))

    async def lane() -> None:
        http = Http(args.host, args.port)
        for i in jobs:
            await _put(http, key, i)
        http.close()

    await asyncio.gather(*(lane() for _ in range(16)))
    seconds, cpu = now() - t0, cpu_seconds([proc]) - cpu0
    gc1 = await ctl.json("GET", "/_profile/gc")
    return {
        "puts_per_s": round(n / seconds, 1),
        "cpu_ms_per_put": round(cpu / n * 1000, 3),
        "gc_collections": [b - a for a, b in zip(gc0, gc1, strict=True)],
    }


def profile_table(results: dict[str, Any], top: int) -> str:
    lines = [f"memory per WebSocket connection, {results['watchers']} connections, one process"]
    for name, doc in results.items():
        if not isinstance(doc, dict) or "rss_per_conn_kib" not in doc:
            continue
        lines.append("")
        head = f"{name}: RSS {doc['rss_per_conn_kib']} KiB/conn; gc-tracked objects "
        head += f"{doc['gc_objects_per_conn']}/conn, {doc['gc_bytes_per_conn_kib']} KiB/conn; "
        head += (
            f"a full gc.collect() {doc['full_gc_ms']['before']} → {doc['full_gc_ms']['after']} ms"
        )
        if "traced_per_conn_kib" in doc:
            head += f"; tracemalloc {doc['traced_per_conn_kib']} KiB/conn"
        lines.append(head)
        if "unwatched_puts" in doc:
            for label, runs in doc["unwatched_puts"].items():
                text = "; ".join(
                    f"{r['puts_per_s']}/s, {r['cpu_ms_per_put']} ms CPU/PUT, "
                    f"gc {r['gc_collections']}"
                    for r in runs
                )
                lines.append(f"  PUTs on an unwatched key, {label}: {text}")
        if "by_line" in doc:
            lines.append("  bytes/conn  file")
            for row in doc["by_file"][: max(3, top // 2)]:
                lines.append(f"  {row['bytes_per_conn']:>10}  {row['file']}")
            lines.append("  bytes/conn  blocks/conn  allocated at")
            for row in doc["by_line"][:top]:
                lines.append(
                    f"  {row['bytes_per_conn']:>10}  {row['blocks_per_conn']:>11}  {row['where']}"
                )
        else:
            lines.append("  bytes/conn  objects/conn  type")
            for row in doc["by_type"][:top]:
                lines.append(f"  {row['bytes_per_conn']:>10}  {row['per_conn']:>12}  {row['type']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- main


_D = " (default %(default)s)"
# (group, flags, argparse keywords): kept as a table so that --help stays the documentation.
# fmt: off
_OPTIONS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("server", ("--url",), {"default": "http://127.0.0.1:8700", "help": "a running server" + _D}),
    ("server", ("--server-pid",), {"type": int, "help": "pid of the evq main process "
        "(default: the process listening on the port whose parent is not)"}),
    ("server", ("--serve",), {"action": "store_true", "help": "start `evq serve` on a fresh "
        "temporary data dir instead of --url; stop it at the end (SIGTERM, exit 0 expected)"}),
    ("server", ("--workers",), {"type": int, "default": 7, "help": "--serve: gateway "
        "processes (each holds at most ~19k watchers)" + _D}),
    ("server", ("--max-watchers",), {"type": int, "help": "--serve: watchers per process"}),
    ("server", ("--shards",), {"type": int, "help": "--serve: shard processes"}),
    ("server", ("--port",), {"type": int, "help": "--serve: port (default: a free one)"}),
    ("server", ("--serve-arg",), {"action": "append", "default": [], "metavar": "ARG",
        "help": "--serve: one more argument for `evq serve` (repeatable)"}),
    ("server", ("--keep-dir",), {"action": "store_true",
        "help": "--serve: keep the temporary directory (data, evq-serve.log)"}),
    ("swarm", ("-n", "--watchers"), {"dest": "n", "type": int, "default": 1000,
        "help": "watchers" + _D}),
    ("swarm", ("--mode",), {"choices": ["ws", "poll"], "default": "ws",
        "help": "WebSocket /v1/ws or long poll /v1/watch" + _D}),
    ("swarm", ("--keys",), {"type": int, "default": 1,
        "help": "keys; watcher i watches key i mod KEYS" + _D}),
    ("swarm", ("--key-prefix",), {"default": "swarm-",
        "help": "key names: PREFIX + random tag + number" + _D}),
    ("swarm", ("--procs",), {"type": int,
        "help": "client processes (default: one per 12,500 watchers; at most 15,000 each)"}),
    ("swarm", ("--sources",), {"type": int,
        "help": "source addresses 127.0.0.2, .3, … (default: one per client process)"}),
    ("swarm", ("--connect-concurrency",), {"type": int, "default": 64,
        "help": "connections being opened at once per client process" + _D}),
    ("swarm", ("--connect-timeout",), {"type": float, "default": 20.0,
        "help": "seconds for one connection and its handshake" + _D}),
    ("swarm", ("--retries",), {"type": int, "default": 3,
        "help": "attempts after a failed connection" + _D}),
    ("swarm", ("--poll-timeout",), {"type": float, "default": 120.0,
        "help": "long poll: the timeout= of each poll, seconds" + _D}),
    ("swarm", ("--client-nice",), {"type": int, "default": 0, "help": "niceness added to "
        "the client processes: with 19 the server gets the CPU first (a control showing how "
        "much the client, on the same cores, delays the server's delivery)" + _D}),
    ("swarm", ("--settle",), {"type": float, "default": 2.0,
        "help": "seconds after all are armed before the memory is read" + _D}),
    ("swarm", ("--progress-every",), {"type": float, "default": 3.0,
        "help": "seconds between progress lines while connecting" + _D}),
    ("changes", ("--singles",), {"type": int, "default": 5,
        "help": "single changes measured one after another" + _D}),
    ("changes", ("--single-pause",), {"type": float, "default": 1.0,
        "help": "seconds of quiet before each single change" + _D}),
    ("changes", ("--burst",), {"type": int, "default": 1000,
        "help": "changes per watched key in the burst; 0: none" + _D}),
    ("changes", ("--unwatched-burst",), {"type": int, "default": 1000, "help": "changes on a "
        "key nobody watches, before connecting and again with all connected; 0: none" + _D}),
    ("changes", ("--unwatched-repeats",), {"type": int, "default": 3,
        "help": "bursts on unwatched keys per measurement (the median is reported)" + _D}),
    ("changes", ("--burst-max-seconds",), {"type": float, "default": 900.0,
        "help": "stop sending a burst's PUTs after this long (the rest is still measured)" + _D}),
    ("changes", ("--put-concurrency",), {"type": int, "default": 64,
        "help": "PUTs in flight during a burst (keep-alive connections)" + _D}),
    ("changes", ("--idle-seconds",), {"type": float, "default": 5.0,
        "help": "quiet seconds with all connected, to measure idle CPU" + _D}),
    ("bounds and output", ("--wait-timeout",), {"type": float, "default": 120.0,
        "help": "seconds for every watcher to get a change" + _D}),
    ("bounds and output", ("--phase-timeout",), {"type": float, "default": 600.0,
        "help": "seconds for connecting and arming all watchers" + _D}),
    ("bounds and output", ("--max-seconds",), {"type": float, "default": 1800.0,
        "help": "the whole run at most this long" + _D}),
    ("bounds and output", ("--json-out",), {"type": Path,
        "help": "also write the JSON summary to this file"}),
    ("memory profile", ("--profile-memory",), {"action": "store_true", "help": "instead of a "
        "run: hold -n WebSocket watchers on one server process of each --profile-kinds, once "
        "plain (RSS, Python objects by type) and once under tracemalloc (allocation sites), and "
        "report where the memory per connection goes. The server side runs as "
        "`watch_swarm.py --profile-server KIND PORT CONTROL_PORT [--trace]` (internal)"}),
    ("memory profile", ("--profile-kinds",), {"default": "lean,bare,gateway", "help": "lean: "
        "a raw asyncio WebSocket server (handshake, frames, pong: what a connection costs "
        "without a framework); bare: a bare aiohttp WebSocket endpoint (answers pings); "
        "gateway: evq's gateway app (gateway.app, queues in the process, no Ray)" + _D}),
    ("memory profile", ("--profile-puts",), {"type": int, "default": 1000, "help": "gateway, "
        "not traced: bursts of PUTs on unwatched keys (3 before, 3 with the watchers): the "
        "server's CPU per PUT and its garbage collections; 0: none" + _D}),
    ("memory profile", ("--profile-top",), {"type": int, "default": 20,
        "help": "rows per breakdown" + _D}),
]
# fmt: on


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="watch_swarm.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    groups: dict[str, Any] = {}
    for group, flags, kw in _OPTIONS:
        if group not in groups:
            groups[group] = ap.add_argument_group(group)
        groups[group].add_argument(*flags, **kw)
    args = ap.parse_args(argv)
    if args.n < 1 or args.keys < 1 or args.singles < 0:
        ap.error("need at least one watcher and one key")
    args.procs = args.procs or max(1, math.ceil(args.n / 12_500))
    args.sources = args.sources or args.procs
    if math.ceil(args.n / args.procs) > 15_000:
        ap.error("at most 15,000 watchers per client process: raise --procs")
    if math.ceil(args.n / args.sources) > 25_000:
        ap.error("at most 25,000 watchers per source address: raise --sources")
    if args.sources > 250:
        ap.error("at most 250 source addresses (127.0.0.2-251)")
    if not args.serve:
        u = urlsplit(args.url)
        args.host, args.port = u.hostname or "127.0.0.1", u.port or 80
    else:
        args.host = "127.0.0.1"
    if not args.host.startswith("127."):
        ap.error("this load test only talks to 127.0.0.x")
    tag = random.randbytes(3).hex()
    args.key_list = [f"{args.key_prefix}{tag}-{i}" for i in range(args.keys)]
    return args


def machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "mem_total_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


async def wait_ready(http: Http, timeout_s: float, proc: EvqServe | None) -> None:
    deadline = now() + timeout_s
    while now() < deadline:
        if proc is not None and proc.proc.poll() is not None:
            raise RuntimeError(f"evq serve exited with {proc.proc.returncode}; see {proc.log_path}")
        with contextlib.suppress(OSError, ConnectionError, asyncio.IncompleteReadError):
            status, _ = await http.request("GET", "/readyz")
            if status == 200:
                return
        http.close()
        await asyncio.sleep(0.5)
    raise RuntimeError("the server did not become ready")


async def coordinate(args: argparse.Namespace, clients: list[Client], shared: Any) -> dict:
    loop = asyncio.get_running_loop()
    for c in clients:
        c.listen(loop)
    run = Run(args, clients, shared)
    try:
        await wait_ready(run.http, 180, args.serve_proc)
        log(f"server ready at http://{args.host}:{args.port}")
        return await run.run()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run.all_clients("close", 30), 40)
        run.http.close()
        args.partial = run.out


def start_clients(args: argparse.Namespace, ctx: Any, shared: Any, deadline: float) -> list[Client]:
    """The client processes, each with its share of the source addresses."""
    sources = [f"127.0.0.{2 + i}" for i in range(args.sources)]
    clients = []
    for i in range(args.procs):
        mine = [s for j, s in enumerate(sources) if j % args.procs == i]
        spec = SwarmSpec(
            index=i,
            host=args.host,
            port=args.port,
            mode=args.mode,
            keys=args.key_list,
            sources=mine or [sources[i % len(sources)]],
            connect_concurrency=args.connect_concurrency,
            connect_timeout_s=args.connect_timeout,
            retries=args.retries,
            poll_timeout_s=args.poll_timeout,
            deadline=deadline + 30,
            nice=args.client_nice,
        )
        clients.append(Client(spec, _CounterView(shared, i * N_COUNTERS), ctx))
    return clients


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--profile-server"]:
        return profile_server_main(argv[1:])
    args = parse_args(argv)
    if args.profile_memory:
        return profile_memory(args)
    doc: dict[str, Any] = {"machine": machine()}
    doc["config"] = {
        k: v
        for k, v in vars(args).items()
        if k
        in (
            "n",
            "mode",
            "keys",
            "procs",
            "sources",
            "burst",
            "unwatched_burst",
            "singles",
            "put_concurrency",
            "workers",
            "serve",
            "connect_concurrency",
            "key_list",
            "client_nice",
        )
    }
    deadline = now() + args.max_seconds
    # Client processes first (fork before this process has threads or a loop).
    ctx = mp.get_context("fork")
    shared = ctx.RawArray("q", args.procs * N_COUNTERS)
    workdir = Path(tempfile.mkdtemp(prefix="watch-swarm-"))
    args.serve_proc = None
    ok = False
    try:
        if args.serve:
            args.serve_proc = serve_process(args, workdir)
            args.host, args.port = "127.0.0.1", args.serve_proc.port
            args.server_pid = args.serve_proc.pid
            log(f"started: {' '.join(args.serve_proc.command)} (pid {args.serve_proc.pid})")
        doc["server"] = {"url": f"http://{args.host}:{args.port}", "started_by_tool": args.serve}
        if args.serve:
            doc["server"]["command"] = " ".join(args.serve_proc.command[1:])
        clients = start_clients(args, ctx, shared, deadline)
        try:
            timeout = max(1.0, deadline - now())
            result = asyncio.run(asyncio.wait_for(coordinate(args, clients, shared), timeout))
            doc.update(result)
            ok = bool(doc.get("correctness", {}).get("ok"))
        except (TimeoutError, RuntimeError, ConnectionError, OSError) as exc:
            doc.update(getattr(args, "partial", {}) or {})
            doc["failure"] = f"{type(exc).__name__}: {exc}"
            log(f"run failed: {doc['failure']}")
        finally:
            codes = [c.stop() for c in clients]
            doc["client_exit_codes"] = codes
    finally:
        if args.serve_proc is not None:
            log("stopping the server (SIGTERM)…")
            doc["server_stop"] = args.serve_proc.stop(120)
            log(f"  {doc['server_stop']}")
            ok = ok and doc["server_stop"]["exit_code"] == 0
            if args.keep_dir:
                doc["server"]["workdir"] = str(workdir)
        if not args.keep_dir:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    doc["machine"]["load_end"] = [round(x, 2) for x in os.getloadavg()]
    print(table(doc))
    text = json.dumps(doc, indent=2, default=str)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    return 0 if ok else 1


class _CounterView:
    """A window of ``N_COUNTERS`` integers in the shared progress array."""

    __slots__ = ("arr", "base")

    def __init__(self, arr: Any, base: int) -> None:
        self.arr = arr
        self.base = base

    def __setitem__(self, i: int, v: int) -> None:
        self.arr[self.base + i] = v

    def __getitem__(self, i: int) -> int:
        return int(self.arr[self.base + i])


if __name__ == "__main__":
    raise SystemExit(main())
