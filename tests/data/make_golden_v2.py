"""Write the golden file of the shard log, format version 2. Run ONCE.

    .venv/bin/python tests/data/make_golden_v2.py            # writes into tests/data/
    .venv/bin/python tests/data/make_golden_v2.py --out DIR  # writes elsewhere (to look)

A human ran this once, when format version 2 was introduced (FORMAT.md, "Compatibility
rules"), and committed what it wrote:

- ``segment-v2.seg``: a segment of shard 2 (of 4) as a local disk holds it, written by the
  real :class:`~actors.log.device.LocalLogDevice` with 4 KiB segments: the header (epoch 4,
  first LSN 100), five blocks (group commits) holding the groups of two or three queues each
  — the shard's own stream ``""`` with the incarnation's ``WriterStarted`` claim in the
  first, one record of every event type, one of them large enough to be stored compressed —
  and then the preallocated zeros, as the segment being written looks after a crash (the
  bytes are read before the device closes and cuts the file to its blocks). Every queue
  name hashes to shard 2 of 4, so recovery of that shard takes every record.
- ``golden-v2.json``: exactly what the segment contains: its header fields, each block's
  offset, length, CRC, epoch, first LSN and count, each group (queue, first sequence
  number) and each record (LSN, sequence number, stored length, compressed or not, the
  event); and each queue's last sequence number. Events are described as in
  ``golden-v1.json`` (``make_golden.describe``: structs with their type and named fields,
  bytes as hex), so a reader can tell a field appended later (with its default) from a
  changed one. It also records the file's size and SHA-256.

The files are **never regenerated**: they are what a version-2 writer wrote, and every
later reader must still decode them (``tests/unit/log/test_golden_v2.py``). That is why
this script refuses to overwrite an existing file. Everything here is fixed: no wall
clock (ManualClock), no randomness (a fixed claim nonce).
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any

import msgspec
from make_golden import (  # tests/data/, beside this script
    describe,
    file_facts,
    large_body,
    write_once,
)

from actors.clock import ManualClock
from actors.core import events as ev
from actors.log.device import LocalLogDevice
from actors.log.shard_recovery import SHARD_STREAM, placement
from actors.log.store import LocalDirStore
from actors.log.wal import WAL_VERSION, encode_block, encode_record
from actors.settings import QueueSettings

HERE = Path(__file__).resolve().parent
T = 1_700_000_000_000  # a fixed point in time; no clock is read

SHARD, SHARDS = 2, 4
EPOCH = 4
FIRST_LSN = 100
SEGMENT_BYTES = 4096
STREAM_SEQ = 4  # epochs 1 to 3 claimed the shard stream's records 1 to 3
CLAIM_NONCE = 0x5EED_0000_0002

ALPHA = "alpha"
FIFO = "steps.fifo"
TEMP = "temp"  # deleted in the last blocks
KEYS = "__evq-keys-13"  # the key partition of "app:price"

Group = tuple[str, int, list[ev.Event]]


def blocks() -> list[list[Group]]:
    """The segment's blocks, in order: each a list of groups (queue, first seq, events)."""
    alpha = QueueSettings(visibility_timeout_ms=20_000, max_receives=3, dead_letter_queue="dlq")
    return [
        [
            (SHARD_STREAM, STREAM_SEQ, [ev.WriterStarted(T, EPOCH, CLAIM_NONCE)]),
            (
                ALPHA,
                1,
                [
                    ev.QueueCreated(T, ALPHA, alpha),
                    ev.MessagesPut(
                        T + 10,
                        [
                            ev.PutItem(1, b"first", T + 10),
                            ev.PutItem(
                                2,
                                b"second",
                                T + 5_000,
                                key="idem-2",
                                attributes={"kind": "later", "n": 2, "tags": ["a", "b"]},
                            ),
                        ],
                    ),
                ],
            ),
            (FIFO, 1, [ev.QueueCreated(T, FIFO, QueueSettings(fifo=True))]),
        ],
        [
            (
                FIFO,
                2,
                [
                    ev.MessagesPut(
                        T + 100,
                        [
                            ev.PutItem(1, large_body(b"golden v2", 40), T + 100, group="g1"),
                            ev.PutItem(2, b"tiny", T + 100, group="g2"),
                        ],
                    )
                ],
            ),
            (
                ALPHA,
                3,
                [
                    ev.MessagesTaken(T + 200, [1], [1001], T + 20_200),
                    ev.MessagesAcked(T + 300, [1]),
                ],
            ),
            (
                TEMP,
                1,
                [
                    ev.QueueCreated(T + 300, TEMP, QueueSettings(id_mode="client")),
                    ev.MessagesPut(T + 400, [ev.PutItem("t-1", b"short-lived", T + 400)]),
                ],
            ),
        ],
        [
            (
                ALPHA,
                5,
                [
                    ev.MessageUpdated(T + 6_000, 2, b"second, updated", None),
                    ev.MessagesTaken(T + 6_100, [2], [1002], T + 26_100),
                    ev.LeasesExtended(T + 6_200, [2], [T + 46_200]),
                    ev.MessagesReleased(T + 6_300, [2], [T + 7_300]),
                ],
            ),
            (
                KEYS,
                1,
                [
                    ev.QueueCreated(T + 6_300, KEYS, QueueSettings()),
                    ev.KeySet(T + 6_400, "app:price", 1, {"eur": 1, "note": None}),
                ],
            ),
        ],
        [
            (
                FIFO,
                3,
                [
                    ev.SettingsChanged(
                        T + 7_000, QueueSettings(fifo=True, visibility_timeout_ms=45_000)
                    ),
                    ev.QueuePurged(T + 7_100),
                    ev.DeadLettersRouted(T + 7_200, [1]),
                ],
            ),
            (TEMP, 3, [ev.QueueDeleted(T + 7_300)]),
        ],
        [
            (
                ALPHA,
                9,
                [ev.MessagesDeleted(T + 8_000, [2]), ev.Checkpoint(T + 8_100)],
            ),
            (KEYS, 3, [ev.KeySet(T + 8_200, "app:price", 2, {"eur": 2, "note": "raised"})]),
        ],
    ]


async def _write(root: Path) -> bytes:
    """The segment as the local device writes it, read before it is closed."""
    store = LocalDirStore(root)
    device = LocalLogDevice(store, SHARD, segment_bytes=SEGMENT_BYTES, clock=ManualClock(T))
    try:
        await device.open()
        await device.begin(EPOCH, FIRST_LSN)
        lsn = FIRST_LSN
        for groups in blocks():
            encoded = [(q, s, [encode_record(e) for e in events]) for q, s, events in groups]
            key, _ = await device.write(EPOCH, lsn, encode_block(EPOCH, lsn, encoded))
            lsn += sum(len(events) for _, _, events in groups)
        return await device.read(key)
    finally:
        await device.close()
        await store.close()


def _describe_segment(data: bytes) -> dict[str, Any]:
    """What the segment holds, read with FORMAT.md's layout (and checked against the
    events this script wrote)."""
    magic, version, flags, epoch, first_lsn, shard, crc = struct.unpack_from("<4sHHQQII", data)
    described: list[dict[str, Any]] = []
    pos, lsn = 32, first_lsn
    last_seq: dict[str, int] = {}
    for groups in blocks():
        length, block_crc, b_epoch, b_lsn, count, b_flags = struct.unpack_from("<IIQQII", data, pos)
        assert (b_epoch, b_lsn, b_flags) == (EPOCH, lsn, 0)
        body = msgspec.msgpack.decode(data[pos + 32 : pos + 32 + length])
        assert count == sum(len(recs) for _, _, recs in body)
        out_groups = []
        for (queue, first_seq, events), (b_queue, b_first, raws) in zip(groups, body, strict=True):
            assert (queue, first_seq, len(events)) == (b_queue, b_first, len(raws))
            records = []
            for i, event in enumerate(events):
                stored = encode_record(event)
                plain = msgspec.msgpack.encode(event)
                records.append(
                    {
                        "lsn": lsn,
                        "seq": first_seq + i,
                        "stored_length": len(stored),
                        "compressed": stored != plain,
                        "plain_length": len(plain),
                        "tag": event.__struct_config__.tag,
                        "event": describe(event),
                    }
                )
                lsn += 1
            if queue != SHARD_STREAM:
                last_seq[queue] = first_seq + len(events) - 1
            out_groups.append({"queue": queue, "first_seq": first_seq, "records": records})
        described.append(
            {
                "offset": pos,
                "length": length,
                "crc": block_crc,
                "epoch": b_epoch,
                "first_lsn": b_lsn,
                "count": count,
                "flags": b_flags,
                "groups": out_groups,
            }
        )
        pos += 32 + length
    assert not any(data[pos:]), "only the preallocated zeros follow the last block"
    return {
        "header": {
            "magic": magic.decode(),
            "version": version,
            "flags": flags,
            "epoch": epoch,
            "first_lsn": first_lsn,
            "shard": shard,
            "header_crc": crc,
        },
        "blocks": described,
        "valid_end": pos,
        "next_lsn": lsn,
        "end": "zeros",
        "queues": last_seq,
    }


def build() -> dict[str, bytes]:
    """Every golden file of version 2, by name."""
    every = {type(e).__name__ for groups in blocks() for _, _, events in groups for e in events}
    assert every == {t.__name__ for t in typing.get_args(ev.Event)}, every
    for groups in blocks():
        assert 2 <= len(groups) <= 3
        assert all(placement(q, SHARDS) == SHARD for q, _, _ in groups if q != SHARD_STREAM)
    with tempfile.TemporaryDirectory() as tmp:
        segment = asyncio.run(_write(Path(tmp)))
    assert len(segment) == SEGMENT_BYTES
    description = {
        "about": (
            "What segment-v2.seg contains. Written once by tests/data/make_golden_v2.py "
            "together with it; never regenerated."
        ),
        "format_version": WAL_VERSION,
        "segment": {
            "file": "segment-v2.seg",
            **file_facts(segment),
            "layout": "local",
            "segment_bytes": SEGMENT_BYTES,
            "shards": SHARDS,
            **_describe_segment(segment),
        },
    }
    text = json.dumps(description, indent=1, sort_keys=False) + "\n"
    return {"segment-v2.seg": segment, "golden-v2.json": text.encode()}


def main(argv: list[str] | None = None) -> int:
    return write_once(build, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
