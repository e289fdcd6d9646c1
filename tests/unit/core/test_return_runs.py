"""Return runs (runs.py, ``Run.lend``): messages a consumer gives back with a delay go
back into one object that reads their bodies through their put's run, instead of staying
one object each. The model test (test_model.py, the spilling machine, return runs of one
message up) checks that nothing a client sees changes; these check the representation."""

from __future__ import annotations

import tracemalloc

import msgspec
import pytest

from actors.core import commands as c
from actors.core import events as ev
from actors.core.decide import execute
from actors.core.runs import LoanRecord, moved_contents
from actors.core.snapshot import decode_snapshot, encode_snapshot, logical, restore, snapshot
from actors.core.state import QueueState
from actors.errors import DataError
from tests.unit.core.test_runs import Shell


class Lending(Shell):
    """A shell whose states give back spans of 4 or more as return runs."""

    def spilling(self, state: QueueState) -> QueueState:
        state = super().spilling(state)
        state.return_min = 4
        return state


def lending(**settings: object) -> Shell:
    return Lending(**settings)


def give_back(sh: Shell, taken: list, delay_ms: int) -> list[str]:
    items = [c.ReleaseItem(id=d.id, lease=d.lease, delay_ms=delay_ms) for d in taken]
    return [r.status for r in sh.run(c.Release(items))]


def replayed_after_move(sh: Shell) -> QueueState:
    """``sh``'s events replayed on a new state with the put's bodies at hand, its runs then
    placed on the copy of the (one) move's record, as a recovery does."""
    rebuilt = sh.spilling(QueueState())
    for e in sh.events:
        rebuilt.apply(e)
    moved = next(e for e in sh.events if type(e) is ev.BodiesMoved)
    sh.log[len(sh.log)] = moved_contents(moved, 0)
    for run in rebuilt.unplaced:
        rebuilt.place(run, len(sh.log) - 1)
    rebuilt.advance(sh.now)
    return rebuilt


def restored(sh: Shell) -> QueueState:
    state = restore(decode_snapshot(encode_snapshot(snapshot(sh.state))))
    return sh.spilling(state)


def test_a_batch_given_back_with_a_delay_is_one_return_run_and_no_message_objects() -> None:
    sh = lending()
    ids = sh.put(100)
    taken = sh.run(c.Take(max=100))
    assert give_back(sh, taken, 60_000) == ["ok"] * 100
    s = sh.state
    assert not s.messages  # the taken messages are gone as objects
    [(act, _, loan)] = s.later
    assert (loan.src, loan.off, loan.count, loan.rc, act) == (
        s.by_id[0],
        0,
        100,
        1,
        sh.now + 60_000,
    )
    assert (s.n_delayed, s.deferred, s.by_id[0].lent) == (100, 100, 100)
    view = sh.run(c.Peek(ids[7]))
    assert (view.state, view.body, view.receive_count) == ("delayed", b"m7", 1)
    assert not s.messages  # reading materializes nothing
    sh.now += 60_000
    again = sh.run(c.Take(max=100))
    assert [d.id for d in again] == ids
    assert [d.body for d in again] == [b"m%d" % i for i in range(100)]
    assert {d.receive_count for d in again} == {2}
    assert s.by_id[0].lent == 0


def test_the_first_take_time_and_the_receive_count_carry_over() -> None:
    sh = lending()
    ids = sh.put(8)
    first_at = sh.now
    give_back(sh, sh.run(c.Take(max=8)), 1_000)
    sh.now += 5_000
    give_back(sh, sh.run(c.Take(max=8)), 1_000)
    [(_, _, loan)] = [e for e in sh.state.later if e[2].left]
    assert (loan.rc, loan.first) == (2, first_at)
    sh.now += 1_000
    again = sh.run(c.Take(max=8))
    assert [d.receive_count for d in again] == [3] * 8
    assert {d.first_taken_ms for d in again} == {first_at}
    assert [d.id for d in again] == ids


def test_a_release_with_gaps_makes_a_return_run_of_each_stretch_long_enough() -> None:
    sh = lending()
    ids = sh.put(20)
    taken = sh.run(c.Take(max=20))
    sh.run(c.Ack([c.LeaseRef(taken[9].id, taken[9].lease)]))
    # 0-8 (9), 10-12 (3: too few), 14-19 (6); 13 released without a delay
    give_back(sh, taken[:9] + taken[10:13] + taken[14:], 30_000)
    give_back(sh, [taken[13]], 0)
    spans = sorted((e[2].off, e[2].count) for e in sh.state.later if e[2].slots is None)
    assert spans == [(0, 9), (14, 6)]
    # the three too few for a return run of their own: in the put's scattered one
    [scattered] = [e[2] for e in sh.state.later if e[2].slots is not None]
    assert (list(scattered.slots), scattered.left) == ([10, 11, 12], 3)
    assert sorted(sh.state.messages) == [int(ids[13])]
    sh.now += 30_000
    got = sh.run(c.Take(max=20))
    assert [d.id for d in got] == [ids[13]] + [i for n, i in enumerate(ids) if n not in (9, 13)]


def test_a_message_whose_body_was_changed_in_flight_is_given_back_with_the_others() -> None:
    """Its put's run holds the new body as a patch (Run.patches), so the batch goes back as
    one return run, not as a message and two runs."""
    sh = lending()
    ids = sh.put(10)
    taken = sh.run(c.Take(max=10))
    sh.run(c.Update(id=ids[4], lease=taken[4].lease, body=b"edited"))
    put = sh.state.by_id[0]
    assert put.patches is not None
    assert len(put.patches) == 1
    give_back(sh, taken, 10_000)
    assert list(sh.state.messages) == []
    assert sorted((e[2].off, e[2].count) for e in sh.state.later) == [(0, 10)]
    sh.now += 10_000
    assert [d.body for d in sh.run(c.Take(max=10))] == [
        b"edited" if n == 4 else b"m%d" % n for n in range(10)
    ]


@pytest.mark.parametrize("attrs", [None, {"k": {"DataType": "String", "StringValue": "v"}}])
def test_return_runs_survive_a_snapshot_and_a_compaction_of_their_put(attrs) -> None:
    sh = lending()
    ids = sh.put(12, attributes=attrs)
    taken = sh.run(c.Take(max=8))
    give_back(sh, taken[4:], 5_000)  # slots 4-7 lent; 0-3 still reserved; 8-11 in the run
    put = sh.state.by_id[0]
    assert put.needed_from() == 4
    assert sh.run(c.MoveBodies([put.id])) == 8  # slots 4-11: the lent ones too
    assert put.floor == 4
    before = logical(sh.state)
    sh.state = restored(sh)
    assert logical(sh.state) == before
    [(_, _, loan)] = sh.state.later
    assert (loan.off, loan.count, loan.src) == (4, 4, sh.state.by_id[0])
    sh.now += 5_000
    got = sh.run(c.Take(max=12))  # the run's ready slots first, then the woken ones
    assert [d.id for d in got] == ids[8:] + ids[4:8]
    assert [d.body for d in got] == [b"m%d" % i for i in [8, 9, 10, 11, 4, 5, 6, 7]]
    assert [d.attributes for d in got] == [attrs] * 8
    # slots 0-3, handed out before the move, are not in the copy: given back as messages
    give_back(sh, taken[:4], 1_000)
    assert not [e for e in sh.state.later if e[2].left]
    assert set(sh.state.messages) == {int(d.id) for d in got} | {int(i) for i in ids[:4]}
    sh.now += 1_000
    assert [v.body for v in sh.run(c.PeekReady(max=4))] == [b"m0", b"m1", b"m2", b"m3"]
    # replayed with the put's bodies at hand (all of them), then placed on the copy, as a
    # recovery does: the same messages, the same bodies
    assert logical(replayed_after_move(sh)) == logical(sh.state)


def test_retention_ends_the_return_runs_with_their_put() -> None:
    sh = lending(retention_ms=60_000)
    sh.put(10)
    sh.now += 40_000
    give_back(sh, sh.run(c.Take(max=10)), 19_000)  # due 1 s before retention ends
    sh.now += 19_500
    assert sh.run(c.Stats()).ready == 10
    assert sh.state.spilled == 10
    assert not sh.state.messages
    sh.now += 500
    stats = sh.run(c.Stats())
    assert (stats.total, stats.expired, stats.delayed) == (0, 10, 0)
    assert (sh.state.deferred, sh.state.n_delayed, sum(e[2].left for e in sh.state.later)) == (
        0,
        0,
        0,
    )


def test_purge_and_delete_reach_messages_in_return_runs() -> None:
    sh = lending()
    ids = sh.put(10)
    give_back(sh, sh.run(c.Take(max=10)), 60_000)
    sh.run(c.Delete(ids[3], None))
    view = sh.run(c.Update(id=ids[5], delay_ms=0))
    assert (view.state, view.body, view.receive_count) == ("ready", b"m5", 1)
    [(_, _, loan)] = sh.state.later
    assert (loan.left, loan.out) == (8, {3, 5})
    assert sh.run(c.Stats()).total == 9
    assert sh.run(c.Purge()) == 9
    assert sh.run(c.Stats()).total == 0


def test_return_runs_woken_at_one_time_with_spans_that_overlap_keep_the_take_order() -> None:
    """The only way a woken run could come before the last ready run in take order: slot 0
    leaves a return run (a reschedule), is taken and given back due at the same time as
    the rest of that return run. The second to wake becomes messages."""
    sh = lending()
    sh.state.return_min = 1
    ids = sh.put(4)
    give_back(sh, sh.run(c.Take(max=4)), 10_000)
    due = sh.now + 10_000
    sh.run(c.Update(id=ids[0], delay_ms=0))  # slot 0 leaves the return run, ready now
    [d] = sh.run(c.Take(max=1))
    sh.now += 4_000
    give_back(sh, [d], 6_000)  # due at the same time as slots 1-3
    assert sorted((e[2].off, e[2].count, e[0]) for e in sh.state.later if e[2].left) == [
        (0, 1, due),
        (0, 4, due),
    ]
    sh.now = due
    sh.run(c.Stats())
    # one woke as a run, the other (its span inside the first's) as messages
    assert (sh.state.spilled, len(sh.state.messages)) in ((1, 3), (3, 1))
    got = sh.run(c.Take(max=4))
    assert [d.id for d in got] == ids
    assert [d.receive_count for d in got] == [3, 2, 2, 2]


def test_a_snapshot_with_a_malformed_return_run_is_refused() -> None:
    sh = lending()
    sh.put(10)
    give_back(sh, sh.run(c.Take(max=10)), 60_000)
    snap = snapshot(sh.state)
    assert len(snap.loans) == 1
    for wrong in (
        LoanRecord(1, 0, 10, 0, [], 0, 1, 0),  # no such run
        LoanRecord(0, 5, 10, 0, [], 0, 1, 0),  # past the run's slots
        LoanRecord(0, 0, 10, 11, [], 0, 1, 0),  # next past its count
        LoanRecord(0, 0, 10, 2, [1], 0, 1, 0),  # a slot out before next
    ):
        bad = msgspec.structs.replace(snap, loans=[wrong])
        with pytest.raises(DataError, match="return run"):
            decode_snapshot(encode_snapshot(bad))


def test_replaying_the_events_gives_the_same_return_runs() -> None:
    sh = lending()
    sh.put(50)
    taken = sh.run(c.Take(max=30))
    give_back(sh, taken[:20], 7_000)
    give_back(sh, taken[20:], 9_000)
    sh.now += 8_000
    rebuilt = sh.spilling(QueueState())
    for e in sh.events:
        rebuilt.apply(e)
    rebuilt.advance(sh.now)
    sh.state.advance(sh.now)
    assert logical(rebuilt) == logical(sh.state)
    assert snapshot(rebuilt).loans == snapshot(sh.state).loans  # held the same way
    assert len(snapshot(rebuilt).loans) == 2
    from_rebuilt = [d.id for d in execute(rebuilt, c.Take(max=50), sh.now, sh.ids)[1]]
    assert from_rebuilt == [d.id for d in sh.run(c.Take(max=50))]
    assert len(from_rebuilt) == 40  # 20 never taken, 20 woken; 10 still waiting


def test_a_thousand_given_back_cost_a_few_bytes_each_not_an_object() -> None:
    sh = lending()
    for _ in range(50):
        sh.put(1000)
    taken = [sh.run(c.Take(max=1000)) for _ in range(50)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for batch in taken:
            give_back(sh, batch, 60_000)
        del taken
        sh.run(c.Stats())  # time moves on: stale index entries swept
        sh.events.clear()  # the test's own record of the events
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert sh.state.n_delayed == 50_000
    assert not sh.state.messages
    assert (after - before) / 50_000 < 8  # the objects freed, one small one a batch held


def test_leases_that_run_out_give_their_batch_back_as_a_return_run_ready_at_once() -> None:
    sh = lending()
    ids = sh.put(100)
    sh.run(c.Take(max=100, visibility_timeout_ms=5_000))
    sh.now += 5_000
    stats = sh.run(c.Stats())
    assert (stats.ready, stats.reserved) == (100, 0)
    s = sh.state
    assert not s.messages
    assert s.spilled == 100
    assert s.runs[-1].src is s.by_id[0]
    got = sh.run(c.Take(max=100))
    assert [(d.id, d.receive_count) for d in got] == [(i, 2) for i in ids]


def test_leases_that_run_out_behind_a_younger_ready_run_are_given_back_as_messages() -> None:
    """Ready at once, a return run must come after the last ready run in take order: a
    put at the same millisecond holds later sequences, so the batch stays messages."""
    sh = lending()
    first = sh.put(10)
    second = sh.put(10)  # a run ready at the same millisecond, after the first
    sh.run(c.Take(max=10, visibility_timeout_ms=0))  # the first's; runs out at the next reading
    assert sh.run(c.Stats()).ready == 20
    assert len(sh.state.messages) == 10  # not a return run
    got = sh.run(c.Take(max=20))
    assert [d.id for d in got] == first + second


# ------------------------------------------------ found by review (2026-11-29)


def test_a_run_restored_with_messages_taken_before_ends_them_by_retention() -> None:
    """After a restore, the messages taken from a run before the snapshot are the run's
    again: it stays alive (in the arrival order) while they are queued, and what it lends
    afterwards ends with it."""
    sh = lending(retention_ms=60_000)
    sh.put(10)
    first = sh.run(c.Take(max=5, visibility_timeout_ms=600_000))  # slots 0-4
    sh.state = restored(sh)  # a restart
    assert len(sh.state.by_id[0].mat) == 5
    rest = sh.run(c.Take(max=5, visibility_timeout_ms=600_000))  # the run holds none now
    sh.run(c.Ack([c.LeaseRef(d.id, d.lease) for d in [first[0], *rest]]))
    sh.now += 1_000
    sh.run(c.Stats())
    give_back(sh, first[1:], 5_000)  # slots 1-4: a return run
    assert [(loan.off, loan.count) for loan in sh.state.by_id[0].live_loans()] == [(1, 4)]
    sh.now += 120_000  # past retention
    stats = sh.run(c.Stats())
    assert (stats.total, stats.expired) == (0, 4)
    assert sh.run(c.Take(max=10)) == []


def test_a_recovered_state_gives_back_as_the_live_one_did_and_reads_the_same_bodies() -> None:
    """Leases that run out at the time of a run that is ready after a dead one: the live
    state and one restored from a snapshot (which holds no dead runs) decide alike, and a
    compaction decided live leaves the recovered state every body it reads."""
    sh = lending()
    put_ids = sh.put(20)
    a = sh.run(c.Take(max=10, visibility_timeout_ms=600_000))
    b = sh.run(c.Take(max=10, visibility_timeout_ms=600_000))
    give_back(sh, b, 3_600_000)  # slots 10-19: a waiting return run
    sh.now += 1_000
    give_back(sh, a, 0)  # slots 0-9: ready messages
    later = sh.put(5)
    got = sh.run(c.Take(max=15, visibility_timeout_ms=0))  # runs out at once
    assert [d.id for d in got] == put_ids[:10] + later
    snap = encode_snapshot(snapshot(sh.state))
    n = len(sh.events)
    sh.run(c.Stats())  # the leases run out
    put = sh.state.by_id[0]
    sh.run(c.MoveBodies([put.id]))
    recovered = sh.spilling(restore(decode_snapshot(snap)))
    for e in sh.events[n:]:
        recovered.apply(e)
    for run in recovered.unplaced:
        recovered.place(run, put.place)
    recovered.advance(sh.now)
    assert logical(recovered) == logical(sh.state)
    live = [(d.id, d.body) for d in sh.run(c.Take(max=10))]
    again = [(d.id, d.body) for d in execute(recovered, c.Take(max=10), sh.now, sh.ids)[1]]
    assert live == again
    assert [body for _, body in live] == [b"m%d" % i for i in range(10)]


def test_a_release_naming_a_message_twice_releases_it_once() -> None:
    sh = lending()
    sh.put(8)
    taken = sh.run(c.Take(max=8))
    s = sh.state
    s.apply(ev.MessagesReleased(sh.now, [int(taken[0].id)] * 2, [sh.now + 1_000] * 2))
    assert (s.n_reserved, s.n_delayed) == (7, 1)


def test_leases_touched_to_the_same_deadline_run_out_once() -> None:
    """A touch at the same millisecond with the same timeout leaves two heap entries at one
    deadline: each message runs out once."""
    sh = lending()
    sh.put(10)
    taken = sh.run(c.Take(max=10, visibility_timeout_ms=5_000))
    sh.run(
        c.Touch([c.TouchItem(id=d.id, lease=d.lease, visibility_timeout_ms=5_000) for d in taken])
    )
    assert len(sh.state.reserved) == 20
    sh.now += 5_000
    stats = sh.run(c.Stats())
    assert (stats.ready, stats.reserved, stats.total) == (10, 0, 10)
    assert sh.state.spilled == 10  # one return run
    assert [d.receive_count for d in sh.run(c.Take(max=10))] == [2] * 10


def test_a_message_given_back_alone_for_now_reads_nothing_back() -> None:
    sh = lending()
    sh.put(8)
    taken = sh.run(c.Take(max=8))
    reads = sh.reads
    give_back(sh, taken[:1], 0)  # one message, ready at once: it stays a message
    assert sh.reads == reads
    assert len(sh.state.messages) == 8
    give_back(sh, taken[1:2], 60_000)  # due later: its body is compared with the put's once
    assert sh.reads == reads + 1
    assert len(sh.state.messages) == 7


def test_a_move_past_slots_a_return_run_holds_makes_them_messages_first() -> None:
    """The safeguard: a BodiesMoved whose copy starts past slots a return run of this state
    holds (decided by a state that did not lend them) turns them into messages, bodies
    read while the old place is still there."""
    sh = lending()
    ids = sh.put(10)
    give_back(sh, sh.run(c.Take(max=10)), 60_000)
    put = sh.state.by_id[0]
    contents = sh.state.contents_of(put)
    moved = ev.BodiesMoved(sh.now, [put.id], [6], [contents.bodies[6:]], None)
    sh.replay(moved)
    assert (put.floor, put.lent) == (6, 4)
    assert sorted(sh.state.messages) == [int(i) for i in ids[:6]]
    assert sh.run(c.Stats()).delayed == 10
    sh.now += 60_000
    got = sh.run(c.Take(max=10))
    assert [(d.id, d.body) for d in got] == [(i, b"m%d" % n) for n, i in enumerate(ids)]


def test_a_delayed_run_woken_behind_a_return_run_of_a_later_put_joins_before_it() -> None:
    """Leases run out before activations at one millisecond: the return run of a later put
    is ready first, and an earlier put's delayed run, woken then, goes before it in take
    order, still a run (no message objects)."""
    sh = lending()
    delayed = [
        r.id
        for r in sh.run(c.Put([c.NewMessage(body=b"d%d" % i, delay_ms=5_000) for i in range(10)]))
    ]
    ready = sh.put(10)
    sh.run(c.Take(max=10, visibility_timeout_ms=5_000))  # the ready put's, for 5 s
    sh.now += 5_000
    assert sh.run(c.Stats()).ready == 20
    assert (len(sh.state.messages), sh.state.spilled) == (0, 20)
    got = sh.run(c.Take(max=20))
    assert [d.id for d in got] == delayed + ready
    assert [d.receive_count for d in got] == [1] * 10 + [2] * 10
