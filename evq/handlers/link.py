"""How a handler's runtime hands chunks of messages to its workers: a pool of worker
processes, and a socket to each.

A worker (a Ray actor placed with the handler's resources, :mod:`evq.handlers.cluster`)
serves :class:`WorkerServer`: a thread that accepts one connection at a time from its
runtime and runs each chunk it receives with :func:`~evq.handlers.task.run_task`. The
runtime reaches it with a :class:`WorkerLink`. Measured here (loadtest/RESULTS.md), a chunk
starts in a worker that was idle about a millisecond sooner this way than through a Ray
actor call, which matters for a handler that should start within milliseconds of a put.

Frames are a 4-byte little-endian length and a pickle: ``(rid, messages)`` in,
``(rid, outcomes)`` or ``(rid, None, error text)`` out. A connection begins with the
handshake of :mod:`actors.handshake` on the runtime's secret (made per runtime and given to
its workers when they are created): the worker's challenge (its ephemeral key and whether it
seals, 33 bytes), the runtime's key and proof (64 bytes), the worker's proof (32 bytes). The
secret never crosses the wire, a connection that does not prove it is refused and logged, and
the worker unpickles nothing before the proof matches; unless both ends are on loopback every
frame after it is sealed. A connection that breaks is a lost worker: its
chunk's outcome is unknown (:class:`~evq.handlers.executor.WorkerLost`).

:class:`WorkerPool` keeps the workers: chunks wait in one line and each worker that is up
and free takes the next, so a worker still being placed (its resources not free yet) holds
no chunk; the pool starts a worker when chunks wait and none is free, and lets go of those
idle for long, keeping ``warm`` of them for the next message.

No Ray here: the tests run every end in one process (``spawn`` and ``kill`` are given).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import pickle
import socket
import struct
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from actors import handshake
from evq.handlers.executor import TaskFailed, WorkerLost

__all__ = ["Chunk", "WorkerLink", "WorkerPool", "WorkerServer"]

log = logging.getLogger(__name__)

_LEN = struct.Struct("<I")
MAX_FRAME = 1 << 30
HANDSHAKE_S = 10.0  # each step of the handshake, at most
HELLO_BYTES = 64  # the runtime's key and proof


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv_frame(sock: socket.socket) -> bytes:
    (size,) = _LEN.unpack(_recv_exactly(sock, 4))
    if size > MAX_FRAME:
        raise ConnectionError(f"frame of {size} bytes over the limit")
    return _recv_exactly(sock, size)


def _frame(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


class WorkerServer:
    """The worker's end: runs ``run(messages) -> outcomes`` for each chunk received."""

    def __init__(
        self,
        run: Callable[[Sequence[Any]], list[Any]],
        secret: str,
        host: str,
        *,
        encrypt: bool | None = None,
    ) -> None:
        """``encrypt``: seal every connection (True), or those not on loopback (None)."""
        self._run = run
        self._encrypt = encrypt
        self._secret = secret.encode()
        self.refused = 0  # connections that did not prove the secret
        self._listener = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, int(self._listener.getsockname()[1]))
        self._serving: socket.socket | None = None
        self._thread = threading.Thread(target=self._serve, name="evq-worker", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed
            with sock:
                self._serving = sock
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with contextlib.suppress(ConnectionError, OSError):
                    self._chunks(sock)
                self._serving = None

    def _chunks(self, sock: socket.socket) -> None:
        encrypt = self._encrypt
        if encrypt is None:
            encrypt = not handshake.on_loopback(sock.getsockname(), sock.getpeername())
        shake = handshake.Server(self._secret, encrypt)
        sock.sendall(_frame(shake.public + (b"\x01" if encrypt else b"\x00")))
        sock.settimeout(HANDSHAKE_S)
        try:
            (size,) = _LEN.unpack(_recv_exactly(sock, 4))
            if size != HELLO_BYTES:
                raise handshake.Refused(f"a first frame of {size} bytes, not a proof")
            hello = _recv_exactly(sock, size)
            proof, sealer, opener = shake.accept(hello[:32], hello[32:])
        except (handshake.Refused, TimeoutError) as exc:
            self.refused += 1
            log.warning("worker: refused a connection from %s: %s", sock.getpeername(), exc)
            return
        sock.settimeout(None)
        sock.sendall(_frame(proof))
        while True:
            frame = _recv_frame(sock)
            rid, messages = pickle.loads(opener.open(frame) if opener else frame)
            try:
                reply: tuple[Any, ...] = (rid, self._run(messages))
            except Exception as exc:  # run_task answers per message; this is a bug or OOM
                reply = (rid, None, f"{type(exc).__name__}: {exc}")
            try:
                data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # an outcome that does not pickle
                data = pickle.dumps((rid, None, f"an outcome could not be sent back: {exc}"))
            sock.sendall(_frame(sealer.seal(data) if sealer else data))

    def close(self) -> None:
        """Stop accepting (a connection being served ends with the process)."""
        with contextlib.suppress(OSError):
            self._listener.close()

    def drop(self) -> None:
        """Break the connection being served at once, as the worker's death would (the
        fault-injection seam of the tests)."""
        serving = self._serving
        if serving is not None:
            with contextlib.suppress(OSError):
                serving.shutdown(socket.SHUT_RDWR)


class WorkerLink:
    """The runtime's end of one worker: one chunk at a time."""

    def __init__(self, address: tuple[str, int], secret: str) -> None:
        self.address = address
        self._secret = secret.encode()
        self._sealer: handshake.Sealed | None = None
        self._opener: handshake.Sealed | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._rids = itertools.count(1)

    async def run(self, messages: Sequence[Any]) -> list[Any]:
        """The outcomes of ``messages``.

        Raises:
            WorkerLost: the connection broke (the worker died): the outcome is unknown.
            TaskFailed: the worker could not run the chunk.
        """
        rid = next(self._rids)
        data = pickle.dumps((rid, list(messages)), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            writer = await self._connect()
            writer.write(_frame(self._sealer.seal(data) if self._sealer else data))
            reply = await self._reply()
        except (OSError, asyncio.IncompleteReadError, ConnectionError, EOFError) as exc:
            self.close()
            raise WorkerLost(f"the worker is gone: {type(exc).__name__}") from None
        except asyncio.CancelledError:
            self.close()  # its answer is not wanted: the next chunk goes on a new connection
            raise
        if reply[0] != rid:
            self.close()
            raise WorkerLost(f"the worker answered call {reply[0]}, not {rid}")
        if reply[1] is None:
            raise TaskFailed(reply[2])
        return reply[1]

    async def _connect(self) -> asyncio.StreamWriter:
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        host, port = self.address
        self._reader, self._writer = await asyncio.open_connection(host, port)
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        challenge = await asyncio.wait_for(self._frame(), HANDSHAKE_S)
        me = handshake.Client(self._secret)
        proof, self._sealer, self._opener = me.answer(challenge[:32], challenge[32:] == b"\x01")
        self._writer.write(_frame(me.public + proof))
        me.confirm(await asyncio.wait_for(self._frame(), HANDSHAKE_S))  # Refused: WorkerLost
        return self._writer

    async def _frame(self) -> bytes:
        assert self._reader is not None
        (size,) = _LEN.unpack(await self._reader.readexactly(4))
        if size > MAX_FRAME:
            raise ConnectionError(f"frame of {size} bytes over the limit")
        return await self._reader.readexactly(size)

    async def _reply(self) -> tuple[Any, ...]:
        frame = await self._frame()
        return pickle.loads(self._opener.open(frame) if self._opener else frame)

    def close(self) -> None:
        """Drop the connection (a call in flight ends with WorkerLost)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._reader = None


class Chunk:
    """Messages for a worker, and their outcomes once one has run them."""

    def __init__(self, messages: list[Any]) -> None:
        self.messages = messages
        self.future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()

    async def result(self) -> list[Any]:
        """One outcome per message. Raises: WorkerLost, TaskFailed."""
        return await asyncio.shield(self.future)

    def cancel(self) -> None:
        """Its outcome is not wanted (a worker running it finishes it all the same)."""
        if not self.future.done():
            self.future.cancel()


# (a new worker's handle) <- spawn(); where it listens <- address(handle); kill(handle)
Spawn = Callable[[], Any]
Address = Callable[[Any], Awaitable[tuple[str, int]]]
Kill = Callable[[Any], None]


class WorkerPool:
    """Workers that take chunks from one line (see the module docstring)."""

    def __init__(
        self,
        spawn: Spawn,
        address: Address,
        kill: Kill,
        secret: str,
        *,
        warm: int = 1,
        idle_s: float = 60.0,
    ) -> None:
        self._spawn, self._address, self._kill = spawn, address, kill
        self._secret = secret
        self.warm = warm
        self.idle_s = idle_s
        self._line: deque[Chunk] = deque()
        self._free: deque[asyncio.Future[None]] = deque()  # free workers waiting for a chunk
        self._drivers: dict[Any, asyncio.Task[None]] = {}  # worker -> its driver
        self._starting = 0  # workers not yet ready for a chunk
        self._closed = False

    @property
    def workers(self) -> int:
        """Workers alive (starting, free or busy)."""
        return len(self._drivers)

    def submit(self, messages: list[Any]) -> Chunk:
        chunk = Chunk(messages)
        self._line.append(chunk)
        while self._free and self._line:
            waiter = self._free.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
        else:
            if self._starting < len(self._line):
                self._start()
        return chunk

    def _start(self) -> None:
        worker = self._spawn()
        self._starting += 1
        self._drivers[worker] = asyncio.ensure_future(self._drive(worker))

    async def _drive(self, worker: Any) -> None:
        """Feed ``worker`` chunks until it dies or idles out."""
        link: WorkerLink | None = None
        try:
            try:
                link = WorkerLink(await self._address(worker), self._secret)
            except TaskFailed as exc:  # it did not start: what waits fails with the reason
                self._fail_waiting(exc)
                return
            finally:
                self._starting -= 1
            while True:
                chunk = await self._next(worker)
                if chunk is None:
                    return  # idle too long
                try:
                    outcomes = await link.run(chunk.messages)
                except (WorkerLost, TaskFailed) as exc:
                    if not chunk.future.done():
                        chunk.future.set_exception(exc)
                    if isinstance(exc, WorkerLost):
                        return
                    continue
                if not chunk.future.done():
                    chunk.future.set_result(outcomes)
        finally:
            if link is not None:
                link.close()
            self._drivers.pop(worker, None)
            self._kill(worker)
            if self._line and not self._closed and self._starting < len(self._line):
                self._start()  # what waits needs another worker

    async def _next(self, worker: Any) -> Chunk | None:
        """The next chunk for ``worker`` (None: it idled out and goes)."""
        while True:
            while self._line:
                chunk = self._line.popleft()
                if not chunk.future.done():  # not cancelled while it waited
                    return chunk
            if self._closed:
                return None
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._free.append(waiter)
            keep = len(self._drivers) <= self.warm
            try:
                if keep:
                    await waiter
                else:
                    await asyncio.wait_for(asyncio.shield(waiter), self.idle_s)
            except TimeoutError:
                if len(self._drivers) > self.warm and not self._line:
                    return None
            finally:
                if waiter in self._free:
                    self._free.remove(waiter)

    def _fail_waiting(self, exc: TaskFailed) -> None:
        """A worker could not start: the chunks waiting for one fail with the reason (their
        messages are released with backoff), as a task that could not run did."""
        while self._line:
            chunk = self._line.popleft()
            if not chunk.future.done():
                chunk.future.set_exception(exc)

    async def close(self) -> None:
        """Let go of every worker; chunks still waiting end with WorkerLost."""
        self._closed = True
        while self._line:
            chunk = self._line.popleft()
            if not chunk.future.done():
                chunk.future.set_exception(WorkerLost("the pool closed"))
        for waiter in self._free:
            if not waiter.done():
                waiter.set_result(None)
        drivers = list(self._drivers.values())
        for driver in drivers:
            driver.cancel()
        await asyncio.gather(*drivers, return_exceptions=True)
