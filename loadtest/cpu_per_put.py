"""CPU per single-message put, by process, for evq and for the trivial aiohttp endpoint.

Issue 4 asks for single puts from 64 clients at >= 80 % of the trivial endpoint's rate. This
tool shows what that asks of the CPU. It starts each target in turn (``evq serve`` on a
fresh durable data directory, then ``loadtest/trivial_server.py``), drives it with the
shared load generator (64 closed-loop clients, one 100-B message per request), and reads
the ``/proc`` CPU times of every process of the target's session and of the load generator
over a steady window in the middle of the load. It prints, per run, the rate and the CPU
microseconds each put cost in each process group:

- evq: ``gateway`` (the ``evq serve`` process), ``workers`` (Ray worker processes: the
  shards), ``ray`` (Ray's own processes: GCS, raylet, dashboard, ...);
- trivial: ``server``;
- both: ``loadgen`` (the load generator) and ``machine`` (all CPU busy on the machine, i.e.
  including processes of other users).

and ``ceiling``: the most puts per second the machine's cores could carry at those costs
(cores x 1e6 / (target's us per put + loadgen's us per put)), i.e. the rate if the work were
spread perfectly over every core and nothing waited for anything.

    .venv/bin/python loadtest/cpu_per_put.py --loadgen-python /tmp/venv-anchors/bin/python \\
        [--runs 3] [--clients 64] [--window 5]

The load generator's venv comes from ``../shared/bench/run_all.sh setup``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench_server import BENCH, Target
from procstat import cpu_seconds, machine_busy_seconds
from served import cmdline, session_pids

CORES = os.cpu_count() or 1


def _group(kind: str, pid: int, main_pid: int) -> str:
    if pid == main_pid:
        return "gateway" if kind == "evq" else "server"
    return "workers" if cmdline(pid).startswith("ray::") else "ray"


def _snapshot(kind: str, main_pid: int, loadgen_pid: int) -> dict[int, tuple[str, float]]:
    """{pid: (group, CPU seconds)} for the target's session and the load generator's."""
    groups = [(pid, _group(kind, pid, main_pid)) for pid in session_pids(main_pid)]
    groups += [(pid, "loadgen") for pid in session_pids(loadgen_pid)]
    snap: dict[int, tuple[str, float]] = {}
    for pid, group in groups:
        cpu = cpu_seconds(pid)
        if cpu is not None:
            snap[pid] = (group, cpu)
    return snap


def measure(
    lg_python: str, kind: str, clients: int, window: float, results_dir: str
) -> dict[str, Any]:
    """One run against a fresh ``kind`` target."""
    target = Target(kind, 8790 if kind == "evq" else 8791)
    target.start()
    try:
        assert target.proc is not None
        name = f"cpu-{kind}-{time.monotonic_ns()}"
        lead = 2.5  # load generator start + its 1-s warm-up, before the CPU window opens
        cmd = [lg_python, str(BENCH / "loadgen.py"), "--adapter", "http_json"]
        cmd += ["--target", target.url, "--opt", "create=1", "--producers", str(clients)]
        cmd += ["--consumers", "0", "--size", "100", "--duration", str(window + lead)]
        cmd += ["--warmup", "1", "--runs", "1", "--procs", "1", "--record-group", name]
        cmd += ["--name", name]
        env = {**os.environ, "ANCHORS_RESULTS_DIR": results_dir, "ANCHORS_QUIET_MAX_WAIT": "0"}
        loadgen = subprocess.Popen(
            cmd, cwd=BENCH, env=env, start_new_session=True, stdout=subprocess.DEVNULL
        )
        time.sleep(lead)
        t0, busy0 = time.monotonic(), machine_busy_seconds()
        before = _snapshot(kind, target.proc.pid, loadgen.pid)
        time.sleep(window)
        after = _snapshot(kind, target.proc.pid, loadgen.pid)
        seconds, busy = time.monotonic() - t0, machine_busy_seconds() - busy0
        if loadgen.wait(120) != 0:
            raise RuntimeError(f"the load generator failed with {loadgen.returncode}")
        with open(os.path.join(results_dir, f"{name}.jsonl")) as f:
            run = [json.loads(line) for line in f if line.strip()][-1]["runs"][0]
    finally:
        target.stop()
    puts_per_s = run["put_s"]
    cpu: dict[str, float] = {}
    for pid, (group, end) in after.items():
        if pid in before:
            cpu[group] = cpu.get(group, 0.0) + end - before[pid][1]
    us = {g: 1e6 * c / seconds / puts_per_s for g, c in sorted(cpu.items())}
    us["machine"] = 1e6 * busy / seconds / puts_per_s
    target_us = sum(v for g, v in us.items() if g not in ("loadgen", "machine"))
    return {
        "target": kind,
        "clients": clients,
        "puts_per_s": round(puts_per_s),
        "put_p50_ms": run.get("put_p50_ms"),
        "us_per_put": {g: round(v, 1) for g, v in us.items()},
        "target_us_per_put": round(target_us, 1),
        "ceiling_puts_per_s": round(CORES * 1e6 / (target_us + us.get("loadgen", 0.0))),
        "machine_busy_pct": round(100 * busy / seconds),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--loadgen-python", default="/tmp/venv-anchors/bin/python")
    ap.add_argument("--runs", type=int, default=3, help="runs per target, alternating")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--window", type=float, default=5.0, help="seconds of CPU measurement")
    a = ap.parse_args()
    results_dir = tempfile.mkdtemp(prefix="evq-cpu-results-")
    out: list[dict[str, Any]] = []
    try:
        for i in range(a.runs):
            for kind in ("trivial", "evq"):
                rec = measure(a.loadgen_python, kind, a.clients, a.window, results_dir)
                rec["run"] = i + 1
                print(json.dumps(rec), flush=True)
                out.append(rec)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(results_dir)
    for kind in ("trivial", "evq"):
        recs = [r for r in out if r["target"] == kind]
        summary = {
            "target": kind,
            "median_puts_per_s": statistics.median(r["puts_per_s"] for r in recs),
            "median_target_us_per_put": statistics.median(r["target_us_per_put"] for r in recs),
            "median_loadgen_us_per_put": statistics.median(
                r["us_per_put"].get("loadgen", 0.0) for r in recs
            ),
            "median_ceiling_puts_per_s": statistics.median(r["ceiling_puts_per_s"] for r in recs),
        }
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
