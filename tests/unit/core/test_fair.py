"""Fair queues (issue 36, actors/core/fair.py) in the pure engine: a standard queue with
``fair`` set hands out its groups' messages turn by turn, so one group's backlog does not
hold back the others; the turns survive replay and snapshots, and ``fair`` can be set and
cleared while messages wait. (The model test walks fair queues against the reference too.)"""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from actors.core import browse
from actors.core import commands as c
from actors.core import events as ev
from actors.core import fair as fair_module
from actors.core.decide import execute
from actors.core.snapshot import decode_snapshot, encode_snapshot, restore, snapshot
from actors.core.state import QueueState
from actors.errors import BadRequest
from actors.ids import SequentialIds
from actors.settings import QueueSettings
from tests.unit.core.test_decide import T1, T2, Q, nm

FAIR = QueueSettings(fair=True)


def grouped(group: str | None, *bodies: bytes) -> list[c.NewMessage]:
    return [nm(b, group=group) for b in bodies]


def test_a_noisy_groups_backlog_does_not_hold_back_the_others() -> None:
    q = Q(FAIR)
    q.put(T1, *grouped("noisy", *(b"n%d" % i for i in range(100))))
    q.put(T2, *grouped("a", b"a1"), *grouped("b", b"b1"))
    # the oldest first (no group has had a turn); then a and b before noisy's second
    assert [d.body for d in q.take(T2, max=4)] == [b"n0", b"a1", b"b1", b"n1"]
    q.put(T2, *grouped("a", b"a2"))  # a comes back: before noisy, served twice since
    assert [d.body for d in q.take(T2, max=2)] == [b"a2", b"n2"]


def test_the_same_queue_without_fair_hands_out_the_oldest_first() -> None:
    q = Q()
    q.put(T1, *grouped("noisy", *(b"n%d" % i for i in range(100))))
    q.put(T2, *grouped("a", b"a1"))
    assert b"a1" not in [d.body for d in q.take(T2, max=100)]


def test_groups_with_a_backlog_take_turns_one_message_each() -> None:
    q = Q(FAIR)
    q.put(T1, *grouped("x", b"x1", b"x2", b"x3"))
    q.put(T1 + 1, *grouped("y", b"y1", b"y2", b"y3"), *grouped("z", b"z1"))
    bodies = [q.take(T2)[0].body for _ in range(7)]
    assert bodies == [b"x1", b"y1", b"z1", b"x2", b"y2", b"x3", b"y3"]
    assert q.take(T2) == []


def test_a_message_without_a_group_is_a_tenant_of_its_own() -> None:
    q = Q(FAIR)
    q.put(T1, *grouped("x", b"x1", b"x2", b"x3"))
    q.take(T1)  # x served: its next ones wait behind anyone who was not
    q.put(T2, b"p1", b"p2")
    assert [d.body for d in q.take(T2, max=4)] == [b"p1", b"p2", b"x2", b"x3"]


def test_a_released_message_goes_back_into_its_groups_turn() -> None:
    q = Q(FAIR)
    q.put(T1, *grouped("x", b"x1", b"x2"), *grouped("y", b"y1", b"y2"))
    [x1] = q.take(T2)
    assert q.release(T2, x1.id, x1.lease) == ["ok"]  # x still has x2: keeps its turn
    # x1 is ready since its release (T2), after x2 (T1): x's next is x2
    assert [d.body for d in q.take(T2, max=4)] == [b"y1", b"x2", b"y2", b"x1"]


def test_turns_and_order_survive_replay_and_a_snapshot() -> None:
    q = Q(FAIR)
    q.put(T1, *grouped("x", b"x1", b"x2", b"x3"), *grouped("y", b"y1", b"y2"))
    q.take(T2, max=3)  # x1, y1, x2: replay equivalence is checked by every q.run
    restored = restore(decode_snapshot(encode_snapshot(snapshot(q.state))))
    assert restored.fair is not None
    assert restored.fair.turn == 3
    put = c.Put(grouped("z", b"z1"))
    q.run(put, T2)
    execute(restored, put, T2, q.ids.__class__())
    want = [d.body for d in q.take(T2, max=5)]
    assert want == [b"z1", b"y2", b"x3"]
    assert [d.body for d in execute(restored, c.Take(5), T2, SequentialIds())[1]] == want


def test_fair_can_be_set_and_cleared_while_messages_wait() -> None:
    q = Q()
    q.put(T1, *grouped("x", b"x1", b"x2", b"x3"))
    q.put(T1 + 1, *grouped("y", b"y1"), b"p1")
    q.run(c.PatchSettings({"fair": True}), T2)
    assert q.state.fair is not None
    assert [d.body for d in q.take(T2, max=3)] == [b"x1", b"y1", b"p1"]
    q.run(c.PatchSettings({"fair": False}), T2)
    assert q.state.fair is None
    assert [d.body for d in q.take(T2, max=3)] == [b"x2", b"x3"]


def test_fair_is_for_standard_queues_and_a_boolean() -> None:
    with pytest.raises(BadRequest, match="standard queues"):
        QueueSettings(fifo=True, fair=True).validate("q.fifo")
    with pytest.raises(BadRequest, match="true or false"):
        QueueSettings(fair=1).validate("q")  # type: ignore[arg-type]
    q = Q(QueueSettings(fifo=True))
    q.fails(c.PatchSettings({"fair": True}), T2, BadRequest)


def test_stats_browse_and_peek_see_a_fair_queues_grouped_messages() -> None:
    q = Q(FAIR)
    q.put(T1, *grouped("x", b"x1"), b"p1", *grouped("y", b"y1"))
    q.put(T2, *grouped("x", b"x2"))
    view = q.stats(T2)
    assert (view.ready, view.oldest_ready_age_ms) == (4, T2 - T1)
    found, _ = browse.page(q.state, "ready", 10, None)
    assert [m.body for m in found] == [b"x1", b"p1", b"y1", b"x2"]
    [d] = q.run(c.PeekReady(1), T2)[1]
    assert d.body == b"x1"
    assert q.stats(T2).ready == 4  # a peek takes nothing


def test_a_purge_and_deletes_leave_no_group_behind() -> None:
    q = Q(FAIR)
    ids = q.put(T1, *grouped("x", b"x1", b"x2"), *grouped("y", b"y1"))
    q.run(c.Delete(ids[2], None), T2)
    assert q.take(T2, max=5)
    assert q.state.fair is not None
    assert q.state.fair.groups == {}  # x emptied by the take, y by the delete: forgotten
    q.put(T2, *grouped("x", b"x3"))
    q.run(c.Purge(), T2)
    assert q.state.fair.groups == {}
    assert q.take(T2) == []


def test_stale_entries_are_swept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fair_module, "_SLACK", 8)
    q = Q(FAIR)
    state: QueueState = q.state
    assert state.fair is not None
    ids = [mid for k in range(3) for mid in q.put(T1, *grouped("x", *[b"m"] * 1000))]
    for mid in [
        mid for k, mid in enumerate(ids) if k % 3
    ]:  # applied as events: replaying 1,500 times over would be slow
        event = ev.MessagesDeleted(T2, [int(mid)])
        state.apply(event)
        q.log.append(event)
    # swept as the deletes left more than twice (+ 8) as many entries as ready messages
    assert state.fair.entries < 3000
    assert len(state.fair.groups["x"].heap) < 3000
    assert state.fair.entries == len(state.fair.groups["x"].heap)
    assert [d.body for d in q.take(T2, max=1000)] == [b"m"] * 1000


@settings(max_examples=60, deadline=None)
@given(
    backlog=st.lists(st.integers(1, 12), min_size=2, max_size=6),
    batches=st.lists(st.integers(1, 7), min_size=1, max_size=40),
)
def test_backlogged_groups_are_never_more_than_one_turn_apart(
    backlog: list[int], batches: list[int]
) -> None:
    """Whatever the takes' sizes, while every group still has messages no group has been
    served twice more than another; each group's own messages go out oldest first."""
    q = Q(FAIR)
    for g, n in enumerate(backlog):
        q.put(T1 + g, *grouped(f"g{g}", *(b"g%d.%d" % (g, i) for i in range(n))))
    served: Counter[str] = Counter()
    order: dict[str, list[int]] = {}
    for size in batches:
        for d in q.take(T2, max=size):
            g, i = d.body.decode().split(".")
            served[g] += 1
            order.setdefault(g, []).append(int(i))
            left = [f"g{k}" for k, n in enumerate(backlog) if served[f"g{k}"] < n]
            counts = [served[name] for name in left]
            if counts:
                assert max(counts) - min(counts) <= 1, (served, left)
                assert all(served[name] <= min(counts) + 1 for name in served)
    assert all(got == sorted(got) for got in order.values())
