"""How long quiet tenants' messages wait in a fair queue while one noisy tenant holds 99 % of
its backlog (issue 36), against the same load without the noisy tenant, on ``evq serve``.

Each run has a fresh queue and the same quiet load: ``--tenants`` tenants, each putting one
message (its own group) ``--tenant-rate`` times a second at random moments, for
``--seconds`` less the last (at most 1 s, a quarter of the run: the consumers drain);
``--consumers`` consumers take up to ``--batch`` messages (long-poll 1 s),
work on each (``--work-ms`` on average, exponentially distributed as jobs' times vary; with
``--fixed-work`` exactly: then the consumers fall into step, their acks and takes written
together, and a message waits for the next such step), and ack it. Three runs a round:

- ``quiet``: the quiet tenants alone, on a fair queue (the baseline);
- ``fair``: the same, with a noisy tenant's backlog of ``--noisy`` messages put first (so
  the consumers are never idle and it holds 99 % and more of what waits);
- ``unfair``: the same as ``fair`` on a queue without ``fair`` (the problem it solves).

A quiet message's time in queue runs from just before its put to the take that hands it
out (one process's clock); one still waiting at the end counts as having waited until then
(a lower bound). The noisy share is the noisy tenant's part of what waits, sampled each
second. ``--rounds`` rounds; the figures are the medians over them of each run's median and
p99, and the ratios ``fair``/``quiet`` of those.

    .venv/bin/python loadtest/fairness.py --rounds 3 --seconds 30

prints a line of progress per run on stderr and the figures as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

from served import ROOT, EvqServe

sys.path.insert(0, str(ROOT))

from evq.client import AsyncClient, Client, NewMessage

CLIENTS = 4


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _run(url: str, queue: str, noisy: int, args: argparse.Namespace) -> dict[str, float]:
    clients = [AsyncClient(url, retries=3, timeout=30) for _ in range(CLIENTS)]
    loop = asyncio.get_running_loop()
    put_at: dict[str, float] = {}  # quiet message body -> when its put started
    waited: list[float] = []
    in_queue: list[float] = []  # the server's: from its put to its take (ms clock)
    noisy_left = noisy
    taken = 0
    shares: list[float] = []
    start = loop.time()
    end = start + args.seconds
    # the tenants stop putting a little before the consumers stop taking: a message put in the
    # run's last instant would count as unserved though nothing kept it waiting
    puts_end = end - min(1.0, args.seconds / 4)
    rng = random.Random(args.seed)

    async def tenant(t: int) -> None:
        client = clients[t % CLIENTS]
        n = 0
        while True:
            await asyncio.sleep(rng.expovariate(args.tenant_rate))
            if loop.time() >= puts_end:
                return
            body = f"t{t}.{n}"
            n += 1
            put_at[body] = loop.time()
            await client.put(queue, NewMessage(body=body, group=f"t{t}"))

    async def consumer(k: int) -> None:
        nonlocal noisy_left, taken
        client = clients[k % CLIENTS]
        while (now := loop.time()) < end:
            got = await client.take(queue, args.batch, wait=min(1.0, max(0.05, end - now)))
            at = loop.time()
            taken += len(got)
            for m in got:
                body = m.body.decode()
                if body.startswith("n"):
                    noisy_left -= 1
                else:
                    waited.append(at - put_at.pop(body))
                    in_queue.append(max(0.0, (m.first_received_at or 0.0) - m.enqueued_at))
                work = args.work_ms / 1000
                await asyncio.sleep(work if args.fixed_work else rng.expovariate(1 / work))
                await client.ack(queue, m)

    async def sample() -> None:
        while loop.time() < end:
            await asyncio.sleep(1.0)
            quiet = len(put_at)
            if noisy_left:
                shares.append(noisy_left / (noisy_left + quiet))

    try:
        await asyncio.gather(
            *(tenant(t) for t in range(args.tenants)),
            *(consumer(k) for k in range(args.consumers)),
            sample(),
        )
    finally:
        for client in clients:
            await client.close()
    stopped = loop.time()
    unserved = len(put_at)
    waited.extend(stopped - t for t in put_at.values())  # still waiting: at least this long
    return {
        "quiet_messages": len(waited),
        "unserved": unserved,
        "median_ms": round(1000 * statistics.median(waited), 2),
        "p99_ms": round(1000 * _quantile(waited, 0.99), 2),
        "server_median_ms": round(1000 * statistics.median(in_queue), 2) if in_queue else None,
        "server_p99_ms": round(1000 * _quantile(in_queue, 0.99), 2) if in_queue else None,
        "noisy_share_min": round(min(shares), 4) if shares else 0.0,
        "noisy_taken": noisy - noisy_left,
        # the mean time between two takes that got a message: the floor of a quiet message's
        # wait while every consumer is busy (none waits to be handed it)
        "take_gap_ms": round(1000 * (stopped - start) / max(1, taken), 2),
    }


def _fill(url: str, queue: str, noisy: int, fair: bool) -> None:
    with Client(url, retries=3, timeout=60) as c:
        c.create_queue(queue, fair=fair)
        for i in range(0, noisy, 1000):
            c.put(queue, [f"n{k}" for k in range(i, min(noisy, i + 1000))], group="noisy")


def one_round(url: str, r: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    rows = {}
    for kind, noisy, fair in (
        ("quiet", 0, True),
        ("fair", args.noisy, True),
        ("unfair", args.noisy, False),
    ):
        queue = f"fairness-{kind}-{r}"
        _fill(url, queue, noisy, fair)
        rows[kind] = asyncio.run(_run(url, queue, noisy, args))
        print(f"round {r} {kind}: {rows[kind]}", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=30.0, help="each run's length")
    p.add_argument("--tenants", type=int, default=20, help="quiet tenants")
    p.add_argument("--tenant-rate", type=float, default=2.0, help="each one's puts a second")
    p.add_argument("--noisy", type=int, default=40_000, help="the noisy tenant's backlog")
    p.add_argument("--consumers", type=int, default=8)
    p.add_argument("--batch", type=int, default=1, help="messages a take asks for")
    p.add_argument("--work-ms", type=float, default=10.0, help="a consumer's mean work a message")
    p.add_argument(
        "--fixed-work", action="store_true", help="each message's work exactly --work-ms"
    )
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = EvqServe(Path(tmp) / "data", Path(tmp) / "serve.log", [])
        try:
            server.wait_ready(120)
            rounds = [one_round(server.url, r, args) for r in range(args.rounds)]
        finally:
            server.stop()
    summary: dict[str, float] = {}
    for kind in ("quiet", "fair", "unfair"):
        for figure in ("median_ms", "p99_ms"):
            summary[f"{kind}_{figure}"] = statistics.median(x[kind][figure] for x in rounds)
    for figure in ("median_ms", "p99_ms"):
        summary[f"fair_over_quiet_{figure[:-3]}"] = round(
            summary[f"fair_{figure}"] / max(summary[f"quiet_{figure}"], 0.001), 2
        )
    summary["noisy_share_min"] = min(x["fair"]["noisy_share_min"] for x in rounds)
    doc = {"args": vars(args), "summary": summary, "rounds": rounds}
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
