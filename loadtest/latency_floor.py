"""Where one durable single put's time goes on this machine, beside the floor of each part
(issue 32: a lone producer's p50 against PostgreSQL's and beanstalkd's).

One request at a time, ``--count`` round trips per figure, ``--rounds`` rounds with every
figure measured in each round one after the other (the machine's mood moves all of them
together); each figure is the p50 of its round, and the summary the median of the rounds:

- ``fdatasync``: a 200-B ``pwrite`` and an ``fdatasync`` of a file in ``--dir``;
- ``hop_tcp``, ``hop_unix``: a 200-B round trip between two asyncio processes (protocols on
  both sides, as the gateway and a shard) over loopback TCP and over a Unix socket: what a
  gateway-to-shard call cannot go below;
- ``http``: a put to a trivial aiohttp app (``trivial_server.py``): HTTP alone;
- ``http_fdatasync``: a put to an aiohttp app that answers after a ``pwrite`` and an
  ``fdatasync`` in its own event loop: the floor of a design without the gateway-shard hop;
- ``evq_healthz``, ``evq_get``, ``evq_put``: ``evq serve --shards 1`` (``--dir``, defaults):
  the gateway alone, one call to the shard (a queue's status), a durable 100-B put.

The client is ``http.client`` with one kept-alive connection for every HTTP figure.

    .venv/bin/python loadtest/latency_floor.py [--rounds 3] [--count 2000] [--dir /work]

Prints one JSON line per figure and round (``{"round", "figure", "p50_ms", "p90_ms"}``),
then ``{"summary": {figure: median p50 ms}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from served import EvqServe, free_port

THIS = Path(__file__).resolve()
HERE = THIS.parent
BODY = b"x" * 200
PUT = json.dumps({"messages": [{"body": "x" * 100}]}).encode()
JSON = {"Content-Type": "application/json"}


def say(doc: object) -> None:
    print(json.dumps(doc), flush=True)


def p50_p90(seconds: list[float]) -> tuple[float, float]:
    """The p50 and p90 of round trips measured in seconds, in ms."""
    seconds = sorted(seconds)
    return round(seconds[len(seconds) // 2] * 1e3, 4), round(
        seconds[len(seconds) * 9 // 10] * 1e3, 4
    )


def percentiles(run: Callable[[], object], count: int) -> tuple[float, float]:
    """p50 and p90 in ms of ``count`` calls of ``run`` (after ``count // 10`` unmeasured)."""
    for _ in range(count // 10):
        run()
    lat = []
    for _ in range(count):
        started = time.perf_counter()
        run()
        lat.append(time.perf_counter() - started)
    return p50_p90(lat)


# ------------------------------------------------------------------ the helpers' processes


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


async def _echo(kind: str, address: str) -> None:
    loop = asyncio.get_running_loop()
    if kind == "tcp":
        await loop.create_server(_Echo, "127.0.0.1", int(address))
    else:
        await loop.create_unix_server(_Echo, address)
    print("ready", flush=True)
    await asyncio.Event().wait()


def _serve_fdatasync(port: int, path: str) -> None:
    from aiohttp import web

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 64 << 20)
    os.fsync(fd)
    at = [0]
    reply = b'{"results":[{"id":"1","status":"created"}]}'

    async def put(request: web.Request) -> web.Response:
        body = await request.read()
        os.pwrite(fd, body, at[0])
        at[0] = (at[0] + len(body)) % (60 << 20)
        os.fdatasync(fd)
        return web.Response(body=reply, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/queues/{name}/messages", put)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


@contextlib.contextmanager
def helper(script: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``script`` with ``args`` in another process; stopped at the end."""
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


# ------------------------------------------------------------------ the figures


def fdatasync(directory: Path, count: int) -> tuple[float, float]:
    path = directory / "latency_floor.dat"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 16 << 20)
        os.fsync(fd)
        at = [0]

        def once() -> None:
            os.pwrite(fd, BODY, at[0])
            at[0] = (at[0] + len(BODY)) % (15 << 20)
            os.fdatasync(fd)

        return percentiles(once, count)
    finally:
        os.close(fd)
        path.unlink()


class _Caller(asyncio.Protocol):
    def __init__(self) -> None:
        self.waiter: asyncio.Future[None] | None = None
        self.got = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= len(BODY) and self.waiter is not None:
            self.got -= len(BODY)
            self.waiter.set_result(None)


async def _round_trips(kind: str, address: str, count: int) -> tuple[float, float]:
    """As a gateway calls a shard: asyncio on both sides, one call in flight."""
    loop = asyncio.get_running_loop()
    if kind == "tcp":
        transport, caller = await loop.create_connection(_Caller, "127.0.0.1", int(address))
    else:
        transport, caller = await loop.create_unix_connection(_Caller, address)
    lat = []
    try:
        for n in range(count + count // 10):
            caller.waiter = loop.create_future()
            started = time.perf_counter()
            transport.write(BODY)  # type: ignore[attr-defined]
            await caller.waiter
            if n >= count // 10:
                lat.append(time.perf_counter() - started)
    finally:
        transport.close()
    return p50_p90(lat)


def hop(kind: str, directory: Path, count: int) -> tuple[float, float]:
    address = str(free_port()) if kind == "tcp" else str(directory / "latency_floor.sock")
    try:
        with helper(THIS, "--echo", kind, address) as proc:
            assert proc.stdout is not None
            proc.stdout.readline()  # "ready"
            return asyncio.run(_round_trips(kind, address, count))
    finally:
        if kind == "unix":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address)


class Http:
    """One kept-alive ``http.client`` connection to 127.0.0.1:``port``."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        self.conn.request(method, path, body=body, headers=JSON if body else {})
        reply = self.conn.getresponse()
        data = reply.read()
        if reply.status >= 300:
            raise RuntimeError(f"{method} {path}: {reply.status} {data[:200]!r}")
        return data

    def put(self) -> bytes:
        return self.call("POST", "/v1/queues/floor/messages", PUT)


def http_figure(script: Path, args: list[str], port: int, count: int) -> tuple[float, float]:
    with helper(script, *args):
        wait_port(port)
        return percentiles(Http(port).put, count)


def evq_figures(directory: Path, count: int) -> dict[str, tuple[float, float]]:
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        server = EvqServe(Path(tmp) / "data", Path(tmp) / "serve.log", ["--shards", "1"])
        try:
            server.wait_ready(180)
            client = Http(server.port)
            client.call("PUT", "/v1/queues/floor", b"{}")
            return {
                "evq_healthz": percentiles(lambda: client.call("GET", "/healthz"), count),
                "evq_get": percentiles(lambda: client.call("GET", "/v1/queues/floor"), count),
                "evq_put": percentiles(client.put, count),
            }
        finally:
            server.stop()


def sitting(rounds: int, count: int, directory: Path) -> dict[str, float]:
    found: dict[str, list[float]] = {}
    for n in range(1, rounds + 1):
        figures = {
            "fdatasync": fdatasync(directory, count),
            "hop_tcp": hop("tcp", directory, count),
            "hop_unix": hop("unix", directory, count),
        }
        port = free_port()
        figures["http"] = http_figure(HERE / "trivial_server.py", [str(port)], port, count)
        port = free_port()
        data = str(directory / "latency_floor.http.dat")
        try:
            figures["http_fdatasync"] = http_figure(
                THIS, ["--serve-fdatasync", str(port), data], port, count
            )
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(data)
        figures.update(evq_figures(directory, count))
        for name, (p50, p90) in figures.items():
            say({"round": n, "figure": name, "p50_ms": p50, "p90_ms": p90})
            found.setdefault(name, []).append(p50)
    return {name: round(statistics.median(p50s), 4) for name, p50s in found.items()}


def main() -> None:
    if sys.argv[1:2] == ["--echo"]:
        asyncio.run(_echo(sys.argv[2], sys.argv[3]))
        return
    if sys.argv[1:2] == ["--serve-fdatasync"]:
        _serve_fdatasync(int(sys.argv[2]), sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=2000, help="round trips per figure and round")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.count < 10:
        ap.error("--count must be at least 10")
    say({"summary": sitting(args.rounds, args.count, args.dir)})


if __name__ == "__main__":
    main()
