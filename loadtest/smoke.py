"""``make loadtest``: a short headless Locust run of the mixed fleet against a fresh server.

Starts ``evq serve`` on a new temporary data directory on 127.0.0.1, waits for ``/readyz``,
runs Locust (several processes: 2000 users do not fit in one on two cores), then reads the
queues' counters, stops the server (SIGTERM, then SIGKILL of whatever of its session is
left) and prints the figures. Reports go to ``--reports`` (default loadtest/reports/,
ignored by git): ``<name>_stats.csv``, ``<name>_stats_history.csv``,
``<name>_failures.csv``, ``<name>.html``, ``<name>-summary.json`` and the server's log.

Exits 1 when the run did not work: no message made it through, or more than
``--max-failure-ratio`` of the requests failed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from served import ROOT, EvqServe, get_json, session_pids


def queue_counts(url: str) -> dict[str, int]:
    """Messages left in every queue after the run, by state."""
    totals: dict[str, int] = {}
    for name in (get_json(f"{url}/v1/queues") or {}).get("queues", []):
        stats = (get_json(f"{url}/v1/queues/{name}") or {}).get("stats", {})
        for key in ("ready", "delayed", "reserved"):
            totals[key] = totals.get(key, 0) + int(stats.get(key, 0))
    return totals


def run_locust(args: argparse.Namespace, url: str, prefix: Path, summary: Path) -> int:
    """The headless Locust run; answers its exit code."""
    command = [sys.executable, "-m", "locust", "-f", str(args.locustfile), "--headless"]
    command += ["-u", str(args.users), "-r", str(args.spawn_rate), "-t", args.time]
    command += [
        "--host",
        url,
        "--csv",
        str(prefix),
        "--csv-full-history",
        "--html",
        f"{prefix}.html",
    ]
    command += ["--stop-timeout", "5", "--only-summary", "--loglevel", "WARNING"]
    if args.processes > 1:
        command += ["--processes", str(args.processes)]
    env = dict(os.environ, EVQ_LOADTEST_SUMMARY=str(summary))
    print("$", " ".join(command), flush=True)
    # Its own session: the worker processes can outlive the master by a moment, and must
    # be gone before the server stops (or their last requests fail against a closed port).
    proc = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
    try:
        return proc.wait(args.deadline)
    except subprocess.TimeoutExpired:
        print(f"locust did not finish within {args.deadline} s", file=sys.stderr)
        return 124
    finally:
        stop_session(proc.pid, grace=10)


def stop_session(sid: int, grace: float) -> None:
    """SIGTERM the processes of session ``sid``, SIGKILL what is left after ``grace`` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for pid in session_pids(sid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.1)


def aggregated(stats_csv: Path) -> dict[str, str]:
    """The "Aggregated" row of Locust's statistics."""
    with stats_csv.open() as f:
        for row in csv.DictReader(f):
            if row["Name"] == "Aggregated":
                return row
    return {}


def report(prefix: Path, summary: Path, left: dict[str, int]) -> tuple[int, int, dict[str, Any]]:
    """Print the figures; answer (requests, failures, message counters)."""
    counters = json.loads(summary.read_text()) if summary.exists() else {}
    counters["left_in_queues"] = left
    summary.write_text(json.dumps(counters, indent=2) + "\n")
    with Path(f"{prefix}_stats.csv").open() as f:
        rows = list(csv.DictReader(f))
    print(
        f"\n{'request':<30}{'count':>9}{'fail':>7}{'rps':>8}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
    )
    for row in rows:
        print(
            f"{row['Name'][:29]:<30}{row['Request Count']:>9}{row['Failure Count']:>7}"
            f"{float(row['Requests/s']):>8.1f}{row['50%']:>9}{row['95%']:>9}{row['99%']:>9}"
        )
    print("\nmessages:", json.dumps(counters))
    total = aggregated(Path(f"{prefix}_stats.csv"))
    return int(total.get("Request Count", 0)), int(total.get("Failure Count", 0)), counters


def main() -> int:
    """Run the smoke test; answer the exit code."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--locustfile", type=Path, default=ROOT / "loadtest/locustfiles/mixed.py")
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--spawn-rate", type=float, default=200)
    parser.add_argument("--time", default="60s", help="Locust's run time (e.g. 60s)")
    parser.add_argument("--processes", type=int, default=4, help="Locust worker processes")
    parser.add_argument("--shards", type=int, help="the server's shards (default: its own)")
    parser.add_argument("--reports", type=Path, default=ROOT / "loadtest/reports")
    parser.add_argument("--name", default="mixed", help="file name prefix of the reports")
    parser.add_argument("--deadline", type=float, default=300, help="kill Locust after (s)")
    parser.add_argument("--max-failure-ratio", type=float, default=0.01)
    args = parser.parse_args()

    args.reports.mkdir(parents=True, exist_ok=True)
    prefix, summary = args.reports / args.name, args.reports / f"{args.name}-summary.json"
    summary.unlink(missing_ok=True)
    data = Path(tempfile.mkdtemp(prefix="evq-loadtest-"))
    shards = ["--shards", str(args.shards)] if args.shards else []
    server = EvqServe(data, args.reports / f"{args.name}-serve.log", shards)
    try:
        server.wait_ready(120)
        print(f"evq serve ready on {server.url} (data {data})", flush=True)
        code = run_locust(args, server.url, prefix, summary)
        left = queue_counts(server.url)
    finally:
        stopped = server.stop()["exit_code"]
        shutil.rmtree(data, ignore_errors=True)
    requests, failures, counters = report(prefix, summary, left)
    print(f"locust exit {code}; evq serve exit {stopped}; reports in {args.reports}/")
    if not counters.get("acked"):
        print("FAILED: no message was acknowledged", file=sys.stderr)
        return 1
    if failures > args.max_failure_ratio * max(requests, 1):
        print(f"FAILED: {failures} of {requests} requests failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
