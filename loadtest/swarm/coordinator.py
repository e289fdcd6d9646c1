"""The coordinator's side of the client processes: :func:`start_clients` forks them, each
with its share of the source addresses and its window of the shared progress counters, and
a :class:`Client` calls one of them over a pipe."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import threading
from typing import Any

from .client import SwarmSpec, client_main
from .common import N_COUNTERS

__all__ = ["Client", "start_clients"]


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
