"""The soak of loadtest/overload.py (``soak``, and ``overload --then-soak``): a mixed
workload at a fraction of the sustainable rate, the RSS slope and fds of every process of
the server's session, p99 per minute, and the verdict."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from overload_load import quantile
from overload_run import Run
from overload_sample import EVQ_KINDS, Phase, Sampler, Totals

__all__ = ["slope_mib_per_hour", "soak", "soak_phase", "soak_summary"]


def soak(args: argparse.Namespace) -> int:
    server_args = ["--shards", str(args.shards), "--workers", str(args.workers)]
    server_args += ["--max-requests", str(args.max_requests)]
    if args.shard_memory_mb:
        server_args += ["--shard-memory-mb", str(args.shard_memory_mb)]
    with Run(args, server_args) as run:
        return _soak(run, args)


def _soak(run: Run, args: argparse.Namespace) -> int:
    queues = run.queues(args.queues)
    run.create(queues)
    sustainable = run.calibrate(queues)
    run.emit({"calibration": sustainable})
    summary = soak_phase(run, args, queues, sustainable, args.minutes * 60)
    run.emit({"summary": summary})
    return 0 if summary["ok"] else 1


def soak_phase(
    run: Run,
    args: argparse.Namespace,
    queues: list[str],
    sustainable: dict[str, Any],
    seconds: float,
) -> dict[str, Any]:
    """The mixed workload for ``seconds``, with a sampler of its own (RSS and fds)."""
    rate = args.fraction * sustainable["requests_per_s"]
    run.emit({"soak": {"put_requests_per_s": round(rate, 1), "seconds": seconds}})
    consumers = run.split(args.consumers, args.procs)
    specs = [
        run.spec(seconds, queues, rate=rate / args.procs, consumers=c, max_conns=512)
        for c in consumers
    ]
    run.sampler = Sampler(run.server.pid, fds=True)
    phase = Phase(run.ctx, specs)
    start = time.monotonic()
    run.sampler.sample(0.0)
    minutes: dict[int, Totals] = {}
    totals, last = Totals(), start

    def fold(doc: dict[str, Any]) -> None:
        totals.add(doc)
        minutes.setdefault(int((doc["t"] - start) // 60), Totals()).add(doc)

    while phase.alive():
        time.sleep(1)
        rss = run.sampler.sample(time.monotonic() - start)
        for doc in phase.drain():
            fold(doc)
        if time.monotonic() - last >= args.progress:
            last = time.monotonic()
            top = {run.sampler.name(p): round(r, 1) for p, r in rss.items()}
            run.emit({"progress": "soak", "t": round(last - start), "of": seconds, "rss": top})
    for doc in phase.join():
        fold(doc)
    return soak_summary(run, args, totals, minutes, time.monotonic() - start)


def slope_mib_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) points, in MiB/hour."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(r for _, r in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return None
    return round(3600 * sum((t - mx) * (r - my) for t, r in points) / var, 2)


def soak_summary(
    run: Run,
    args: argparse.Namespace,
    totals: Totals,
    minutes: dict[int, Totals],
    seconds: float,
) -> dict[str, Any]:
    """The soak's verdict: RSS slopes and fds per process, p99 per minute, failed requests."""
    sampler = run.sampler
    # A slope over a few minutes is the warm-up's, not a leak's: judged from 10 minutes on.
    slope_judged = seconds - args.warmup >= args.min_slope_minutes * 60
    processes, failures = _processes(sampler, args, slope_judged)
    per_minute = {
        op: [quantile(minutes[m].hist[op], 0.99) for m in sorted(minutes)]
        for op in ("put", "take", "ack")
    }
    failures += _request_failures(totals)
    roles = Counter(sampler.roles[p] for p in sampler.rss)
    return {
        "ok": not failures,
        "failures": failures,
        "seconds": round(seconds, 1),
        "processes": processes,
        "roles": dict(roles),
        "p99_ms_per_minute": per_minute,
        "p99_ms_first_vs_last_10_min": {
            op: {"first": v[:10], "last": v[-10:]} for op, v in per_minute.items()
        },
        "totals": totals.summary(seconds),
        "thresholds": _thresholds(args, slope_judged),
    }


def _processes(
    sampler: Sampler, args: argparse.Namespace, slope_judged: bool
) -> tuple[dict[str, Any], list[str]]:
    """Each process's RSS (start, end, slope after the warm-up) and fds (start, end); the
    gateway and shard processes whose RSS grew too fast or whose fds grew too much."""
    processes, failures = {}, []
    for pid, points in sampler.rss.items():
        name, kind = sampler.name(pid), sampler.roles.get(pid)
        kept = [(t, r) for t, r in points if t >= args.warmup]
        slope = slope_mib_per_hour(kept)
        fds = sampler.fd.get(pid, [])
        processes[name] = {
            "rss_start_mib": round(points[0][1], 1),
            "rss_end_mib": round(points[-1][1], 1),
            "rss_slope_mib_per_hour": slope,
            "samples": len(points),
            "fds_start": fds[0] if fds else None,
            "fds_end": fds[-1] if fds else None,
        }
        if kind not in EVQ_KINDS:
            continue
        if slope_judged and slope is not None and slope > args.max_rss_slope:
            failures.append(f"{name}: RSS grows {slope} MiB/h > {args.max_rss_slope}")
        if fds and fds[-1] - fds[0] > args.max_fd_growth:
            failures.append(f"{name}: fds {fds[0]} -> {fds[-1]} (> +{args.max_fd_growth})")
    return processes, failures


def _request_failures(totals: Totals) -> list[str]:
    """Requests that timed out or whose connection failed."""
    failures = []
    for op in ("put", "take", "ack"):
        for kind in ("timeout", "conn_error"):
            if totals.kinds[op].get(kind):
                failures.append(f"{totals.kinds[op][kind]} {op}s: {kind}")
    return failures


def _thresholds(args: argparse.Namespace, slope_judged: bool) -> dict[str, Any]:
    return {
        "rss_slope_mib_per_hour": args.max_rss_slope,
        "rss_slope_judged": slope_judged,
        "rss_slope_judged_from_minutes": args.min_slope_minutes,
        "fd_growth": args.max_fd_growth,
        "judged": list(EVQ_KINDS),
        "warmup_s": args.warmup,
    }
