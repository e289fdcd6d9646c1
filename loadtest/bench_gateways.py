"""Several gateways on one Ray cluster: puts/s through one and through two, and how long a
gateway's death keeps its clients waiting.

Both modes start a one-node Ray cluster (``ray start --head`` on 127.0.0.2, a session and a
temp dir of its own) and two ``evq serve --ray-address …`` gateways with one cluster secret
and a fresh local store; the first creates the shards, the second attaches.

``throughput``: the shared load generator (``../shared/bench/loadgen.py``, raw keep-alive
HTTP, closed loop, one 100-B message per put) drives ``--producers`` single-put producers
from ``--procs`` processes, through one gateway or spread over both
(``evq_queues:GatewaysAdapter``), all on one queue. Configurations alternate within a round,
reversed every other round (1, 2, 2, 1, …); medians at the end. The load generator runs in
the shared harness's virtualenv (``../shared/bench/setup.sh`` makes ``/tmp/venv-anchors``).

``failover``: ``--clients`` threads, each a :class:`evq.client.Client` given both
gateways (half of them each one first), put one message after another. ``--kills`` times,
alternately, one gateway is SIGKILLed, then started again on its port once the clients have
moved. For every client that was using the killed gateway, the sample is the time from the
kill to its first put answered by the other. Prints p50, p99 and max over all samples.

    .venv/bin/python loadtest/bench_gateways.py throughput [--runs 3] [--producers 64] \\
        [--procs 8] [--duration 5]
    .venv/bin/python loadtest/bench_gateways.py failover [--clients 32] [--kills 10]

Prints one JSON line per run or kill, then a summary line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from served import RAY_ENV, ROOT, EvqServe, free_port, put_load, session_pids

HEAD_IP = "127.0.0.2"
SECRET = "bench-gateways-cluster-secret"
ENV = {"EVQ_CLUSTER_SECRET": SECRET, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}


def say(doc: dict) -> None:
    print(json.dumps(doc), flush=True)


@contextlib.contextmanager
def ray_head(root: Path) -> Iterator[str]:
    """A one-node Ray cluster; yields its address; every process of it killed at the end."""
    port = free_port()
    ray = str(Path(sys.executable).with_name("ray"))
    cmd = [ray, "start", "--block", "--head", "--disable-usage-stats", "--port", str(port)]
    cmd += ["--node-ip-address", HEAD_IP, "--include-dashboard", "false"]
    cmd += ["--temp-dir", str(root / "ray")]
    env = {**os.environ, **RAY_ENV, **ENV}
    with open(root / "head.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield f"{HEAD_IP}:{port}"
    finally:
        for _ in range(50):
            pids = session_pids(proc.pid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        proc.wait(10)


class Gateway:
    """One ``evq serve --ray-address`` that can be killed and started again on its port."""

    def __init__(self, name: str, root: Path, address: str, shards: int) -> None:
        self.name = name
        self.root = root
        self.extra = ["--ray-address", address, "--shards", str(shards)]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.serve: EvqServe | None = None

    def start(self) -> Gateway:
        self.serve = EvqServe(
            self.root / "data", self.root / f"{self.name}.log", self.extra, self.port, ENV
        )
        self.serve.wait_ready(180)
        return self

    def kill(self) -> None:
        assert self.serve is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.serve.pid, signal.SIGKILL)
        self.serve.stop(timeout=10)


def stop_shards(address: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "evq", "shards", "stop", "--ray-address", address],
        cwd=ROOT,
        env={**os.environ, **RAY_ENV, **ENV},
        stdout=subprocess.DEVNULL,
        check=False,
        timeout=180,
    )


@contextlib.contextmanager
def cluster(shards: int, parent: str | None) -> Iterator[tuple[str, list[Gateway]]]:
    root = Path(tempfile.mkdtemp(prefix="evqbg-", dir=parent or "/tmp"))
    try:
        with ray_head(root) as address:
            time.sleep(3)
            gateways = [Gateway(n, root, address, shards) for n in ("a", "b")]
            try:
                for gw in gateways:
                    gw.start()
                yield address, gateways
            finally:
                for gw in gateways:
                    if gw.serve is not None and gw.serve.proc.poll() is None:
                        gw.serve.stop()
                stop_shards(address)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- throughput


def run_load(lg_python: str, targets: list[str], args: argparse.Namespace) -> dict:
    """One measured run of the load generator, its processes spread over ``targets``."""
    name = f"g{len(targets)}-{time.monotonic_ns()}"
    load = [*("--producers", str(args.producers), "--procs", str(args.procs))]
    load += ["--opt", f"targets={','.join(targets)}", "--duration", str(args.duration)]
    adapter = "evq_queues:GatewaysAdapter"
    return {"gateways": len(targets), **put_load(lg_python, adapter, targets[0], name, load)}


def throughput(args: argparse.Namespace) -> None:
    results: dict[int, list[dict]] = {1: [], 2: []}
    with cluster(args.shards, args.dir) as (_, gateways):
        urls = [gw.url for gw in gateways]
        for r in range(args.runs):
            for count in (1, 2) if r % 2 == 0 else (2, 1):
                run = run_load(args.loadgen_python, urls[:count], args)
                results[count].append(run)
                say({"round": r, **run})
    summary = {
        f"{n}_gateways": {
            "median_puts_per_s": statistics.median(x["puts_per_s"] for x in runs),
            "median_p50_ms": statistics.median(x["p50_ms"] for x in runs),
            "median_p99_ms": statistics.median(x["p99_ms"] for x in runs),
        }
        for n, runs in results.items()
    }
    one, two = (summary[f"{n}_gateways"]["median_puts_per_s"] for n in (1, 2))
    say({"summary": summary, "two_over_one": round(two / one, 3)})


# ---------------------------------------------------------------- failover


def failover(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from evq.client import Client, RetryPolicy

    samples: list[float] = []
    with cluster(args.shards, args.dir) as (_, gateways):
        urls = [gw.url for gw in gateways]
        with Client(urls[0]) as admin:
            admin.create_queue("failover")
        stop = threading.Event()
        # Per client: (monotonic time, url) of its last answered put.
        last: list[tuple[float, str]] = [(0.0, "")] * args.clients
        errors: list[BaseException] = []

        def client_loop(i: int) -> None:
            order = urls[i % 2 :] + urls[: i % 2]
            policy = RetryPolicy(retries=20, backoff=0.01, max_backoff=0.2)
            try:
                with Client(order, timeout=5, retries=policy) as client:
                    n = 0
                    while not stop.is_set():
                        client.put("failover", f"{i}-{n}")
                        last[i] = (time.monotonic(), client.base_url)
                        n += 1
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        try:
            for k in range(args.kills):
                time.sleep(args.settle)
                victim, other = gateways[k % 2], gateways[(k + 1) % 2]
                on_victim = [i for i in range(args.clients) if last[i][1] == victim.url]
                killed_at = time.monotonic()
                victim.kill()
                deadline = killed_at + 30
                waits: dict[int, float] = {}
                while len(waits) < len(on_victim) and time.monotonic() < deadline:
                    for i in on_victim:
                        at, url = last[i]
                        if i not in waits and url == other.url and at > killed_at:
                            waits[i] = at - killed_at
                    time.sleep(0.001)
                lost = len(on_victim) - len(waits)
                samples += waits.values()
                say(
                    {
                        "kill": k,
                        "gateway": victim.name,
                        "clients": len(on_victim),
                        "no_success_in_30s": lost,
                        "p50_s": round(statistics.median(waits.values()), 4) if waits else None,
                        "max_s": round(max(waits.values()), 4) if waits else None,
                    }
                )
                victim.start()
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        if errors:
            raise SystemExit(f"clients failed: {errors[:3]}")
    samples.sort()
    say(
        {
            "summary": "gateway death -> its clients' next success",
            "samples": len(samples),
            "p50_s": round(statistics.median(samples), 4),
            "p99_s": round(samples[min(len(samples) - 1, int(0.99 * len(samples)))], 4),
            "max_s": round(samples[-1], 4),
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("mode", choices=["throughput", "failover"])
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--dir", default=None, help="where the data directory goes")
    ap.add_argument("--loadgen-python", default="/tmp/venv-anchors/bin/python")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--producers", type=int, default=64)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of load before a kill")
    args = ap.parse_args()
    throughput(args) if args.mode == "throughput" else failover(args)


if __name__ == "__main__":
    main()
