"""One swarm run's phases, in order (:class:`Run`): the keys, connecting, the server's
memory per watcher, idle CPU, keys nobody watches, single changes, a burst, correctness;
and :func:`coordinate`, the coordinator's event loop around them."""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import itertools
import math
import random
from collections import Counter
from typing import Any

from served import EvqServe

from .common import C_ARMED, C_EVENTS, KIB, MIB, log, now
from .coordinator import Client
from .harness import Harness
from .http_client import Http, TimedPut
from .server import fds, rss, server_processes
from .stats import dist_ms, median

__all__ = ["Run", "coordinate", "wait_ready"]


class Run(Harness):
    """One swarm run: the phases in order, the figures collected in ``self.out``."""

    async def run(self) -> dict[str, Any]:
        args = self.args
        await self.setup_keys()
        self.server = server_processes(args.port, args.server_pid)
        self.out["server_processes"] = [
            {"pid": pid, "role": "main" if i == 0 else "gateway worker"}
            for i, pid in enumerate(self.server)
        ]
        log(f"server: {len(self.server)} process(es) {self.server}")
        if args.unwatched_burst:
            await self.burst([f"{args.key_prefix}warm-up"], min(200, args.unwatched_burst))
            self.out["unwatched_none"] = await self.unwatched("no watcher connected")
        await asyncio.sleep(1.0)
        rss_before = rss(self.server)
        await self.connect()
        await asyncio.sleep(args.settle)
        rss_after = rss(self.server)
        await self.memory(rss_before, rss_after)
        self.out["idle"] = await self.idle()
        if args.unwatched_burst:
            self.out["unwatched_connected"] = await self.unwatched("all watchers connected")
        self.out["single"] = await self.singles()
        if args.burst:
            self.out["burst"] = await self.watched_burst()
        self.out["correctness"] = await self.correctness()
        return self.out

    async def setup_keys(self) -> None:
        for i, key in enumerate(self.keys):
            await self.put(key, -1 - i)  # the key exists: version >= 1
        self.out["initial_versions"] = {k: await self.version_of(k) for k in self.keys}

    async def connect(self) -> None:
        args = self.args
        n, p = args.n, len(self.clients)
        shares = [n // p + (1 if i < n % p else 0) for i in range(p)]
        firsts = list(itertools.accumulate([0, *shares[:-1]]))
        version = max(self.out["initial_versions"].values())
        log(f"connecting {n} {args.mode} watchers from {p} client process(es)…")
        t0 = now()
        mark = self.cpu_mark()
        calls = self._connect_calls(shares, firsts, version)
        progress = await self._connect_progress(calls, t0)
        results = [c.result() for c in calls]  # raises the clients' errors here
        counts = await self.counts()
        t_connected = max(r["t_connected"] for r in results) - t0
        t_armed = max(r["t_armed"] for r in results) - t0
        doc = _connect_doc(n, counts, t_connected, t_armed, self.cpu_since(mark), progress)
        self.out["connect"] = doc
        connected, armed = doc["connected"], doc["armed"]
        log(
            f"  {connected} connected in {t_connected:.2f} s ({connected / t_connected:.0f}/s), "
            f"{armed} armed after {t_armed:.2f} s"
        )

    def _connect_calls(
        self, shares: list[int], firsts: list[int], version: int
    ) -> list[asyncio.Future[Any]]:
        """Each client process connects its share of the watchers (numbered from its first)."""
        args = self.args
        return [
            asyncio.ensure_future(
                c.call(
                    "connect",
                    args.phase_timeout + 10,
                    n=s,
                    first=f,
                    version=version,
                    timeout=args.phase_timeout,
                )
            )
            for c, s, f in zip(self.clients, shares, firsts, strict=True)
        ]

    async def _connect_progress(
        self, calls: list[asyncio.Future[Any]], t0: float
    ) -> list[dict[str, Any]]:
        """A progress line every ``--progress-every`` s until every client has answered."""
        progress: list[dict[str, Any]] = []
        pending = set(calls)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=self.args.progress_every)
            connected, armed, failed, lost, _, errors = self.totals()
            elapsed = now() - t0
            progress.append({"t": round(elapsed, 1), "connected": connected, "armed": armed})
            log(
                f"  {elapsed:6.1f} s: {connected} connected, {armed} armed, {failed} failed, "
                f"{lost} lost, {errors} errors ({connected / max(elapsed, 1e-9):.0f}/s)"
            )
        return progress

    async def memory(self, before: list[int], after: list[int]) -> None:
        armed = (await self.counts())[C_ARMED]
        delta = sum(after) - sum(before)
        self.out["memory"] = {
            "rss_before_mib": round(sum(before) / MIB, 1),
            "rss_after_mib": round(sum(after) / MIB, 1),
            "delta_mib": round(delta / MIB, 1),
            "watchers": armed,
            "per_watcher_kib": round(delta / armed / KIB, 2) if armed else math.nan,
            "per_process": [
                {
                    "pid": pid,
                    "rss_before_mib": round(b / MIB, 1),
                    "rss_after_mib": round(a / MIB, 1),
                    "fds": fds(pid),
                }
                for pid, b, a in zip(self.server, before, after, strict=True)
            ],
        }
        log(
            f"  server RSS {sum(before) / MIB:.0f} → {sum(after) / MIB:.0f} MiB: "
            f"{self.out['memory']['per_watcher_kib']} KiB per watcher"
        )

    async def idle(self) -> dict[str, Any]:
        mark = self.cpu_mark()
        await asyncio.sleep(self.args.idle_seconds)
        cpu = self.cpu_since(mark)
        log(f"  idle {cpu['wall_s']:.0f} s: server {cpu['server_cores']:.3f} cores")
        return cpu

    async def unwatched(self, label: str) -> dict[str, Any]:
        """Bursts on keys nobody watches (a new key each time): PUT rate and CPU."""
        args = self.args
        runs = []
        events0 = (await self.counts())[C_EVENTS]
        for r in range(args.unwatched_repeats):
            key = f"{args.key_prefix}unwatched-{random.randbytes(4).hex()}"
            result = await self.burst([key], args.unwatched_burst)
            result.pop("last")
            result.pop("final")
            runs.append(result)
            cpu = result["cpu"]
            log(
                f"unwatched key, {label}, {r + 1}/{args.unwatched_repeats}: {result['puts']} "
                f"PUTs in {result['seconds']:.2f} s ({result['puts_per_s']:.0f}/s); CPU s: "
                f"gateway {cpu['server_cpu_s']:.2f}, whole server {cpu.get('whole_server_cpu_s')}"
            )
        cpus = [r["cpu"] for r in runs]
        return {
            "runs": runs,
            "median_puts_per_s": median([r["puts_per_s"] for r in runs]),
            "median_seconds": median([r["seconds"] for r in runs]),
            "median_gateway_cpu_s": median([c["server_cpu_s"] for c in cpus]),
            "median_whole_server_cpu_s": median(
                [c.get("whole_server_cpu_s", math.nan) for c in cpus]
            ),
            "events": (await self.counts())[C_EVENTS] - events0,  # must be 0
        }

    async def quiet(self, limit_s: float = 120.0) -> float:
        """Wait until the server processes are idle (< 0.05 cores over half a second), so a
        change is measured alone and not behind the re-arms of the previous one."""
        t0 = now()
        while now() - t0 < limit_s:
            mark = self.cpu_mark()
            await asyncio.sleep(0.5)
            if self.cpu_since(mark)["server_cores"] < 0.05:
                break
        return now() - t0

    async def singles(self) -> dict[str, Any]:
        runs = [await self._single(r) for r in range(self.args.singles)]
        return {
            "runs": runs,
            "median": {
                f"{side}_{q}": round(median([r[side][q] for r in runs]), 1)
                for side in ("arrived_sent", "handled_sent", "arrived_answered", "handled_answered")
                for q in ("p50_ms", "p99_ms", "max_ms")
            },
        }

    async def _single(self, r: int) -> dict[str, Any]:
        """The ``r``-th single change (one PUT per key, after a quiet pause): when the
        watchers' sockets got it and when the client processes handled it."""
        await asyncio.sleep(self.args.single_pause)
        await self.quiet()
        events0 = (await self.counts())[C_EVENTS]
        mark = self.cpu_mark()
        done = await asyncio.gather(*(self.put(k, 10_000 + r) for k in self.keys))
        targets = {i: d.version for i, d in enumerate(done)}
        last = max(done, key=lambda d: d.t_answered)
        results = await self.all_clients(
            "wait", self.args.wait_timeout + 30, targets=targets, timeout=self.args.wait_timeout
        )
        cpu = self.cpu_since(mark)
        times, stamps = _arrays(results, "times"), _arrays(results, "stamps")
        first = min(done, key=lambda d: d.t_sent)
        d = {
            # the kernel's receive time at the watcher's socket (what the server did) and
            # the time the client process handled it, after the PUT was sent and answered
            "arrived_sent": dist_ms([k - first.w_sent for k in stamps]),
            "handled_sent": dist_ms([t - first.t_sent for t in times]),
            "arrived_answered": dist_ms([k - last.w_answered for k in stamps]),
            "handled_answered": dist_ms([t - last.t_answered for t in times]),
            "reached": len(times),
            "short": sum(x["short"] for x in results),
            "put_ms": round((last.t_answered - first.t_sent) * 1000, 1),
            "events": (await self.counts())[C_EVENTS] - events0,
            "cpu": cpu,
        }
        self._log_single(r, d)
        return d

    def _log_single(self, r: int, d: dict[str, Any]) -> None:
        a, h, cpu = d["arrived_sent"], d["handled_sent"], d["cpu"]
        log(
            f"one change {r + 1}/{self.args.singles} (ms after the PUT was sent): in the "
            f"socket p50 {a['p50_ms']} / p99 {a['p99_ms']} / max {a['max_ms']}, handled "
            f"p50 {h['p50_ms']} / p99 {h['p99_ms']} / max {h['max_ms']}; PUT answered after "
            f"{d['put_ms']}; {d['reached']} reached, {d['short']} short; CPU s gateway "
            f"{cpu['server_cpu_s']:.2f}, client {cpu['client_cpu_s']:.2f}"
        )

    async def watched_burst(self) -> dict[str, Any]:
        args = self.args
        log(f"burst of {args.burst} changes per key on {len(self.keys)} watched key(s)")
        events0 = (await self.counts())[C_EVENTS]
        mark = self.cpu_mark()
        b = await self.burst(self.keys, args.burst)
        targets = {i: b["final"][k] for i, k in enumerate(self.keys)}
        results = await self.all_clients(
            "wait", args.wait_timeout + 30, targets=targets, timeout=args.wait_timeout
        )
        cpu = self.cpu_since(mark)
        last: TimedPut = b.pop("last")
        times, stamps = _arrays(results, "times"), _arrays(results, "stamps")
        handled = dist_ms([t - last.t_answered for t in times])
        b.update(
            reached=len(times),
            short=sum(x["short"] for x in results),
            all_at_final_after_last_put_ms=handled["max_ms"],
            to_final_handled=handled,
            to_final_arrived=dist_ms([k - last.w_answered for k in stamps]),
            events=(await self.counts())[C_EVENTS] - events0,
            cpu_whole=cpu,
        )
        b["events_per_watcher"] = round(b["events"] / max(1, self.args.n), 1)
        log(
            f"  {b['puts']} PUTs in {b['seconds']:.1f} s ({b['puts_per_s']:.0f}/s); all at the "
            f"final version {handled['max_ms']:.0f} ms after the last PUT; "
            f"{b['events_per_watcher']} events per watcher; {b['short']} short"
        )
        return b

    async def correctness(self) -> dict[str, Any]:
        finals = {k: await self.version_of(k) for k in self.keys}
        summaries = await self.all_clients("summary", 60)
        at_final = not_final = closed = watchers = 0
        errors: Counter[str] = Counter()
        for s in summaries:
            watchers += s["watchers"]
            closed += s["closed"]
            errors.update(s["errors"])
            for kidx, versions in s["versions"].items():
                final = finals[self.keys[int(kidx)]]
                for version, count in versions.items():
                    if int(version) == final:
                        at_final += count
                    else:
                        not_final += count
        _, _, failed, lost, events, n_errors = await self.counts()
        doc = {
            "final_versions": finals,
            "watchers_requested": self.args.n,
            "watchers_connected": watchers,
            "at_final_version": at_final,
            "not_at_final_version": not_final + (self.args.n - watchers),
            "connect_failures": failed,
            "lost_connections": lost,
            "errors": n_errors,
            "error_kinds": dict(errors.most_common(10)),
            "events_total": events,
            "ok": at_final == self.args.n,
        }
        log(f"correctness: {at_final}/{self.args.n} at the final version; {lost} lost")
        return doc


def _connect_doc(
    n: int,
    counts: list[int],
    t_connected: float,
    t_armed: float,
    cpu: dict[str, float],
    progress: list[dict[str, Any]],
) -> dict[str, Any]:
    connected, armed, failed, lost, _, _errors = counts
    return {
        "watchers": n,
        "connected": connected,
        "armed": armed,
        "failed": failed,
        "lost": lost,
        "connect_seconds": round(t_connected, 2),
        "connect_rate_per_s": round(connected / t_connected, 1) if t_connected else math.nan,
        "armed_seconds": round(t_armed, 2),
        "cpu": cpu,
        "progress": progress,
    }


def _arrays(results: list[dict[str, Any]], name: str) -> list[float]:
    out: list[float] = []
    for r in results:
        a = array.array("d")
        a.frombytes(r[name])
        out.extend(a)
    return out


async def wait_ready(http: Http, timeout_s: float, proc: EvqServe | None) -> None:
    deadline = now() + timeout_s
    while now() < deadline:
        if proc is not None and proc.proc.poll() is not None:
            raise RuntimeError(f"evq serve exited with {proc.proc.returncode}; see {proc.log_path}")
        with contextlib.suppress(OSError, ConnectionError, asyncio.IncompleteReadError):
            status, _ = await http.request("GET", "/readyz")
            if status == 200:
                return
        http.close()
        await asyncio.sleep(0.5)
    raise RuntimeError("the server did not become ready")


async def coordinate(args: argparse.Namespace, clients: list[Client], shared: Any) -> dict:
    loop = asyncio.get_running_loop()
    for c in clients:
        c.listen(loop)
    run = Run(args, clients, shared)
    try:
        await wait_ready(run.http, 180, args.serve_proc)
        log(f"server ready at http://{args.host}:{args.port}")
        return await run.run()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run.all_clients("close", 30), 40)
        run.http.close()
        args.partial = run.out
