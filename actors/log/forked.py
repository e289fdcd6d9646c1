"""A big queue's snapshot encoded in a forked child, so that its shard goes on serving.

Encoding a snapshot is CPU-bound and must see the state as of one record. At depth it takes
seconds (10-15 s for a queue of 30M+ messages in runs, loadtest/RESULTS.md): on the shard's
event loop that stops every queue of the shard for as long, and past the channel's silence
limit (``actors.channel``: 12 s) the gateways drop the connection, failing every call in
flight with "may have happened", which clients then resend.

:func:`encode_forked` forks: the child holds the parent's memory as it was at the fork (the
kernel copies a page only when one side writes it), encodes from it, writes the bytes into
a pipe and exits; the parent's loop reads them on a thread meanwhile and goes on applying
events. This is how Redis writes its snapshots (``BGSAVE``).

The child is careful, as a child of a threaded process must be: it only runs ``encode``
(pure Python and C extensions over objects it already has: no import, no lock another
thread could hold, no event loop, no store), with the collector off (its passes would
write every object's header, copying each page), and leaves with ``os._exit``. One child
at a time per process (:func:`one_child`): several would each copy what the parent
writes meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import struct
from collections.abc import Awaitable, Callable
from typing import NoReturn

from actors.errors import InternalError

__all__ = ["CHILD_TIMEOUT_S", "can_fork", "encode_forked", "one_child"]

_LENGTH = struct.Struct("<Q")
_CHUNK = 1 << 20
# A 100M-message queue's snapshot takes its child 5-15 s here; one still at work after this
# is stuck (or starved past any use): killed, and the snapshot is taken again later.
CHILD_TIMEOUT_S = 600.0
_locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}


def can_fork() -> bool:
    """Whether this platform forks (Linux and the other POSIX systems)."""
    return hasattr(os, "fork")


def one_child() -> asyncio.Lock:
    """The lock a caller holds from before it reads the state it will fork on until the
    child's bytes are back: one child at a time in this process."""
    loop = asyncio.get_running_loop()
    lock = _locks.get(loop)
    if lock is None:
        _locks.clear()  # a loop of before (tests run several) holds no child any more
        lock = _locks[loop] = asyncio.Lock()
    return lock


def encode_forked(
    encode: Callable[[], bytes], timeout_s: float = CHILD_TIMEOUT_S
) -> Awaitable[bytes]:
    """Fork now; the awaitable gives ``encode()``'s bytes, as the child computed them from
    the memory as it was at this call (whatever the loop does meanwhile). Hold
    :func:`one_child` around the call and the await. Cancelled, or not done within
    ``timeout_s`` (a child stuck for any reason must not hold every later snapshot of the
    process), the child is killed (its reader then sees the pipe end, and reaps it).

    Raises:
        OSError: no child (at the call, before anything changed).
        InternalError: (awaiting) the child failed, was killed or sent fewer bytes.
    """
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:  # the child: never returns
        _child(encode, r, w)
    os.close(w)
    return _result(pid, r, timeout_s)


async def _result(pid: int, r: int, timeout_s: float) -> bytes:
    collected = asyncio.get_running_loop().run_in_executor(None, _collect, pid, r)
    try:
        data, status = await asyncio.wait_for(asyncio.shield(collected), timeout_s)
    except (asyncio.CancelledError, TimeoutError) as exc:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # its reader sees the pipe end and reaps it
        if isinstance(exc, TimeoutError):
            await collected
            raise InternalError(
                f"the snapshot's child process did not finish within {timeout_s:g} s: killed"
            ) from None
        raise
    if data is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        raise InternalError(f"the snapshot's child process failed ({_how(status)})")
    return data


def _child(encode: Callable[[], bytes], r: int, w: int) -> NoReturn:
    code = 1
    try:
        gc.disable()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a stop of the session ends it too
        os.close(r)
        data = encode()
        _write_all(w, memoryview(_LENGTH.pack(len(data))))
        _write_all(w, memoryview(data))
        code = 0
    finally:
        os._exit(code)  # whatever happened: the parent learns it from the exit code


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view[:_CHUNK]) :]


def _collect(pid: int, r: int) -> tuple[bytes | None, int]:
    """On a thread: the child's bytes (None: it ended before sending them all), then its
    exit status once it is gone."""
    try:
        head = _read_exactly(r, _LENGTH.size)
        data = None if head is None else _read_exactly(r, _LENGTH.unpack(head)[0])
    finally:
        os.close(r)
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # reaped already (SIGCHLD ignored): all its bytes say it ended well
        status = 0 if data is not None else 1 << 8
    return data, status


def _read_exactly(fd: int, length: int) -> bytes | None:
    buf = bytearray(length)
    view = memoryview(buf)
    got = 0
    while got < length:
        n = os.readv(fd, [view[got : got + _CHUNK]])
        if n == 0:
            return None
        got += n
    return bytes(buf)


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    return f"status {status}"
