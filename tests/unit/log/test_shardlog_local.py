"""The shard log on a local file: each block is written from the pump itself (a ``pwrite``
and an ``fdatasync`` block the loop anyway), released in order, and what the released
commands append goes out in the next block; a failed fsync fails its block and everything
after it. And a call's reply is handed on in the very step that releases it."""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from actors.core import events as ev
from actors.flow import Call
from actors.log.device import LocalLogDevice
from actors.log.faults import FaultyDisk
from actors.log.shardlog import ShardLog
from actors.log.store import DiskFailed, LocalDirStore
from actors.log.wal import decode_block, decode_groups, decode_record

Q = "q"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LocalDirStore]:
    st = LocalDirStore(tmp_path / "store")
    yield st
    await st.close()


async def open_log(
    store: LocalDirStore, disk: FaultyDisk, **options: int
) -> tuple[LocalLogDevice, ShardLog]:
    device = LocalLogDevice(store, 0, disk=disk)
    await device.open()
    await device.begin(1, 1)
    return device, ShardLog(device, 1, 1, **options)


def acked(i: int) -> ev.Event:
    return ev.MessagesAcked(1, [i])


def read_back(device: LocalLogDevice, segment: str, offset: int, length: int) -> list[object]:
    block = decode_block(device.read_at(segment, offset, length))
    return [decode_record(r) for _, _, records in decode_groups(block) for r in records]


async def test_appends_of_one_turn_go_out_as_one_block_without_a_task(
    store: LocalDirStore,
) -> None:
    disk = FaultyDisk()
    device, wal = await open_log(store, disk)
    try:
        batches = [wal.append(Q, 1 + i, [acked(i)]) for i in range(5)]
        assert len({id(b) for b in batches}) == 1
        await batches[0].wait()
        assert wal.blocks_written == 1
        assert not wal._tasks  # written by the pump, not by a task of its own
        batch = batches[0]
        assert read_back(device, batch.segment, batch.offset, batch.length) == [
            acked(i) for i in range(5)
        ]
        assert wal.durable_lsn == 5
        assert wal.idle
    finally:
        await device.close()


async def test_what_a_released_command_appends_goes_out_in_the_next_block(
    store: LocalDirStore,
) -> None:
    disk = FaultyDisk()
    device, wal = await open_log(store, disk)
    try:
        first = wal.append(Q, 1, [acked(1)])
        later: list[object] = []
        # A waiter that appends as soon as the first block is released, in the same step
        # (as a take woken by a put decides at once).
        fut = first.wait()
        fut.add_done_callback(lambda _: later.append(wal.append(Q, 2, [acked(2)])))
        await fut
        await asyncio.sleep(0)  # the callback runs
        [second] = later
        assert second is not first
        await second.wait()  # type: ignore[attr-defined]
        assert wal.blocks_written == 2
        assert wal.durable_lsn == 2
        assert (first.segment, first.offset + first.length) == (
            second.segment,  # type: ignore[attr-defined]
            second.offset,  # type: ignore[attr-defined]
        )
        await wal.drain()
        assert wal.idle
    finally:
        await device.close()


async def test_blocks_over_the_size_limit_go_out_one_after_the_other_in_order(
    store: LocalDirStore,
) -> None:
    device, wal = await open_log(store, FaultyDisk(), max_batch_bytes=1)  # a batch per append
    try:
        batches = [wal.append(Q, 1 + i, [acked(i)]) for i in range(4)]
        released: list[int] = []
        for i, b in enumerate(batches):
            b.wait().add_done_callback(lambda _, i=i: released.append(i))
        await wal.drain()
        await asyncio.sleep(0)
        assert released == [0, 1, 2, 3]
        assert wal.blocks_written == 4
        assert [b.first_lsn for b in batches] == [1, 2, 3, 4]
    finally:
        await device.close()


async def test_a_failed_fdatasync_fails_its_block_and_every_later_one(
    store: LocalDirStore, caplog: pytest.LogCaptureFixture
) -> None:
    disk = FaultyDisk()
    device, wal = await open_log(store, disk)
    try:
        await wal.append(Q, 1, [acked(1)]).wait()
        disk.fail("fdatasync", errno.EIO)
        failed = wal.append(Q, 2, [acked(2)])
        with caplog.at_level(logging.ERROR), pytest.raises(DiskFailed):
            await failed.wait()
        assert wal.failed is not None
        assert wal.durable_lsn == 1
        with pytest.raises(DiskFailed):
            wal.append(Q, 3, [acked(3)])  # a broken log takes nothing more
        with pytest.raises(DiskFailed):
            await wal.drain()
    finally:
        await device.close()


async def test_a_call_hands_its_results_on_in_the_step_that_settles_it() -> None:
    seen: list[list[object]] = []
    call = Call(2)
    call.on_done(seen.append)
    call.settle(1, "b")
    assert seen == []
    call.settle(0, "a")
    assert seen == [["a", "b"]]  # not a loop turn later
    assert call.future.result() == ["a", "b"]

    done = Call(0)  # nothing to wait for: handed on at once
    done.on_done(seen.append)
    assert seen[-1] == []


async def test_a_failing_hand_on_is_logged_and_the_call_still_resolves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(results: list[object]) -> None:
        raise RuntimeError("the transport is gone")

    call = Call(1)
    call.on_done(broken)
    with caplog.at_level(logging.ERROR, logger="actors.flow"):
        call.settle(0, "a")
    assert "a call's reply failed" in caplog.text
    assert call.future.result() == ["a"]
