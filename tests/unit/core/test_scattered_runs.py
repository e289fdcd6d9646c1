"""Scattered return runs (runs.py, ``Run.scatter``): messages of a run given back one or a
few at a time (a release of too few that follow each other, a reschedule) go back into one
object of their put's run, 14 bytes each, instead of one message object each. The model
test (test_model.py: the spilling walk with ``return_min`` 2, and the machine drawing it)
checks that nothing a client sees changes; these check the representation."""

from __future__ import annotations

import tracemalloc

import msgspec
import pytest

from actors.core import commands as c
from actors.core import state as state_module
from actors.core.runs import LoanRecord, Run
from actors.core.snapshot import decode_snapshot, encode_snapshot, logical, restore, snapshot
from actors.core.state import QueueState
from actors.errors import DataError, MessageNotFound
from tests.unit.core.test_return_runs import replayed_after_move
from tests.unit.core.test_runs import T0, Shell, spread_put


def release(sh: Shell, d: object, delay_ms: int) -> str:
    [r] = sh.run(c.Release([c.ReleaseItem(id=d.id, lease=d.lease, delay_ms=delay_ms)]))  # type: ignore[attr-defined]
    return r.status


def scattered(state: QueueState) -> list:
    return [loan for r in state.by_id for loan in r.live_loans() if loan.slots is not None]


def restored(sh: Shell) -> QueueState:
    return sh.spilling(restore(decode_snapshot(encode_snapshot(snapshot(sh.state)))))


def test_messages_released_one_at_a_time_wait_in_one_scattered_run_in_time_order() -> None:
    sh = Shell()
    ids = sh.put(10)
    taken = sh.run(c.Take(max=10))
    # each alone, due at its own time (a consumer failing messages one by one, with backoff)
    for n, d in enumerate(taken):
        assert release(sh, d, 1_000 * (10 - n)) == "ok"
    s = sh.state
    assert not s.messages
    [loan] = scattered(s)
    assert (loan.left, loan.act, loan.src) == (10, T0 + 1_000, s.by_id[0])
    assert (s.deferred, s.n_delayed, s.by_id[0].lent) == (10, 10, 10)
    view = sh.run(c.Peek(ids[3]))
    assert (view.state, view.body, view.receive_count, view.activate_at_ms) == (  # type: ignore[attr-defined]
        "delayed",
        b"m3",
        1,
        T0 + 7_000,
    )
    assert not s.messages  # reading materializes nothing
    sh.now += 3_000  # the last three released are due
    got = sh.run(c.Take(max=10))
    assert [d.id for d in got] == [ids[9], ids[8], ids[7]]
    assert [(d.body, d.receive_count, d.first_taken_ms) for d in got] == [
        (b"m9", 2, T0),
        (b"m8", 2, T0),
        (b"m7", 2, T0),
    ]
    sh.now += 7_000
    assert [d.id for d in sh.run(c.Take(max=10))] == ids[6::-1]
    assert (s.deferred, s.n_delayed, s.by_id[0].lent) == (0, 0, 0)


def test_a_reschedule_of_a_message_still_in_its_run_costs_no_object() -> None:
    sh = Shell(retention_ms=10 * 86_400_000)
    far = spread_put(sh, [86_400_000 * d for d in (3, 1, 2)])  # a spread run
    ready = sh.put(4)  # a ready run
    for mid, delay in [(far[0], 60_000), (ready[2], 30_000), (far[1], 5 * 86_400_000)]:
        view = sh.run(c.Update(id=mid, delay_ms=delay))
        assert (view.state, view.activate_at_ms) == ("delayed", T0 + delay)  # type: ignore[attr-defined]
    s = sh.state
    assert not s.messages
    assert sorted((loan.src.seq, loan.left) for loan in scattered(s)) == [
        (s.by_id[0].seq, 2),
        (s.by_id[1].seq, 1),
    ]
    stats = sh.run(c.Stats())
    assert (stats.ready, stats.delayed, stats.total) == (3, 4, 7)  # type: ignore[attr-defined]
    page = sh.run(c.Browse(state="delayed", limit=10))
    assert [m.id for m in page.messages] == [ready[2], far[0], far[2], far[1]]  # type: ignore[attr-defined]
    # rescheduled again: out of the scattered run and into it again, at the new time
    sh.run(c.Update(id=ready[2], delay_ms=90_000))
    assert not s.messages
    sh.now += 60_000
    got = sh.run(c.Take(max=10))
    assert [d.id for d in got] == [ready[0], ready[1], ready[3], far[0]]
    sh.run(c.Ack([c.LeaseRef(d.id, d.lease) for d in got]))
    sh.now += 30_000
    got = sh.run(c.Take(max=10))
    assert [(d.id, d.body, d.receive_count) for d in got] == [(ready[2], b"m2", 1)]


def test_a_reschedule_of_a_taken_message_starts_its_receive_count_again() -> None:
    sh = Shell()
    ids = sh.put(3)
    taken = sh.run(c.Take(max=3))
    sh.run(c.Update(id=ids[1], lease=taken[1].lease, delay_ms=10_000))
    assert len(sh.state.messages) == 2  # the other two are still reserved
    [loan] = scattered(sh.state)
    assert (list(loan.rcs), loan.first_of(0), loan.act_of(0)) == ([0], T0, T0 + 10_000)
    sh.now += 10_000
    [d] = sh.run(c.Take(max=3))
    assert (d.id, d.receive_count, d.first_taken_ms) == (ids[1], 1, T0)


def test_messages_due_now_stay_messages_and_changed_bodies_go_back_as_patches() -> None:
    sh = Shell()
    ids = sh.put(3)
    sh.run(c.Update(id=ids[1], delay_ms=0))  # ready at once: taken soon
    assert sorted(sh.state.messages) == [int(ids[1])]
    assert not scattered(sh.state)
    # a new body and a later time: the body a patch of the put's run, the slot scattered
    sh.run(c.Update(id=ids[0], body=b"edited", delay_ms=10_000))
    sh.run(c.Update(id=ids[2], body=b"m2", delay_ms=5_000))  # the same body
    assert sorted(sh.state.messages) == [int(ids[1])]
    [loan] = scattered(sh.state)
    assert loan.left == 2
    assert len(sh.state.by_id[0].patches or ()) == 2
    sh.now += 10_000
    assert [d.body for d in sh.run(c.Take(max=3))] == [b"m1", b"m2", b"edited"]


def test_a_message_rescheduled_over_and_over_keeps_the_run_small() -> None:
    sh = Shell()
    ids = sh.put(2)
    for n in range(500):
        sh.run(c.Update(id=ids[n % 2], delay_ms=1_000 + n))
    [loan] = scattered(sh.state)
    assert loan.left == 2
    assert loan.count <= 2 * loan.left + 33  # what left it is dropped once it dominates
    sh.now += 2_000
    assert sorted(d.id for d in sh.run(c.Take(max=3))) == sorted(ids)


def test_a_snapshot_holds_what_a_scattered_run_still_holds_and_a_restore_takes_the_same() -> None:
    sh = Shell()
    ids = sh.put(8)
    taken = sh.run(c.Take(max=8))
    for n in (1, 3, 5, 6):
        release(sh, taken[n], 1_000 * n)
    sh.run(c.Update(id=ids[3], delay_ms=0))  # out of it again, ready now
    [record] = snapshot(sh.state).loans
    assert (record.count, record.next, record.out) == (3, 0, [])
    assert record.slots == b"".join(i.to_bytes(4, "little") for i in (1, 5, 6))
    before = logical(sh.state)
    sh.state = restored(sh)
    assert logical(sh.state) == before
    [loan] = scattered(sh.state)
    assert (loan.left, loan.act, sh.state.by_id[0].lent) == (3, T0 + 1_000, 3)
    sh.now += 6_000
    got = sh.run(c.Take(max=8))
    assert [d.id for d in got] == [ids[3], ids[1], ids[5], ids[6]]
    assert [d.receive_count for d in got] == [2, 2, 2, 2]
    # the events replayed over the first state give the same one
    rebuilt = sh.spilling(QueueState())
    for e in sh.events:
        rebuilt.apply(e)
    rebuilt.advance(sh.now)
    assert logical(rebuilt) == logical(sh.state)


@pytest.mark.parametrize(
    "change",
    [
        {"slots": b"\x09\x00\x00\x00"},  # past the put's run
        {"times": b""},
        {"receive_counts": b"\x01"},
        {"next": 1},
        {  # one slot twice, every array of the right length
            "slots": b"\x02\x00\x00\x00" * 2,
            "count": 2,
            "times": b"\x00" * 16,
            "receive_counts": b"\x00" * 8,
            "first_takes": b"\x00" * 16,
        },
    ],
)
def test_a_damaged_scattered_record_is_a_data_error(change: dict) -> None:
    sh = Shell()
    sh.put(8)
    taken = sh.run(c.Take(max=8))
    release(sh, taken[2], 1_000)
    snap = snapshot(sh.state)
    [record] = snap.loans
    bad = msgspec.structs.replace(snap, loans=[msgspec.structs.replace(record, **change)])
    with pytest.raises(DataError):
        decode_snapshot(encode_snapshot(bad))
    assert isinstance(record, LoanRecord)


def test_retention_ends_a_scattered_run_with_its_put() -> None:
    sh = Shell(retention_ms=60_000)
    ids = sh.put(3)
    sh.now += 40_000
    taken = sh.run(c.Take(max=3))
    release(sh, taken[0], 30_000)  # due 10 s after its retention ends
    sh.run(c.Update(id=ids[1], lease=taken[1].lease, delay_ms=50_000))
    sh.run(c.Ack([c.LeaseRef(taken[2].id, taken[2].lease)]))
    [loan] = scattered(sh.state)
    assert (loan.left, len(sh.state.messages)) == (2, 0)
    sh.now += 20_000
    stats = sh.run(c.Stats())
    assert (stats.total, stats.expired, stats.delayed) == (0, 2, 0)  # type: ignore[attr-defined]
    assert (sh.state.deferred, sh.state.n_delayed, loan.left) == (0, 0, 0)
    sh.now += 30_000
    assert sh.run(c.Take(max=3)) == []


def test_a_compaction_keeps_the_slots_a_scattered_run_reads() -> None:
    sh = Shell()
    ids = sh.put(12)
    taken = sh.run(c.Take(max=6))
    release(sh, taken[4], 5_000)  # slot 4, scattered
    put = sh.state.by_id[0]
    assert put.needed_from() == 4
    assert sh.run(c.MoveBodies([put.id])) == 8  # slots 4-11 (5, reserved, among them)
    assert put.floor == 4
    sh.now += 5_000
    got = sh.run(c.Take(max=12))
    assert [d.id for d in got] == [*ids[6:], ids[4]]
    assert [d.body for d in got] == [b"m%d" % i for i in [6, 7, 8, 9, 10, 11, 4]]
    assert logical(replayed_after_move(sh)) == logical(sh.state)


def test_purge_and_delete_reach_scattered_messages() -> None:
    sh = Shell()
    ids = sh.put(5)
    for mid in ids:
        sh.run(c.Update(id=mid, delay_ms=60_000))
    sh.run(c.Delete(ids[2], None))
    assert sh.run(c.Stats()).total == 4  # type: ignore[attr-defined]
    with pytest.raises(MessageNotFound):
        sh.run(c.Peek(ids[2]))
    assert sh.run(c.Purge()) == 4
    assert (sh.run(c.Stats()).total, sh.state.deferred, len(sh.state.messages)) == (0, 0, 0)  # type: ignore[attr-defined]


def test_a_message_rescheduled_alone_costs_a_tenth_of_an_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """10,000 messages rescheduled one at a time, each to a time of its own (timers pushed
    back): the engine's memory for them, before (as objects) and after. (The stale heap
    entries a state sweeps once they outnumber its live ones by 4,096 are swept from 64
    here: a fixed cost, not one a message, which 10,000 would not amortize.)"""
    monkeypatch.setattr(state_module, "_COMPACT_SLACK", 64)

    def cost(return_runs: bool) -> float:
        sh = Shell()
        ids = [mid for _ in range(10) for mid in sh.put(1000)]
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        if not return_runs:  # a state that holds every message as an object
            sh.state.unspill_all()
        for n, mid in enumerate(ids):
            sh.run(c.Update(id=mid, delay_ms=60_000 + 7 * n))
            sh.events.clear()  # the test's own record of them
        sh.run(c.Stats())
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        assert sh.run(c.Stats()).delayed == len(ids)  # type: ignore[attr-defined]
        assert bool(sh.state.messages) is not return_runs
        return used / len(ids)

    # 14 bytes of arrays a message and their growth's reserve, plus the 2,000 tuples
    # CPython keeps for reuse (12.8 B a message at this size: a fixed cost)
    objects, scattered_ = cost(False), cost(True)
    assert scattered_ < 48, (scattered_, objects)
    assert objects > 6 * scattered_, (scattered_, objects)


def test_the_arrays_grow_wider_when_a_value_needs_it() -> None:
    """Times and first takes are held as 4-byte distances from the put, receive counts and
    places in time order in 2 bytes: a value past those makes that array wider."""
    sh = Shell()
    sh.put(3)
    put = sh.state.by_id[0]
    loan = Run.scatter(put)
    assert [a.typecode for a in (loan.acts, loan.order, loan.rcs, loan.firsts)] == list("IHHI")
    far = put.at_ms + (1 << 33)  # 99 days on
    loan.add(0, put.at_ms + 5, 70_000, 0)
    loan.add(1, far, 1, far - 1)
    loan.add(2, put.at_ms + 7, 2, put.at_ms)
    assert [a.typecode for a in (loan.acts, loan.order, loan.rcs, loan.firsts)] == list("qHIq")
    assert [(loan.act_of(j), loan.rcs[j], loan.first_of(j)) for j in range(3)] == [
        (put.at_ms + 5, 70_000, 0),
        (far, 1, far - 1),
        (put.at_ms + 7, 2, put.at_ms),
    ]
    assert list(loan.spilled_by_time()) == [0, 2, 1]
    assert (loan.act, loan.left, put.lent) == (put.at_ms + 5, 3, 3)


def test_one_message_rescheduled_over_and_over_reuses_its_scattered_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A timer pushed back again and again (one message, rescheduled alone each time): each
    reschedule takes it out of its scattered run, which is then empty; it is filled again,
    not left behind for a new one (a run a reschedule in its put's ``loans``, each searched
    by the next: quadratic, and ~1 KB a reschedule until a snapshot prunes them), and the
    stale entries of ``later`` are swept as those of the message heaps are."""
    monkeypatch.setattr(state_module, "_COMPACT_SLACK", 64)
    sh = Shell()
    ids = sh.put(3)
    for n in range(3_000):
        sh.run(c.Update(id=ids[0], delay_ms=60_000 + n))
    put = sh.state.by_id[0]
    assert len(put.loans or ()) == 1
    [loan] = scattered(sh.state)
    assert (loan.left, loan.count, put.lent) == (1, 1, 1)
    assert len(sh.state.later) <= 2 * sh.state.deferred + state_module._COMPACT_SLACK
    sh.now += 60_000 + 3_000
    got = sh.run(c.Take(max=3))
    assert [(d.id, d.body) for d in got] == [(ids[1], b"m1"), (ids[2], b"m2"), (ids[0], b"m0")]
    assert got[2].activate_at_ms == T0 + 60_000 + 2_999
