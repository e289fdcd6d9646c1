"""One sitting, side by side: evq against beanstalkd (``-f 0``: fsync before every reply),
RabbitMQ (classic queue, persistent messages, publisher confirms), PostgreSQL as a queue
(SKIP LOCKED, ``synchronous_commit=on``) and Redis (``appendfsync always``), with the shared
harness's load generator and load shape (``../shared/bench``), one after the other on this
machine.

Rows (100-B messages, closed loop, ``--runs`` runs of ``--duration`` s each, medians):

- single puts from 1, 16 and 64 producers (one load-generator process);
- single puts from 64 producers spread over 8 load-generator processes;
- 16 producers + 16 consumers taking 1 message and acking it;
- evq only: 100 messages per put, 16 producers (messages/s = puts/s x 100).

Beside them, the single-put rows against ``floor_server.py`` (``--only floor``): the least a
Python process can do per durable HTTP put, the ceiling of any design of evq's in Python on
this machine (not a peer: the last column leaves it out).

Peers run through the harness's own ``bench_beanstalkd.py``, ``bench_rabbitmq.py``,
``bench_postgres.py`` and ``bench_redis.py`` (a fresh server per run); evq is one ``evq
serve`` with its defaults on a fresh data directory (``loadtest/served.py``), measured
through ``adapters/http_json.py`` like ``run_all.sh ours``.
Raw records go to ``--out`` (``<group>.jsonl`` per target, the harness's format); the table is
printed as Markdown and written to ``--out/table.md``, with a last column: evq's median over
the best peer's in that row (acked/s in the take-and-ack row).

    .venv/bin/python loadtest/sitting.py [--runs 3] [--duration 5] [--out DIR] \\
        [--only evq|beanstalkd|rabbitmq|postgres|redis|floor ...] [--serve --shards 1 ...]

Needs the harness set up once (``../shared/bench/run_all.sh setup``: the peers' servers and
the load generator's virtualenv at ``/tmp/venv-anchors``). About 25 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from served import ROOT, EvqServe, free_port, get_json

BENCH = ROOT.parent / "shared" / "bench"
LOADGEN_PY = "/tmp/venv-anchors/bin/python"

# record group -> column title, in table order
TARGETS = {
    "beanstalkd": "beanstalkd -f 0",
    "rabbitmq": "RabbitMQ classic, confirms",
    "postgres": "PostgreSQL, SKIP LOCKED",
    "redis": "Redis, AOF always",
    "evq": "evq",
    "floor": "the floor in Python (`floor_server.py`)",
}
NOT_PEERS = ("evq", "floor")  # columns the last one does not compare evq with

# (row key, title) in table order
ROWS = [
    ("p1", "1 producer, single puts"),
    ("p16", "16 producers, single puts"),
    ("p64", "64 producers, single puts (1 load-generator process)"),
    ("p64x8", "64 producers, single puts, 8 load-generator processes"),
    ("mixed", "16 producers + 16 consumers (take 1, ack)"),
    ("batch", "16 producers, 100 messages per put"),
]


def _env(out: Path, args: argparse.Namespace) -> dict[str, str]:
    return {
        **os.environ,
        "ANCHORS_RESULTS_DIR": str(out),
        "ANCHORS_RUNS": str(args.runs),
        "ANCHORS_DURATION": str(args.duration),
        "ANCHORS_WARMUP": str(args.warmup),
        "ANCHORS_QUIET_MAX_WAIT": str(args.quiet_wait),
        "ANCHORS_ROOT_PID": str(os.getpid()),
    }


def _run(cmd: list[str], env: dict[str, str]) -> None:
    print("==", " ".join(cmd), flush=True)
    subprocess.run(["nice", "-n", "-10", *cmd], cwd=BENCH, env=env, check=True, timeout=3600)


def peers(out: Path, args: argparse.Namespace) -> None:
    env = _env(out, args)
    if "beanstalkd" in args.only:
        bench = [LOADGEN_PY, "bench_beanstalkd.py", "--modes", "f0", "--sizes", "100"]
        _run([*bench, "--conc", "1,16,64", "--mixed-sizes", "100"], env)
        _run([*bench, "--conc", "64", "--mixed-sizes", "", "--procs", "8"], env)
    if "rabbitmq" in args.only:
        bench = [LOADGEN_PY, "bench_rabbitmq.py", "--queue-types", "classic", "--sizes", "100"]
        _run([*bench, "--conc", "1,16,64", "--mixed-sizes", "100"], env)
        _run([*bench, "--conc", "64", "--mixed-sizes", "", "--procs", "8"], env)
    for peer in ("postgres", "redis"):
        if peer in args.only:
            bench = [LOADGEN_PY, f"bench_{peer}.py", "--sizes", "100"]
            _run([*bench, "--conc", "1,16,64", "--mixed-sizes", "100"], env)
            _run([*bench, "--conc", "64", "--mixed-sizes", "", "--procs", "8"], env)


def _http_load(target: str, pid: int, group: str) -> list[str]:
    """The load generator's command through the HTTP adapter, its records in ``group``."""
    base = [LOADGEN_PY, "loadgen.py", "--adapter", "http_json", "--target", target]
    base += ["--opt", "create=1", "--size", "100", "--server-pid", str(pid)]
    return [*base, "--record-group", group]


def _single_puts(base: list[str], env: dict[str, str]) -> None:
    """The single-put rows: 1, 16 and 64 producers, then 64 from 8 processes."""
    for c in (1, 16, 64):
        _run([*base, "--producers", str(c), "--name", f"put, {c} producers, 100 B"], env)
    eight = ["--producers", "64", "--procs", "8", "--name", "put, 64 producers, 100 B, 8 procs"]
    _run([*base, *eight], env)


def evq(out: Path, args: argparse.Namespace) -> None:
    env = _env(out, args)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        server = EvqServe(Path(tmp) / "data", Path(tmp) / "serve.log", args.serve)
        try:
            server.wait_ready(180)
            base = _http_load(server.url, server.pid, "evq")
            _single_puts(base, env)
            rows = [
                (
                    ["--producers", "16", "--consumers", "16", "--batch", "1"],
                    "mixed 16 prod + 16 cons (take 1 + ack), 100 B",
                ),
                (
                    ["--producers", "16", "--opt", "put_batch=100"],
                    "put x100 per request, 16 producers, 100 B",
                ),
            ]
            for row, name in rows:
                _run([*base, *row, "--name", name], env)
        finally:
            print(json.dumps({"server_stop": server.stop()}), flush=True)


def floor(out: Path, args: argparse.Namespace) -> None:
    """The single-put rows against ``floor_server.py``: the least a Python process does per
    durable HTTP put (no take, so no take-and-ack row)."""
    env = _env(out, args)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "loadtest" / "floor_server.py"), str(port)]
        + (["--dir", args.dir] if args.dir else [])
    )
    try:
        target = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while get_json(f"{target}/healthz", timeout=1) is None:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("floor_server.py did not answer within 30 s")
            time.sleep(0.2)
        _single_puts(_http_load(target, server.pid, "floor"), env)
    finally:
        server.terminate()
        server.wait(10)


# ------------------------------------------------------------------ the table


def _records(out: Path) -> list[dict[str, Any]]:
    recs = []
    for path in sorted(out.glob("*.jsonl")):
        recs += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return recs


def _row_of(rec: dict[str, Any]) -> tuple[str, str] | None:
    """(target, row key) of a record, None for rows the table does not show."""
    group, name, settings = rec["group"], rec["name"], rec.get("settings", {})
    procs = int(settings.get("procs", 1) or 1)
    if group == "beanstalkd" and "(-f 0)" not in name:
        return None
    if group == "rabbitmq" and "classic" not in name:
        return None
    if group not in TARGETS:
        return None
    if "mixed" in name:
        return (group, "mixed") if "take 100" not in name else None
    if "x100" in name:
        return group, "batch"
    if int(settings.get("size", 100)) != 100:
        return None
    producers = int(settings.get("producers", 0))
    if producers == 64 and procs == 8:
        return group, "p64x8"
    if procs == 1 and producers in (1, 16, 64):
        return group, f"p{producers}"
    return None


def _median(runs: list[dict[str, Any]], key: str) -> tuple[float, float, float] | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def table(out: Path) -> str:
    """The newest record of each (target, row) as a Markdown table of medians (min-max)."""
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in _records(out):
        row = _row_of(rec)
        if row is not None:
            newest[row] = rec
    targets = list(TARGETS.items())
    lines = ["| | " + " | ".join(t for _, t in targets) + " | evq / best peer |"]
    lines.append("|---" * (len(targets) + 2) + "|")
    for key, title in ROWS:
        cells = []
        for target, _ in targets:
            rec = newest.get((target, key))
            cells.append(_cell(key, rec) if rec is not None else "—")
        lines.append(f"| {title} | " + " | ".join(cells) + f" | {_ratio(key, newest)} |")
    when = sorted({r["ts"] for r in newest.values()})
    lines.append("")
    lines.append(f"Records from {when[0]} to {when[-1]}." if when else "No records.")
    return "\n".join(lines)


def _rate(key: str, rec: dict[str, Any] | None) -> float | None:
    """The median rate of a row (acked/s for the mixed row, puts/s otherwise)."""
    if rec is None:
        return None
    got = _median(rec["runs"], "acked_s" if key == "mixed" else "put_s")
    return None if got is None else got[0]


def _ratio(key: str, newest: dict[tuple[str, str], dict[str, Any]]) -> str:
    """evq's median over the best peer's, in that row."""
    ours = _rate(key, newest.get(("evq", key)))
    best = [r for t in TARGETS if t not in NOT_PEERS if (r := _rate(key, newest.get((t, key))))]
    if ours is None or not best:
        return "—"
    return f"{ours / max(best):.2f}x"


def _cell(key: str, rec: dict[str, Any]) -> str:
    runs = rec["runs"]
    if key == "mixed":
        put, acked = _median(runs, "put_s"), _median(runs, "acked_s")
        if put is None or acked is None:
            return "—"
        return f"{put[0]:,.0f} put/s, **{acked[0]:,.0f} acked/s** ({acked[1]:,.0f}-{acked[2]:,.0f})"
    put = _median(runs, "put_s")
    if put is None:
        return "—"
    if key == "batch":
        return f"{put[0] * 100:,.0f} msg/s ({put[1] * 100:,.0f}-{put[2] * 100:,.0f})"
    text = f"{put[0]:,.0f}/s ({put[1]:,.0f}-{put[2]:,.0f})"
    p50 = _median(runs, "put_p50_ms")
    if key == "p1" and p50 is not None:
        text += f", p50 {p50[0]:.3f} ms"
    return text


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--quiet-wait", type=float, default=60.0, help="wait for a quiet machine")
    ap.add_argument("--out", default=None, help="results directory (default: a new one in /tmp)")
    ap.add_argument("--dir", default=None, help="where evq's data directory goes")
    ap.add_argument("--only", nargs="+", default=list(TARGETS))
    ap.add_argument("--table-only", action="store_true", help="print the table of --out")
    ap.add_argument("--serve", nargs=argparse.REMAINDER, default=[], help="evq serve options")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="evq-sitting-"))
    out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        if not Path(LOADGEN_PY).exists():
            sys.exit(f"{LOADGEN_PY} is missing: run ../shared/bench/run_all.sh setup first")
        started = time.time()
        peers(out, args)
        if "evq" in args.only:
            evq(out, args)
        if "floor" in args.only:
            floor(out, args)
        print(f"sitting took {time.time() - started:.0f} s; records in {out}", flush=True)
    text = table(out)
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
