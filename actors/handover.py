"""Moving one queue to another shard while the server runs (docs/DESIGN-NOTES.md, "Handover
of one queue"; issue 34).

1. **Fence on the source.** The queue's shard writes its last record there
   (``QueueHandedOver``: from then on it decides nothing, also after a restart, which
   replays the record) and a snapshot of it that holds its bodies. Its commands are answered
   ``Moving`` (503, retried by every client), its waiting takes answer empty.
2. **Publish.** The next generation of the placement map names the target; it is created
   only if absent, so a second coordinator loses (``PlacementConflict``) and the handover is
   called off on the source (``QueueTakenOver`` there: it serves again).
3. **Take over on the target.** The target loads the queue from that snapshot (messages,
   leases, idempotency keys, FIFO groups, spilled messages with their bodies) and writes
   ``QueueTakenOver``; the source lets go of it. Gateways learn the way from the source's
   ``WrongShard``.

Each step can be run again, so a coordinator that dies is resumed by running the move
again: before 2 the source still holds the queue fenced (the rerun hands it over again,
the same snapshot); after 2 the map names the target (the rerun, or the target's own
restart, takes it over). Only one queue is unavailable, from 1 to 3.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from actors.errors import QueueError
from actors.log.placement import Placement, PlacementConflict, read_placement, write_placement
from actors.log.store import ObjectStore

__all__ = ["ShardCalls", "move_queue", "move_queues"]

log = logging.getLogger(__name__)


class ShardCalls(Protocol):
    """What a coordinator asks of the shards (in process, or over Ray)."""

    async def hand_over(self, shard: int, name: str, to: int, generation: int) -> str:
        """Step 1 on ``shard``: the snapshot's key."""
        ...

    async def take_back(self, shard: int, name: str, generation: int | None = None) -> None:
        """Call a handover off on ``shard`` (only the one for map ``generation``, if given)."""
        ...

    async def placed(self, placement: Placement) -> dict[str, int]:
        """Every shard serves by ``placement`` from now on: the strays, queue → the shard
        that holds it (:meth:`QueueShard.placed`)."""
        ...

    async def fetch(self, shard: int, name: str, key: str) -> None:
        """Step 3's reads on ``shard`` ahead (the snapshot ``key``), while step 2 runs."""
        ...

    async def take_over(self, shard: int, name: str, key: str | None = None) -> bool:
        """Step 3 on ``shard`` (from the snapshot ``key`` if known)."""
        ...


async def move_queue(
    store: ObjectStore, shards: ShardCalls, count: int, name: str, target: int
) -> tuple[Placement, float]:
    """Move queue ``name`` to shard ``target``: the map it ends at, and how long the queue
    answered nothing (seconds).

    Raises:
        PlacementConflict: another coordinator changed the map meanwhile (called off here:
            run it again).
        QueueError: a shard failed (run it again).
    """
    current = await read_placement(store, count)
    source = current.shard_of(name)
    started = time.perf_counter()
    if source == target:  # published already: a rerun, or nothing to do
        await shards.placed(current)
        await shards.take_over(target, name)
        return current, time.perf_counter() - started
    new = current.moved({name: target})
    key = await shards.hand_over(source, name, target, new.generation)
    fetching = _read_ahead(shards, {name: (target, key)})
    try:
        await write_placement(store, current, new)
    except PlacementConflict:
        await shards.take_back(source, name, new.generation)
        raise
    finally:
        await fetching
    await shards.placed(new)
    await shards.take_over(target, name, key)
    paused = time.perf_counter() - started
    log.info(
        "queue %s moved from shard %d to %d (generation %d, %s): %.1f ms without an owner",
        name,
        source,
        target,
        new.generation,
        key,
        paused * 1000,
    )
    return new, paused


def _read_ahead(
    shards: ShardCalls, snapshots: dict[str, tuple[int, str]]
) -> asyncio.Future[list[None]]:
    """The targets read the handovers' snapshots (queue → (target, key)) while the map is
    written: the take-over then only writes its record. Runs in the background; a failed
    read is only logged (the take-over reads again)."""

    async def fetch(name: str, to: int, key: str) -> None:
        try:
            await shards.fetch(to, name, key)
        except Exception as exc:  # ahead of time only
            log.info("queue %s: shard %d did not read %s ahead: %r", name, to, key, exc)

    return asyncio.ensure_future(
        asyncio.gather(*(fetch(n, to, key) for n, (to, key) in snapshots.items()))
    )


async def move_queues(
    store: ObjectStore, shards: ShardCalls, count: int, moves: dict[str, int]
) -> tuple[Placement, dict[str, float]]:
    """Move several queues at once (queue → target shard), with one generation of the map:
    each is fenced on its source (together: their records share the sources' group
    commits), the map is written once, and each is taken over on its target. Returns the
    map it ends at and how long each queue answered nothing (seconds); a queue already on
    its target is not moved.

    Raises:
        PlacementConflict: another coordinator changed the map meanwhile (every handover is
            called off: run it again).
        QueueError: a shard failed (the handovers that were made are called off).
    """
    current = await read_placement(store, count)
    todo = {name: to for name, to in moves.items() if current.shard_of(name) != to}
    if not todo:
        return current, {}
    new = current.moved(todo)
    started = time.perf_counter()
    sources = {name: current.shard_of(name) for name in todo}
    handed = await asyncio.gather(
        *(shards.hand_over(sources[n], n, to, new.generation) for n, to in todo.items()),
        return_exceptions=True,
    )
    failed = next((r for r in handed if isinstance(r, BaseException)), None)
    snapshots = {
        n: (to, key)
        for (n, to), key in zip(todo.items(), handed, strict=True)
        if isinstance(key, str)
    }
    fetching = _read_ahead(shards, snapshots)
    try:
        if failed is not None:
            raise failed
        await write_placement(store, current, new)
    except BaseException:
        # every one, also those whose handover failed after its fence (a snapshot's
        # write): a take-back of a queue that was not fenced does nothing
        for name in todo:
            with contextlib.suppress(QueueError):
                await shards.take_back(sources[name], name, new.generation)
        raise
    finally:
        await fetching
    await shards.placed(new)
    ended: dict[str, float] = {}

    async def take_over(name: str, to: int) -> None:
        await shards.take_over(to, name, snapshots[name][1])
        ended[name] = time.perf_counter() - started

    await asyncio.gather(*(take_over(n, to) for n, to in todo.items()))
    for name, to in todo.items():
        log.info(
            "queue %s moved from shard %d to %d (generation %d, with %d other(s)): "
            "%.1f ms without an owner",
            name,
            sources[name],
            to,
            new.generation,
            len(todo) - 1,
            ended[name] * 1000,
        )
    return new, ended
