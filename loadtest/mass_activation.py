"""A mass activation (issue 33): ``--count`` messages put ahead, every one due at the same
second (a mailing scheduled for 09:00), then drained by consumers taking ``--take-max`` at a
time and acking them.

It starts a fresh ``evq serve`` (its defaults, the data directory in a temporary directory
under ``--dir``), creates one queue and puts the messages (``--producers`` at once, 1000 a
put, ``--size`` random base64 characters each) with ``activate_at`` = the fill's end plus
``--lead`` seconds, rounded up to a whole second. From a second before that time it polls
the queue's stats every 20 ms and reports when the first messages counted ready and when
all were (seconds after their time). Then ``--consumers`` clients take and ack until the
queue is empty: the take's p50/p99/max (each take alone, ms) and the drain's rate.

With ``--depth N`` the queue first holds N messages due far later (each at its own time
drawn from ``--depth-spread``, 1h..30d by default: ``bench_depth.py --delay-spread``'s
producers): the mailing activates and drains on top of a deep queue of deferred work, whose
messages stay delayed throughout (the drain ends when a take answers nothing ready).

    .venv/bin/python loadtest/mass_activation.py --count 1000000 [--lead 10] [--dir /work]
        [--consumers 8] [--procs 1] [--depth 100000000 [--depth-spread 1h..30d]]

One JSON line a phase, then a Markdown row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
from bench_depth import spread
from bench_depth_load import Filler, batches, random_bodies
from served import EvqServe


def emit(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


def put_body(n: int, size: int, at: float) -> bytes:
    """A put's JSON body: ``n`` random bodies, every one due at ``at``."""
    items = (b'{"body":"%s","activate_at":%.3f}' % (b, at) for b in random_bodies(n, size))
    return b'{"messages":[' + b",".join(items) + b"]}"


async def fill(url: str, count: int, producers: int, size: int, at: float) -> float:
    """Put ``count`` messages due at ``at``; answers the seconds it took."""
    todo = [min(1000, count - i) for i in range(0, count, 1000)]
    started = time.monotonic()

    async def producer(s: aiohttp.ClientSession) -> None:
        while todo:
            n = todo.pop()
            async with s.post(url, data=put_body(n, size, at), headers=_JSON) as r:
                if r.status != 200 and r.status != 201:
                    raise RuntimeError(f"put answered {r.status}: {await r.text()}")

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(producer(s) for _ in range(producers)))
    return time.monotonic() - started


async def watch(stats_url: str, count: int, at: float) -> dict[str, float | None]:
    """Poll the stats from a second before ``at`` until all ``count`` are ready."""
    await asyncio.sleep(max(0.0, at - 1 - time.time()))
    first = None
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(stats_url) as r:
                doc = await r.json()
            now = time.time()
            ready = doc["stats"]["ready"]
            if ready and first is None:
                first = now - at
            if ready >= count:
                return {"first_ready_after_s": first, "all_ready_after_s": now - at}
            if now > at + 120:
                return {"first_ready_after_s": first, "all_ready_after_s": None}
            await asyncio.sleep(0.02)


async def drain(base: str, consumers: int, take_max: int, procs: int = 1) -> dict[str, Any]:
    """Take and ack until the queue answers nothing: each take's latency, the rate. The
    consumers run in ``procs`` processes (a fleet's are processes of their own: in one, a
    take's time counts the loop's work for the others, parsing their replies)."""
    started = time.monotonic()
    if procs <= 1:
        latencies, done = await _consume(base, consumers, take_max)
    else:
        shares = [consumers // procs + (i < consumers % procs) for i in range(procs)]
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(procs, mp_context=ctx) as pool:
            parts = list(pool.map(_consume_in_process, [(base, n, take_max) for n in shares]))
        latencies = [x for part, _ in parts for x in part]
        done = sum(n for _, n in parts)
    seconds = time.monotonic() - started
    ms = sorted(x * 1000 for x in latencies)
    return {
        "consumers": consumers,
        "procs": procs,
        "drained": done,
        "drain_s": round(seconds, 2),
        "drain_msgs_per_s": round(done / seconds),
        "takes": len(ms),
        "take_p50_ms": round(statistics.median(ms), 3),
        "take_p99_ms": round(ms[min(len(ms) - 1, math.ceil(0.99 * len(ms)) - 1)], 3),
        "take_max_ms": round(ms[-1], 3),
    }


def _consume_in_process(job: tuple[str, int, int]) -> tuple[list[float], int]:
    return asyncio.run(_consume(*job))


async def _consume(base: str, consumers: int, take_max: int) -> tuple[list[float], int]:
    """``consumers`` clients on one loop, taking and acking until a take answers nothing:
    each take's seconds, and how many messages they acked."""
    latencies: list[float] = []
    done = 0

    async def consumer(s: aiohttp.ClientSession) -> None:
        nonlocal done
        while True:
            t = time.perf_counter()
            async with s.post(f"{base}/take", json={"max": take_max}) as r:
                got = (await r.json())["messages"]
            latencies.append(time.perf_counter() - t)
            if not got:
                return
            items = [{"id": m["id"], "lease": m["lease"]} for m in got]
            async with s.post(f"{base}/ack", json={"items": items}) as r:
                await r.read()
            done += len(got)

    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(consumer(s) for _ in range(consumers)))
    return latencies, done


_JSON = {"Content-Type": "application/json"}


def fill_depth(server: EvqServe, args: argparse.Namespace) -> dict[str, Any]:
    """``--depth`` messages into the queue, each due at its own time of ``--depth-spread``
    (two producer processes, ``--producers`` connections): progress every 10 s."""
    filler = Filler(2, args.producers, args.size, timing=args.depth_spread)
    try:
        started = time.monotonic()
        futures = filler.start(server.port, ["mailing"], batches([args.depth], 1000))
        while not all(f.done() for f in futures):
            time.sleep(10 if args.depth > 10_000_000 else 1)
            put = filler.put
            emit(
                {
                    "depth_fill": {
                        "put": put,
                        "msgs_per_s": round(put / (time.monotonic() - started)),
                    }
                }
            )
        done = sum(f.result()[0] for f in futures)
    finally:
        filler.close()
    seconds = time.monotonic() - started
    return {
        "depth": done,
        "depth_fill_s": round(seconds, 1),
        "depth_msgs_per_s": round(done / seconds),
    }


async def run(args: argparse.Namespace, server: EvqServe) -> dict[str, Any]:
    base = f"{server.url}/v1/queues/mailing"
    # the deferred messages must outlive their delays (the default retention is 4 days)
    settings = {"retention": int(args.depth_spread[1]) + 86_400} if args.depth else {}
    async with aiohttp.ClientSession() as s, s.put(base, json=settings) as r:
        if r.status not in (200, 201):
            raise RuntimeError(f"creating the queue answered {r.status}")
    deep: dict[str, Any] = {"depth": 0}
    if args.depth:
        deep = await asyncio.to_thread(fill_depth, server, args)
        emit({"depth_filled": deep})
    # a time far enough ahead for the whole fill: about 300k messages a second here
    at = math.ceil(time.time() + args.count / 100_000 + args.lead)
    fill_s = await fill(f"{base}/messages", args.count, args.producers, args.size, at)
    emit(
        {
            "fill": {
                "messages": args.count,
                "seconds": round(fill_s, 2),
                "due_in_s": at - time.time(),
            }
        }
    )
    if time.time() >= at - 1:
        raise RuntimeError("the fill ended less than a second before the messages' time")
    woke = await watch(f"{base}", args.count, at)
    emit({"activation": woke})
    drained = await drain(base, args.consumers, args.take_max, args.procs)
    emit({"drain": drained})
    return {"count": args.count, **deep, **woke, **drained}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--producers", type=int, default=16)
    ap.add_argument("--consumers", type=int, default=8)
    ap.add_argument("--procs", type=int, default=1, help="processes the consumers are spread over")
    ap.add_argument("--take-max", type=int, default=100)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument(
        "--lead", type=float, default=10.0, help="s between the fill's end and the time"
    )
    ap.add_argument("--dir", default="/work")
    ap.add_argument(
        "--depth", type=int, default=0, help="messages due far later, put first (default none)"
    )
    ap.add_argument(
        "--depth-spread",
        type=spread,
        default=(3600.0, 30 * 86_400.0),
        help="LO..HI: when the --depth messages are due, each at its own time (default 1h..30d)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="evq-mass-", dir=args.dir) as tmp:
        server = EvqServe(Path(tmp) / "data", Path(tmp) / "serve.log", [])
        try:
            server.wait_ready(180)
            row = asyncio.run(run(args, server))
        finally:
            emit({"server_stop": server.stop()})
    print(
        "| deferred beside | messages due at once | first ready after | all ready after | take-"
        f"{args.take_max} p50 / p99 / max while draining | drain |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    all_s = row["all_ready_after_s"]
    print(
        f"| {row['depth']:,} | {row['count']:,} | {row['first_ready_after_s']:.3f} s | "
        f"{'never' if all_s is None else f'{all_s:.3f} s'} | {row['take_p50_ms']} / "
        f"{row['take_p99_ms']} / {row['take_max_ms']} ms | {row['drain_msgs_per_s']:,} msg/s |"
    )
    return 0 if all_s is not None else 1


if __name__ == "__main__":
    sys.exit(main())
