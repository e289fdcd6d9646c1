"""The take-and-ack row at depth, evq beside PostgreSQL and Redis (issue 32: "at depth, where a
table queue suffers").

The harness's mixed row (16 producers putting, 16 consumers each taking 1 message and acking
it, 100-B messages, closed loop) three ways, each run on a fresh queue:

- ``empty``: the queue empty when the run starts (the sitting's row);
- ``queued``: ``--depth`` messages put into it first, left ready: every take finds the
  oldest among them;
- ``churned``: ``--depth`` messages put, then every one of them taken and acked (the churn
  that leaves a table queue its dead rows to vacuum), then the run on the emptied queue.

The fill and the churn go through each system's own fast path, before the run's clock starts,
and are not measured: PostgreSQL one ``INSERT … SELECT generate_series`` (the churn: one
``UPDATE`` as the takes do, then one ``DELETE`` as the acks do; autovacuum left on, as it
runs); Redis the harness's put script pipelined 2,000 at a time (the churn: its take and ack
scripts, 1,000 at a time); evq 1,000 messages per put, 8 at a time (the churn: takes of
1,000, each acked). The load itself is the harness's ``loadgen`` with the harness's adapters
(PostgreSQL: asyncpg, pgmq's data model; Redis: redis-py, Lua scripts; evq: the HTTP
adapter, ``adapters/http_json.py``) subclassed only to fill the queue in ``prepare``.
Servers: the harness's ``bench_postgres.Postgres`` (one for all runs: each run has its own
table) and ``bench_redis.Redis`` (fresh per run, as the harness runs it); ``evq serve`` with
its defaults (``--evq-python``, a fresh data directory under ``--dir``).

Runs under the harness's virtualenv (asyncpg, redis), like its benches:

    /tmp/venv-anchors/bin/python loadtest/depth_mixed.py --depth 1000000 --runs 3 \\
        --duration 5 --dir /work [--only evq postgres redis] [--out DIR]

Records go to ``--out`` (the harness's format: ``<target>.jsonl``); the table (acked/s,
medians of the runs with their range, and each depth's rate over the empty queue's) is
printed and written to ``--out/depth.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT.parent / "shared" / "bench"
sys.path.insert(0, str(BENCH))

from served import EvqServe  # noqa: E402  (a sibling: loadtest/ is first on sys.path)

MODES = ("empty", "queued", "churned")
TARGETS = {"postgres": "PostgreSQL, SKIP LOCKED", "redis": "Redis, AOF always", "evq": "evq"}

# the harness's adapters, each filling its queue in prepare (depth_adapters.py: they import
# the harness's client libraries, which only its virtualenv has)
ADAPTERS = {
    "postgres": "depth_adapters:DeepPostgres",
    "redis": "depth_adapters:DeepRedis",
    "evq": "depth_adapters:DeepHttp",
}


def measure(target: str, args: argparse.Namespace) -> None:
    import common
    from bench_postgres import Postgres
    from bench_redis import Redis
    from loadgen import Spec, run_repeated

    shape = {"producers": 16, "consumers": 16, "size": 100, "batch": 1, "take_wait_s": 1.0}
    shape |= {"duration": args.duration, "warmup": args.warmup}
    for mode in MODES:
        opts = {"mode": mode, "depth": str(args.depth if mode != "empty" else 0)}
        name = f"mixed 16 prod + 16 cons (take 1 + ack), 100 B, {mode}"
        if mode != "empty":
            name += f" {args.depth:,}"
        print(f"== {target}: {name}", flush=True)
        if target == "redis":
            srv = Redis()
            spec = Spec(
                adapter=ADAPTERS["redis"], target="", opts={**opts, "cleanup": "0"}, **shape
            )
            runs = run_repeated(spec, args.runs, before_each=srv.start, after_each=srv.stop)
        elif target == "postgres":
            pg = Postgres()
            pg.start()
            try:
                spec = Spec(
                    adapter=ADAPTERS["postgres"],
                    target=pg.target,
                    server_pid=pg.p.pid,
                    opts=opts,
                    **shape,
                )
                runs = run_repeated(spec, args.runs)
            finally:
                pg.stop()
        else:
            with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
                evq = EvqServe(Path(tmp) / "data", Path(tmp) / "serve.log", python=args.evq_python)
                try:
                    evq.wait_ready(180)
                    spec = Spec(
                        adapter=ADAPTERS["evq"],
                        target=evq.url,
                        server_pid=evq.pid,
                        opts={**opts, "create": "1"},
                        **shape,
                    )
                    runs = run_repeated(spec, args.runs)
                finally:
                    evq.stop()
        common.record(target, name, {**shape, "mode": mode, "depth": args.depth}, runs)


def table(out: Path, depth: int) -> str:
    rates: dict[tuple[str, str], list[float]] = {}
    for path in sorted(out.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            mode = rec.get("settings", {}).get("mode")
            if rec["group"] in TARGETS and mode in MODES:
                rates[rec["group"], mode] = [r["acked_s"] for r in rec["runs"]]
    lines = ["| 16 + 16, take 1 + ack | " + " | ".join(TARGETS.values()) + " |"]
    lines.append("|---" * (len(TARGETS) + 1) + "|")
    titles = {
        "empty": "queue empty",
        "queued": f"{depth:,} messages queued",
        "churned": f"{depth:,} just taken and acked",
    }
    for mode in MODES:
        cells = []
        for target in TARGETS:
            runs = rates.get((target, mode))
            if not runs:
                cells.append("—")
                continue
            cell = f"**{statistics.median(runs):,.0f} acked/s** ({min(runs):,.0f}-{max(runs):,.0f})"
            base = rates.get((target, "empty"))
            if mode != "empty" and base:
                cell += (
                    f", {100 * statistics.median(runs) / statistics.median(base):.0f} % of empty"
                )
            cells.append(cell)
        lines.append(f"| {titles[mode]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--depth", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--only", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    ap.add_argument("--out", type=Path, default=None, help="records (default: a new directory)")
    ap.add_argument("--dir", default=None, help="where evq's data directory goes")
    ap.add_argument("--evq-python", default=str(ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("--table-only", action="store_true", help="print the table of --out")
    args = ap.parse_args()
    if args.depth < 1:
        ap.error("--depth must be at least 1")
    out = args.out or Path(tempfile.mkdtemp(prefix="depth-mixed-"))
    out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        import common

        common.RESULTS_DIR = str(out)  # read when a record is written
        started = time.monotonic()
        for target in args.only:
            measure(target, args)
        print(f"took {time.monotonic() - started:.0f} s; records in {out}", flush=True)
    text = table(out, args.depth)
    (out / "depth.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
