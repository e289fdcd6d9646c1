"""Many queues against one: the same single-put producers on 1, 8 and 64 queues of one server.

Starts a fresh ``evq serve`` (durable local store; ``--serve`` passes it options) and drives
it with the shared load generator (``../shared/bench/loadgen.py``: raw HTTP keep-alive
clients, closed loop, one 100-B message per put) from ``--procs`` processes with
``--producers`` producers in all, spread over the queues by ``loadtest/evq_queues.py``: with
64 producers from 8 processes, 8 queues get 8 producers each and 64 queues one each. The
counts alternate within each round, in reverse every other round (1, 8, 64, 64, 8, 1, …), so
that noise on the machine, and the slower start of a run right after another, fall on all of
them alike; each round creates fresh queues. Prints every run and the medians as
JSON lines. The load generator runs in the shared harness's virtualenv
(``../shared/bench/setup.sh`` makes ``/tmp/venv-anchors``).

    .venv/bin/python loadtest/bench_queues.py --loadgen-python /tmp/venv-anchors/bin/python \\
        [--runs 3] [--queues 1 8 64] [--producers 64] [--procs 8] [--duration 5] \\
        [--serve --shards 1 ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from served import EvqServe, put_load


def run_once(lg_python: str, url: str, queues: int, args: argparse.Namespace) -> dict:
    """One measured run of the load generator against ``queues`` queues."""
    name = f"q{queues}-{time.monotonic_ns()}"
    load = [*("--producers", str(args.producers), "--procs", str(args.procs))]
    load += [*("--opt", f"queues={queues}", "--opt", f"per_proc={args.producers // args.procs}")]
    load += ["--duration", str(args.duration)]
    return {"queues": queues, **put_load(lg_python, "evq_queues:SpreadAdapter", url, name, load)}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--loadgen-python", default="/tmp/venv-anchors/bin/python")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--queues", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--producers", type=int, default=64)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--dir", default=None, help="where the server's data directory goes")
    ap.add_argument("--serve", nargs=argparse.REMAINDER, default=[], help="evq serve options")
    args = ap.parse_args()
    runs: dict[int, list[dict]] = {q: [] for q in args.queues}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        server = EvqServe(Path(tmp) / "data", Path(tmp) / "serve.log", args.serve)
        try:
            server.wait_ready(120)
            for round_ in range(args.runs):
                # Every other round runs the counts in reverse: with a fixed order, 64 queues
                # measured 15.3k/s last in each round and 16.8k/s first (the run before
                # deletes its queues as it ends), so the order would pick the winner.
                order = args.queues if round_ % 2 == 0 else args.queues[::-1]
                for queues in order:
                    rec = run_once(args.loadgen_python, server.url, queues, args)
                    runs[queues].append(rec)
                    print(json.dumps(rec), flush=True)
        finally:
            print(json.dumps({"server_stop": server.stop()}), flush=True)
    for queues, recs in runs.items():
        summary = {
            "queues": queues,
            "producers": args.producers,
            "procs": args.procs,
            "median_puts_per_s": statistics.median(r["puts_per_s"] for r in recs),
            "runs_puts_per_s": [r["puts_per_s"] for r in recs],
            "median_p50_ms": statistics.median(r["p50_ms"] for r in recs),
        }
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
