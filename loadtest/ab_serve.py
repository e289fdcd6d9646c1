"""Two ``evq serve`` side by side, A and B, measured in alternation: the way to tell a change's
effect on this machine, where the host's steal moves every figure by 2x within minutes.

Both servers run the whole time (an idle one costs next to nothing); each round measures every
row on A and on B, one right after the other, in the order ABBA... (A first in odd rounds, B
first in even ones), so a drift of the machine weighs on both alike. Each measurement is one
run of the shared harness's load generator (``../shared/bench/loadgen.py``, the HTTP adapter,
100-B messages, as ``sitting.py`` runs it). The summary gives, per row, the median of each
side, and the median of the rounds' B/A ratios (a ratio within one round is measured minutes
apart at most). A measurement during which the host stole more than ``--max-steal`` % of the
CPU (``steal`` in /proc/stat, as the harness records it) is taken again, ``--tries`` times at
most (the last one counts).

A and B differ by their tree (``--a-tree``/``--b-tree``: another checkout, run with its own
directory first on ``PYTHONPATH``, Ray's workers included), their environment (``--a-env``,
``--b-env``: ``KEY=VALUE``), their ``evq serve`` arguments (``--a-args``, ``--b-args``), or
HTTPS (``--a-tls``, ``--b-tls``: a certificate of a CA made for the run; the load generator
trusts that CA through ``SSL_CERT_FILE``). The cost of TLS on the per-operation rows::

    .venv/bin/python loadtest/ab_serve.py --b-tls --rows p1,p64,mixed --rounds 6

    .venv/bin/python loadtest/ab_serve.py --b-tree ../wt --rounds 6 --duration 4 \\
        [--rows p1,p16,p64,mixed] [--a-env EVQ_UVLOOP=0] [--dir /work]

Rows: ``p1``, ``p16``, ``p64`` (single puts from that many producers), ``p64x8`` (64 producers
from 8 processes), ``mixed`` (16 producers + 16 consumers taking 1 and acking: acked/s),
``batch`` (16 producers, 100 messages per put: messages/s), ``poll`` (1 producer + 16
consumers long-polling for 1 message each and acking it: acked/s; the queue is mostly empty,
so takes wait). Prints a JSON line per
measurement, then ``{"summary": ...}``; raw records go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from served import BENCH, ROOT, EvqServe

LOADGEN_PY = "/tmp/venv-anchors/bin/python"
ROWS: dict[str, list[str]] = {
    "p1": ["--producers", "1"],
    "p16": ["--producers", "16"],
    "p64": ["--producers", "64"],
    "p64x8": ["--producers", "64", "--procs", "8"],
    "mixed": ["--producers", "16", "--consumers", "16", "--batch", "1"],
    "batch": ["--producers", "16", "--opt", "put_batch=100"],
    "poll": ["--producers", "1", "--consumers", "16", "--batch", "1"],
}


def rate(row: str, rec: dict[str, Any]) -> float:
    """A measurement's figure: acked/s (mixed, poll), messages/s (batch), puts/s (the others)."""
    [run] = rec["runs"]
    if row in ("mixed", "poll"):
        return float(run["acked_s"])
    return float(run["put_s"]) * (100 if row == "batch" else 1)


def summarize(
    figures: dict[str, dict[str, list[float]]], p50: dict[str, list[float]]
) -> dict[str, Any]:
    """Per row: each side's median, the median of the rounds' B/A ratios, and those ratios;
    the 1-producer row's median p50 latency per side."""
    summary: dict[str, Any] = {}
    for row, sides in figures.items():
        ratios = [b / a for a, b in zip(sides["a"], sides["b"], strict=True) if a]
        summary[row] = {
            "a": round(statistics.median(sides["a"]), 1),
            "b": round(statistics.median(sides["b"]), 1),
            "b_over_a": round(statistics.median(ratios), 3),
            "rounds_b_over_a": [round(x, 2) for x in ratios],
        }
    if p50["a"] and p50["b"]:
        summary["p1_p50_ms"] = {s: round(statistics.median(v), 3) for s, v in p50.items()}
    return summary


def measure(
    side: str, server: EvqServe, row: str, out: Path, args: argparse.Namespace, ca: str = ""
) -> Any:
    """One run of ``row`` against ``server``; its record."""
    group = f"ab-{side}"
    # With HTTPS on either side both use the adapter that speaks it (the same raw client
    # over TLS or plain TCP: loadtest/tls_adapter.py), so that only the server differs.
    adapter = "tls_adapter:TlsJsonAdapter" if args.a_tls or args.b_tls else "http_json"
    cmd = [LOADGEN_PY, "loadgen.py", "--adapter", adapter, "--target", server.url]
    cmd += ["--opt", "create=1", "--size", "100", "--server-pid", str(server.pid)]
    cmd += ["--record-group", group, *ROWS[row], "--name", f"{row}"]
    env = {
        **os.environ,
        "ANCHORS_RESULTS_DIR": str(out),
        "ANCHORS_RUNS": "1",
        "ANCHORS_DURATION": str(args.duration),
        "ANCHORS_WARMUP": str(args.warmup),
        "ANCHORS_QUIET_MAX_WAIT": "0",
        "ANCHORS_ROOT_PID": str(os.getpid()),
        **({"SSL_CERT_FILE": ca} if ca else {}),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT / "loadtest"), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    records = out / f"{group}.jsonl"
    before = records.read_text().count("\n") if records.exists() else 0
    subprocess.run(
        ["nice", "-n", "-10", *cmd], cwd=BENCH, env=env, check=True, timeout=600,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    lines = records.read_text().splitlines()
    assert len(lines) == before + 1, f"loadgen wrote {len(lines) - before} records"
    return json.loads(lines[-1])


def start(
    side: str, tree: Path, env: list[str], extra: str, tmp: Path, tls: Any = None
) -> EvqServe:
    """``evq serve`` of ``tree`` with ``env`` and ``extra`` arguments, on a fresh directory;
    over HTTPS with ``tls`` (a pair of loadtest.tlscerts)."""
    environ = dict(item.split("=", 1) for item in env)
    if tree.resolve() != ROOT.resolve():
        environ["PYTHONPATH"] = str(tree.resolve())
    data = tmp / f"data-{side}"
    args = shlex.split(extra)
    if tls is not None:
        args += ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
    scheme = "https" if tls is not None else "http"
    log = tmp / f"serve-{side}.log"
    return EvqServe(data, log, args, env=environ, cwd=tree, scheme=scheme)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--a-tree", type=Path, default=ROOT)
    ap.add_argument("--b-tree", type=Path, default=ROOT)
    ap.add_argument("--a-env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--b-env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--a-args", default="", help="evq serve's arguments for A (one string)")
    ap.add_argument("--b-args", default="", help="evq serve's arguments for B (one string)")
    ap.add_argument("--a-tls", action="store_true", help="A serves HTTPS")
    ap.add_argument("--b-tls", action="store_true", help="B serves HTTPS")
    ap.add_argument("--rows", default="p1,p16,mixed")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument(
        "--max-steal", type=float, default=10.0,
        help="measure again when the host stole more of the CPU than this (%%)",
    )  # fmt: skip
    ap.add_argument("--tries", type=int, default=3, help="measurements at most, per cell")
    ap.add_argument("--out", type=Path, default=None, help="records (default: a new directory)")
    ap.add_argument("--dir", default=None, help="where the data directories go")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop both servers on the way out
    rows = args.rows.split(",")
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}; known: {list(ROWS)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="ab-"))
    out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, dict[str, list[float]]] = {r: {"a": [], "b": []} for r in rows}
    p50: dict[str, list[float]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp_dir:
        tmp = Path(tmp_dir)
        ca = ""
        pairs: dict[str, Any] = {"a": None, "b": None}
        if args.a_tls or args.b_tls:
            sys.path.insert(0, str(ROOT))
            from loadtest.tlscerts import Authority

            authority = Authority(tmp / "ca")
            ca = str(authority.bundle)
            os.environ["SSL_CERT_FILE"] = ca  # this process's readiness probes too
            pairs = {s: authority.issue(s) if on else None for s, on in
                     (("a", args.a_tls), ("b", args.b_tls))}  # fmt: skip
        servers = {
            "a": start("a", args.a_tree, args.a_env, args.a_args, tmp, pairs["a"]),
            "b": start("b", args.b_tree, args.b_env, args.b_args, tmp, pairs["b"]),
        }
        try:
            for server in servers.values():
                server.wait_ready(180)
            for rnd in range(args.rounds):
                order = ["a", "b"] if rnd % 2 == 0 else ["b", "a"]
                for row in rows:
                    for side in order:
                        for _ in range(args.tries):  # the host took the CPU: measure again
                            rec = measure(side, servers[side], row, out, args, ca)
                            [run] = rec["runs"]
                            if run.get("steal_cpu_pct", 0.0) <= args.max_steal:
                                break
                        figures[row][side].append(rate(row, rec))
                        if row == "p1":
                            p50[side].append(float(run["put_p50_ms"]))
                        line = {"round": rnd + 1, "row": row, "side": side}
                        line |= {"rate": round(rate(row, rec), 1)}
                        line |= {"steal_pct": round(run.get("steal_cpu_pct", 0.0), 1)}
                        print(json.dumps(line), flush=True)
        finally:
            for server in servers.values():
                print(json.dumps({"server_stop": server.stop()}), flush=True)
    summary = summarize(figures, p50)
    summary["when"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    summary["out"] = str(out)
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
