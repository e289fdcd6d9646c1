"""The overload's verdict in loadtest/overload.py: each process's peak RSS against its
limit (a shard: the budget plus the shard allowance; a gateway: its idle RSS plus the
gateway allowance), the answers that must not happen (timeouts, failed connections, 429s
without Retry-After), a 429 at all, and the recovery."""

from __future__ import annotations

import argparse
from typing import Any

from overload_load import put_request
from overload_run import Run
from overload_sample import EVQ_KINDS, MIB, Sampler

__all__ = ["allowances_mib", "judge"]


def judge(
    run: Run,
    args: argparse.Namespace,
    base: dict[str, float],
    sustainable: dict[str, Any],
    offered: dict[str, Any],
    over: dict[str, Any],
    recovery: dict[str, Any],
) -> dict[str, Any]:
    """The verdict: memory, timeouts, Retry-After, recovery."""
    sampler = run.sampler
    allowances = allowances_mib(args)
    memory, failures = _memory(sampler, args, base, allowances)
    failures += _answer_failures(over, recovery)
    return {
        "ok": not failures,
        "failures": failures,
        "sustainable": sustainable,
        "offered": offered,
        "overload": over,
        "recovery": recovery,
        "memory": memory,
        "allowances": allowances,
        "other_processes_peak_mib": _other_peaks(sampler),
    }


def _memory(
    sampler: Sampler,
    args: argparse.Namespace,
    base: dict[str, float],
    allowances: dict[str, Any],
) -> tuple[dict[str, Any], list[str]]:
    """Each judged process's base, peak and limit, and the peaks past their limit."""
    memory = {}
    failures = []
    for pid in sampler.judged():
        name, kind = sampler.name(pid), sampler.roles[pid]
        if kind == "shard":
            limit = args.shard_memory_mb + allowances["shard_mib"]
        else:
            limit = base.get(name, sampler.rss[pid][0][1]) + allowances["gateway_mib"]
        limit = round(limit, 1)
        peak = sampler.peak(pid)
        memory[name] = {"base_mib": base.get(name), "peak_mib": round(peak, 1), "limit_mib": limit}
        if peak > limit:
            failures.append(f"{name} peaked at {peak:.0f} MiB > {limit:.0f} MiB")
    if not any(sampler.roles[p] == "shard" for p in sampler.judged()):
        failures.append("no shard process was sampled")
    return memory, failures


def _answer_failures(over: dict[str, Any], recovery: dict[str, Any]) -> list[str]:
    """Timeouts, failed connections, 429s without Retry-After; no 429; no recovery."""
    failures = []
    for label, doc in (("overload", over), ("recovery", recovery)):
        for op in ("put", "take", "ack"):
            failures += _op_failures(label, op, doc.get(op, {}))
    if not over.get("put", {}).get("r429"):
        failures.append("overload: no 429 at all (was the server overloaded?)")
    if not recovery["recovered"]:
        failures.append(f"no recovery within {recovery['limit_s']} s")
    return failures


def _op_failures(label: str, op: str, counts: dict[str, Any]) -> list[str]:
    failures = []
    if counts.get("timeout"):
        failures.append(f"{label}: {counts['timeout']} {op}s timed out")
    if counts.get("conn_error"):
        failures.append(f"{label}: {counts['conn_error']} {op}s: connection failed")
    if counts.get("r429_no_retry_after"):
        failures.append(f"{label}: {counts['r429_no_retry_after']} 429s without Retry-After")
    return failures


def _other_peaks(sampler: Sampler) -> dict[str, float]:
    """Ray's own processes' peaks: reported, not judged."""
    return {
        sampler.name(p): round(sampler.peak(p), 1)
        for p in sampler.rss
        if sampler.roles.get(p) not in EVQ_KINDS
    }


def allowances_mib(args: argparse.Namespace) -> dict[str, Any]:
    """What a process may hold past its budget (shards) or its idle size (gateways), in
    MiB: as given, else from the bounds that hold those bytes (stated in the summary)."""
    request = len(put_request("ovl-0", args.batch * args.overload_batch_factor, args.size))
    in_flight = args.max_requests * args.workers * request / MIB
    shard = args.shard_allowance_mb
    if shard is None:
        shard = 16 + in_flight
    gateway = args.gateway_allowance_mb
    if gateway is None:
        gateway = 64 + (args.procs * args.max_conns + 3 * args.max_requests) * request / MIB
    return {
        "shard_mib": round(shard, 1),
        "gateway_mib": round(gateway, 1),
        "request_bytes": request,
        "rule": "shard peak <= --shard-memory-mb + shard allowance; gateway (and worker) "
        "peak <= its idle RSS (baseline) + gateway allowance",
        "shard_default": "16 MiB (1-s sampling, allocator) + the requests the gateways let in "
        "at once (--max-requests x --workers x request bytes): their bodies reach a shard "
        "before it can refuse them",
        "gateway_default": "64 MiB (allocator, buffers) + request bytes x (the client's "
        "connections, each with a request read, + 3 x --max-requests: those in flight "
        "decoded, and twice in a frame toward a shard)",
    }
