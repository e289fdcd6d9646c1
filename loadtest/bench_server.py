"""The server benchmark matrix of issue 4, side by side with a trivial aiohttp endpoint.

Drives ``evq serve`` (fresh data directory, durable local store) and
``loadtest/trivial_server.py`` with the shared load generator (../shared/bench/loadgen.py,
a lean raw-HTTP client; see PLATFORM.md on why the client must not be the bottleneck), same
shapes for both: single and 100-message puts from 1, 64 and 1000 clients with 100 B and
4 KiB bodies, take+ack in batches of 100, a mixed fleet of 1000 producers and 1000
consumers, and latency at about half of peak. Writes every run to a JSON-lines file and
prints a Markdown table of medians for loadtest/RESULTS.md.

    .venv/bin/python loadtest/bench_server.py --loadgen-python /tmp/venv-anchors/bin/python \\
        [--runs 3] [--duration 5] [--out loadtest/reports/server.jsonl] [--only evq]

The load generator's own venv comes from ``../shared/bench/run_all.sh setup``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from served import ROOT, EvqServe

BENCH = (ROOT / ".." / "shared" / "bench").resolve()


class Row:
    def __init__(
        self,
        name: str,
        *,
        producers: int = 0,
        consumers: int = 0,
        size: int = 100,
        put_batch: int = 1,
        take_batch: int = 1,
        procs: int = 1,
        key: bool = False,
        targets: tuple[str, ...] = ("evq",),
    ) -> None:
        self.name = name
        self.producers, self.consumers, self.size = producers, consumers, size
        self.put_batch, self.take_batch, self.procs = put_batch, take_batch, procs
        self.key = key  # measured --runs times (others once)
        self.targets = targets


def matrix() -> list[Row]:
    both = ("trivial", "evq")
    rows = []
    for size in (100, 4096):
        for clients in (1, 64, 1000):
            procs = 2 if clients >= 1000 else 1
            rows.append(
                Row(
                    f"put x1, {clients} clients, {size} B",
                    producers=clients,
                    size=size,
                    procs=procs,
                    key=(clients == 64 and size == 100),
                    targets=both,
                )
            )
            rows.append(
                Row(
                    f"put x100, {clients} clients, {size} B",
                    producers=clients,
                    size=size,
                    put_batch=100,
                    procs=procs,
                    key=(clients == 64 and size == 100),
                )
            )
    for clients in (4, 8, 16):
        rows.append(Row(f"put x1, {clients} clients, 100 B (toward half peak)", producers=clients))
    rows.append(
        Row(
            "take 100 + ack, 16 producers x100 + 16 consumers, 100 B",
            producers=16,
            consumers=16,
            put_batch=100,
            take_batch=100,
            key=True,
        )
    )
    rows.append(
        Row(
            "mixed 1000 producers + 1000 consumers (take 10 + ack), 100 B",
            producers=1000,
            consumers=1000,
            take_batch=10,
            procs=2,
        )
    )
    return rows


def _wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready in {timeout}s")


class Target:
    def __init__(self, kind: str, port: int) -> None:
        self.kind, self.port = kind, port
        self.proc: subprocess.Popen[bytes] | None = None
        self.evq: EvqServe | None = None
        self.data: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if self.kind == "trivial":
            py = str(ROOT / ".venv" / "bin" / "python")
            self.proc = subprocess.Popen(
                [py, str(ROOT / "loadtest" / "trivial_server.py"), str(self.port)],
                cwd=ROOT,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _wait_http(self.url + "/healthz", 120)
            return
        self.data = tempfile.mkdtemp(prefix="evq-bench-")
        extra = ["--auto-create", "--max-requests", "100000", "--max-connections", "20000"]
        extra += ["--log-level", "WARNING"]
        log_path = Path(self.data) / "evq-serve.log"
        self.evq = EvqServe(Path(self.data) / "data", log_path, extra, port=self.port)
        self.proc = self.evq.proc
        self.evq.wait_ready(120)

    def stop(self) -> None:
        if self.evq is not None:
            self.evq.stop(60)
        elif self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.data:
            shutil.rmtree(self.data, ignore_errors=True)


def run_row(
    lg_python: str, target: Target, row: Row, runs: int, duration: float, results_dir: str
) -> list[dict[str, Any]]:
    cmd = [
        lg_python,
        str(BENCH / "loadgen.py"),
        "--adapter",
        "http_json",
        "--target",
        target.url,
        "--opt",
        "create=1",
        "--producers",
        str(row.producers),
        "--consumers",
        str(row.consumers),
        "--size",
        str(row.size),
        "--batch",
        str(row.take_batch),
        "--duration",
        str(duration),
        "--warmup",
        "1",
        "--runs",
        str(runs if row.key else 1),
        "--procs",
        str(row.procs),
        "--server-pid",
        str(target.proc.pid if target.proc else 0),
        "--record-group",
        f"server-{target.kind}",
        "--name",
        row.name,
    ]
    if row.put_batch > 1:
        cmd += ["--opt", f"put_batch={row.put_batch}"]
    env = {**os.environ, "ANCHORS_RESULTS_DIR": results_dir, "ANCHORS_QUIET_MAX_WAIT": "5"}
    print(f"== {target.kind}: {row.name}", flush=True)
    subprocess.run(cmd, cwd=BENCH, env=env, check=True, timeout=600)
    with open(os.path.join(results_dir, f"server-{target.kind}.jsonl")) as f:
        last = [json.loads(line) for line in f if line.strip()][-1]
    return last["runs"]  # type: ignore[no-any-return]


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--loadgen-python", default="/tmp/venv-anchors/bin/python")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--out", default=str(ROOT / "loadtest" / "reports" / "server.jsonl"))
    ap.add_argument("--only", choices=["evq", "trivial"])
    a = ap.parse_args()
    results_dir = tempfile.mkdtemp(prefix="evq-bench-results-")
    out: list[dict[str, Any]] = []
    rows = matrix()
    for kind in ("trivial", "evq"):
        if a.only and kind != a.only:
            continue
        for row in [r for r in rows if kind in r.targets]:
            target = Target(kind, 8790 if kind == "evq" else 8791)
            target.start()  # a fresh server per row: no backlog from the previous one
            try:
                runs = run_row(a.loadgen_python, target, row, a.runs, a.duration, results_dir)
            finally:
                target.stop()
            out.append({"target": kind, "row": row.name, "put_batch": row.put_batch, "runs": runs})
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        for rec in out:
            f.write(json.dumps(rec) + "\n")
    print(table(out))
    return 0


def table(out: list[dict[str, Any]]) -> str:
    trivial = {r["row"]: median(r["runs"], "put_s") for r in out if r["target"] == "trivial"}
    lines = [
        "| row | evq msg/s | p50 ms | p99 ms | acked/s | e2e p99 ms | trivial req/s | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in out:
        if r["target"] != "evq":
            continue
        puts = median(r["runs"], "put_s") or 0.0
        msgs = puts * r["put_batch"]
        base = trivial.get(r["row"])
        ratio = f"{puts / base:.0%}" if base else ""

        def f(key: str, scale: float = 1.0, runs: list[dict[str, Any]] = r["runs"]) -> str:
            v = median(runs, key)
            return "" if v is None else f"{v * scale:,.1f}"

        lines.append(
            f"| {r['row']} ({len(r['runs'])} run{'s' if len(r['runs']) > 1 else ''}) | "
            f"{msgs:,.0f} | {f('put_p50_ms')} | {f('put_p99_ms')} | {f('acked_s')} | "
            f"{f('e2e_p99_ms')} | {'' if base is None else f'{base:,.0f}'} | {ratio} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
