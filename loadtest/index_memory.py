"""Bytes of memory per queued message: today's engine state against a compact index.

Issue 22 asks for 100M queued messages within 12 GiB of server RSS (≤ 100 B a message
beyond a fixed base), bodies on disk and a compact index in memory, and to decide the
index's shape by measuring. This measures, in one process, with tracemalloc (every Python
allocation, so numpy's buffers too) and the process's RSS:

- ``engine``: today's ``QueueState`` fed ``MessagesPut`` events of 1000 messages (100-B
  bodies, server ids, ready at once), as a shard holds them;
- ``engine-nobody``: the same with empty bodies: what today's object model costs without
  the bodies (a body reference would cost at least this);
- ``runs``: the engine as a shard on a local log runs it (``spill``: each put a run,
  actors/core/runs.py), every run placed, so its bodies are in the log, not here;
- ``runs-updated``: ``runs`` with every message's body then changed by an update
  (``MessageUpdated``), each placed where its record is, as a shard does (runs.py,
  ``Patches``: the slot stays in its run);
- ``columns``: a columnar sketch of the same index (numpy arrays indexed by arrival
  sequence: activation time, state, receive count, body segment, offset and length; the
  put time once per put; ready messages as a FIFO of sequence numbers), the shape the issue
  suggests.

    .venv/bin/python loadtest/index_memory.py [--messages 1000000 2000000]

Each row is a fresh process; the slope between the two sizes is the per-message cost.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH = 1000
BODY = b"x" * 100


def _engine(n: int, body: bytes, spill: bool = False, update: bool = False) -> object:
    from actors.core import events as ev
    from actors.core.state import QueueState

    state = QueueState()
    state.spill = spill
    state.apply(ev.QueueCreated(at_ms=1, name="q", settings=state.settings))
    for first in range(1, n + 1, BATCH):
        items = [
            ev.PutItem(id=i, body=body and body[:-8] + i.to_bytes(8, "little"), activate_at_ms=2)
            for i in range(first, first + BATCH)
        ]  # a body of its own per message, as decoding a put gives
        state.apply(ev.MessagesPut(at_ms=2, items=items))
        for run in state.unplaced:  # as a shard does once the put is durable
            state.place(run, ("wal/0000/00000000000000000001.seg", first, 0, first, first))
        state.unplaced.clear()
    if update:
        segment = "wal/0000/00000000000000000002.seg"
        for i in range(1, n + 1):
            new = body[:-8] + (n + i).to_bytes(8, "little")  # its own, as decoding gives
            state.apply(ev.MessageUpdated(at_ms=3, id=i, body=new))
            for put, slot, token in state.unpatched:
                state.place_patch(put, slot, token, (segment, 4096 * i, 4096, n + i, n + i))
            state.unpatched.clear()
    return state


class _Columns:
    """The index as columns indexed by ``seq - base``; grown by doubling."""

    def __init__(self) -> None:
        import numpy as np

        self.np = np
        self.n = 0
        self.cap = 1024
        self.cols = {
            "activate_at_ms": np.zeros(self.cap, np.int64),
            "state": np.zeros(self.cap, np.uint8),
            "receive_count": np.zeros(self.cap, np.uint16),
            "segment": np.zeros(self.cap, np.uint32),
            "offset": np.zeros(self.cap, np.uint32),
            "length": np.zeros(self.cap, np.uint32),
        }
        self.put_at: list[tuple[int, int]] = []  # (first seq, put time): one per put
        self.ready = np.zeros(self.cap, np.int64)  # FIFO of sequence numbers

    def put(self, count: int, at_ms: int, segment: int, offset: int) -> None:
        while self.n + count > self.cap:
            self.cap *= 2
            self.cols = {k: self.np.resize(v, self.cap) for k, v in self.cols.items()}
            self.ready = self.np.resize(self.ready, self.cap)
        s = slice(self.n, self.n + count)
        self.cols["activate_at_ms"][s] = at_ms
        self.cols["state"][s] = 1
        self.cols["segment"][s] = segment
        self.cols["offset"][s] = self.np.arange(offset, offset + 110 * count, 110)
        self.cols["length"][s] = 100
        self.ready[s] = self.np.arange(self.n, self.n + count)
        self.put_at.append((self.n, at_ms))
        self.n += count


def _columns(n: int) -> object:
    index = _Columns()
    for first in range(0, n, BATCH):
        index.put(BATCH, 2, first // 100_000, (first % 100_000) * 110)
    return index


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def measure(kind: str, n: int) -> dict[str, float]:
    """Build ``n`` messages of ``kind`` here; the bytes it took."""
    gc.collect()
    rss0 = _rss()
    tracemalloc.start()
    build = {
        "engine": lambda: _engine(n, BODY),
        "engine-nobody": lambda: _engine(n, b""),
        "runs": lambda: _engine(n, BODY, spill=True),
        "runs-updated": lambda: _engine(n, BODY, spill=True, update=True),
        "columns": lambda: _columns(n),
    }[kind]
    kept = build()
    gc.collect()
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert kept is not None
    return {"kind": kind, "messages": n, "traced": traced, "rss": _rss() - rss0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, nargs=2, default=[1_000_000, 2_000_000])
    kinds = ["engine", "engine-nobody", "runs", "runs-updated", "columns"]
    parser.add_argument("--kinds", nargs="+", default=kinds)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # child: kind, n
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]))))
        return
    print("| index | bytes/message, traced (slope) | RSS/message (slope) |")
    print("|---|---|---|")
    for kind in args.kinds:
        rows = [_child(kind, n) for n in args.messages]
        (a, b), dn = rows, args.messages[1] - args.messages[0]
        traced = (b["traced"] - a["traced"]) / dn
        rss = (b["rss"] - a["rss"]) / dn
        print(f"| {kind} | {traced:.0f} | {rss:.0f} |", flush=True)


def _child(kind: str, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--one", kind, str(n)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


if __name__ == "__main__":
    main()
