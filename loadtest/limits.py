"""How exactly a queue's ``take_rate`` and ``put_rate`` hold (issue 36): ``evq serve`` with
``--workers`` gateway processes sharing the port (2 by default: the limit is kept where the
queue lives, not per gateway), consumers and producers spread over several clients (each its
own connections, so both gateways serve them), every target rate in turn.

For each rate R, a queue with ``take_rate`` R, filled beforehand, is taken from by
``--consumers`` long-polling consumers (take 10, wait 1 s, ack) for ``--seconds``; another
with ``put_rate`` R gets single-message puts from ``--producers`` producers, each pausing
20 ms after a 429. The rate measured leaves out the first ``--warmup`` seconds (the bucket
lets a second's worth go at once) and is what was taken (accepted) per second after it.

    .venv/bin/python loadtest/limits.py --rates 20,100,500 --seconds 30

prints a line of progress per run on stderr and the figures as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from served import ROOT, EvqServe

sys.path.insert(0, str(ROOT))

from actors.errors import Overloaded
from evq.client import AsyncClient, Client

CLIENTS = 8


async def _consume(url: str, queue: str, seconds: float, consumers: int) -> list[float]:
    """Each message's take time, from the start."""
    clients = [AsyncClient(url, retries=3, timeout=30) for _ in range(CLIENTS)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    times: list[float] = []

    async def consumer(client: AsyncClient) -> None:
        while (now := loop.time() - start) < seconds:
            got = await client.take(queue, 10, wait=min(1.0, max(0.1, seconds - now)))
            at = loop.time() - start
            times.extend([at] * len(got))
            if got:
                await client.ack(queue, *got)

    try:
        await asyncio.gather(*(consumer(clients[i % CLIENTS]) for i in range(consumers)))
    finally:
        for client in clients:
            await client.close()
    return times


async def _produce(url: str, queue: str, seconds: float, producers: int) -> list[float]:
    """Each accepted put's time, from the start."""
    clients = [AsyncClient(url, retries=0, timeout=30) for _ in range(CLIENTS)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    times: list[float] = []

    async def producer(client: AsyncClient) -> None:
        while loop.time() - start < seconds:
            try:
                await client.put(queue, [b"x" * 100])
            except Overloaded:
                await asyncio.sleep(0.02)
                continue
            times.append(loop.time() - start)

    try:
        await asyncio.gather(*(producer(clients[i % CLIENTS]) for i in range(producers)))
    finally:
        for client in clients:
            await client.close()
    return times


def _rate(times: list[float], warmup: float, seconds: float) -> float:
    return sum(1 for t in times if warmup <= t < seconds) / (seconds - warmup)


def measure(url: str, rate: int, args: argparse.Namespace) -> dict[str, float]:
    take_q, put_q = f"limits-take-{rate}", f"limits-put-{rate}"
    with Client(url, retries=3, timeout=60) as c:
        c.create_queue(take_q, take_rate=rate)
        c.create_queue(put_q, put_rate=rate)
        total = int(rate * (args.seconds + 2)) + 100
        for i in range(0, total, 1000):
            c.put(take_q, [b"x" * 100] * min(1000, total - i))
    took = asyncio.run(_consume(url, take_q, args.seconds, args.consumers))
    put = asyncio.run(_produce(url, put_q, args.seconds, args.producers))
    take_rate = _rate(took, args.warmup, args.seconds)
    put_rate = _rate(put, args.warmup, args.seconds)
    row = {
        "target": rate,
        "take_per_s": round(take_rate, 2),
        "take_error_pct": round(100 * (take_rate - rate) / rate, 2),
        "put_per_s": round(put_rate, 2),
        "put_error_pct": round(100 * (put_rate - rate) / rate, 2),
        "taken_in_first_second": sum(1 for t in took if t < 1.0),
    }
    print(f"rate {rate}: {row}", file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="20,100,500", help="target rates, messages a second")
    p.add_argument("--seconds", type=float, default=30.0, help="each run's length")
    p.add_argument("--warmup", type=float, default=2.0, help="left out of the measured rate")
    p.add_argument("--workers", type=int, default=2, help="gateway processes")
    p.add_argument("--consumers", type=int, default=16)
    p.add_argument("--producers", type=int, default=16)
    args = p.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        server = EvqServe(
            Path(tmp) / "data", Path(tmp) / "serve.log", ["--workers", str(args.workers)]
        )
        try:
            server.wait_ready(120)
            rows = [measure(server.url, rate, args) for rate in rates]
        finally:
            server.stop()
    doc = {"workers": args.workers, "seconds": args.seconds, "warmup": args.warmup, "rows": rows}
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
