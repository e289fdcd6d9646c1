"""A TCP proxy on 127.0.0.1 that records every byte each way: what a capture of the wire
between two of our ends would hold (the channel's and the handlers' link tests)."""

from __future__ import annotations

import asyncio
import contextlib


class Tap:
    """Listens on a port of its own and relays each connection to ``upstream``."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.seen = bytearray()
        self.done = asyncio.Event()  # a connection through it ended both ways
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> tuple[str, int]:
        """Start listening; the address to connect to instead of ``upstream``."""
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return host, port

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    self.seen += data
                    dst.write(data)
            dst.close()
            with contextlib.suppress(ConnectionError):
                await dst.wait_closed()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        self.done.set()
