"""Write the golden files of the current log format version. Run ONCE per format version.

    .venv/bin/python tests/data/make_golden.py            # writes into tests/data/
    .venv/bin/python tests/data/make_golden.py --out DIR  # writes elsewhere (to look)

A human runs this once, when a format version is introduced (FORMAT.md, "Compatibility
rules"), and commits what it writes:

- ``segment-v<N>.seg``: a segment of epoch 3 from sequence number 10, one record of every
  event type (one of them large enough to be stored compressed);
- ``snapshot-v<N>.snap``: a snapshot object of a FIFO queue with ready, delayed, reserved and
  blocked messages, a dead letter and an idempotency key;
- ``golden-v<N>.json``: exactly what those two files contain (every field of every event and
  of the snapshot, and the stats the snapshot's state reports), for the tests to compare
  with. It also records each file's size and SHA-256.

The files are **never regenerated**: they are what a writer of version N wrote, and every
later reader must still decode them (``tests/unit/log/test_golden.py``). That is why this
script refuses to overwrite an existing file. A new format version gets new files
(``-v<N+1>``) from this script; the old ones stay. Everything here is fixed: no wall clock,
no randomness, ids from SequentialIds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from actors.core import commands as c
from actors.core import events as ev
from actors.core.decide import execute
from actors.core.snapshot import encode_snapshot, snapshot
from actors.core.state import QueueState
from actors.ids import SequentialIds
from actors.log.codec import (
    SEGMENT_VERSION,
    SNAPSHOT_OBJECT_VERSION,
    encode_payloads,
    encode_segment,
    encode_snapshot_object,
)
from actors.settings import QueueSettings

HERE = Path(__file__).resolve().parent
T = 1_700_000_000_000  # a fixed point in time; no clock is read

SEGMENT_EPOCH = 3
SEGMENT_FIRST_SEQ = 10
SNAPSHOT_EPOCH = 3


def large_body(title: bytes, lines: int) -> bytes:
    """A deterministic, very compressible body."""
    return b"".join(b"%s line %04d: the quick brown fox\n" % (title, i) for i in range(lines))


def segment_events() -> list[ev.Event]:
    """The golden segment's events, in order (sequence numbers 10, 11, ...)."""
    return [
        ev.QueueCreated(
            T,
            "golden",
            QueueSettings(
                visibility_timeout_ms=20_000,
                max_receives=3,
                dead_letter_queue="golden-dlq",
                idempotency_window_ms=600_000,
            ),
        ),
        ev.MessagesPut(
            T + 100,
            [
                ev.PutItem(1, b"small body", T + 100),
                ev.PutItem(
                    2,
                    large_body(b"segment", 40),
                    T + 100,
                    key="idem-2",
                    attributes={"kind": "large", "n": 2, "tags": ["a", "b"]},
                ),
            ],
        ),
        ev.MessagesTaken(T + 300, [1, 2], [1001, 1002], T + 20_300),
        ev.MessagesAcked(T + 400, [1]),
        ev.MessagesReleased(T + 500, [2], [T + 1_500]),
        ev.LeasesExtended(T + 600, [2], [T + 40_600]),
        # Exactly at the compression threshold (FORMAT.md: 256 bytes or more): this 255-byte
        # payload stays plain however well it would compress, the next one (256) is compressed.
        ev.MessageUpdated(T + 700, 2, (b"updated body " * 20)[:233], None),
        ev.MessagesDeleted(T + 800, [2, ("client-id-7/" * 20)[:234]]),
        ev.QueuePurged(T + 900),
        ev.DeadLettersRouted(T + 1_000, [7, 8]),
        ev.WriterStarted(T + 1_100, 3),
        ev.SettingsChanged(
            T + 1_200, QueueSettings(visibility_timeout_ms=45_000, retention_ms=7_200_000)
        ),
    ]


def snapshot_state() -> tuple[QueueState, int]:
    """The golden snapshot's state, built by the engine from fixed commands; and the number
    of events that built it (the snapshot's sequence number)."""
    state = QueueState()
    ids = SequentialIds()
    settings = QueueSettings(fifo=True, max_receives=1, idempotency_window_ms=3_600_000)
    commands: list[tuple[int, object]] = [
        (T, c.Create("golden.fifo", settings)),
        (
            T + 1_000,
            c.Put(
                [
                    c.NewMessage(body=b"a-1", group="a", idempotency_key="order-17"),
                    c.NewMessage(body=b"a-2", group="a"),
                    c.NewMessage(body=b"a-3", group="a", attributes={"prio": 1}),
                    c.NewMessage(body=large_body(b"snapshot", 30), group="b"),
                    c.NewMessage(body=b"c-1 later", group="c", delay_ms=120_000),
                ]
            ),
        ),
        (T + 2_000, c.Take(max=1)),  # a-1; its lease runs out at T + 32 000 ...
        (T + 40_000, c.Take(max=1)),  # ... so it is dead-lettered (max_receives=1); take a-2
    ]
    events = 0
    for now, command in commands:
        emitted, _ = execute(state, command, now, ids)
        events += len(emitted)
    return state, events


# ---------------------------------------------------------------- description


def describe(value: Any) -> Any:
    """``value`` as JSON: structs as {"struct", "fields"}, bytes as {"bytes_hex"}."""
    if isinstance(value, msgspec.Struct):
        return {
            "struct": type(value).__name__,
            "fields": {
                f.name: describe(getattr(value, f.name)) for f in msgspec.structs.fields(value)
            },
        }
    if isinstance(value, bytes):
        return {"bytes_hex": value.hex()}
    if isinstance(value, list | tuple):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {k: describe(v) for k, v in value.items()}
    assert value is None or isinstance(value, bool | int | str), value
    return value


def file_facts(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def build() -> dict[str, bytes]:
    """Every golden file of this version, by name."""
    version = SEGMENT_VERSION
    events = segment_events()
    payloads = encode_payloads(events)
    sizes = {type(e).__name__: len(p) for e, p in zip(events, payloads, strict=True)}
    assert (sizes["MessageUpdated"], sizes["MessagesDeleted"]) == (255, 256), sizes
    segment = encode_segment(SEGMENT_EPOCH, SEGMENT_FIRST_SEQ, payloads)
    records = []
    offset = 32
    for i, (event, payload) in enumerate(zip(events, payloads, strict=True)):
        length, _, flags = struct.unpack_from("<IIB", segment, offset)  # FORMAT.md's frame
        records.append(
            {
                "seq": SEGMENT_FIRST_SEQ + i,
                "offset": offset,
                "stored_length": length,
                "compressed": bool(flags & 1),
                "payload_length": len(payload),
                "tag": event.__struct_config__.tag,
                "event": describe(event),
            }
        )
        offset += 9 + length
    assert offset == len(segment)

    state, seq = snapshot_state()
    snap = snapshot(state)
    body = encode_snapshot(snap)
    snap_object = encode_snapshot_object(SNAPSHOT_EPOCH, seq, body)
    _, stats = execute(state, c.Stats(), state.clock_ms, SequentialIds())

    description = {
        "about": (
            f"What segment-v{version}.seg and snapshot-v{version}.snap contain. Written once "
            "by tests/data/make_golden.py together with them; never regenerated."
        ),
        "format_version": version,
        "segment": {
            "file": f"segment-v{version}.seg",
            **file_facts(segment),
            "version": version,
            "epoch": SEGMENT_EPOCH,
            "first_seq": SEGMENT_FIRST_SEQ,
            "count": len(events),
            "records": records,
        },
        "snapshot": {
            "file": f"snapshot-v{version}.snap",
            **file_facts(snap_object),
            "version": SNAPSHOT_OBJECT_VERSION,
            "epoch": SNAPSHOT_EPOCH,
            "seq": seq,
            "compressed": bool(snap_object[6] & 1),
            "body_length": len(body),
            "snapshot": describe(snap),
            "stats_at_ms": state.clock_ms,
            "stats": msgspec.to_builtins(stats),
        },
    }
    text = json.dumps(description, indent=1, sort_keys=False) + "\n"
    return {
        f"segment-v{version}.seg": segment,
        f"snapshot-v{version}.snap": snap_object,
        f"golden-v{version}.json": text.encode(),
    }


def main(argv: list[str] | None = None) -> int:
    return write_once(build, __doc__, argv)


def write_once(
    build: Callable[[], dict[str, bytes]], doc: str | None, argv: list[str] | None
) -> int:
    """The command line of a golden-file script: write what ``build`` makes into ``--out``,
    refusing if any of its files is there already (``doc``: the script's docstring)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write into")
    args = parser.parse_args(argv)
    files = build()
    taken = [name for name in files if (args.out / name).exists()]
    if taken:
        print(
            f"refusing to overwrite {', '.join(taken)} in {args.out}: golden files are written "
            "once per format version and never regenerated",
            file=sys.stderr,
        )
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (args.out / name).write_bytes(data)
        print(f"wrote {args.out / name} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
