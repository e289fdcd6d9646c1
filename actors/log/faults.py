"""Fault injection for the event log: a store wrapper that fails on a schedule, and the
same for the local log's disk calls (:class:`FaultyDisk`).

Every fault goes through one seam, :class:`FaultyStore`, which wraps a real store and follows
a schedule written where the test reads it::

    store = FaultyStore(inner).fail_put(3).ack_lost_put(5).delay("put_if_absent", 0.05)

Calls are numbered from 1 in the order they start. ``fail_put`` and ``ack_lost_put`` count
put-type calls (``put`` and ``put_if_absent``) together: "the 3rd put" is the 3rd write,
whichever method made it. ``fail(op, n)`` and ``delay(op, s, n)`` count the calls of ``op``
alone. The wrapper counts every call in :attr:`FaultyStore.calls` and records each fault it
injected in :attr:`FaultyStore.injected`.

A local log (:class:`~actors.log.device.LocalLogDevice`) writes files, not objects; its
seam is :class:`~actors.log.device.Disk`, and :class:`FaultyDisk` is the faulty one::

    disk = FaultyDisk().fail("fdatasync", errno.EIO, 3).delay("fdatasync", 0.01)
    disk.no_space()   # zero-filling new segments fails with ENOSPC, statvfs shows 0 free
    disk.space_back()
"""

from __future__ import annotations

import asyncio
import errno as errnos
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from actors.log.device import Disk
from actors.log.store import ObjectStore, StoreError

__all__ = [
    "DISK_OPS",
    "OPS",
    "PUT_OPS",
    "DiskInjected",
    "FaultSchedule",
    "FaultyDisk",
    "FaultyStore",
    "Injected",
]

Op = Literal["get", "put", "put_if_absent", "list", "delete"]
OPS: tuple[Op, ...] = ("get", "put", "put_if_absent", "list", "delete")
PUT_OPS: tuple[Op, ...] = ("put", "put_if_absent")


def _check_nths(nths: tuple[int, ...]) -> set[int]:
    if not nths or any(not isinstance(n, int) or n < 1 for n in nths):
        raise ValueError(f"call numbers count from 1, got {nths!r}")
    return set(nths)


def _check_op(op: str) -> Op:
    if op not in OPS:
        raise ValueError(f"unknown store operation {op!r}; expected one of {OPS}")
    return op  # narrowed by the check above


@dataclass
class FaultSchedule:
    """Which calls fail and which are slow; call numbers count from 1."""

    fail_puts: set[int] = field(default_factory=set)
    lost_ack_puts: set[int] = field(default_factory=set)
    fail_calls: dict[Op, set[int]] = field(default_factory=dict)
    # op -> (seconds, call numbers or None for every call)
    delays: dict[Op, tuple[float, set[int] | None]] = field(default_factory=dict)

    def fail_put(self, *nths: int) -> Self:
        """Fail these put-type calls before they write (``ambiguous=False``)."""
        self.fail_puts |= _check_nths(nths)
        return self

    def ack_lost_put(self, *nths: int) -> Self:
        """Let these put-type calls write, then fail them (``ambiguous=True``)."""
        self.lost_ack_puts |= _check_nths(nths)
        return self

    def fail(self, op: str, *nths: int) -> Self:
        """Fail these calls of ``op`` before they reach the store (``ambiguous=False``)."""
        self.fail_calls.setdefault(_check_op(op), set()).update(_check_nths(nths))
        return self

    def delay(self, op: str, seconds: float, *nths: int) -> Self:
        """Hold these calls of ``op`` (every call if none given) for ``seconds`` first;
        replaces an earlier delay of ``op``."""
        if seconds < 0:
            raise ValueError("a delay cannot be negative")
        self.delays[_check_op(op)] = (seconds, _check_nths(nths) if nths else None)
        return self


@dataclass(frozen=True)
class Injected:
    """One fault that was injected: the call and what happened to it."""

    op: Op
    call: int  # the number of this call among the calls of ``op``
    put: int | None  # its number among all put-type calls; None for other operations
    fault: Literal["fail", "ack_lost", "delay"]


class FaultyStore:
    """An :class:`~actors.log.store.ObjectStore` that passes calls to ``inner`` and injects
    the faults of its schedule."""

    def __init__(
        self,
        inner: ObjectStore,
        schedule: FaultSchedule | None = None,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self.write_slots = getattr(inner, "write_slots", 1)
        self.schedule = schedule if schedule is not None else FaultSchedule()
        self._sleep = sleep  # injectable, so a test with a fake clock need not wait
        self.calls: Counter[str] = Counter()
        self.injected: list[Injected] = []

    def __repr__(self) -> str:
        return f"FaultyStore({self.inner!r})"

    @property
    def puts(self) -> int:
        """Put-type calls started so far."""
        return self.calls["put"] + self.calls["put_if_absent"]

    # -- schedule, chainable

    def fail_put(self, *nths: int) -> Self:
        """Fail the ``nths`` put-type calls before they write (``ambiguous=False``)."""
        self.schedule.fail_put(*nths)
        return self

    def ack_lost_put(self, *nths: int) -> Self:
        """Let the ``nths`` put-type calls write, then raise (``ambiguous=True``)."""
        self.schedule.ack_lost_put(*nths)
        return self

    def fail(self, op: str, *nths: int) -> Self:
        """Fail the ``nths`` calls of ``op`` before they reach the store."""
        self.schedule.fail(op, *nths)
        return self

    def delay(self, op: str, seconds: float, *nths: int) -> Self:
        """Hold calls of ``op`` (all, or the ``nths``) for ``seconds`` before running them."""
        self.schedule.delay(op, seconds, *nths)
        return self

    # -- the ObjectStore protocol

    async def get(self, key: str) -> bytes:
        """Raises: KeyNotFound, StoreError (also injected)."""
        await self._before("get", key)
        return await self.inner.get(key)

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        """Raises: StoreError (also injected)."""
        numbers = await self._before("put_if_absent", key)
        created = await self.inner.put_if_absent(key, data)
        self._after_put("put_if_absent", key, numbers)
        return created

    async def put(self, key: str, data: bytes) -> None:
        """Raises: StoreError (also injected)."""
        numbers = await self._before("put", key)
        await self.inner.put(key, data)
        self._after_put("put", key, numbers)

    async def list(self, prefix: str) -> list[str]:
        """Raises: StoreError (also injected)."""
        await self._before("list", prefix)
        return await self.inner.list(prefix)

    async def delete(self, key: str) -> None:
        """Raises: StoreError (also injected)."""
        await self._before("delete", key)
        await self.inner.delete(key)

    async def close(self) -> None:
        """Close the wrapped store."""
        await self.inner.close()

    # -- the seam

    async def _before(self, op: Op, key: str) -> tuple[int, int | None]:
        # Number the call before any await, so numbers follow the order in which calls start.
        self.calls[op] += 1
        call = self.calls[op]
        put = self.puts if op in PUT_OPS else None
        seconds, which = self.schedule.delays.get(op, (0.0, None))
        if seconds and (which is None or call in which):
            self.injected.append(Injected(op, call, put, "delay"))
            await self._sleep(seconds)
        if put in self.schedule.fail_puts or call in self.schedule.fail_calls.get(op, ()):
            self.injected.append(Injected(op, call, put, "fail"))
            raise StoreError(
                f"injected failure: {op} #{call} {key!r}", op=op, key=key, ambiguous=False
            )
        return call, put

    def _after_put(self, op: Op, key: str, numbers: tuple[int, int | None]) -> None:
        call, put = numbers
        if put in self.schedule.lost_ack_puts:
            self.injected.append(Injected(op, call, put, "ack_lost"))
            raise StoreError(
                f"injected lost acknowledgement: {op} (put #{put}) {key!r} was written",
                op=op,
                key=key,
                ambiguous=True,
            )


# ------------------------------------------------------------------ the local disk

DiskOp = Literal["pwrite", "fdatasync"]
DISK_OPS: tuple[DiskOp, ...] = ("pwrite", "fdatasync")
SPARE_SUFFIX = ".spare"  # the file the local log zero-fills ahead of time


def _check_disk_op(op: str) -> DiskOp:
    if op not in DISK_OPS:
        raise ValueError(f"unknown disk call {op!r}; expected one of {DISK_OPS}")
    return op  # narrowed by the check above


@dataclass(frozen=True)
class DiskInjected:
    """One disk fault that was injected."""

    op: DiskOp
    call: int  # the number of this call among the calls of ``op``
    path: str
    fault: str  # an errno name (``EIO``), or ``delay``


class FaultyDisk(Disk):
    """The local log's disk calls, failed or slowed on a schedule; real calls otherwise.

    ``fail(op, errno, *nths)`` fails those calls of ``op`` (numbered from 1 as they are
    made; none given: every later call) with ``OSError(errno)``, before the real call (a
    failed ``fdatasync`` has then flushed nothing, the worst case). ``no_space()`` makes
    zero-filling a new segment fail with ENOSPC and statvfs show no free space, as on a
    full file system where writes into blocks already written still succeed;
    ``space_back()`` ends that. ``delay(op, seconds)`` holds every call of ``op`` first
    (the calls run on the shard's event loop or the spare's thread, as real slow calls do).
    ``only`` restricts faults to paths containing it.
    """

    def __init__(self, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.calls: Counter[str] = Counter()
        self.injected: list[DiskInjected] = []
        self.out_of_space = False
        self._fail: dict[DiskOp, dict[int | None, tuple[int, str]]] = {}
        self._delay: dict[DiskOp, tuple[float, str]] = {}
        self._sleep = sleep  # injectable, so a test with a fake clock need not wait

    def fail(self, op: str, code: int, *nths: int, only: str = "") -> Self:
        """Fail the ``nths`` calls of ``op`` (every later one if none) with errno ``code``."""
        which = _check_nths(nths) if nths else {None}
        for n in which:
            self._fail.setdefault(_check_disk_op(op), {})[n] = (code, only)
        return self

    def heal(self) -> Self:
        """Fail nothing more (delays and the space stay as they are)."""
        self._fail.clear()
        return self

    def delay(self, op: str, seconds: float, *, only: str = "") -> Self:
        """Hold every later call of ``op`` for ``seconds`` (0: no more delay)."""
        if seconds < 0:
            raise ValueError("a delay cannot be negative")
        self._delay[_check_disk_op(op)] = (seconds, only)
        return self

    def no_space(self) -> Self:
        """The file system is full from now on."""
        self.out_of_space = True
        return self

    def space_back(self) -> Self:
        """Space returned."""
        self.out_of_space = False
        return self

    # -- the Disk seam

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int, path: str) -> int:
        """``os.pwrite``, or a fault. Raises: OSError."""
        self._before("pwrite", path)
        if self.out_of_space and path.endswith(SPARE_SUFFIX):
            self.injected.append(DiskInjected("pwrite", self.calls["pwrite"], path, "ENOSPC"))
            raise OSError(errnos.ENOSPC, os.strerror(errnos.ENOSPC), path)
        return super().pwrite(fd, data, offset, path)

    def fdatasync(self, fd: int, path: str) -> None:
        """``os.fdatasync``, or a fault. Raises: OSError."""
        self._before("fdatasync", path)
        super().fdatasync(fd, path)

    def free_bytes(self, path: str) -> int:
        """None while out of space, else what statvfs says."""
        return 0 if self.out_of_space else super().free_bytes(path)

    def _before(self, op: DiskOp, path: str) -> None:
        self.calls[op] += 1
        call = self.calls[op]
        seconds, only = self._delay.get(op, (0.0, ""))
        if seconds and only in path:
            self.injected.append(DiskInjected(op, call, path, "delay"))
            self._sleep(seconds)
        schedule = self._fail.get(op, {})
        found = schedule.get(call) or schedule.get(None)
        if found is not None and found[1] in path:
            code = found[0]
            self.injected.append(DiskInjected(op, call, path, errnos.errorcode.get(code, "?")))
            raise OSError(code, os.strerror(code), path)
