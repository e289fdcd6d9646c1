"""Helpers for the fault, fencing and crash tests: open a queue on a shard of its own, look
at the shard's log, compare the queue's in-memory state with what recovery rebuilds from
the store.

Everything here goes through real stores and the public surface of the shard and the queue,
except :func:`settle`, which waits for background tasks (snapshots, reloads) so a test can
look at the store without racing them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from obstore.store import MemoryStore

from actors.clock import Clock
from actors.core import commands as cmd
from actors.core import events as ev
from actors.core.ids import IdSource, SequentialIds
from actors.core.snapshot import logical
from actors.core.state import QueueState
from actors.log.device import LogDevice, open_device
from actors.log.obstore_store import ObstoreStore
from actors.log.shard_recovery import SHARD_STREAM, read_shard
from actors.log.store import LocalDirStore, ObjectStore
from actors.log.wal import decode_groups, decode_record, scan_segment
from actors.queue_actor import QueueActor
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard

NAME = "q"
CLIENT_IDS = QueueSettings(id_mode="client")

_T = TypeVar("_T")


def empty_store(kind: str, root: Path) -> ObjectStore:
    """A real, empty store: ``"local"`` a directory under ``root``, otherwise obstore's
    in-memory store."""
    if kind == "local":
        return LocalDirStore(root / "store")
    return ObstoreStore(MemoryStore(), "memory://")


def body_of(mid: str) -> bytes:
    """The body every test puts under client id ``mid``."""
    return f"body of {mid}".encode()


def put(*mids: str, key: bool = False) -> cmd.Put:
    """A put of client-id messages (with ``key``: each id is also its idempotency key)."""
    return cmd.Put(
        [cmd.NewMessage(body=body_of(m), id=m, idempotency_key=m if key else None) for m in mids]
    )


def spawn(coro: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
    """Run ``coro`` as a task (it starts at the next turn of the loop)."""
    return asyncio.ensure_future(coro)


async def open_actor(
    store: ObjectStore,
    clock: Clock,
    *,
    name: str = NAME,
    ids: IdSource | None = None,
    settings: QueueSettings | None = CLIENT_IDS,
    log_settings: LogSettings | None = None,
) -> QueueActor:
    """A running queue on a shard of its own (shard 0 of 1, ``actor.host``);
    ``settings=None`` opens an existing queue without creating it."""
    shard = QueueShard(
        0, 1, store, clock=clock, ids=ids or SequentialIds(), log_settings=log_settings
    )
    await shard.start()
    if settings is not None:
        await shard.create(name, settings, list(QueueSettings.__struct_fields__))
    return await shard.get(name)


async def close(actor: QueueActor, *, snapshot: bool = True) -> None:
    """Close the actor's whole shard (every queue, the log)."""
    await actor.host.close(snapshot=snapshot)  # type: ignore[attr-defined]


async def wait_until(predicate: Callable[[], bool], what: str, within: float = 10.0) -> None:
    """Poll ``predicate`` (every loop turn at first, then every 5 ms) until it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    turns = 0
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting until {what}")
        turns += 1
        await asyncio.sleep(0 if turns < 50 else 0.005)


async def write_started(store: Any, before: int) -> None:
    """Wait until a segment write (``put_if_absent``) beyond the first ``before`` has begun."""
    await wait_until(
        lambda: store.calls["put_if_absent"] > before, f"put_if_absent #{before + 1} started"
    )


async def settle(actor: QueueActor, within: float = 10.0) -> None:
    """Wait until the shard's log is idle and the background tasks of the queue and the
    shard (snapshots, reloads, pruning) have finished."""
    shard: Any = actor.host
    await wait_until(
        lambda: (
            shard.log_ready.is_set()
            and shard.wal.idle
            and not actor._background
            and not shard._background
        ),  # the only private attributes the tests read
        "the actor settled",
        within,
    )


def state_view(state: QueueState, now_ms: int) -> Any:
    """The logical content of ``state`` at ``now_ms`` as plain data (for readable diffs).

    Advancing is a projection (state.py): the state at a time is fixed by the events and
    the time, so two states of the same log advanced to the same time must be equal."""
    state.advance(now_ms)
    return msgspec.to_builtins(logical(state))


def device_of(store: ObjectStore) -> LogDevice:
    """A device to read shard 0's log in ``store`` (a local directory's files, or objects)."""
    return open_device(store, 0)


async def recovered(store: ObjectStore, name: str = NAME) -> QueueState:
    """The state a recovery from ``store`` rebuilds for ``name`` (read-only: no repair, no
    epoch claimed); an empty state if there is no such queue."""
    queues, _ = await read_shard(store, device_of(store), 0, 1)
    found = queues.get(name)
    return found.state if found is not None else QueueState()


async def durable_view(store: ObjectStore, now_ms: int, name: str = NAME) -> Any:
    """What a recovery from ``store`` rebuilds (read-only: claims no epoch)."""
    return state_view(await recovered(store, name), now_ms)


async def assert_state_is_durable(actor: QueueActor, store: ObjectStore, now_ms: int) -> None:
    """The actor's in-memory state is exactly what recovery rebuilds from the store."""
    await actor.execute(cmd.Stats())  # waits until everything decided so far is durable
    await settle(actor)
    assert state_view(actor.state, now_ms) == await durable_view(store, now_ms, actor.name)


class Segment(msgspec.Struct):
    """A segment of shard 0's log as these tests look at it: its epoch, first LSN and number
    of records, and the events of one queue and of the shard's own stream (its claims), in
    order. On an object store a segment is one block: one group commit."""

    epoch: int
    first_lsn: int
    count: int
    events: list[ev.Event]
    seqs: list[int]  # the queue sequence number of each event (0 for the shard's claims)


async def read_log(store: ObjectStore, name: str = NAME) -> list[tuple[str, Segment]]:
    """Every segment of shard 0's log, decoded, in order."""
    device = device_of(store)
    out = []
    for _, key in await device.segments():
        read = scan_segment(await device.read(key))
        events: list[ev.Event] = []
        seqs: list[int] = []
        for block in read.blocks:
            for queue, first, records in decode_groups(block):
                if queue in (name, SHARD_STREAM):
                    events.extend(decode_record(r) for r in records)
                    seqs.extend(range(first, first + len(records)) if queue else [0] * len(records))
        epoch = read.blocks[-1].epoch if read.blocks else read.header.epoch
        out.append((key, Segment(epoch, read.header.first_lsn, read.records, events, seqs)))
    return out


async def segment_keys(store: ObjectStore, name: str = NAME) -> list[str]:
    """The keys of shard 0's log segments, in order."""
    return [key for _, key in await device_of(store).segments()]


def put_ids(segments: list[tuple[str, Segment]]) -> list[str]:
    """Every message id put in these segments, once per put (duplicates show twice)."""
    return [
        str(item.id)
        for _, read in segments
        for event in read.events
        if isinstance(event, ev.MessagesPut)
        for item in event.items
    ]


def segment_with(segments: list[tuple[str, Segment]], match: Callable[[ev.Event], bool]) -> str:
    """The key of the one segment holding an event that ``match`` accepts."""
    found = [key for key, read in segments if any(match(e) for e in read.events)]
    assert len(found) == 1, f"expected one segment with such an event, found {found}"
    return found[0]


def puts_id(mid: str) -> Callable[[ev.Event], bool]:
    """Matches the put of message ``mid``."""
    return lambda e: isinstance(e, ev.MessagesPut) and any(str(i.id) == mid for i in e.items)


def deletes_id(mid: str) -> Callable[[ev.Event], bool]:
    """Matches the deletion of message ``mid``."""
    return lambda e: isinstance(e, ev.MessagesDeleted) and mid in [str(i) for i in e.ids]


async def settle_shard(shard: QueueShard) -> None:
    """Until the log is idle and no background work (snapshots, pruning, checkpoints) is
    left: waits on the tasks themselves, not on time."""
    while True:
        await shard.wal.drain()
        tasks = [
            *shard._background,
            *(t for q in shard.queues.values() for t in q._background),
        ]  # the only private attributes these tests read
        if not tasks and shard.wal.idle:
            return
        await asyncio.gather(*tasks)
