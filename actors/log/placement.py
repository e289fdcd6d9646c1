"""The placement map: which shard holds each queue, one generation at a time.

A queue's shard was only ever ``placement(name, count)``, a hash over the shard count
``wal/LAYOUT`` fixes. Moving one queue (a resize, a rolling restart) needs a map that can say
"this queue is on shard 7" for one queue at a time (docs/DESIGN-NOTES.md, "Growing the shard
count"). A map holds the shard count and the queues that are not on their hash's shard: the
hash stays every other queue's answer, so a map of a store that never moved a queue is empty
and a million queues cost nothing until they move.

Each generation is an object of its own, ``wal/placement/<generation>.json``, created only if
absent (``put_if_absent``: a link on a local disk, ``If-None-Match`` on S3). Replacing the map
is creating the next generation: of two writers that read generation g, one creates g+1 and
the other is told it lost (:class:`PlacementConflict`), so two operators cannot both move a
queue, with the one conditional write every store already has. The current map is the
highest generation; older ones are pruned, keeping a few for the record. A store with none
is generation 0: the layout's count, every queue at its hash.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import msgspec

from actors.errors import Conflict, DataError, WrongShard
from actors.log import keys
from actors.log.store import KeyNotFound, ObjectStore

__all__ = [
    "KEPT_GENERATIONS",
    "MAX_HOPS",
    "MOVING_WAIT_S",
    "MovingWait",
    "Placement",
    "PlacementConflict",
    "generation_key",
    "moving_pause",
    "placement",
    "prune_placements",
    "read_placement",
    "refused_to",
    "write_placement",
]


def placement(name: str, count: int) -> int:
    """The shard of queue ``name`` among ``count`` shards by the hash (stable across
    processes): every queue's unless the map moved it."""
    return zlib.crc32(name.encode()) % count


PLACEMENT_FORMAT = 1
MAX_HOPS = 4  # a command follows this many refusals (WrongShard), then answers the last
# A command refused because its queue is being handed over (Moving: no effect) is sent
# again for this long by the gateway before the client sees the 503: a handover takes tens
# of milliseconds, so clients do not notice it.
MOVING_WAIT_S = 2.0


def moving_pause(attempt: int) -> float:
    """Seconds to wait before sending a command refused ``Moving`` again (its ``attempt``-th
    time): 5 ms, doubling up to 100 ms."""
    return min(0.005 * (1 << min(attempt, 5)), 0.1)


class MovingWait:
    """The waits of one command refused ``Moving`` (no effect) before it is sent again."""

    __slots__ = ("slept", "waits")

    def __init__(self) -> None:
        self.waits = 0
        self.slept = 0.0

    async def again(self) -> bool:
        """Wait a moment (:func:`moving_pause`) and say to resend; False once it has waited
        ``MOVING_WAIT_S`` (then the refusal goes to the client, a 503 it retries)."""
        if self.slept >= MOVING_WAIT_S:
            return False
        pause = moving_pause(self.waits)
        await asyncio.sleep(pause)
        self.slept += pause
        self.waits += 1
        return True


async def follow_refusal(learnt: bool, hops: int, wait: MovingWait) -> bool:
    """Whether to resend a command after a ``WrongShard``, the ``hops``-th in a row, once
    the caller ``learnt`` from it where the queue is: at once up to ``MAX_HOPS``, then each
    after a moment's wait (shards that disagree until the newest map reaches them all),
    until the moving wait's budget is spent."""
    return learnt and (hops < MAX_HOPS or await wait.again())


KEPT_GENERATIONS = 8  # older generations are pruned past this many
_WIDTH = 20


class Placement(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """One generation of the map (JSON): the shard count, and the queues placed elsewhere
    than their hash's shard."""

    format: int = PLACEMENT_FORMAT
    generation: int = 0
    count: int
    queues: dict[str, int] = {}

    def shard_of(self, name: str) -> int:
        """The shard that holds queue ``name``."""
        shard = self.queues.get(name)
        return placement(name, self.count) if shard is None else shard

    @property
    def span(self) -> int:
        """How many shards must run: the count, and past it any a resize still drains (a
        shrink pins the queues of the shards it removes where they are until each moves)."""
        return max(self.count, 1 + max(self.queues.values(), default=-1))

    def moved(self, moves: dict[str, int], count: int | None = None) -> Placement:
        """The next generation: ``moves`` (queue → shard) applied, at ``count`` shards (the
        same by default). A queue placed where its hash puts it leaves the table. A queue
        may be on a shard past ``count`` that runs: one a shrink drains, or the spare one
        past the span that a rolling restart hands each shard's queues to."""
        count = self.count if count is None else count
        table = {name: shard for name, shard in self.queues.items() if name not in moves}
        table.update(moves)
        for name, shard in moves.items():
            if not 0 <= shard <= max(count, self.span):
                raise DataError(f"queue {name!r} placed on shard {shard} of {count}")
        for name in [name for name, shard in table.items() if shard == placement(name, count)]:
            del table[name]
        return Placement(generation=self.generation + 1, count=count, queues=table)

    def resized(self, count: int, where: dict[str, int]) -> Placement:
        """The next generation at ``count`` shards, with every queue of ``where`` (queue →
        the shard that holds it now) pinned there: the first step of a resize, which
        changes where new queues go and moves no queue yet."""
        if count < 1:
            raise DataError(f"a shard count of {count}")
        pins = {name: shard for name, shard in where.items() if shard != placement(name, count)}
        if any(shard < 0 for shard in pins.values()):
            raise DataError("a queue placed on a negative shard")
        return Placement(generation=self.generation + 1, count=count, queues=pins)

    def view(self) -> dict[str, object]:
        """What ``GET /v1/admin/shards`` shows of it."""
        return {"generation": self.generation, "count": self.count, "moved": dict(self.queues)}


class PlacementConflict(Conflict):
    """Another writer created that generation of the map first: read it again."""

    code = "PlacementConflict"


PLACEMENT_PREFIX = f"{keys.WAL_ROOT}placement/"
_decoder = msgspec.json.Decoder(Placement)


def generation_key(generation: int) -> str:
    """The object of generation ``generation``."""
    return f"{PLACEMENT_PREFIX}{generation:0{_WIDTH}d}.json"


def _generation_of(key: str) -> int | None:
    stem = key.removeprefix(PLACEMENT_PREFIX).removesuffix(".json")
    if len(stem) != _WIDTH or not stem.isdigit() or not key.endswith(".json"):
        return None
    return int(stem)


async def read_placement(store: ObjectStore, count: int) -> Placement:
    """The store's current map; generation 0 at ``count`` shards (the layout's) if none was
    written.

    Raises:
        DataError: the newest generation does not decode, or is of an unknown format, or is
            not the generation its name says.
        StoreError: the store failed.
    """
    generations = sorted(
        g for g in map(_generation_of, await store.list(PLACEMENT_PREFIX)) if g is not None
    )
    for generation in reversed(generations):
        key = generation_key(generation)
        try:
            data = await store.get(key)
        except KeyNotFound:  # pruned since the listing: a newer one exists
            continue
        try:
            found = _decoder.decode(data)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"{key} does not decode: {exc}") from exc
        if found.format != PLACEMENT_FORMAT:
            raise DataError(f"{key}: format {found.format} is not readable by this version")
        if found.generation != generation or found.count < 1:
            raise DataError(f"{key}: generation {found.generation} of {found.count} shard(s)")
        return found
    return Placement(count=count)


async def write_placement(store: ObjectStore, after: Placement, new: Placement) -> None:
    """Make ``new`` the current map, if ``after`` still is (``new`` is its next generation).

    Raises:
        PlacementConflict: another writer made that generation first.
        StoreError: the store failed.
    """
    if new.generation != after.generation + 1:
        raise DataError(f"generation {new.generation} does not follow {after.generation}")
    data = msgspec.json.encode(new) + b"\n"
    if not await store.put_if_absent(generation_key(new.generation), data):
        raise PlacementConflict(
            f"generation {new.generation} of the placement map was written by another "
            "process: read the map again",
            generation=new.generation,
        )


async def prune_placements(store: ObjectStore, current: int) -> int:
    """Remove the generations older than the ``KEPT_GENERATIONS`` latest up to ``current``;
    how many were removed."""
    old = [
        g
        for g in map(_generation_of, await store.list(PLACEMENT_PREFIX))
        if g is not None and g <= current - KEPT_GENERATIONS
    ]
    for generation in old:
        await store.delete(generation_key(generation))
    return len(old)


def refused_to(results: list[Any]) -> int | None:
    """The shard named by ``results`` when every one is a refusal (WrongShard) for their
    queue (a shard refuses all of a queue's commands alike, before any effect): resend them
    there. None: something was answered."""
    if not results or not all(isinstance(r, WrongShard) for r in results):
        return None
    shard = results[0].fields.get("shard")
    return shard if isinstance(shard, int) and shard >= 0 else None
