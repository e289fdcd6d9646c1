"""Micro-benchmark of the pure queue engine in one process (no Ray, no I/O).

Measures put, take+ack throughput for N messages of S bytes, and memory per queued message
beyond its body. Run several times and quote medians:

    .venv/bin/python loadtest/bench_engine.py --messages 1000000 --runs 3

``--fair-compare``: instead, take+ack of messages in ``--groups`` groups on a queue that is
fair (actors/core/fair.py) and on one that is not, and of messages without a group, the
three in turn each run (what the fair order costs the engine):

    .venv/bin/python loadtest/bench_engine.py --fair-compare --messages 200000 --groups 1000
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import tracemalloc

from actors.core import commands as c
from actors.core.decide import execute
from actors.core.state import QueueState
from actors.ids import RandomIds
from actors.settings import QueueSettings


def run_once(
    n: int, size: int, put_batch: int, take_batch: int, groups: int = 0, fair: bool = False
) -> dict[str, float]:
    gc.collect()
    state = QueueState()
    ids = RandomIds()
    now = 1_700_000_000_000
    execute(state, c.Create("bench", QueueSettings(fair=fair)), now, ids)
    body = b"x" * size
    names = [f"g{k}" for k in range(groups)] or [None]

    t0 = time.perf_counter()
    for i in range(0, n, put_batch):
        now += 1
        batch = [
            c.NewMessage(body=body, group=names[(i + j) % len(names)])
            for j in range(min(put_batch, n - i))
        ]
        execute(state, c.Put(batch), now, ids)
    t_put = time.perf_counter() - t0
    assert state.n_ready == n, state.n_ready

    t0 = time.perf_counter()
    taken = 0
    while True:
        now += 1
        _, deliveries = execute(state, c.Take(max=take_batch), now, ids)
        if not deliveries:
            break
        taken += len(deliveries)
        items = [c.LeaseRef(d.id, d.lease) for d in deliveries]
        execute(state, c.Ack(items), now, ids)
    t_take = time.perf_counter() - t0
    assert taken == n, taken
    assert not state.messages, len(state.messages)
    return {"put_per_s": n / t_put, "take_ack_per_s": n / t_take}


def memory_per_message(n: int, size: int, put_batch: int) -> float:
    """Bytes allocated per queued message, bodies excluded (each body is its own object)."""
    gc.collect()
    tracemalloc.start()
    state = QueueState()
    ids = RandomIds()
    now = 1_700_000_000_000
    execute(state, c.Create("mem", QueueSettings()), now, ids)
    before = tracemalloc.get_traced_memory()[0]
    bodies = 0
    for i in range(0, n, put_batch):
        now += 1
        batch = [c.NewMessage(body=b"%0*d" % (size, i + j)) for j in range(min(put_batch, n - i))]
        bodies += sum(sys.getsizeof(m.body) for m in batch)
        execute(state, c.Put(batch), now, ids)
        del batch
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(state.messages) == n
    return (after - before - bodies) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--put-batch", type=int, default=1000)
    ap.add_argument("--take-batch", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--memory-messages", type=int, default=1_000_000)
    ap.add_argument("--fair-compare", action="store_true")
    ap.add_argument("--groups", type=int, default=1000, help="with --fair-compare")
    args = ap.parse_args()
    if args.fair_compare:
        fair_compare(args)
        return

    runs = []
    for r in range(args.runs):
        res = run_once(args.messages, args.size, args.put_batch, args.take_batch)
        runs.append(res)
        print(
            f"run {r + 1}/{args.runs}: {res['put_per_s']:,.0f} puts/s, "
            f"{res['take_ack_per_s']:,.0f} take+ack/s",
            file=sys.stderr,
        )
    mem = memory_per_message(args.memory_messages, args.size, args.put_batch)
    summary = {
        "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()}",
        "messages": args.messages,
        "size": args.size,
        "put_batch": args.put_batch,
        "take_batch": args.take_batch,
        "put_per_s_median": statistics.median(r["put_per_s"] for r in runs),
        "put_per_s_runs": [round(r["put_per_s"]) for r in runs],
        "take_ack_per_s_median": statistics.median(r["take_ack_per_s"] for r in runs),
        "take_ack_per_s_runs": [round(r["take_ack_per_s"]) for r in runs],
        "bytes_per_message_beyond_body": round(mem, 1),
    }
    print(json.dumps(summary, indent=2))


def fair_compare(args: argparse.Namespace) -> None:
    variants = {
        "no_group": (0, False),
        "groups": (args.groups, False),
        "groups_fair": (args.groups, True),
    }
    rows: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.runs):
        for name, (groups, fair) in variants.items():
            res = run_once(args.messages, args.size, args.put_batch, args.take_batch, groups, fair)
            rows[name].append(res["take_ack_per_s"])
            print(f"run {r + 1} {name}: {res['take_ack_per_s']:,.0f} take+ack/s", file=sys.stderr)
    summary = {
        "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()}",
        "messages": args.messages,
        "groups": args.groups,
        "take_batch": args.take_batch,
        **{f"{k}_take_ack_per_s_runs": [round(x) for x in v] for k, v in rows.items()},
        **{f"{k}_take_ack_per_s_median": round(statistics.median(v)) for k, v in rows.items()},
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
