"""What the phases of a run measure with (:class:`Harness`): the client processes' counters
and calls, the server's processes and their CPU time (``procstat``), the coordinator's PUTs
and bursts."""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from procstat import total_cpu_seconds
from served import session_pids

from .common import N_COUNTERS, log, now
from .coordinator import Client
from .http_client import Http, TimedPut, timed_put
from .stats import dist_ms

__all__ = ["Harness"]


class Harness:
    """A run's means: the client processes, the server's processes (pids: the main process,
    then its gateway workers), the coordinator's HTTP; the figures go to ``self.out``."""

    def __init__(self, args: argparse.Namespace, clients: list[Client], shared: Any) -> None:
        self.args = args
        self.clients = clients
        self.shared = shared
        self.http = Http(args.host, args.port)
        self.keys: list[str] = args.key_list
        self.server: list[int] = []
        self.client_pids = [c.proc.pid for c in clients]
        self.out: dict[str, Any] = {}

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

    def session(self) -> list[int]:
        """Every process of a server started here (Ray and its shards too)."""
        if self.args.serve_proc is None:
            return []
        return session_pids(self.args.serve_proc.pid)

    def cpu_mark(self) -> tuple[float, float, float, float]:
        return (
            now(),
            total_cpu_seconds(self.server),
            total_cpu_seconds(self.client_pids),
            total_cpu_seconds(self.session()),
        )

    def cpu_since(self, mark: tuple[float, float, float, float]) -> dict[str, float]:
        t, s, c, w = mark
        wall = now() - t
        server = total_cpu_seconds(self.server) - s
        client = total_cpu_seconds(self.client_pids) - c
        doc = {
            "wall_s": round(wall, 3),
            "server_cpu_s": round(server, 3),
            "client_cpu_s": round(client, 3),
            "server_cores": round(server / wall, 3) if wall > 0 else math.nan,
            "client_cores": round(client / wall, 3) if wall > 0 else math.nan,
        }
        if self.args.serve_proc is not None:
            doc["whole_server_cpu_s"] = round(total_cpu_seconds(self.session()) - w, 3)
        return doc

    async def put(self, key: str, i: int) -> TimedPut:
        return await timed_put(self.http, key, i)

    async def version_of(self, key: str) -> int:
        return int((await self.http.json("GET", f"/v1/keys/{key}"))["version"])

    async def burst(self, keys: list[str], count: int) -> dict[str, Any]:
        """``count`` PUTs per key, ``--put-concurrency`` at once, for at most
        ``--burst-max-seconds``; the final versions, PUT rate and latency."""
        jobs = iter([(k, i) for i in range(count) for k in keys])
        state = _Burst(jobs, {k: 0 for k in keys}, now() + self.args.burst_max_seconds)
        mark = self.cpu_mark()
        ticker = asyncio.ensure_future(self._burst_progress(state))
        try:
            await asyncio.gather(*(self._lane(state) for _ in range(self.args.put_concurrency)))
        finally:
            ticker.cancel()
        return _burst_doc(state, count * len(keys), self.cpu_since(mark))

    async def _lane(self, state: _Burst) -> None:
        """One keep-alive connection sending the burst's PUTs, until none are left or the
        time is up."""
        lane_http = Http(self.args.host, self.args.port)
        try:
            for key, i in state.jobs:
                if now() > state.stop_at:
                    break
                try:
                    done = await timed_put(lane_http, key, i)
                except (RuntimeError, OSError, ConnectionError):
                    state.failed += 1
                    continue
                state.put_s.append(done.t_answered - done.t_sent)
                state.final[key] = max(state.final[key], done.version)
                if done.t_answered > state.last.t_answered:
                    state.last = done
        finally:
            lane_http.close()

    async def _burst_progress(self, state: _Burst) -> None:
        t0 = now()
        while True:
            await asyncio.sleep(self.args.progress_every * 5)
            n = len(state.put_s)
            log(f"  {n} PUTs answered in {now() - t0:.0f} s ({n / (now() - t0):.1f}/s)")


@dataclass
class _Burst:
    """A burst's PUTs still to send (shared by its lanes) and what the lanes measured."""

    jobs: Iterator[tuple[str, int]]
    final: dict[str, int]  # each key's highest version answered
    stop_at: float
    last: TimedPut = field(default_factory=lambda: TimedPut(0, 0.0, 0.0, 0.0, 0.0))
    failed: int = 0
    put_s: list[float] = field(default_factory=list)


def _burst_doc(state: _Burst, planned: int, cpu: dict[str, float]) -> dict[str, Any]:
    puts = len(state.put_s)
    return {
        "puts": puts,
        "planned": planned,
        "failed": state.failed,
        "seconds": cpu["wall_s"],
        "puts_per_s": round(puts / cpu["wall_s"], 1) if cpu["wall_s"] > 0 else math.nan,
        "put_latency": dist_ms(state.put_s),
        "cpu": cpu,
        "final": state.final,
        "last": state.last,
    }
