"""A queue handed to another shard, in the engine: ``HandOver`` fences the state (every
client command refused, ``Moving``), a snapshot and a replay keep the fence, and
``TakeOver`` lifts it with nothing else changed."""

from __future__ import annotations

import pytest

from actors.core import commands as c
from actors.core.decide import execute
from actors.core.snapshot import decode_snapshot, encode_snapshot, logical, restore, snapshot
from actors.core.state import QueueState
from actors.errors import BadRequest, Moving
from actors.ids import SequentialIds
from actors.settings import QueueSettings

T0 = 1_700_000_000_000


def _queue() -> tuple[QueueState, list[object], SequentialIds]:
    state, ids, events = QueueState(), SequentialIds(), []
    for command in (
        c.Create("q", QueueSettings()),
        c.Put([c.NewMessage(body=b"a"), c.NewMessage(body=b"b", delay_ms=60_000)]),
        c.Take(1),
    ):
        got, _ = execute(state, command, T0, ids)
        events += got
    return state, events, ids


def test_a_handed_over_state_decides_nothing_but_its_taking_over() -> None:
    state, events, ids = _queue()
    before = logical(state)
    got, reply = execute(state, c.HandOver(source=0, to=2, generation=5), T0 + 1, ids)
    events += got
    assert reply is None
    assert state.moving == (0, 2, 5)
    for command in (c.Take(1), c.Put([c.NewMessage(body=b"x")]), c.Purge(), c.Peek("1")):
        with pytest.raises(Moving) as refused:
            execute(state, command, T0 + 2, ids)
        assert refused.value.fields == {"queue": "q", "shard": 2, "generation": 5}
    assert execute(state, c.Stats(), T0 + 2, ids)[1].total == 2  # read-only: still answered
    copy = restore(decode_snapshot(encode_snapshot(snapshot(state))))
    assert copy.moving == (0, 2, 5)
    replayed = QueueState()
    for event in events:
        replayed.apply(event)
    replayed.advance(state.clock_ms)  # the refused commands moved the live clock only
    assert logical(replayed) == logical(state)
    got, _ = execute(copy, c.TakeOver(source=0, generation=5), T0 + 3, ids)
    assert copy.moving is None
    assert got  # one record: QueueTakenOver
    assert execute(copy, c.TakeOver(source=0, generation=5), T0 + 3, ids) == ([], None)
    after = logical(copy)
    assert (after.messages, after.next_seq, after.idem) == (
        before.messages,
        before.next_seq,
        before.idem,
    )
    taken = execute(copy, c.Take(5), T0 + 4, ids)[1]
    assert taken == []  # the ready one is reserved (its lease carried over), the other delayed


def test_a_handover_must_name_another_shard_and_a_generation() -> None:
    state, _, ids = _queue()
    for bad in (c.HandOver(0, 0, 1), c.HandOver(0, 1, 0), c.HandOver(-1, 1, 1)):
        with pytest.raises(BadRequest):
            execute(state, bad, T0, ids)
    assert state.moving is None
