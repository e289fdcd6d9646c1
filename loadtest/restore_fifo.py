"""How long the engine takes to restore a FIFO queue from a snapshot, in one process (no
server, no disk): ``--messages`` messages in 1,000 groups, 1000 a put, each due at its own
time over 30 days (a spread FIFO run each put, placed as a shard places it), encoded,
decoded, restored. With ``--profile`` the restore's top functions by own time.

    .venv/bin/python loadtest/restore_fifo.py [--messages 2000000] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.core import events as ev
from actors.core import snapshot as sn
from actors.core.state import QueueState

BATCH = 1000
SEGMENT = "wal/0000/00000000000000000001.seg"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--messages", type=int, default=2_000_000)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    state = QueueState()
    state.spill = True
    settings = msgspec.structs.replace(state.settings, fifo=True)
    state.apply(ev.QueueCreated(at_ms=1, name="q.fifo", settings=settings))
    started = time.perf_counter()
    for first in range(1, args.messages + 1, BATCH):
        items = [
            ev.PutItem(
                id=i,
                body=b"x" * 100,
                activate_at_ms=10_000_000 + (i * 7919) % 2_592_000_000,
                group=f"g{i % 1000:04d}",
            )
            for i in range(first, first + BATCH)
        ]
        state.apply(ev.MessagesPut(at_ms=2, items=items))
        for run in state.unplaced:  # as a shard does once the put is durable
            state.place(run, (SEGMENT, first, 0, first, first))
        state.unplaced.clear()
        if first % 1_000_000 == 1:
            print(f"filled {first - 1:,}", file=sys.stderr)
    fill = time.perf_counter() - started
    data = sn.encode_snapshot(sn.snapshot(state))
    del state
    gc.collect()
    snap = sn.decode_snapshot(data)
    profile = cProfile.Profile() if args.profile else None
    gc.disable()
    started = time.perf_counter()
    if profile is not None:
        profile.enable()
    restored = sn.restore(snap)
    if profile is not None:
        profile.disable()
    seconds = time.perf_counter() - started
    print(
        f"{args.messages:,} FIFO messages: fill {fill:.1f} s, snapshot {len(data) / 2**20:.0f}"
        f" MiB, restore {seconds:.2f} s ({restored.n_delayed:,} delayed)"
    )
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
