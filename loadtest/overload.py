"""Overload and soak of a real ``evq serve`` (issue 19, "Overload and soak").

``overload``: starts ``evq serve`` on a fresh data directory with a shard memory budget
(``--shard-memory-mb``: past it a shard refuses puts with 429) and the gateway's request
bound (``--max-requests``), then

1. **calibrates**: a closed loop of ``--producers`` connections putting ``--batch``
   messages of ``--size`` bytes per request, while ``--consumers`` take and ack, for
   ``--calibrate`` s: the *sustainable* put rate (requests/s and messages/s);
2. **overloads**: offers ``--factor`` (10) times that many *messages* per second open-loop
   for ``--minutes``, with no consumers (the backlog grows until the budget refuses it). One
   Python process cannot offer 10x the requests it could complete on this 2-core machine, so
   the requests are ``--overload-batch-factor`` times bigger (more messages each) and the
   request rate is the rest of the factor; the summary's ``offered`` says exactly what
   10x was (messages/s, bytes/s, requests/s, messages per request) and what was really sent.
   Each request waits at most ``--timeout`` s for an answer (else: a client timeout);
3. **recovers**: drops to ``--recovery-fraction`` (0.5) of the sustainable put rate
   (open-loop, the calibration's request shape) with the consumers draining, until puts are
   answered 2xx again at that rate (``--recovery-window`` consecutive seconds with >= 99 % of
   answers 2xx and >= half the rate answered 2xx) or ``--recovery-limit`` s pass. Not the
   whole sustainable rate: that is the machine's capacity with producers and consumers
   sharing it, so the backlog would drain only as fast as it grows and the shards would stay
   at their budget (measured: ~30k messages/s put and as many acked, a quarter to a third of
   the puts still refused after 120 s).

Every second it samples the RSS of each process of the server's session (the gateway, its
workers, the shards, Ray's own) and counts answers by kind: 2xx, 429 with and without
Retry-After (and of those, ``r429_over_budget``: a shard over its memory budget refused, not a
gateway's own bounds), 503, other, client timeouts, connection errors; p50/p99 of answered
requests.
It prints JSON lines (``baseline``, ``calibration``, ``offered``, ``progress`` every
``--progress`` s, ``overload``, ``recovery``, then ``summary``) and exits 1 when

- a shard's peak RSS passed the budget plus the shard allowance: by default 16 MiB (1-s
  sampling, the allocator) + the bytes of the requests the gateways let in at once
  (``--max-requests`` x ``--workers`` x one overload request): their bodies reach a shard
  before it can refuse them (``--shard-allowance-mb`` overrides);
- a gateway process's peak passed its idle RSS (the ``baseline``, measured after start)
  plus the gateway allowance: 64 MiB + one overload request's bytes x (the client's
  connections + 3 x ``--max-requests``: read, decoded, framed toward a shard) — a gateway
  has no memory budget, only its bounds on requests and connections
  (``--gateway-allowance-mb`` overrides);
- a request timed out (``--timeout``) instead of being answered, or a connection failed;
- a 429 lacked Retry-After; overload brought no 429 at all; or it did not recover.

The summary states the allowances, every process's base and peak, and Ray's own processes'
peaks (reported, not judged). ``--then-soak S`` runs the soak workload below for S seconds
on the same server after the recovery (the integration test does, to start one server).

``soak``: the same server (no memory budget unless given) under a mixed workload: open-loop
puts at ``--fraction`` of the sustainable rate, consumers taking and acking, for
``--minutes`` (60). Every second: RSS and open file descriptors (``/proc/PID/fd``) of every
process of the session; put/take/ack latencies per minute. The summary gives per process
the RSS slope (least squares over the samples after ``--warmup`` s, MiB/hour), fds at start
and end, and p99 per minute (first and last 10 minutes). Exit 1 when a gateway or shard
process's RSS slope passes ``--max-rss-slope`` MiB/h (judged when at least
``--min-slope-minutes`` (10) remain after the warm-up: a shorter slope is the warm-up's),
its fds grew by more than ``--max-fd-growth``, or a request timed out.

Usage (the long runs of the issue; each starts and stops its own server)::

    .venv/bin/python loadtest/overload.py overload --minutes 5 --shard-memory-mb 400 \\
        --out loadtest/reports/overload
    .venv/bin/python loadtest/overload.py soak --minutes 60 --out loadtest/reports/soak

    common: --shards 2 --workers 1 --producers 32 --consumers 8 --queues 4 --size 1000
            --batch 10 --take-max 1000 --procs 2 (load processes) --max-conns 1024 (each)
            --max-requests 512 --timeout 10 --calibrate 10 --progress 5 --dir --out --keep
    overload: --factor 10 --overload-batch-factor 5 --recovery-limit 120
              --recovery-window 3 --shard-allowance-mb --gateway-allowance-mb --then-soak S
    soak: --fraction 0.5 --warmup 120 --max-rss-slope 20 --min-slope-minutes 10
          --max-fd-growth 50

The tool's modules (in loadtest/): ``overload_load.py``, the load processes (a lean HTTP
client, producers and consumers, the latency buckets); ``overload_sample.py``, the server's
processes sampled, load phases and their totals; ``overload_run.py``, the server, the output
and the calibration; ``overload_judge.py``, the overload's verdict; ``overload_soak.py``, the
soak; this one, the overload's phases and the command line.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections import Counter
from typing import Any

from overload_judge import judge
from overload_run import Run
from overload_sample import Phase, Totals
from overload_soak import soak, soak_phase

# ------------------------------------------------------------------ the overload


def baseline(run: Run) -> dict[str, float]:
    """Idle RSS of every process (median of three samples)."""
    samples: dict[int, list[float]] = {}
    for _ in range(3):
        for pid, rss in run.sampler.sample(time.monotonic() - run.t0).items():
            samples.setdefault(pid, []).append(rss)
        time.sleep(0.5)
    return {run.sampler.name(pid): round(sorted(v)[len(v) // 2], 1) for pid, v in samples.items()}


def watch_phase(run: Run, phase: Phase, totals: Totals, label: str, seconds: float) -> None:
    """Sample every second while ``phase`` runs; progress lines every ``--progress`` s."""
    args, started, last = run.args, time.monotonic(), time.monotonic()
    window = Totals()
    while phase.alive():
        time.sleep(1)
        rss = run.sampler.sample(time.monotonic() - run.t0)
        for doc in phase.drain():
            totals.add(doc)
            window.add(doc)
        if time.monotonic() - last >= args.progress:
            last = time.monotonic()
            by_role: dict[str, float] = {}
            for pid, r in rss.items():
                key = run.sampler.roles.get(pid, "?")
                by_role[key] = round(max(by_role.get(key, 0), r), 1)
            run.emit(
                {
                    "progress": label,
                    "t": round(time.monotonic() - started, 1),
                    "of": seconds,
                    "max_rss_mib": by_role,
                    **window.summary(args.progress),
                }
            )
            window = Totals()
    for doc in phase.join():
        totals.add(doc)


def overload(args: argparse.Namespace) -> int:
    server_args = ["--shards", str(args.shards), "--workers", str(args.workers)]
    server_args += ["--shard-memory-mb", str(args.shard_memory_mb)]
    server_args += ["--max-requests", str(args.max_requests)]
    with Run(args, server_args) as run:
        return _overload(run, args)


def _overload(run: Run, args: argparse.Namespace) -> int:
    queues = run.queues(args.queues)
    run.create(queues)
    base = baseline(run)
    run.emit({"baseline": base, "shard_memory_mb": args.shard_memory_mb})
    sustainable = run.calibrate(queues)
    run.emit({"calibration": sustainable})
    offered = offer(args, sustainable)
    run.emit({"offered": offered})
    # overload: open loop, no consumers
    batch = args.batch * args.overload_batch_factor
    specs = [
        run.spec(args.minutes * 60, queues, rate=r, batch=batch)
        for r in _rates(offered["requests_per_s"], args.procs)
    ]
    totals = Totals()
    watch_phase(run, Phase(run.ctx, specs), totals, "overload", args.minutes * 60)
    over = totals.summary(args.minutes * 60)
    sent = sum(totals.kinds["put"].values())
    over["sent_requests_per_s"] = round(sent / (args.minutes * 60), 1)
    over["sent_messages_per_s"] = round(sent * batch / (args.minutes * 60), 1)
    run.emit({"overload": over})
    recovery = recover(run, queues, sustainable)
    run.emit({"recovery": recovery})
    summary = judge(run, args, base, sustainable, offered, over, recovery)
    if args.then_soak:  # the same server, after the overload: does it serve as before?
        soaked = soak_phase(run, args, queues, sustainable, args.then_soak)
        summary["soak"] = soaked
        summary["failures"] += [f"soak: {f}" for f in soaked["failures"]]
        summary["ok"] = not summary["failures"]
    run.emit({"summary": summary})
    return 0 if summary["ok"] else 1


def offer(args: argparse.Namespace, sustainable: dict[str, Any]) -> dict[str, Any]:
    """What ``--factor`` times the sustainable load is, and how it is offered."""
    messages_per_s = args.factor * sustainable["messages_per_s"]
    per_request = args.batch * args.overload_batch_factor
    requests_per_s = messages_per_s / per_request
    return {
        "factor": args.factor,
        "means": f"{args.factor}x the sustainable messages/s (and bytes/s), open-loop, "
        f"in requests of {per_request} messages ({args.overload_batch_factor}x the "
        f"calibration's {args.batch}) at {requests_per_s:.0f} requests/s "
        f"({requests_per_s / sustainable['requests_per_s']:.2f}x its request rate)",
        "messages_per_s": round(messages_per_s, 1),
        "bytes_per_s": round(messages_per_s * args.size),
        "requests_per_s": round(requests_per_s, 1),
        "messages_per_request": per_request,
        "processes": args.procs,
    }


def _rates(total: float, procs: int) -> list[float]:
    return [total / procs] * procs


def recover(run: Run, queues: list[str], sustainable: dict[str, Any]) -> dict[str, Any]:
    """``--recovery-fraction`` of the sustainable put rate (open loop), consumers draining:
    seconds until puts are answered 2xx at that rate for ``--recovery-window`` seconds in a
    row."""
    args = run.args
    rate = sustainable["requests_per_s"] * args.recovery_fraction
    consumers = run.split(args.consumers, args.procs)
    specs = [
        run.spec(args.recovery_limit, queues, rate=rate / args.procs, consumers=c)
        for c in consumers
    ]
    dropped = time.monotonic()
    phase = Phase(run.ctx, specs)
    seconds: dict[int, Counter[str]] = {}
    drained: dict[int, Counter[str]] = {}  # takes' and acks' answers and messages, a second
    totals = Totals()
    recovered_at: float | None = None
    last = dropped
    refusal: str | None = None  # the last put answered other than 2xx
    while phase.alive() and recovered_at is None:
        time.sleep(0.5)
        rss = run.sampler.sample(time.monotonic() - run.t0)
        if time.monotonic() - last >= args.progress:
            last = time.monotonic()
            line = _recovery_line(run, rss, seconds, last - dropped)
            line["drain"] = _recent(run, drained)
            run.emit(line | {"refusal": refusal})
            refusal = None
        for doc in phase.drain():
            totals.add(doc)
            refusal = doc["put"].get("refusal") or refusal
            second = int(doc["t"] - dropped)
            seconds.setdefault(second, Counter()).update(doc["put"]["kinds"])
            drain = drained.setdefault(second, Counter())
            for op in ("take", "ack"):
                drain.update({f"{op}_{k}": n for k, n in doc[op]["kinds"].items()})
                drain[f"{op}_messages"] += doc[op]["messages"]
        recovered_at = _recovered(seconds, rate, args.recovery_window)
    for proc in phase.procs:
        proc.terminate()
    phase.join()
    return {
        "rate_requests_per_s": rate,
        "recovered": recovered_at is not None,
        "seconds_to_recover": recovered_at,
        "limit_s": args.recovery_limit,
        **totals.summary(time.monotonic() - dropped),
    }


def _recovery_line(
    run: Run, rss: dict[int, float], seconds: dict[int, Counter[str]], t: float
) -> dict[str, Any]:
    shards = {
        run.sampler.name(p): round(r, 1)
        for p, r in rss.items()
        if run.sampler.roles.get(p) == "shard"
    }
    put = _recent(run, seconds)
    return {"progress": "recovery", "t": round(t, 1), "shard_rss_mib": shards, "put": put}


def _recent(run: Run, seconds: dict[int, Counter[str]]) -> dict[str, int]:
    """The counts of the last ``--progress`` seconds."""
    recent = Counter[str]()
    for s in sorted(seconds)[-int(run.args.progress) :]:
        recent.update(seconds[s])
    return dict(recent)


def _recovered(seconds: dict[int, Counter[str]], rate: float, window: int) -> float | None:
    """The first second that starts ``window`` complete seconds in which >= 99 % of put
    answers were 2xx and at least half of ``rate`` was answered 2xx (None: not yet): refused
    no more, and flowing (the rate itself is the machine's whole capacity, measured on a
    busy machine, and the consumers are draining the backlog besides). A second is complete
    once a later one has reports (every process reports each second)."""
    done = sorted(seconds)[:-1]
    good = [
        s
        for s in done
        if seconds[s]["ok"] >= 0.5 * rate and seconds[s]["ok"] >= 0.99 * sum(seconds[s].values())
    ]
    for s in good:
        if all(s + k in good for k in range(window)):
            return float(s)
    return None


# ------------------------------------------------------------------ command line


def _common(p: argparse.ArgumentParser, minutes: float) -> None:
    p.add_argument("--minutes", type=float, default=minutes)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="gateway processes")
    p.add_argument("--max-requests", type=int, default=512)
    p.add_argument("--producers", type=int, default=32, help="calibration: closed loop")
    p.add_argument("--consumers", type=int, default=8)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--size", type=int, default=1000, help="message body bytes")
    p.add_argument("--batch", type=int, default=10, help="messages per put request")
    p.add_argument("--take-max", type=int, default=1000)
    p.add_argument("--procs", type=int, default=2, help="load-generator processes")
    p.add_argument("--max-conns", type=int, default=1024, help="per load process")
    p.add_argument("--timeout", type=float, default=10.0, help="client timeout per request, s")
    p.add_argument("--calibrate", type=float, default=10.0, help="seconds")
    p.add_argument("--progress", type=float, default=5.0, help="seconds between lines")
    p.add_argument("--dir", default=None, help="where the data directory goes")
    p.add_argument("--out", default=None, help="also write the JSON lines here")
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    p.add_argument(
        "--serve-arg", action="append", default=[], help="one more argument for evq serve"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    o = sub.add_parser("overload")
    _common(o, 5.0)
    o.add_argument("--shard-memory-mb", type=int, default=400)
    o.add_argument("--factor", type=float, default=10.0)
    o.add_argument("--overload-batch-factor", type=int, default=5)
    o.add_argument("--shard-allowance-mb", type=float, default=None, help="default: computed")
    o.add_argument("--gateway-allowance-mb", type=float, default=None, help="default: computed")
    o.add_argument("--recovery-limit", type=float, default=120.0)
    o.add_argument("--recovery-window", type=int, default=3)
    o.add_argument(
        "--recovery-fraction", type=float, default=0.5, help="of the sustainable put rate"
    )
    o.add_argument("--then-soak", type=float, default=0, help="s of soak on the same server")
    s = sub.add_parser("soak")
    _common(s, 60.0)
    s.add_argument("--shard-memory-mb", type=int, default=0, help="0: the server's default")
    for p in (o, s):
        p.add_argument("--fraction", type=float, default=0.5, help="of the sustainable rate")
        p.add_argument("--warmup", type=float, default=120.0, help="s left out of slopes")
        p.add_argument("--max-rss-slope", type=float, default=20.0, help="MiB/h per process")
        p.add_argument("--max-fd-growth", type=int, default=50)
        p.add_argument("--min-slope-minutes", type=float, default=10.0, help="to judge slopes")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # SIGTERM (a test's timeout) unwinds, so the server's session is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return overload(args) if args.command == "overload" else soak(args)


if __name__ == "__main__":
    sys.exit(main())
