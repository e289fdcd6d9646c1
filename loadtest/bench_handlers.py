"""Handlers: messages/s through a no-op handler, and put → handler-start latency when idle.

Ray starts in this process (``num_cpus=2``) and a fresh ``evq serve`` (2 shards, a temp
data directory) joins it, so ``direct`` handlers take straight from the shards; ``http``
handlers go through the server's API on 127.0.0.1.

- Throughput, per batch size: a queue is loaded with N messages, then a no-op handler
  (per-message calls, ``max_concurrency`` 8, ``num_cpus`` 0.1) is started on it; the rate is
  taken from the queue's ``acked`` counter between 10 % and 90 % of N (start-up and tail
  left out). The size ``default`` is a handler with every option at its default
  (``HandlerOptions(queue=…)``: ``batch_size`` 100, ``max_concurrency`` 8, ``num_cpus`` 1).
  Ray's worker processes are warmed up first.
- Latency: one message at a time on an idle handler with the default options; the handler
  notes ``time.time()`` when it starts; latency = that minus the time just before the put
  was sent (the put's HTTP round trip and durable write included). 0.3 s of idle between
  samples.

    .venv/bin/python loadtest/bench_handlers.py --runs 3

Every figure is the median over ``--runs`` runs, each printed too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from served import RAY_ENV, ROOT

os.environ.update(RAY_ENV)
sys.path.insert(0, str(ROOT))

import ray

from evq.client import Client
from evq.handlers import Handler, HandlerOptions, Job, start
from tests.integration.server import Server, server_env


def noop(message: Job) -> None:
    """The handler measured: does nothing, acked."""


def stamp(message: Job) -> None:
    """Notes when it started (for the latency)."""
    with open(message.json()["log"], "a") as f:
        f.write(f"{message.id} {time.time()}\n")


def load(client: Client, queue: str, count: int) -> None:
    body = b"x" * 64
    for start_at in range(0, count, 1000):
        client.put(queue, [body] * min(1000, count - start_at), auto_key=False)


def acked(client: Client, queue: str) -> int:
    stats = client.get_queue(queue).stats
    return stats.acked if stats else 0


def throughput(client: Client, url: str, batch: str, count: int, transport: str) -> float:
    queue = f"tp-{transport}-{batch}-{time.time_ns()}"
    client.create_queue(queue)
    load(client, queue, count)
    if batch == "default":
        options = HandlerOptions(queue=queue)
    else:
        options = HandlerOptions(
            queue=queue, batch_size=int(batch), max_concurrency=8, num_cpus=0.1
        )
    handler = Handler(noop, options)
    run = start(handler, server=url, transport=transport)
    lo, hi = int(count * 0.1), int(count * 0.9)
    t_lo = t_hi = None
    deadline = time.monotonic() + 600
    while t_hi is None and time.monotonic() < deadline:
        n = acked(client, queue)
        now = time.monotonic()
        if t_lo is None and n >= lo:
            t_lo, n_lo = now, n
        if n >= hi:
            t_hi, n_hi = now, n
        time.sleep(0.05)
    run.drain(5)
    run.kill()
    client.delete_queue(queue)
    if t_lo is None or t_hi is None or t_hi <= t_lo:
        raise RuntimeError(f"batch {batch}: did not get through {count} messages")
    return (n_hi - n_lo) / (t_hi - t_lo)


def latency(client: Client, url: str, samples: int, transport: str, log: Path) -> list[float]:
    queue = f"lat-{transport}-{time.time_ns()}"
    client.create_queue(queue)
    handler = Handler(stamp, HandlerOptions(queue=queue))
    run = start(handler, server=url, transport=transport)
    while run.stats().state != "running":
        time.sleep(0.05)
    log.write_text("")
    body = json.dumps({"log": str(log)})
    # the first message also warms a worker up: not counted
    results: list[float] = []
    for i in range(samples + 1):
        time.sleep(0.3)
        sent = time.time()
        [put] = client.put(queue, body)
        while True:  # the handler notes when it started: looking often is not needed
            seen = dict(line.split() for line in log.read_text().splitlines())
            if put.id in seen:
                break
            time.sleep(0.005)
        if i:
            results.append((float(seen[put.id]) - sent) * 1000)
    run.drain(5)
    run.kill()
    client.delete_queue(queue)
    return results


def one_run(url: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with Client(url, timeout=60) as client:
        # warm Ray's worker processes up before measuring (not measured: too short)
        with contextlib.suppress(RuntimeError):
            throughput(client, url, "100", 2000, "direct")
        for transport in args.transports:
            for batch, count in zip(args.sizes, args.counts, strict=True):
                rate = throughput(client, url, batch, count, transport)
                out[f"{transport} batch {batch} msg/s"] = round(rate)
                print(f"  {transport} batch {batch}: {rate:,.0f} msg/s", flush=True)
            lat = latency(client, url, args.samples, transport, tmp / "stamps")
            out[f"{transport} latency p50 ms"] = round(statistics.median(lat), 1)
            out[f"{transport} latency p90 ms"] = round(statistics.quantiles(lat, n=10)[-1], 1)
            print(
                f"  {transport} latency: p50 {statistics.median(lat):.1f} ms, "
                f"p90 {statistics.quantiles(lat, n=10)[-1]:.1f} ms, "
                f"min {min(lat):.1f} ms",
                flush=True,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="default,1,100,1000")
    ap.add_argument("--counts", default="30000,1500,30000,60000", help="messages per size")
    ap.add_argument("--transports", default="direct,http")
    ap.add_argument("--samples", type=int, default=30, help="latency samples per run")
    args = ap.parse_args()
    args.sizes = args.sizes.split(",")
    args.counts = [int(s) for s in args.counts.split(",")]
    args.transports = args.transports.split(",")
    print(f"load average before: {os.getloadavg()}", flush=True)
    # As evq serve's own local Ray: workers at the default niceness, not Ray's 15 (a shard
    # or a handler's worker behind everything else on a busy machine).
    # The cluster's nodes hold its secret (the shards and handlers read their node's): this
    # one is the bench's own process, and the server joining it shows the same.
    secret = os.environ.setdefault("EVQ_CLUSTER_SECRET", secrets.token_hex(16))
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        namespace="bench",
        _system_config={"worker_niceness": 0},
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(
            Path(tmp) / "data",
            *("--ray-address", ray.get_runtime_context().gcs_address),
            env=server_env(EVQ_CLUSTER_SECRET=secret),  # joining needs one
        )
        server.start()
        try:
            for n in range(args.runs):
                print(f"run {n + 1}:", flush=True)
                results.append(one_run(server.url, args, Path(tmp)))
        finally:
            server.stop()
            ray.shutdown()
    print(f"load average after: {os.getloadavg()}")
    print("\nmedian of", args.runs, "run(s):")
    for key in results[0]:
        values = [r[key] for r in results]
        print(f"  {key}: {statistics.median(values)}  ({'; '.join(str(v) for v in values)})")


if __name__ == "__main__":
    main()
