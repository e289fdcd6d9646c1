"""What loadtest/overload.py measures: the server's session and the load's reports.

``Sampler``: the RSS (and open fds) of every process of the server's session (the gateway,
its workers, the shards, Ray's own), once a second, each with its ``role``. ``Phase``: load
processes (overload_load) for a while, their reports drained; ``Totals``: those reports
folded into answers by kind and latency per operation."""

from __future__ import annotations

import queue as queue_mod
from collections import Counter
from typing import Any

from overload_load import KINDS, _load_main, quantile
from procstat import cmdline, fd_count, rss_bytes, session_pids

__all__ = [
    "EVQ_KINDS",
    "MIB",
    "Phase",
    "Sampler",
    "Totals",
    "role",
]

MIB = 1024 * 1024
EVQ_KINDS = ("gateway", "worker", "shard")  # judged; Ray's own processes are only reported


# ------------------------------------------------------------------ the server's processes


def role(pid: int, server_pid: int) -> str:
    """What a process of the server's session is: gateway, worker, shard, or ray."""
    if pid == server_pid:
        return "gateway"
    command = cmdline(pid)
    if command is None:
        return "gone"
    if command.startswith("ray::ShardActor"):
        return "shard"
    if "gateway.workers" in command:
        return "worker"
    return "ray"


class Sampler:
    """RSS (and fds) of every process of the server's session, once a second, read
    through ``procstat``."""

    def __init__(self, server_pid: int, fds: bool = False) -> None:
        self.server_pid, self.fds = server_pid, fds
        self.roles: dict[int, str] = {}
        self.rss: dict[int, list[tuple[float, float]]] = {}
        self.fd: dict[int, list[int]] = {}

    def sample(self, t: float) -> dict[int, float]:
        now: dict[int, float] = {}
        for pid in session_pids(self.server_pid):
            if pid not in self.roles:
                self.roles[pid] = role(pid, self.server_pid)
            nbytes = rss_bytes(pid)
            if nbytes is None:
                continue
            rss = now[pid] = nbytes / MIB
            self.rss.setdefault(pid, []).append((t, rss))
            if self.fds and (n := fd_count(pid)) is not None:
                self.fd.setdefault(pid, []).append(n)
        return now

    def name(self, pid: int) -> str:
        return f"{self.roles.get(pid, '?')}:{pid}"

    def peak(self, pid: int) -> float:
        return max(r for _, r in self.rss[pid])

    def judged(self) -> list[int]:
        return [p for p, r in self.roles.items() if r in EVQ_KINDS and p in self.rss]


# ------------------------------------------------------------------ one phase of load


class Phase:
    """Load processes for a while; their reports folded per second."""

    def __init__(self, ctx: Any, specs: list[dict[str, Any]]) -> None:
        self.out = ctx.Queue()
        # daemonic: ended by multiprocessing at exit (also on SIGTERM, through SystemExit)
        self.procs = [
            ctx.Process(target=_load_main, args=(s, self.out), daemon=True) for s in specs
        ]
        for proc in self.procs:
            proc.start()

    def drain(self) -> list[dict[str, Any]]:
        docs = []
        while True:
            try:
                docs.append(self.out.get_nowait())
            except queue_mod.Empty:
                return docs

    def alive(self) -> bool:
        return any(p.is_alive() for p in self.procs)

    def join(self) -> list[dict[str, Any]]:
        docs = []
        for proc in self.procs:
            while proc.is_alive():
                docs += self.drain()
                proc.join(0.1)
        return docs + self.drain()


class Totals:
    """Answers by kind and latency per operation, over a phase."""

    def __init__(self) -> None:
        self.kinds = {op: Counter[str]() for op in ("put", "take", "ack")}
        self.hist = {op: Counter[int]() for op in ("put", "take", "ack")}
        self.messages: Counter[str] = Counter()
        self.over_budget: Counter[str] = Counter()
        self.refusal: dict[str, str] = {}  # op: the last answer that was not 2xx
        self.not_sent = 0

    def add(self, doc: dict[str, Any]) -> None:
        for op in self.kinds:
            self.kinds[op].update(doc[op]["kinds"])
            self.hist[op].update({int(k): v for k, v in doc[op]["hist"].items()})
            self.messages[op] += doc[op]["messages"]
            self.over_budget[op] += doc[op].get("over_budget", 0)
            if doc[op].get("refusal"):
                self.refusal[op] = doc[op]["refusal"]
        self.not_sent += doc["not_sent"]

    def summary(self, seconds: float) -> dict[str, Any]:
        out: dict[str, Any] = {"seconds": round(seconds, 1), "not_sent": self.not_sent}
        for op, kinds in self.kinds.items():
            if not kinds:
                continue
            out[op] = {
                **{k: kinds.get(k, 0) for k in KINDS},
                "r429_over_budget": self.over_budget[op],
                "messages": self.messages[op],
                "p50_ms": quantile(self.hist[op], 0.5),
                "p99_ms": quantile(self.hist[op], 0.99),
                "max_ms": quantile(self.hist[op], 1.0),  # the slowest answered, to its bucket
            }
            if op in self.refusal:
                out[op]["last_refusal"] = self.refusal[op]
        return out
