"""The archive (actors/log/archive.py): every segment the shard prunes is in the archive
first, byte for byte, so the archive and the live log together hold the whole log, with no
gap; a crash between the copy and the deletion loses nothing and doubles nothing;
baselines and retention keep the archived history usable. Real shards, both layouts."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from actors.clock import ManualClock
from actors.errors import DataError
from actors.ids import SequentialIds
from actors.log import keys
from actors.log.archive import DAY_MS, day_of
from actors.log.store import ObjectStore, StoreError
from actors.log.wal import scan_segment
from actors.settings import LogSettings
from actors.shard import QueueShard
from tests.fault.actor_support import CLIENT_IDS, device_of, empty_store, put
from tests.fault.actor_support import settle_shard as settle

pytestmark = pytest.mark.fault

SMALL = LogSettings(segment_bytes=700, snapshot_every_records=10**9, snapshot_every_ms=10**12)
T0 = 1_800_000_000_000


@pytest.fixture(params=["local", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    st = empty_store(request.param, tmp_path)
    yield st
    await st.close()


async def open_shard(
    store: ObjectStore, clock: ManualClock, settings: LogSettings = SMALL
) -> QueueShard:
    shard = QueueShard(0, 1, store, clock=clock, ids=SequentialIds(), log_settings=settings)
    await shard.start()
    return shard


_rounds = itertools.count()


async def churn(shard: QueueShard, queue: str, rounds: int) -> None:
    """Puts, snapshots after each, so the log rolls and its old segments are prunable."""
    for _ in range(rounds):
        i = next(_rounds)
        [result] = await shard.execute_many(queue, [put(*(f"{queue}-{i}-{j}" for j in range(5)))])
        assert not isinstance(result, Exception), result
        await shard.queues[queue].snapshot()
        await settle(shard)


async def archived(store: ObjectStore) -> dict[str, str]:
    """Archived shard-log segments: live key → archive key."""
    found = {}
    for key in await store.list(keys.ARCHIVE_ROOT):
        if keys.is_wal_segment(keys.unarchived(key)):
            found[keys.unarchived(key)] = key
    return found


async def live(store: ObjectStore) -> list[str]:
    return [key for _, key in await device_of(store).segments()]


async def lsn_runs(store: ObjectStore) -> list[tuple[int, int]]:
    """(first LSN, records) of every segment, archive and live log together, one each."""
    runs = {}
    for key, where in {**(await archived(store)), **{k: k for k in await live(store)}}.items():
        blocks = scan_segment(await store.get(where)).blocks
        runs[keys.seq_of(key)] = sum(b.count for b in blocks)
    return sorted(runs.items())


async def test_every_pruned_segment_is_in_the_archive_first(
    store: ObjectStore, tmp_path: Path
) -> None:
    clock = ManualClock(T0)
    shard = await open_shard(store, clock)
    try:
        await shard.create("q", CLIENT_IDS, [])
        await churn(shard, "q", 8)
        kept = await archived(store)
        assert len(kept) >= 3  # pruned, and archived
        assert not set(kept) & set(await live(store))
        for key, where in kept.items():
            assert where == keys.archive_key(key, day_of(T0))
        runs = await lsn_runs(store)
        assert runs[0][0] == 1  # the whole log, from its first record
        for (first, count), (following, _) in itertools.pairwise(runs):
            assert first + count == following  # no gap, no overlap
        assert await store.get(keys.archive_marker_key(0)) == b"evq archive\n"
    finally:
        await shard.close(snapshot=False)


async def test_a_crash_between_copy_and_deletion_keeps_one_of_each(store: ObjectStore) -> None:
    clock = ManualClock(T0)
    shard = await open_shard(store, clock)
    deleted = 0
    device = shard.device
    real_delete = device.delete

    async def failing_delete(key: str) -> None:  # the crash: the copy is made, not the delete
        nonlocal deleted
        deleted += 1
        if deleted == 1:
            raise StoreError("the server died here", ambiguous=False)
        await real_delete(key)

    device.delete = failing_delete  # type: ignore[method-assign]
    try:
        await shard.create("q", CLIENT_IDS, [])
        for _ in range(20):
            await churn(shard, "q", 1)
            if deleted:
                break
        both = set(await archived(store)) & set(await live(store))
        assert len(both) == 1  # archived, not deleted: in both places
        await churn(shard, "q", 3)  # the next prune archives it again (same bytes) and deletes
        assert not set(await archived(store)) & set(await live(store))
        runs = await lsn_runs(store)
        for (first, count), (following, _) in itertools.pairwise(runs):
            assert first + count == following
    finally:
        await shard.close(snapshot=False)


async def test_other_bytes_under_the_archive_name_keep_the_segment_live(
    store: ObjectStore,
) -> None:
    clock = ManualClock(T0)
    shard = await open_shard(store, clock)
    try:
        await shard.create("q", CLIENT_IDS, [])
        first = (await live(store))[0]
        await store.put(keys.archive_key(first, day_of(T0)), b"something else")
        await churn(shard, "q", 4)
        assert first in await live(store)  # never deleted: its copy is not its copy
        with pytest.raises(DataError):
            await shard.archive.keep(first, await store.get(first))  # type: ignore[union-attr]
    finally:
        await shard.close(snapshot=False)


async def test_a_log_archived_from_the_middle_gets_baselines_first(store: ObjectStore) -> None:
    clock = ManualClock(T0)
    unarchived = LogSettings(**{**_fields(SMALL), "archive": False})
    shard = await open_shard(store, clock, unarchived)
    try:
        await shard.create("q", CLIENT_IDS, [])
        await churn(shard, "q", 5)
        assert await store.list(keys.ARCHIVE_ROOT) == []  # pruned, not archived
    finally:
        await shard.close(snapshot=False)
    shard = await open_shard(store, clock)
    try:
        oldest = shard.queues["q"].snapshots[0]
        await churn(shard, "q", 3)
        baselines = [
            keys.seq_of(k)
            for k in await store.list(keys.ARCHIVE_ROOT)
            if keys.unarchived(k).startswith(keys.snapshot_prefix("q"))
        ]
        assert baselines  # a state the archived records of q continue from
        assert min(baselines) >= oldest  # one the live log had: nothing older is left
        assert await archived(store)
        assert await store.get(keys.archive_marker_key(0))
    finally:
        await shard.close(snapshot=False)


async def test_retention_removes_old_days_and_keeps_a_baseline(store: ObjectStore) -> None:
    clock = ManualClock(T0)
    settings = LogSettings(**{**_fields(SMALL), "archive_retention_days": 2})
    shard = await open_shard(store, clock, settings)
    try:
        await shard.create("q", CLIENT_IDS, [])
        await churn(shard, "q", 5)
        day0 = await store.list(keys.archive_key("", day_of(T0)))
        assert day0
        clock.advance(3 * DAY_MS)  # day0 is now past the retention
        await churn(shard, "q", 5)
        assert await store.list(keys.archive_key("", day_of(T0))) == []
        today = await store.list(keys.archive_key("", day_of(T0 + 3 * DAY_MS)))
        assert any(keys.is_wal_segment(keys.unarchived(k)) for k in today)
        baselines = [k for k in today if keys.unarchived(k).startswith(keys.snapshot_prefix("q"))]
        assert baselines  # where the history kept now starts
    finally:
        await shard.close(snapshot=False)


def test_days_are_utc_dates() -> None:
    moment = int(dt.datetime(2026, 11, 25, 23, 59, tzinfo=dt.UTC).timestamp() * 1000)
    assert day_of(moment) == "20261125"
    assert day_of(moment + 60_000) == "20261126"
    assert keys.unarchived(keys.archive_key("wal/0001/x.seg", "20261125")) == "wal/0001/x.seg"
    assert keys.archive_day("archive/shards/0001") is None
    assert keys.unarchived("wal/0001/x.seg") == "wal/0001/x.seg"


def _fields(settings: LogSettings) -> dict[str, object]:
    return {f: getattr(settings, f) for f in settings.__struct_fields__}
