"""The coordinator's HTTP: a small keep-alive client (:class:`Http`) and one timed PUT of a
key (:func:`timed_put`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, NamedTuple

from .common import now

__all__ = ["Http", "TimedPut", "timed_put"]


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


class TimedPut(NamedTuple):
    """One PUT of a key: its version and when it was sent and answered."""

    version: int
    t_sent: float  # monotonic
    t_answered: float  # monotonic
    w_sent: float  # wall clock (to compare with the kernel's receive timestamps)
    w_answered: float  # wall clock


async def timed_put(http: Http, key: str, i: int) -> TimedPut:
    """PUT ``{"value": {"i": i}}`` on ``key``; its version and times."""
    t_sent, w_sent = now(), time.time()
    doc = await http.json("PUT", f"/v1/keys/{key}", {"value": {"i": i}})
    return TimedPut(int(doc["version"]), t_sent, now(), w_sent, time.time())
