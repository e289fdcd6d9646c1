"""Changing the shard count of a running server, queue by queue (issue 34;
docs/DESIGN-NOTES.md, "Growing the shard count").

1. **Start the shards first.** Growing, the new shards are started and recovered (empty)
   before anything names them.
2. **Pin.** The next generation of the placement map has the new count, and every queue
   that the new hash would put elsewhere is pinned where it is: no queue moves, but new
   queues go where the new count puts them. Each shard is given the map; a queue created
   under the older map meanwhile (a stray: the shard holds it, the new map names another)
   is pinned by one more generation. A handover whose coordinator died before it wrote
   the map is called off.
3. **Move.** Each pinned queue is handed to its hash's shard, a few at a time
   (:func:`actors.handover.move_queues`: one map generation per batch); each move unpins
   it.
4. **Stop the drained shards.** Shrinking, the shards past the new count hold nothing any
   more: they are stopped.

Every step can be run again: a resize that died (or was cancelled) is resumed by asking for
the same count, and asking for another count starts from wherever the last one stopped,
because the map at any generation says where every queue is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from actors.errors import BadRequest, Conflict, QueueError
from actors.handover import ShardCalls, move_queue, move_queues
from actors.log.layout import read_layout, settled_count
from actors.log.placement import Placement, placement, read_placement, write_placement
from actors.log.store import ObjectStore

__all__ = ["Cancelled", "ResizeCalls", "resize", "restart_shards"]

log = logging.getLogger(__name__)

MAX_STRAY_ROUNDS = 8  # generations written for queues created meanwhile, before giving up
# Queues moved together (one map generation, their records in shared group commits): a
# move's fixed costs (the map's write, telling every shard) are paid once per batch, and
# each queue is still without an owner for only one batch's handover.
MOVE_BATCH = 8


class Cancelled(Conflict):
    """The resize was cancelled between two moves (the map is whole: run it again to go on)."""

    code = "Cancelled"


class ResizeCalls(ShardCalls, Protocol):
    """What a resize asks of the shards besides a handover's calls."""

    async def run(self, span: int) -> None:
        """Shards 0 … ``span``-1 run and have recovered (starting the missing ones)."""
        ...

    async def held(self, shard: int) -> list[tuple[str, bool]]:
        """Shard ``shard``'s queues (:meth:`QueueShard.held`)."""
        ...

    async def arrivals(self, shard: int) -> list[str]:
        """The queues shard ``shard`` has still to take over (:meth:`QueueShard.arrivals`)."""
        ...

    async def stop(self, count: int) -> None:
        """Stop the shards from ``count`` on (they hold nothing)."""
        ...

    async def restart(self, shard: int) -> None:
        """Stop shard ``shard`` (it holds nothing) and start a fresh incarnation of it, in a
        new process where shards have their own (the code installed now)."""
        ...


Progress = Callable[[int, int], None]


async def resize(
    store: ObjectStore,
    shards: ResizeCalls,
    count: int,
    *,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> Placement:
    """Make ``count`` the shard count of the running server over ``store``: the map it ends
    at. ``progress(done, total)`` follows the moves.

    Raises:
        Cancelled: ``cancelled()`` said so between two moves.
        PlacementConflict: another coordinator changed the map meanwhile (run it again).
        QueueError: a shard or the store failed (run it again).
    """
    if count < 1:
        raise BadRequest(f"a shard count of {count}: at least 1")
    current = await _current(store, count)
    span = max(current.span, count)
    await shards.run(span)  # growing: the new shards first, empty and ready
    if current.count != count:
        where: dict[str, int] = {}
        fenced: list[tuple[int, str]] = []
        for index in range(current.span):
            for name, moving in await shards.held(index):
                where[name] = index
                if moving:
                    fenced.append((index, name))
        new = current.resized(count, where)
        await write_placement(store, current, new)
        log.info(
            "resize to %d shard(s): map generation %d, %d queue(s) to move",
            count,
            new.generation,
            len(new.queues),
        )
        current = new
        await settled_count(store, count)  # the layout follows: a restart runs ``count``
        for index, name in fenced:  # a handover whose map was never written: called off
            await shards.take_back(index, name)
    current = await _pin_strays(store, shards, current)
    await _take_over_arrivals(shards, span)
    todo = sorted(current.queues)
    if progress is not None:
        progress(0, len(todo))
    for done in range(0, len(todo), MOVE_BATCH):
        if cancelled():
            raise Cancelled(
                f"the resize to {count} shard(s) was cancelled with {len(todo) - done} "
                "queue(s) left to move; ask for a count again to go on"
            )
        batch = {name: placement(name, count) for name in todo[done : done + MOVE_BATCH]}
        current, _ = await move_queues(store, shards, count, batch)
        if progress is not None:
            progress(done + len(batch), len(todo))
    if current.span < span:
        await shards.placed(current)
        await shards.stop(current.span)
    log.info("resize to %d shard(s): done (map generation %d)", count, current.generation)
    return current


async def _take_over_arrivals(shards: ResizeCalls, span: int) -> None:
    """Finish the handovers an earlier run left after writing their map (its coordinator
    died, or a target failed): each target takes its queues over now."""
    for index in range(span):
        for name in await shards.arrivals(index):
            await shards.take_over(index, name)
            log.info(
                "resize: queue %s taken over by shard %d (left by an earlier run)", name, index
            )


async def _current(store: ObjectStore, default: int = 1) -> Placement:
    """The store's map (of the layout's count when none was written)."""
    layout = await read_layout(store)
    return await read_placement(store, layout.shards if layout is not None else default)


async def _pin_strays(store: ObjectStore, shards: ResizeCalls, current: Placement) -> Placement:
    """Give every shard ``current``; pin the queues created under an older map on a shard it
    does not name where they are, by as many generations as it takes."""
    for _ in range(MAX_STRAY_ROUNDS):
        strays = await shards.placed(current)
        if not strays:
            return current
        new = current.resized(current.count, {**current.queues, **strays})
        await write_placement(store, current, new)
        log.info("resize: %d queue(s) created meanwhile pinned where they are", len(strays))
        current = new
    raise QueueError(f"queues kept being created under older maps: {sorted(strays)[:5]}")


async def restart_shards(
    store: ObjectStore,
    shards: ResizeCalls,
    *,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> Placement:
    """Restart every shard of the running server over ``store``, one at a time, with no
    pause for its queues: a spare shard (one past the map's span) takes each shard's queues
    by handover, the shard is stopped and started afresh, and its queues are handed back.
    ``progress(done, total)`` counts the shards restarted. Returns the map it ends at (the
    queues where they were).

    Raises:
        Cancelled: ``cancelled()`` said so between two shards (the spare is stopped).
        PlacementConflict, QueueError: as :func:`resize` (run it again).
    """
    current = await _current(store)
    span = current.span
    spare = span
    await shards.run(span + 1)
    await _take_over_arrivals(shards, span + 1)
    if progress is not None:
        progress(0, span)
    try:
        for index in range(span):
            if cancelled():
                raise Cancelled(
                    f"the rolling restart was cancelled with {span - index} shard(s) left"
                )
            current = await _restart_one(store, shards, index, spare)
            if progress is not None:
                progress(index + 1, span)
    finally:
        await _drain(store, shards, spare)
        await shards.stop(spare)
    log.info("rolling restart of %d shard(s): done (map generation %d)", span, current.generation)
    return current


async def _restart_one(
    store: ObjectStore, shards: ResizeCalls, index: int, spare: int
) -> Placement:
    """Shard ``index``'s queues to the spare, a fresh incarnation of it, its queues back."""
    held = [name for name, _ in await shards.held(index)]
    current = await _current(store)
    for name in held:
        current, _ = await move_queue(store, shards, current.count, name, spare)
    await shards.restart(index)
    for name in held:
        current, _ = await move_queue(store, shards, current.count, name, index)
    log.info("rolling restart: shard %d restarted (%d queue(s) handed back)", index, len(held))
    return current


async def _drain(store: ObjectStore, shards: ResizeCalls, spare: int) -> None:
    """Hand what the spare holds (a restart cut short) back to the shards the hash names."""
    current = await _current(store)
    for name, _ in await shards.held(spare):
        current, _ = await move_queue(
            store, shards, current.count, name, placement(name, current.count)
        )
