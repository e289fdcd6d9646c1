"""A client process of the swarm: its watchers (:class:`Swarm`, told what to do by a
:class:`SwarmSpec`) and the loop that answers the coordinator's calls over a pipe
(:func:`client_main`)."""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import json
import os
import resource
import signal
import socket
import threading
from collections import Counter
from typing import Any

import msgspec

from .common import C_ARMED, C_CONNECTED, C_ERRORS, C_EVENTS, C_FAILED, C_LOST, N_COUNTERS, now
from .watchers import ARMED, CLOSED, OPEN, SO_TIMESTAMPNS, PollWatcher, Watcher, WsWatcher

__all__ = ["Swarm", "SwarmSpec", "client_main"]

IP_BIND_ADDRESS_NO_PORT = 24  # Linux: choose the source port at connect(), per 4-tuple


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
    result: dict[str, Any] | list[int]
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
