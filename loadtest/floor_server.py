"""The floor of a durable HTTP put in Python on this machine: the least a Python process can
do per put, to measure evq's rows against (issue 32).

One process, uvloop, one ``asyncio.Protocol`` per connection, httptools (llhttp) for the
requests, no validation, no queue, no ids: each ``POST …/messages`` body is appended, as read,
to a group; once per loop turn (``call_soon`` from the first request of the turn, so every
request read in the same turn joins it) the group is written with one ``pwrite`` and one
``fdatasync`` in the loop's own thread (as Redis does with ``appendfsync always``; a writer
thread measured slower here), then every request of the group is answered with a fixed
201-shaped reply. ``POST …/take`` answers no messages and ``…/ack`` no results, at once;
``PUT``/``DELETE`` of a queue answer 201/204, ``GET`` (``/healthz``) 200. Nothing else.

It is durable the way evq is (the reply follows the ``fdatasync`` of its bytes) and does
strictly less; a server in Python cannot beat it on the same machine, so its rates are the
ceiling of any design of evq's in Python, whatever the processes and hops.

    .venv/bin/python loadtest/floor_server.py PORT --dir /work

Run by ``loadtest/sitting.py`` (``--only floor``) beside the peers; on its own, drive it
with the harness's load generator like evq (``--adapter http_json --target
http://127.0.0.1:PORT``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile

import httptools
import uvloop
from trivial_server import ACK_REPLY, PUT_REPLY, TAKE_REPLY  # the same replies as the baseline


def _response(status: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % (status, len(body)) + body


PUT = _response(b"201 Created", PUT_REPLY)
TAKE = _response(b"200 OK", TAKE_REPLY)
ACK = _response(b"200 OK", ACK_REPLY)
CREATED = _response(b"201 Created", b"{}")
DELETED = b"HTTP/1.1 204 No Content\r\n\r\n"
HEALTHY = _response(b"200 OK", b'{"status":"ok"}')


class Log:
    """An append-only file, written and synced once per loop turn."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.pos = 0
        self.bodies: list[bytes] = []
        self.waiting: list[asyncio.Transport] = []
        self.scheduled = False
        self.syncs = 0

    def add(self, body: bytes, transport: asyncio.Transport) -> None:
        self.bodies.append(body)
        self.waiting.append(transport)
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.commit)

    def commit(self) -> None:
        self.scheduled = False
        block, waiting = b"".join(self.bodies), self.waiting
        self.bodies, self.waiting = [], []
        self.pos += os.pwrite(self.fd, block, self.pos)
        os.fdatasync(self.fd)
        self.syncs += 1
        for transport in waiting:
            if not transport.is_closing():
                transport.write(PUT)


class Connection(asyncio.Protocol):
    def __init__(self, log: Log) -> None:
        self.log = log
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url
        self.body = []

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        transport = self.transport
        assert transport is not None
        method = self.parser.get_method()
        if method == b"POST" and self.url.endswith(b"/messages"):
            self.log.add(b"".join(self.body), transport)
        elif method == b"POST" and self.url.endswith(b"/take"):
            transport.write(TAKE)
        elif method == b"POST":
            transport.write(ACK)
        elif method == b"PUT":
            transport.write(CREATED)
        elif method == b"GET":
            transport.write(HEALTHY)
        else:
            transport.write(DELETED)


async def serve(port: int, directory: str) -> None:
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        log = Log(os.path.join(tmp, "log"))
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Connection(log), "127.0.0.1", port)
        stop = loop.create_future()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
        async with server:
            await stop
        os.close(log.fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("port", type=int)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the log file goes")
    args = ap.parse_args()
    uvloop.run(serve(args.port, args.dir))


if __name__ == "__main__":
    main()
