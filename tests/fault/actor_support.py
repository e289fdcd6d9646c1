"""Helpers for the fault, fencing and crash tests: open a queue actor, look at its log,
compare its in-memory state with what recovery rebuilds from the store.

Everything here goes through real stores and the actor's public surface, except
:func:`settle`, which waits for the actor's background tasks (snapshots) so a test can look
at the store without racing them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import msgspec

from actors.clock import Clock
from actors.core import commands as cmd
from actors.core import events as ev
from actors.core.ids import IdSource, SequentialIds
from actors.core.snapshot import snapshot
from actors.core.state import QueueState
from actors.log import keys
from actors.log.codec import SegmentRead, decode_segment
from actors.log.faults import FaultyStore
from actors.log.replay import replay
from actors.log.store import ObjectStore
from actors.queue_actor import QueueActor
from actors.settings import LogSettings, QueueSettings

NAME = "q"
CLIENT_IDS = QueueSettings(id_mode="client")

_T = TypeVar("_T")


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
    """A running queue actor; ``settings=None`` opens an existing queue without creating."""
    actor = QueueActor(
        name, store, clock=clock, ids=ids or SequentialIds(), log_settings=log_settings
    )
    await actor.open(cmd.Create(name, settings) if settings is not None else None)
    return actor


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


async def write_started(store: FaultyStore, before: int) -> None:
    """Wait until a segment write (``put_if_absent``) beyond the first ``before`` has begun."""
    await wait_until(
        lambda: store.calls["put_if_absent"] > before, f"put_if_absent #{before + 1} started"
    )


async def settle(actor: QueueActor, within: float = 10.0) -> None:
    """Wait until the actor's writer is idle and its background tasks (snapshots, reloads)
    have finished."""
    await wait_until(
        lambda: (
            actor.writer is not None and actor.writer.idle and not actor._background
        ),  # the only private attribute the tests read
        "the actor settled",
        within,
    )


def state_view(state: QueueState, now_ms: int) -> Any:
    """The logical content of ``state`` at ``now_ms`` as plain data (for readable diffs).

    Advancing is a projection (state.py): the state at a time is fixed by the events and
    the time, so two states of the same log advanced to the same time must be equal."""
    state.advance(now_ms)
    return msgspec.to_builtins(snapshot(state))


async def durable_view(store: ObjectStore, now_ms: int, name: str = NAME) -> Any:
    """What a recovery from ``store`` rebuilds (read-only: claims no epoch)."""
    replayed = await replay(store, name)
    return state_view(replayed.state, now_ms)


async def assert_state_is_durable(actor: QueueActor, store: ObjectStore, now_ms: int) -> None:
    """The actor's in-memory state is exactly what recovery rebuilds from the store."""
    await actor.execute(cmd.Stats())  # waits until everything decided so far is durable
    await settle(actor)
    assert state_view(actor.state, now_ms) == await durable_view(store, now_ms, actor.name)


async def read_log(store: ObjectStore, name: str = NAME) -> list[tuple[str, SegmentRead]]:
    """Every segment of the queue, decoded, in order."""
    return [(key, decode_segment(await store.get(key))) for key in await segment_keys(store, name)]


async def segment_keys(store: ObjectStore, name: str = NAME) -> list[str]:
    """The queue's segment keys, in order."""
    return sorted(await store.list(keys.log_prefix(name)), key=keys.seq_of)


def put_ids(segments: list[tuple[str, SegmentRead]]) -> list[str]:
    """Every message id put in these segments, once per put (duplicates show twice)."""
    return [
        str(item.id)
        for _, read in segments
        for event in read.events
        if isinstance(event, ev.MessagesPut)
        for item in event.items
    ]


def segment_with(segments: list[tuple[str, SegmentRead]], match: Callable[[ev.Event], bool]) -> str:
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
