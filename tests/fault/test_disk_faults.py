"""Faults of the local log's disk, injected through its seam (:class:`FaultyDisk`) into real
shards writing real files with real fsyncs (FORMAT.md, "Faults of the disk"):

- a failed fdatasync is never retried and never taken for success: the commands of that
  write fail, the shard stops writing for good, says why (status, an ERROR line naming the
  shard and the errno), and a new shard on the same log recovers what was acknowledged;
- a full disk (ENOSPC) refuses puts with a clear error while takes, acks and releases go
  on in the reserve (the spare segment); puts resume by themselves once space returns; when
  the reserve runs out too, commands wait and finish once space returns; nothing
  acknowledged is lost;
- a slow fdatasync makes group commits bigger, not more numerous.

The same faults for real, through the kernel: ``test_disk_real.py``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core.ids import SequentialIds
from actors.core.snapshot import logical
from actors.errors import QueueError, Unavailable
from actors.log.device import SPACE_CHECK_S, LocalLogDevice
from actors.log.faults import SPARE_SUFFIX, FaultyDisk
from actors.log.store import LocalDirStore
from actors.settings import LogSettings
from actors.shard import QueueShard
from tests.fault.actor_support import CLIENT_IDS, put, wait_until

pytestmark = pytest.mark.fault

Q = "q"
SEGMENT = 4096  # a few dozen small commands per segment: rolls come quickly
SETTINGS = LogSettings(
    segment_bytes=SEGMENT, snapshot_every_records=10**9, snapshot_every_ms=10**12
)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LocalDirStore]:
    st = LocalDirStore(tmp_path / "store")
    yield st
    await st.close()


async def open_shard(store: LocalDirStore, disk: FaultyDisk | None = None) -> QueueShard:
    device = LocalLogDevice(store, 0, segment_bytes=SEGMENT, disk=disk or FaultyDisk())
    shard = QueueShard(
        0,
        1,
        store,
        clock=ManualClock(),
        ids=SequentialIds(),
        log_settings=SETTINGS,
        device=device,
    )
    await shard.start()
    if Q not in await shard.names():
        await shard.create(Q, CLIENT_IDS, [])
    return shard


async def run(shard: QueueShard, *commands: object) -> list[Any]:
    return await shard.execute_many(Q, list(commands))


async def put_one(shard: QueueShard, mid: str) -> Any:
    """The ids a put of ``mid`` reports as put, or its error."""
    [result] = await run(shard, put(mid))
    return result if isinstance(result, QueueError) else [r.id for r in result]


async def ids_after_restart(store: LocalDirStore) -> set[str]:
    """The ids of every message a new shard on the same log recovers."""
    shard = await open_shard(store)
    try:
        queue = await shard.get(Q)
        return {str(m.id) for m in logical(queue.state).messages}
    finally:
        await shard.close()


# ---------------------------------------------------------------- a failed fsync


async def test_a_failed_fdatasync_fails_its_write_stops_the_shard_and_is_never_retried(
    store: LocalDirStore, caplog: pytest.LogCaptureFixture
) -> None:
    disk = FaultyDisk()
    shard = await open_shard(store, disk)
    assert [await put_one(shard, m) for m in ("a", "b")] == [["a"], ["b"]]
    disk.fail("fdatasync", errno.EIO)
    syncs = disk.calls["fdatasync"]
    with caplog.at_level(logging.ERROR):
        result = await put_one(shard, "c")
    # The block of "c" was written to the page cache, its fsync failed: reading the file
    # back in this process would find it and call it durable. It must not.
    assert isinstance(result, Unavailable), result
    assert disk.calls["fdatasync"] == syncs + 1, "the failed fsync was retried"
    status = shard.status()
    assert status.log_failed is not None
    assert "EIO" in status.log_failed
    assert "restart" in status.log_failed
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("shard 0" in m and "errno 5" in m for m in errors), errors

    disk.heal()  # the disk answers again: this process still writes nothing
    for command in (put("d"), cmd.Take(1), cmd.Stats()):
        [refused] = await run(shard, command)
        assert isinstance(refused, Unavailable), (command, refused)
        assert refused.message == status.log_failed
    assert disk.calls["fdatasync"] == syncs + 1, "a write was tried after the failure"
    await shard.close()

    recovered = await ids_after_restart(store)
    assert {"a", "b"} <= recovered, "an acknowledged put was lost"
    assert "d" not in recovered


async def test_a_failed_fdatasync_while_starting_a_segment_stops_the_shard_too(
    store: LocalDirStore,
) -> None:
    disk = FaultyDisk()
    shard = await open_shard(store, disk)
    acked = [m for m in (f"m{i}" for i in range(200)) if await put_one(shard, m) == [m]]
    assert len(acked) == 200
    # Only the header's sync of the next segment fails (the blocks' syncs succeed).
    disk.fail("fdatasync", errno.EIO, disk.calls["fdatasync"] + 1)
    results = [await put_one(shard, f"n{i}") for i in range(200)]
    failed = [r for r in results if isinstance(r, QueueError)]
    assert failed, "no segment was started"
    assert shard.status().log_failed is not None
    first = results.index(failed[0])
    assert all(isinstance(r, Unavailable) for r in results[first:]), results[first:]
    acked += [f"n{i}" for i in range(first)]
    await shard.close()
    assert set(acked) <= await ids_after_restart(store)


# ---------------------------------------------------------------- a full disk


async def fill_until_refused(shard: QueueShard, prefix: str, limit: int = 1000) -> list[str]:
    """Put messages one by one until a put is refused; the ids put."""
    acked = []
    for i in range(limit):
        result = await put_one(shard, f"{prefix}{i}")
        if isinstance(result, QueueError):
            assert isinstance(result, Unavailable), result
            assert "full" in result.message
            assert "puts are refused" in result.message
            return acked
        acked.append(f"{prefix}{i}")
    raise AssertionError(f"{limit} puts went through a full disk")


async def test_a_full_disk_refuses_puts_takes_and_acks_go_on_and_puts_resume_by_themselves(
    store: LocalDirStore,
) -> None:
    disk = FaultyDisk()
    shard = await open_shard(store, disk)
    acked = [m for m in ("a", "b") if await put_one(shard, m) == [m]]
    disk.no_space()
    acked += await fill_until_refused(shard, "x")
    assert shard.status().disk_full is not None
    assert shard.status().log_failed is None

    # Takes and acks go on in the reserve (the segment that was the spare).
    [taken] = await run(shard, cmd.Take(3))
    assert [d.id for d in taken] == acked[:3]
    [done] = await run(shard, cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in taken[:2]]))
    assert not isinstance(done, QueueError), done
    [released] = await run(
        shard, cmd.Release([cmd.ReleaseItem(id=taken[2].id, lease=taken[2].lease)])
    )
    assert not isinstance(released, QueueError), released
    gone = {d.id for d in taken[:2]}

    disk.space_back()
    await asyncio.sleep(SPACE_CHECK_S)
    # The first put after space returns starts a new spare; the puts resume once it is made.
    for _ in range(200):
        result = await put_one(shard, "after")
        if result == ["after"]:
            break
        assert isinstance(result, Unavailable), result
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("puts did not resume after space returned")
    acked.append("after")
    assert shard.status().disk_full is None
    await shard.close()
    assert await ids_after_restart(store) == set(acked) - gone


async def test_puts_that_reach_a_segments_tail_before_its_spare_is_made_leave_the_tail(
    store: LocalDirStore,
) -> None:
    """The disk fills while the next spare is being made (slowly): puts go on into the new
    segment until its tail, then wait for the spare, learn it failed and are refused; the
    tail is left to takes, acks and releases, which go on without space returning (a
    fresh-clone run on a loaded machine met this order on a real tmpfs: puts used the whole
    segment, the roll found no spare, and the shard served nothing until space returned)."""
    disk = FaultyDisk()
    shard = await open_shard(store, disk)
    acked = [m for m in ("a", "b") if await put_one(shard, m) == [m]]
    disk.delay("pwrite", 1.0, only=SPARE_SUFFIX)
    disk.no_space()
    acked += await fill_until_refused(shard, "x")
    assert len(acked) > SEGMENT // 200, "refused before the spare in hand was used"
    assert shard.status().disk_full is not None
    assert not [i for i in disk.injected if not i.path.endswith(SPARE_SUFFIX)]

    [taken] = await asyncio.wait_for(run(shard, cmd.Take(3)), 10)
    assert isinstance(taken, list), taken
    assert [d.id for d in taken] == acked[:3]
    [done] = await asyncio.wait_for(
        run(shard, cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in taken[:2]])), 10
    )
    assert not isinstance(done, QueueError), done
    [released] = await asyncio.wait_for(
        run(shard, cmd.Release([cmd.ReleaseItem(id=taken[2].id, lease=taken[2].lease)])), 10
    )
    assert not isinstance(released, QueueError), released
    assert shard.status().log_failed is None
    await shard.close()
    assert await ids_after_restart(store) == set(acked) - {d.id for d in taken[:2]}


async def test_when_the_reserve_runs_out_too_commands_wait_and_finish_once_space_returns(
    store: LocalDirStore,
) -> None:
    disk = FaultyDisk()
    shard = await open_shard(store, disk)
    disk.no_space()
    acked = await fill_until_refused(shard, "x")
    # Take and release until the reserve is full too: the write that needs the next segment
    # finds no space and fails (it wrote nothing), and the shard reads its log again until
    # there is space for a segment; meanwhile commands wait.
    for _ in range(1000):
        [taken] = await run(shard, cmd.Take(1))
        if isinstance(taken, QueueError):
            break
        [released] = await run(
            shard, cmd.Release([cmd.ReleaseItem(id=taken[0].id, lease=taken[0].lease)])
        )
        if isinstance(released, QueueError):
            break
    else:
        raise AssertionError("the reserve never ran out")
    failed = taken if isinstance(taken, QueueError) else released
    assert isinstance(failed, Unavailable), failed
    waiting = asyncio.ensure_future(run(shard, cmd.Take(1)))
    await asyncio.sleep(0.5)
    assert not waiting.done(), "a command was answered while the log has no space"
    disk.space_back()
    [taken] = await asyncio.wait_for(waiting, 20)
    assert isinstance(taken, list), taken
    assert len(taken) == 1
    await wait_until(lambda: shard.device.full() is None, "puts are taken again", within=10)
    assert await put_one(shard, "after") == ["after"]
    await shard.close()
    assert await ids_after_restart(store) == {*acked, "after"}


# ---------------------------------------------------------------- a slow disk


async def test_a_slow_fdatasync_makes_group_commits_bigger_not_more_numerous(
    store: LocalDirStore,
) -> None:
    disk = FaultyDisk()
    shard = await open_shard(store, disk)
    disk.delay("fdatasync", 0.05)
    syncs = disk.calls["fdatasync"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await asyncio.gather(*(put_one(shard, f"m{i}") for i in range(300)))
    took = loop.time() - started
    assert results == [[f"m{i}"] for i in range(300)]
    commits = disk.calls["fdatasync"] - syncs
    assert took >= 0.05, "the delay was not injected"
    assert commits <= 10, f"{commits} fsyncs for 300 concurrent puts: no group commit"
    await shard.close()
