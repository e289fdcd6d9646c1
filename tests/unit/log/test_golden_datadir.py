"""The committed version-1 data directory opens with today's server, unchanged, and goes on.

``tests/data/datadir-v1/`` is a whole data directory written by a version-1 server (a log per
queue: ``queues/<queue>/log/``) and ``datadir-v1.json`` says what each queue held then
(``tests/data/make_golden_datadir.py``): messages in every state with their leases, a FIFO
queue, a dead letter, idempotency keys, an application key. Every test works on a copy; the
committed directory is checked to be untouched after each.

- Today's shards (one, or three: version 1 had no layout, any count opens it) rebuild every
  queue exactly as the JSON says, with the clock where the old server stopped.
- The version-1 segments go once two snapshots cover them (FORMAT.md, "Version 1"); the
  queues then live on in the shard log.
- More commands on that history (acks of version-1 leases, FIFO order, idempotency keys, a
  key's version) work, and after a restart — graceful or as after a crash — the old history
  and the new records are both there.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.clock import ManualClock
from actors.core import commands as c
from actors.core import replies as rp
from actors.core.snapshot import logical
from actors.errors import QueueError
from actors.ids import SequentialIds
from actors.keyspace import partition_of
from actors.log import keys
from actors.log.shard_recovery import placement
from actors.log.store import LocalDirStore
from actors.log.wal import decode_groups, scan_segment
from actors.shard import QueueShard

DATA = Path(__file__).resolve().parents[2] / "data"
DATADIR = DATA / "datadir-v1"
GOLDEN = json.loads((DATA / "datadir-v1.json").read_text())
QUEUES: dict[str, Any] = GOLDEN["queues"]
KEY = "app:price"


def manifest(root: Path) -> dict[str, str]:
    """Every file under ``root`` and its SHA-256."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


PRISTINE = manifest(DATADIR)


@pytest.fixture(autouse=True)
def _golden_untouched() -> Iterator[None]:
    yield
    assert manifest(DATADIR) == PRISTINE, "tests/data/datadir-v1 changed: work on a copy"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy of the version-1 data directory."""
    shutil.copytree(DATADIR, tmp_path / "data")
    return tmp_path / "data"


class Server:
    """Today's shards over one data directory, as a server runs them."""

    def __init__(self, root: Path, count: int, clock: ManualClock) -> None:
        self.store = LocalDirStore(root)
        self.shards = [
            QueueShard(i, count, self.store, clock=clock, ids=SequentialIds()) for i in range(count)
        ]

    async def start(self) -> Server:
        for shard in self.shards:
            await shard.start()
        return self

    def shard(self, name: str) -> QueueShard:
        return self.shards[placement(name, len(self.shards))]

    async def run(self, name: str, *commands: object) -> list[Any]:
        results = await self.shard(name).execute_many(name, list(commands))
        errors = [r for r in results if isinstance(r, QueueError)]
        assert not errors, errors
        return results

    async def settle(self) -> None:
        """Until no background work (snapshots, pruning) is left in any shard or queue."""
        while True:
            tasks = [
                t
                for shard in self.shards
                for t in [
                    *shard._background,
                    *(t for q in shard.queues.values() for t in q._background),
                ]
            ]  # the only private attributes read here: waiting on them instead of sleeping
            if not tasks:
                return
            await asyncio.gather(*tasks)

    def described(self) -> dict[str, Any]:
        """Every queue as ``make_golden_datadir.py`` described it (``last_seq`` aside)."""
        out = {}
        for shard in self.shards:
            for name, queue in shard.queues.items():
                if queue.state.created:
                    out[name] = describe(queue.state)
        return out

    async def stop(self, *, snapshot: bool) -> None:
        for shard in self.shards:
            await shard.close(snapshot=snapshot)
        await self.store.close()


def describe(s: Any) -> dict[str, Any]:
    """A queue's state as the JSON has it (see make_golden_datadir._describe)."""
    return {
        "settings": {"fifo": s.settings.fifo, "max_receives": s.settings.max_receives},
        "counts": [s.n_ready, s.n_delayed, s.n_reserved],
        "messages": [
            {
                "id": str(m.id),
                "body": m.body.decode(),
                "state": m.state,
                "activate_at_ms": m.activate_at_ms,
                "receive_count": m.receive_count,
                "lease": m.lease,
                "group": m.group,
                "attributes": m.attributes,
            }
            for m in logical(s).messages
        ],
        "keys": {k: list(v) for k, v in s.keys.items()},
        "idempotency_keys": sorted(s.idem),
    }


def golden(name: str) -> dict[str, Any]:
    return {k: v for k, v in QUEUES[name].items() if k != "last_seq"}


def v1_segments(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.glob("queues/*/log/*"))


def shard_log_records(root: Path, count: int) -> dict[str, list[int]]:
    """The sequence numbers each queue has in the shard logs (format 2), in log order."""
    out: dict[str, list[int]] = {}
    for index in range(count):
        for path in sorted((root / keys.wal_prefix(index)).glob("*.seg")):
            for block in scan_segment(path.read_bytes()).blocks:
                for queue, first, raws in decode_groups(block):
                    out.setdefault(queue, []).extend(range(first, first + len(raws)))
    return out


def test_the_golden_directory_is_a_version_1_directory() -> None:
    assert not (DATADIR / "wal").exists()  # no shard log, no layout
    assert {p.split("/")[1] for p in PRISTINE} == set(QUEUES)
    assert all(p.split("/")[2] in ("log", "snap", "reports") for p in PRISTINE), sorted(PRISTINE)
    assert partition_of(KEY) in QUEUES


@pytest.mark.parametrize("count", [1, 3])
async def test_every_queue_opens_as_the_json_says_and_version_1_segments_go(
    root: Path, count: int
) -> None:
    clock = ManualClock(GOLDEN["clock_ms"])
    server = await Server(root, count, clock).start()
    try:
        reports = {r.queue: r for shard in server.shards for r in shard.reports}
        assert set(reports) == set(QUEUES)
        for name, expected in QUEUES.items():
            assert reports[name].clean, reports[name]
            assert reports[name].last_seq == expected["last_seq"], name
        assert all(shard.report is not None and shard.report.clean for shard in server.shards)
        await server.settle()
        assert server.described() == {name: golden(name) for name in QUEUES}
        # Two snapshots of each queue cover all its version-1 records: those segments are gone.
        assert v1_segments(root) == []
        for name, expected in QUEUES.items():
            queue = server.shard(name).queues[name]
            assert not queue.legacy
            assert queue.snapshot_floor >= expected["last_seq"], (name, queue.snapshots)
        [view] = await server.run(partition_of(KEY), c.GetKey(KEY))
        assert view == rp.KeyView(KEY, 2, {"eur": 2})
    finally:
        await server.stop(snapshot=False)


async def _go_on(server: Server, clock: ManualClock) -> None:
    """Commands that lean on the version-1 history."""
    clock.advance(5)
    jobs = server.shard("jobs").queues["jobs"].state
    [reserved] = [m for m in logical(jobs).messages if m.lease]
    [[acked]] = await server.run("jobs", c.Ack([c.LeaseRef(str(reserved.id), str(reserved.lease))]))
    assert acked.status == rp.OK  # a lease handed out by the version-1 server
    [[again, fresh]] = await server.run(
        "jobs",
        c.Put([c.NewMessage(body=b"dup", idempotency_key="k0"), c.NewMessage(body=b"after")]),
    )
    assert again.status == rp.DUPLICATE  # its idempotency key came from version 1
    assert fresh.status == rp.CREATED
    [taken] = await server.run("jobs", c.Take(1))
    assert [d.body for d in taken] == [b"job 3"]  # the oldest ready message
    [[acked]] = await server.run("jobs", c.Ack([c.LeaseRef(taken[0].id, taken[0].lease)]))
    assert acked.status == rp.OK
    # FIFO: a1 is reserved, so group a waits for it; b1 is next, then a2 once a1 is acked.
    fifo = server.shard("orders.fifo").queues["orders.fifo"].state
    [a1] = [m for m in logical(fifo).messages if m.lease]
    [taken] = await server.run("orders.fifo", c.Take(2))
    assert [d.body for d in taken] == [b"b1"]
    [[acked]] = await server.run("orders.fifo", c.Ack([c.LeaseRef(str(a1.id), str(a1.lease))]))
    assert acked.status == rp.OK
    [taken] = await server.run("orders.fifo", c.Take(1))
    assert [d.body for d in taken] == [b"a2"]
    [[letter]] = await server.run("dead", c.Take(1))
    assert letter.attributes == {"evq.source_queue": "work", "evq.source_id": "16"}
    [view] = await server.run(partition_of(KEY), c.SetKey(KEY, {"eur": 3}))
    assert view.version == 3  # the key's versions go on from version 1's
    clock.advance(5)


@pytest.mark.parametrize("graceful", [True, False], ids=["graceful", "crash"])
async def test_written_further_it_reopens_with_the_old_history_and_the_new_records(
    root: Path, graceful: bool
) -> None:
    count = 3
    clock = ManualClock(GOLDEN["clock_ms"])
    server = await Server(root, count, clock).start()
    try:
        await server.settle()
        await _go_on(server, clock)
        await server.settle()
        live = server.described()
        next_seqs = {n: server.shard(n).queues[n].next_seq for n in QUEUES}
    finally:
        await server.stop(snapshot=graceful)
    assert live["jobs"] != golden("jobs")  # it did change

    # The new records are in the shard logs, numbered on from the version-1 ones.
    logged = shard_log_records(root, count)
    for name, expected in QUEUES.items():
        seqs = logged[name]
        assert seqs == list(range(seqs[0], next_seqs[name])), name
        assert seqs[0] == expected["last_seq"] + 1, name

    server = await Server(root, count, clock).start()
    try:
        assert server.described() == live
        for name in QUEUES:
            assert server.shard(name).queues[name].next_seq == next_seqs[name]
        assert v1_segments(root) == []
        [view] = await server.run(partition_of(KEY), c.GetKey(KEY))
        assert (view.version, view.value) == (3, {"eur": 3})
        # version-1 messages still there, untouched, beside the new ones
        jobs = {m["body"]: m for m in server.described()["jobs"]["messages"]}
        for old in golden("jobs")["messages"]:
            if old["body"] not in ("job 2", "job 3"):  # the two acked above
                assert jobs[old["body"]] == old
        assert jobs["after"]["state"] == 1
    finally:
        await server.stop(snapshot=False)
