"""The placement map (actors/log/placement.py): generations replaced only by creating the
next one, on every store; the hash is every unmoved queue's shard."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from actors.errors import DataError, QueueNotFound, WrongShard
from actors.log.placement import (
    KEPT_GENERATIONS,
    Placement,
    PlacementConflict,
    generation_key,
    prune_placements,
    read_placement,
    refused_to,
    write_placement,
)
from actors.log.shard_recovery import placement
from actors.log.store import ObjectStore


def elsewhere(name: str, count: int) -> int:
    """A shard that is not ``name``'s by the hash."""
    return (placement(name, count) + 1) % count


async def test_a_store_without_a_map_is_generation_0_every_queue_at_its_hash(
    store: ObjectStore,
) -> None:
    found = await read_placement(store, 4)
    assert (found.generation, found.count, found.queues) == (0, 4, {})
    assert [found.shard_of(f"q{i}") for i in range(20)] == [
        placement(f"q{i}", 4) for i in range(20)
    ]


async def test_a_generation_written_is_the_map_read_and_moves_only_its_queues(
    store: ObjectStore,
) -> None:
    start = await read_placement(store, 4)
    moved = start.moved({"orders": elsewhere("orders", 4)})
    await write_placement(store, start, moved)
    found = await read_placement(store, 4)
    assert found == moved
    assert found.generation == 1
    assert found.shard_of("orders") == elsewhere("orders", 4) != placement("orders", 4)
    assert found.shard_of("billing") == placement("billing", 4)
    # moved back to its hash's shard, a queue leaves the table
    back = found.moved({"orders": placement("orders", 4)})
    await write_placement(store, found, back)
    assert (await read_placement(store, 4)).queues == {}


async def test_of_two_writers_from_one_generation_one_wins_and_the_other_is_told(
    store: ObjectStore,
) -> None:
    start = await read_placement(store, 2)
    mine = start.moved({"a": elsewhere("a", 2)})
    theirs = start.moved({"b": elsewhere("b", 2)})
    results = await asyncio.gather(
        write_placement(store, start, mine),
        write_placement(store, start, theirs),
        return_exceptions=True,
    )
    lost = [r for r in results if isinstance(r, PlacementConflict)]
    assert len(lost) == 1
    assert results.count(None) == 1
    assert lost[0].fields["generation"] == 1
    assert (await read_placement(store, 2)) in (mine, theirs)


async def test_a_map_must_follow_the_generation_it_replaces(store: ObjectStore) -> None:
    start = await read_placement(store, 2)
    with pytest.raises(DataError, match="does not follow"):
        await write_placement(store, start, Placement(generation=5, count=2))


def test_a_queue_cannot_be_placed_on_a_shard_that_does_not_exist() -> None:
    with pytest.raises(DataError, match="shard 5 of 4"):
        Placement(count=4).moved({"q": 5})
    with pytest.raises(DataError, match="shard -1 of 4"):
        Placement(count=4).moved({"q": -1})
    spare = Placement(count=4).moved({"q": 4})  # the spare past the span: a rolling restart's
    assert (spare.shard_of("q"), spare.span) == (4, 5)
    grown = Placement(count=1).moved({}, count=4)  # a new count: unmoved queues hash over it
    assert (grown.count, grown.generation) == (4, 1)
    assert grown.shard_of("q") == placement("q", 4)


async def test_old_generations_are_pruned_and_the_newest_is_read(store: ObjectStore) -> None:
    current = await read_placement(store, 3)
    for i in range(12):
        following = current.moved({f"q{i}": elsewhere(f"q{i}", 3)})
        await write_placement(store, current, following)
        current = following
    assert await prune_placements(store, current.generation) == 12 - KEPT_GENERATIONS
    left = await store.list("wal/placement/")
    assert left == [generation_key(g) for g in range(13 - KEPT_GENERATIONS, 13)]
    assert await read_placement(store, 3) == current
    assert len(current.queues) == 12


async def test_a_damaged_or_unknown_map_is_refused_not_guessed(store: ObjectStore) -> None:
    assert await store.put_if_absent(generation_key(1), b"{not json")
    with pytest.raises(DataError, match="does not decode"):
        await read_placement(store, 2)
    future = msgspec.json.encode(Placement(format=9, generation=2, count=2))
    assert await store.put_if_absent(generation_key(2), future)
    with pytest.raises(DataError, match="format 9"):
        await read_placement(store, 2)
    lying = msgspec.json.encode(Placement(generation=7, count=2))
    assert await store.put_if_absent(generation_key(3), lying)
    with pytest.raises(DataError, match="generation 7"):
        await read_placement(store, 2)


def test_refusals_name_where_to_resend_only_when_every_result_is_one() -> None:
    wrong = WrongShard("elsewhere", queue="q", shard=3, generation=2)
    assert refused_to([wrong, wrong]) == 3
    assert refused_to([wrong, QueueNotFound("no such queue")]) is None
    assert refused_to([]) is None
    assert refused_to([WrongShard("elsewhere", queue="q")]) is None
