"""Runs (actors/core/runs.py): a spilling state holds a ready put as one object, its bodies
in the log, and reads them back through the shell's reader. The model test
(test_model.py, the spilling machine) checks that nothing a client sees changes; these check
the representation itself."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from actors.core import commands as c
from actors.core import events as ev
from actors.core import state as state_module
from actors.core.decide import execute
from actors.core.runs import Contents, Run, moved_contents
from actors.core.snapshot import decode_snapshot, encode_snapshot, logical, restore, snapshot
from actors.core.state import RESERVED, RUN_DEPTH, RUN_MIN_PUT, QueueState
from actors.errors import MessageNotFound
from actors.ids import SequentialIds
from actors.settings import QueueSettings

T0 = 1_700_000_000_000


class Shell:
    """A spilling state and a dict for a log: what a shell does around the engine."""

    def __init__(self, name: str = "q", **settings: object) -> None:
        self.log: dict[int, Contents] = {}
        self.events: list[ev.Event] = []
        self.reads = 0
        self.state = self.spilling(QueueState())
        self.ids = SequentialIds()
        self.now = T0
        assert self.run(c.Create(name, QueueSettings(id_mode="server", **settings))) is True

    def spilling(self, state: QueueState) -> QueueState:
        state.spill, state.run_min_put = True, 1  # every put a run, however small
        state.read = self.read
        return state

    def read(self, place: Any) -> Contents:
        self.reads += 1  # a run's place is a number here, a patch's shaped as the shell's
        return self.log[place[1] if isinstance(place, (tuple, list)) else place]

    def run(self, command: object) -> object:
        events, reply = execute(self.state, command, self.now, self.ids)
        self.events.extend(events)
        self._placed(events)
        return reply

    def replay(self, event: ev.Event) -> None:
        """Fold an event read from a log (one an older evq wrote, say) into the state."""
        self.state.apply(event)
        self.events.append(event)
        self._placed([event])

    def _placed(self, events: list[ev.Event]) -> None:
        moved = next((e for e in events if type(e) is ev.BodiesMoved), None)
        for run in self.state.unplaced:  # "durable": bodies now come from the log
            if moved is None:
                self.log[len(self.log)] = Contents(list(run.bodies or []), run.attrs)
            else:  # compaction: the same bodies from the record's slot on
                self.log[len(self.log)] = moved_contents(moved, moved.ids.index(run.ref))
            self.state.place(run, len(self.log) - 1)
        self.state.unplaced.clear()
        for put, i, token in self.state.unpatched:  # an update's record, "durable"
            body = put.patches.held.get(i) if put.patches is not None else None
            if body is None:
                continue  # moved since, or dropped (its message is gone)
            at = max(self.log, default=-1) + 1  # (a test may have dropped places)
            self.log[at] = Contents([body], None)
            self.state.place_patch(put, i, token, ("log", at, 0, 0, 0))
        self.state.unpatched.clear()

    def put(self, n: int, **kw: object) -> list[str]:
        reply = self.run(c.Put([c.NewMessage(body=b"m%d" % i, **kw) for i in range(n)]))
        return [r.id for r in reply]  # type: ignore[attr-defined]


def test_a_ready_put_is_one_run_with_no_message_objects_and_its_bodies_in_the_log() -> None:
    sh = Shell()
    ids = sh.put(1000)
    s = sh.state
    assert (len(s.runs), s.spilled, s.n_ready, s.total, len(s.messages)) == (1, 1000, 1000, 1000, 0)
    assert s.runs[0].bodies is None
    assert s.runs[0].place == 0
    stats = sh.run(c.Stats())
    assert (stats.ready, stats.total, stats.oldest_ready_age_ms) == (1000, 1000, 0)
    view = sh.run(c.Peek(ids[500]))
    assert (view.body, view.state) == (b"m500", "ready")
    assert len(s.messages) == 0  # reading materializes nothing


def test_a_take_materializes_the_run_front_in_order_and_reads_bodies_from_the_log() -> None:
    sh = Shell()
    ids = sh.put(100)
    got = sh.run(c.Take(max=10))
    assert [d.id for d in got] == ids[:10]
    assert [d.body for d in got] == [b"m%d" % i for i in range(10)]
    s = sh.state
    assert s.runs[0].next == 10
    assert s.spilled == 90
    assert s.n_reserved == 10
    assert all(s.messages[int(i)].state == RESERVED for i in ids[:10])
    assert sh.reads > 0


def test_messages_changed_out_of_order_leave_the_run_and_the_rest_stays_in_order() -> None:
    sh = Shell()
    ids = sh.put(10)
    sh.run(c.Delete(ids[3], None))
    view = sh.run(c.Update(id=ids[5], body=b"new", delay_ms=0))  # its time set: a message
    assert view.body == b"new"
    run = sh.state.runs[0]
    assert run.out == {3, 5}
    assert run.left == 8
    got = sh.run(c.Take(max=10))
    assert [d.id for d in got] == [i for n, i in enumerate(ids) if n != 3]
    assert got[4].body == b"new"
    assert sh.state.spilled == 0
    assert sh.state.front_run() is None


class ClockIds(SequentialIds):
    """Ids with gaps, as the server's (from the clock, with a random part)."""

    def next_id(self, now_ms: int) -> int:
        return super().next_id(now_ms) * 10


def test_a_put_draws_one_id_and_counts_up_from_it_so_its_run_holds_no_ids() -> None:
    sh = Shell()
    sh.ids = ClockIds()
    assert [int(i) for i in sh.put(3)] == [10, 11, 12]
    assert [int(i) for i in sh.put(2)] == [20, 21]  # the next put draws again
    assert [int(i) for i in sh.put(2, delay_ms=0)] == [30, 31]  # the general loop: the same
    assert [r.ids for r in sh.state.runs] == [None, None, None]
    sh.now += 1
    sh.ids = SequentialIds()  # the clock's candidate falls behind: the last id + 1
    assert [int(i) for i in sh.put(2)] == [32, 33]


def test_a_run_of_ids_that_are_not_consecutive_keeps_them() -> None:
    sh = Shell()
    # Puts decided before ids were drawn once per put (a log an older evq wrote) have ids
    # drawn one by one from the clock: gaps within one put.
    items = [ev.PutItem(10 * (i + 1), b"m%d" % i, sh.now) for i in range(5)]
    sh.replay(ev.MessagesPut(sh.now, items))
    run = sh.state.runs[0]
    assert run.ids is not None
    assert list(run.ids) == [10, 20, 30, 40, 50]
    assert sh.run(c.Peek("30")).body == b"m2"
    with pytest.raises(MessageNotFound):
        sh.run(c.Peek("31"))  # an id between two is no message
    sh.run(c.Delete("40", None))
    sh.state = sh.spilling(restore(decode_snapshot(encode_snapshot(snapshot(sh.state)))))
    assert list(sh.state.runs[0].ids or []) == [10, 20, 30, 40, 50]
    got = sh.run(c.Take(max=10))
    assert [d.id for d in got] == ["10", "20", "30", "50"]
    assert [d.body for d in got] == [b"m0", b"m1", b"m2", b"m4"]


def test_only_puts_ready_at_the_put_or_later_without_groups_spill() -> None:
    sh = Shell()
    sh.run(c.Put([c.NewMessage(body=b"z", activate_at_ms=sh.now - 5)]))  # ready since before
    sh.run(c.Put([c.NewMessage(body=b"r"), c.NewMessage(body=b"d", delay_ms=10)]))  # mixed
    assert (sh.state.spilled, sh.state.deferred) == (0, 0)
    assert len(sh.state.messages) == 3
    fifo = Shell("q.fifo", fifo=True)
    fifo.run(c.Put([c.NewMessage(body=b"x", group="g")]))
    fifo.run(c.Put([c.NewMessage(body=b"x", group="g", delay_ms=100)]))
    assert (fifo.state.spilled, fifo.state.deferred) == (0, 0)


ATTRS = [{"kind": "mail", "n": i} if i % 3 else None for i in range(30)]


def attr_put(sh: Shell, **kw: object) -> list[str]:
    """A put of 30 messages, two of every three with attributes."""
    messages = [c.NewMessage(body=b"m%d" % i, attributes=a, **kw) for i, a in enumerate(ATTRS)]
    return [r.id for r in sh.run(c.Put(messages))]  # type: ignore[attr-defined]


@pytest.mark.parametrize("delay", [None, 60_000, "spread"], ids=["ready", "delayed", "spread"])
def test_messages_with_attributes_spill_and_read_them_back_from_the_log(delay: object) -> None:
    sh = Shell()
    if delay == "spread":
        at = [sh.now + 1000 * (30 - i) for i in range(30)]  # the last due first
        messages = [
            c.NewMessage(body=b"m%d" % i, attributes=a, activate_at_ms=at[i])
            for i, a in enumerate(ATTRS)
        ]
        ids = [r.id for r in sh.run(c.Put(messages))]  # type: ignore[attr-defined]
    else:
        ids = attr_put(sh, delay_ms=delay)
    s = sh.state
    [run] = s.by_id
    assert (len(s.messages), s.spilled + s.deferred, run.with_attrs) == (0, 30, True)
    assert (run.bodies, run.attrs) == (None, None)  # placed: both are in the log
    assert sh.run(c.Peek(ids[4])).attributes == {"kind": "mail", "n": 4}
    assert sh.run(c.Peek(ids[3])).attributes is None
    listed = sh.run(c.Browse(state="delayed" if delay else "ready", limit=100))
    assert {m.id: m.attributes for m in listed.messages} == dict(zip(ids, ATTRS, strict=True))
    assert len(s.messages) == 0  # reading materializes nothing
    sh.now += 60_000
    got = sh.run(c.Take(max=100))
    assert {d.id: (d.body, d.attributes) for d in got} == {
        mid: (b"m%d" % i, ATTRS[i]) for i, mid in enumerate(ids)
    }


def test_attributes_survive_a_snapshot_placed_or_not_and_a_move() -> None:
    sh = Shell()
    ids = attr_put(sh)
    sh.run(c.Take(max=2))
    events, moved = execute(sh.state, c.MoveBodies([int(ids[0])]), sh.now, sh.ids)
    assert moved == 28
    assert events[0].attributes == [ATTRS[2:]]
    assert moved_contents(events[0], 0).attrs == [None, None, *ATTRS[2:]]
    sh.state.unplaced.clear()
    sh.log[1] = moved_contents(events[0], 0)
    sh.state.place(sh.state.by_id[0], 1)
    del sh.log[0]  # the put's segment is gone: only the move holds them
    snap = snapshot(sh.state)
    assert (snap.runs[0].with_attrs, snap.runs[0].attrs, len(snap.messages)) == (True, None, 2)
    data = encode_snapshot(snap)  # the attributes stayed in the log, with the bodies
    sh.state = sh.spilling(restore(decode_snapshot(data)))
    assert sh.run(c.Peek(ids[29])).attributes == ATTRS[29]
    # a put not yet durable keeps its attributes in the snapshot, with its bodies
    unplaced = QueueState()
    unplaced.spill, unplaced.run_min_put = True, 1
    execute(unplaced, c.Create("q", QueueSettings(id_mode="server")), sh.now, sh.ids)
    put = [c.NewMessage(body=b"b", attributes={"x": "1"}), c.NewMessage(body=b"c")]
    execute(unplaced, c.Put(put), sh.now, sh.ids)
    snap = snapshot(unplaced)
    assert (snap.runs[0].with_attrs, snap.runs[0].attrs) == (True, [{"x": "1"}, None])
    restored = restore(decode_snapshot(encode_snapshot(snap)))
    got = execute(restored, c.Take(max=2), sh.now, sh.ids)[1]
    assert [d.attributes for d in got] == [{"x": "1"}, None]


def test_a_put_ready_at_one_later_time_is_a_delayed_run_with_no_message_objects() -> None:
    sh = Shell()
    ids = sh.put(1000, delay_ms=60_000)
    s = sh.state
    assert (s.deferred, s.n_delayed, s.spilled, s.n_ready, s.total) == (1000, 1000, 0, 0, 1000)
    assert (len(s.messages), len(s.runs), len(s.later)) == (0, 0, 1)
    assert s.by_id[0].bodies is None  # placed: the bodies are in the log
    assert s.next_due_ms() == T0 + 60_000
    stats = sh.run(c.Stats())
    assert (stats.delayed, stats.ready, stats.total) == (1000, 0, 1000)
    view = sh.run(c.Peek(ids[500]))
    assert (view.body, view.state, view.activate_at_ms) == (b"m500", "delayed", T0 + 60_000)
    assert sh.run(c.Take(max=10)) == []
    assert len(s.messages) == 0  # reading materializes nothing
    sh.now += 60_000
    got = sh.run(c.Take(max=1000))
    assert [d.id for d in got] == ids
    assert [d.body for d in got][:2] == [b"m0", b"m1"]
    assert (s.deferred, s.n_delayed, s.spilled, s.n_reserved) == (0, 0, 0, 1000)


def test_a_delayed_run_wakes_whole_in_one_step_not_one_per_message() -> None:
    """The mass activation: 100 puts of 100 messages due at one time are 100 steps of
    ``advance``, and all 10,000 are ready at that millisecond."""
    sh = Shell()
    for _ in range(100):
        sh.put(100, activate_at_ms=T0 + 3_600_000)
    s = sh.state
    before = s.transitions
    s.advance(T0 + 3_599_999)
    assert (s.n_ready, s.n_delayed, s.transitions) == (0, 10_000, before)
    s.advance(T0 + 3_600_000)
    assert (s.n_ready, s.n_delayed) == (10_000, 0)
    assert s.transitions - before == 100
    assert len(s.messages) == 0
    assert s.oldest_ready_ms() == T0 + 3_600_000


def test_delayed_runs_join_the_take_order_at_their_time_after_earlier_ready_runs() -> None:
    sh = Shell()
    late = sh.put(3, delay_ms=1_000)  # ready at T0 + 1000, put first
    soon = sh.put(2, delay_ms=500)  # ready at T0 + 500
    sh.now += 200
    ready = sh.put(2)  # a ready run at T0 + 200
    heap = sh.run(c.Put([c.NewMessage(body=b"h", delay_ms=700, attributes={"k": "v"})]))
    sh.now += 1_000  # T0 + 1200: all due; heap's message at T0 + 900
    got = sh.run(c.Take(max=100))
    assert [d.id for d in got] == [*ready, *soon, heap[0].id, *late]  # type: ignore[index]
    assert sh.state.runs[-1].id == int(late[0])  # woken last, after the runs before it


def test_a_command_on_a_delayed_spilled_message_materializes_it_as_delayed() -> None:
    sh = Shell()
    ids = sh.put(10, delay_ms=10_000)
    s = sh.state
    view = sh.run(c.Update(id=ids[2], body=b"new"))
    assert (view.body, view.state, view.activate_at_ms) == (b"new", "delayed", T0 + 10_000)
    sh.run(c.Update(id=ids[3], delay_ms=0))  # reschedule: ready now
    sh.run(c.Delete(ids[4], None))
    # the body changed in its run (Run.patches): only the rescheduled one is a message
    assert (s.deferred, s.n_delayed, s.n_ready, s.total, len(s.messages)) == (8, 8, 1, 9, 1)
    assert [d.id for d in sh.run(c.Take(max=10))] == [ids[3]]
    sh.now += 10_000
    got = sh.run(c.Take(max=10))
    assert [d.id for d in got] == [i for n, i in enumerate(ids) if n not in (3, 4)]
    assert got[2].body == b"new"


def test_browse_lists_delayed_runs_in_activation_order_across_pages() -> None:
    sh = Shell()
    far = sh.put(3, delay_ms=3 * 86_400_000)  # far future, put first
    near = sh.put(3, delay_ms=3_600_000)
    one = sh.put(1, delay_ms=60_000)
    sh.run(c.Update(id=one[0], delay_ms=7_200_000))  # a message object in the delayed heap
    want = [*near, one[0], *far]
    seen, after = [], None
    while True:
        page = sh.run(c.Browse(state="delayed", limit=2, after=after))
        seen += [m.id for m in page.messages]  # type: ignore[attr-defined]
        after = page.next  # type: ignore[attr-defined]
        if after is None:
            break
    assert seen == want
    # listing materialized nothing (the rescheduled one waits in its put's scattered
    # return run: runs.py, Run.scatter)
    assert not sh.state.messages


def test_a_snapshot_holds_delayed_runs_without_bodies_and_restores_them_by_the_clock() -> None:
    sh = Shell()
    due = sh.put(4, delay_ms=1_000)
    waiting = sh.put(5, delay_ms=5_000)
    sh.now += 2_000
    ready = sh.put(2)
    sh.run(c.Delete(waiting[1], None))
    data = encode_snapshot(snapshot(sh.state))
    assert b"m3" not in data  # the bodies stayed in the log
    restored = sh.spilling(restore(decode_snapshot(data)))
    assert (restored.spilled, restored.deferred, restored.n_ready, restored.n_delayed) == (
        6,
        4,
        6,
        4,
    )
    assert logical(restored) == logical(sh.state)
    sh.state = restored
    assert [d.id for d in sh.run(c.Take(max=100))] == [*due, *ready]
    sh.now += 3_000
    got = sh.run(c.Take(max=100))
    assert [d.id for d in got] == [i for n, i in enumerate(waiting) if n != 1]


def test_retention_ends_a_delayed_run_before_its_time() -> None:
    sh = Shell(retention_ms=200_000)
    sh.put(5, delay_ms=120_000)
    sh.run(c.PatchSettings({"retention_ms": 60_000}))  # shortened: it ends before its time
    sh.now += 60_000
    stats = sh.run(c.Stats())
    assert (stats.delayed, stats.total, stats.expired) == (0, 0, 5)  # type: ignore[attr-defined]
    sh.now += 60_000
    assert sh.run(c.Take(max=10)) == []
    assert sh.state.spilled == 0


def test_purge_drops_delayed_runs() -> None:
    sh = Shell()
    sh.put(5, delay_ms=1_000)
    sh.put(5)
    sh.run(c.Purge())
    s = sh.state
    assert (s.deferred, s.spilled, s.n_delayed, s.n_ready, s.total) == (0, 0, 0, 0, 0)
    assert (s.later, s.by_id, s.runs) == ([], [], [])
    sh.now += 1_000
    assert sh.run(c.Take(max=10)) == []


def test_runs_and_heap_messages_are_taken_in_one_order() -> None:
    sh = Shell()
    first = sh.put(3, delay_ms=10)  # messages, ready at T0 + 10
    sh.now += 20
    run = sh.put(3)  # a run, ready at T0 + 20
    sh.now += 1
    got = sh.run(c.Take(max=2))
    assert [d.id for d in got] == first[:2]
    sh.run(c.Release([c.ReleaseItem(id=got[0].id, lease=got[0].lease)]))  # ready at T0 + 21
    got = sh.run(c.Take(max=10))
    assert [d.id for d in got] == [first[2], *run, first[0]]


def test_a_snapshot_holds_where_bodies_are_and_restores_runs_that_read_them() -> None:
    sh = Shell()
    ids = sh.put(50)
    sh.run(c.Take(max=5))
    sh.run(c.Delete(ids[20], None))
    data = encode_snapshot(snapshot(sh.state))
    assert b"m30" not in data  # the bodies stayed in the log
    restored = sh.spilling(restore(decode_snapshot(data)))
    assert (restored.spilled, restored.n_ready, restored.n_reserved, restored.total) == (
        44,
        44,
        5,
        49,
    )
    sh.state = restored
    got = sh.run(c.Take(max=100))
    assert [d.id for d in got] == [i for n, i in enumerate(ids[5:], 5) if n != 20]
    assert got[-1].body == b"m49"


def test_an_unplaced_run_keeps_its_bodies_in_the_snapshot() -> None:
    sh = Shell()
    _events, _ = execute(sh.state, c.Put([c.NewMessage(body=b"inline")]), sh.now, sh.ids)
    snap = snapshot(sh.state)
    assert snap.runs[0].place is None
    assert snap.runs[0].bodies == [b"inline"]
    restored = restore(decode_snapshot(encode_snapshot(snap)))
    [d] = execute(restored, c.Take(max=1), sh.now, sh.ids)[1]
    assert d.body == b"inline"


def test_retention_ends_a_run_with_its_materialized_messages() -> None:
    sh = Shell(retention_ms=60_000)
    sh.put(10)
    sh.run(c.Take(max=3, visibility_timeout_ms=120_000))
    sh.now += 60_000
    stats = sh.run(c.Stats())
    assert (stats.total, stats.expired, stats.ready, stats.reserved) == (0, 10, 0, 0)
    assert sh.state.spilled == 0
    assert not sh.state.messages


def test_purge_drops_runs() -> None:
    sh = Shell()
    sh.put(10)
    sh.run(c.Take(max=2))
    assert sh.run(c.Purge()) == 10
    stats = sh.run(c.Stats())
    assert (stats.total, stats.ready, stats.purged) == (0, 0, 10)
    assert sh.state.runs == []


def test_an_ack_of_a_message_never_taken_is_a_stale_lease_not_an_unknown_id() -> None:
    sh = Shell()
    ids = sh.put(3)
    [r] = sh.run(c.Ack([c.LeaseRef(ids[1], "1")]))
    assert r.status == "stale_lease"
    [r] = sh.run(c.Ack([c.LeaseRef("999999", "1")]))
    assert r.status == "not_found"


def test_browse_lists_spilled_messages_in_key_order_across_pages() -> None:
    sh = Shell()
    ids = sh.put(7)
    seen: list[str] = []
    after = None
    while True:
        page = sh.run(c.Browse("ready", 3, after))
        seen += [v.id for v in page.messages]
        after = page.next
        if after is None:
            break
    assert seen == ids
    assert not sh.state.messages


def spread_put(sh: Shell, delays_ms: list[int]) -> list[str]:
    """A put whose messages are each due at a time of their own."""
    msgs = [c.NewMessage(body=b"s%d" % i, delay_ms=d) for i, d in enumerate(delays_ms)]
    return [r.id for r in sh.run(c.Put(msgs))]  # type: ignore[attr-defined]


def test_a_put_of_messages_each_due_at_its_own_time_is_one_spread_run() -> None:
    sh = Shell()
    ids = spread_put(sh, [3000, 1000, 2000, 1000])
    s = sh.state
    [run] = s.by_id
    assert (run.acts is not None, run.act, len(s.messages)) == (True, T0 + 1000, 0)
    assert (s.deferred, s.n_delayed, s.total) == (4, 4, 4)
    # 4 bytes a time (from the first, T0 + 1000) and 2 a place in the time order
    assert (run.acts.typecode, run.order.typecode, run.base) == ("I", "H", T0 + 1000)  # type: ignore[union-attr]
    assert list(run.acts) == [2000, 0, 1000, 0]  # type: ignore[arg-type]
    assert sh.run(c.Peek(ids[0])).activate_at_ms == T0 + 3000  # type: ignore[attr-defined]
    assert s.next_due_ms() == T0 + 1000
    sh.now += 1000  # the two due at T0 + 1000 wake, as ready messages; the run waits on
    assert [d.id for d in sh.run(c.Take(max=10))] == [ids[1], ids[3]]
    assert (s.deferred, s.n_delayed, s.n_reserved, run.act) == (2, 2, 2, T0 + 2000)
    assert s.next_due_ms() == T0 + 2000
    sh.now += 2000
    got = sh.run(c.Take(max=10))
    assert [d.id for d in got] == [ids[2], ids[0]]
    assert [d.body for d in got] == [b"s2", b"s0"]
    assert (s.deferred, s.n_delayed, run.left) == (0, 0, 0)


def test_a_spread_run_waits_on_past_slots_changed_before_their_time() -> None:
    sh = Shell()
    ids = spread_put(sh, [1000, 2000, 3000])
    sh.run(c.Update(id=ids[0], delay_ms=5000))  # the first due, moved later: out of the run
    sh.run(c.Delete(ids[1], None))
    s = sh.state
    # the moved one is back in a (scattered) return run of the put's
    assert (s.deferred, s.n_delayed, s.total, len(s.messages)) == (2, 2, 2, 0)
    assert s.next_due_ms() == T0 + 1000  # early is allowed (a stale entry), never late
    sh.now += 3000
    assert [d.id for d in sh.run(c.Take(max=10))] == [ids[2]]
    sh.now += 2000
    assert [d.id for d in sh.run(c.Take(max=10))] == [ids[0]]


def test_browse_lists_spread_runs_slot_by_slot_in_activation_order() -> None:
    sh = Shell()
    a = spread_put(sh, [5000, 1000, 3000])
    b = spread_put(sh, [2000, 4000])
    uniform = sh.put(2, delay_ms=3000)
    want = [a[1], b[0], a[2], *uniform, b[1], a[0]]
    pages = [sh.run(c.Browse(state="delayed", limit=2))]
    while pages[-1].next is not None:  # type: ignore[attr-defined]
        pages.append(sh.run(c.Browse(state="delayed", limit=2, after=pages[-1].next)))  # type: ignore[attr-defined]
    assert [m.id for p in pages for m in p.messages] == want  # type: ignore[attr-defined]
    assert [m.activate_at_ms for p in pages for m in p.messages][:2] == [T0 + 1000, T0 + 2000]  # type: ignore[attr-defined]


def test_bodies_of_64_kib_or_more_keep_their_lengths_in_4_bytes() -> None:
    sh = Shell(max_message_bytes=256 * 1024)
    big = b"x" * (1 << 16)
    sh.run(c.Put([c.NewMessage(body=b"small"), c.NewMessage(body=big)]))
    [run] = sh.state.runs
    assert (run.lengths.typecode, list(run.lengths), run.size) == ("I", [5, 1 << 16], 65541)
    restored = restore(decode_snapshot(encode_snapshot(snapshot(sh.state))))
    assert list(restored.runs[0].lengths) == [5, 1 << 16]
    got = sh.run(c.Take(max=2))
    assert [d.body for d in got] == [b"small", big]  # type: ignore[attr-defined]


def test_a_snapshot_of_a_spread_run_half_woken_restores_what_still_waits() -> None:
    sh = Shell()
    ids = spread_put(sh, [1000, 4000, 2000, 3000])
    sh.now += 2000  # ids[0] and ids[2] woke
    [first] = sh.run(c.Take(max=1))
    assert first.id == ids[0]  # type: ignore[attr-defined]
    data = encode_snapshot(snapshot(sh.state))
    assert b"s1" not in data  # the waiting bodies stayed in the log
    restored = sh.spilling(restore(decode_snapshot(data)))
    [run] = restored.by_id
    assert (run.act, restored.deferred, restored.n_delayed, restored.n_ready) == (
        T0 + 3000,
        2,
        2,
        1,
    )
    assert logical(restored) == logical(sh.state)
    sh.state = restored
    assert [d.id for d in sh.run(c.Take(max=10))] == [ids[2]]
    sh.now += 2000
    assert [d.id for d in sh.run(c.Take(max=10))] == [ids[3], ids[1]]


def test_a_spread_run_is_restored_from_its_held_form_or_from_the_times_of_older_snapshots() -> None:
    sh = Shell()
    ids = spread_put(sh, [3000, 1000, 2000, 1000, 5000])
    sh.now += 1000
    sh.run(c.Take(max=1))  # ids[1] woke and is taken; ids[3] woke, ready
    sh.run(c.Delete(ids[2]))  # changed before its time
    [record] = snapshot(sh.state).runs
    assert (record.acts, record.base) == (b"", T0 + 1000)
    assert (len(record.times), len(record.order)) == (4 * 5, 2 * 5)  # as held: no sort
    older = msgspec.structs.replace(
        record,
        base=0,
        times=b"",
        order=b"",
        acts=b"".join((T0 + d).to_bytes(8, "little") for d in [3000, 1000, 2000, 1000, 5000]),
    )  # what a snapshot held before base, times and order were appended
    for r in (record, older):
        run = Run.from_record(r)
        assert [run.act_of(i) for i in range(5)] == [T0 + d for d in (3000, 1000, 2000, 1000, 5000)]
        assert (run.act, list(run.spilled_by_time())) == (T0 + 3000, [0, 4])
        assert run.due_slots(T0 + 4000) == [0]


def test_a_spread_run_over_more_than_49_days_keeps_its_times_in_8_bytes() -> None:
    sh = Shell(retention_ms=100 * 86_400_000)
    day = 86_400_000
    ids = spread_put(sh, [60 * day, 1000, 50 * day])
    [run] = sh.state.by_id
    assert (run.acts.typecode, run.base) == ("q", T0 + 1000)  # type: ignore[union-attr]
    assert sh.run(c.Peek(ids[0])).activate_at_ms == T0 + 60 * day  # type: ignore[attr-defined]
    restored = restore(decode_snapshot(encode_snapshot(snapshot(sh.state))))
    assert [restored.by_id[0].act_of(i) for i in range(3)] == [
        T0 + 60 * day,
        T0 + 1000,
        T0 + 50 * day,
    ]
    sh.now += 50 * day
    assert [d.id for d in sh.run(c.Take(max=10))] == [ids[1], ids[2]]


@pytest.mark.parametrize("n", [1, 1000])
def test_a_placed_run_costs_about_two_bytes_a_message(n: int) -> None:
    sh = Shell()
    sh.put(n)
    run = sh.state.runs[0]
    assert run.lengths.itemsize * len(run.lengths) == 2 * n
    assert not sh.state.messages
    assert sh.state.n_ready == n


def test_acked_messages_are_not_kept_by_runs_behind_one_still_alive() -> None:
    sh = Shell()
    for _ in range(20):
        sh.put(1000)
    sh.now += 10  # a release now puts it after every run
    [first] = sh.run(c.Take(max=1))
    sh.run(c.Release([c.ReleaseItem(id=first.id, lease=first.lease)]))  # alive, in run 1
    acked = 0
    while got := [d for d in sh.run(c.Take(max=1000)) if d.id != first.id]:
        sh.run(c.Ack([c.LeaseRef(d.id, d.lease) for d in got]))  # all but the first
        acked += len(got)
    assert acked == 19_999
    kept = sum(len(r.mat) for r in sh.state.arrivals if isinstance(r, Run))
    assert kept < 5_000  # gone ones swept (20k without), whatever the front run holds
    assert sh.state.total == 1


def test_moved_bodies_are_read_from_their_new_place_by_peek_take_update_and_reschedule() -> None:
    sh = Shell()
    ids = sh.put(10)
    other = sh.put(5)
    [first, second] = sh.state.runs
    assert [d.id for d in sh.run(c.Take(max=3))] == ids[:3]
    sh.run(c.Delete(ids[5]))  # out of order: slot 5 leaves the run
    before = logical(sh.state)
    events, moved = execute(sh.state, c.MoveBodies([int(ids[0]), int(other[0])]), sh.now, sh.ids)
    assert events == [
        ev.BodiesMoved(
            sh.now,
            [int(ids[0]), int(other[0])],
            [3, 0],
            [[b"m%d" % i for i in range(3, 10)], [b"m%d" % i for i in range(5)]],
        )
    ]
    assert moved == 12
    assert sh.state.unplaced == [first, second]  # for the shell to place again
    sh.state.unplaced.clear()
    sh.log[2], sh.log[3] = moved_contents(events[0], 0), moved_contents(events[0], 1)
    sh.state.place(first, 2)
    sh.state.place(second, 3)
    del sh.log[0], sh.log[1]  # the old segment is gone
    assert logical(sh.state) == before  # nothing a client sees changed
    assert sh.run(c.Peek(ids[4])).body == b"m4"
    with pytest.raises(MessageNotFound):
        sh.run(c.Peek(ids[5]))
    assert sh.run(c.Update(id=ids[6], body=b"new")).body == b"new"
    later = sh.now + 60_000
    assert sh.run(c.Reschedule(id=ids[7], activate_at_ms=later)).body == b"m7"
    got = sh.run(c.Take(max=100))
    assert [(d.id, d.body) for d in got] == [
        (ids[3], b"m3"),
        (ids[4], b"m4"),
        (ids[6], b"new"),
        (ids[8], b"m8"),
        (ids[9], b"m9"),
        *[(other[i], b"m%d" % i) for i in range(5)],
    ]


def test_a_move_skips_runs_that_are_gone_or_not_yet_in_the_log() -> None:
    sh = Shell()
    ids = sh.put(3)
    sh.run(c.Take(max=3))  # the run is taken whole
    events, moved = execute(sh.state, c.MoveBodies([int(ids[0]), 12345]), sh.now, sh.ids)
    assert (events, moved) == ([], 0)
    unplaced = execute(sh.state, c.Put([c.NewMessage(body=b"x")]), sh.now, sh.ids)[1]
    assert sh.state.unplaced  # written, not yet durable
    events, moved = execute(sh.state, c.MoveBodies([int(unplaced[0].id)]), sh.now, sh.ids)
    assert (events, moved) == ([], 0)


def test_replaying_a_move_gives_the_state_that_moved() -> None:
    sh = Shell()
    ids = sh.put(6)
    sh.run(c.Take(max=2))
    events, _ = execute(sh.state, c.MoveBodies([int(ids[0])]), sh.now, sh.ids)
    replayed = QueueState()
    replayed.spill, replayed.run_min_put = True, 1
    for e in sh.events:
        replayed.apply(e)
    replayed.apply(events[0])
    assert logical(replayed) == logical(sh.state)
    assert replayed.unplaced[-1].id == int(ids[0])  # placed again by the replaying shell


def test_small_puts_are_runs_only_in_a_deep_queue() -> None:
    """By default a put of fewer than RUN_MIN_PUT messages stays messages while the queue is
    shallow (taken soon, from memory), and is a run once RUN_DEPTH messages are ready."""
    sh = Shell()
    s = sh.state
    s.run_min_put = RUN_MIN_PUT
    [small] = sh.put(1)
    assert (len(s.runs), len(s.messages)) == (0, 1)
    sh.put(RUN_MIN_PUT)
    assert (len(s.runs), s.spilled) == (1, RUN_MIN_PUT)
    for _ in range(RUN_DEPTH // 1000):
        sh.run(c.Put([c.NewMessage(body=b"x")] * 1000))
    [deep] = sh.put(1)
    assert (s.runs[-1].count, s.runs[-1].id) == (1, int(deep))
    assert int(deep) not in s.messages
    # taken in put order, across both
    got = sh.run(c.Take(max=2))
    assert [d.id for d in got][:1] == [small]  # type: ignore[attr-defined]


def calls_to(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[object]:
    """``owner.name`` (a function of one argument) made to note each call's argument before
    it runs, for the test's length; the list of them."""
    seen: list[object] = []
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda arg: seen.append(arg) or real(arg))
    return seen


def test_gone_materialized_messages_are_swept_from_the_runs_holding_any_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message taken out of a run stays listed by it (``Run.mat``) until the state sweeps
    the gone ones, every ``_COMPACT_SLACK`` taken: in the runs listed as holding any
    (``mat_runs``), never in the runs deferred for days beside them (at 100M deferred, 100k
    runs visited made each sweep ~10 ms: take-100 p99 16 ms during a mass activation)."""
    monkeypatch.setattr(state_module, "_COMPACT_SLACK", 16)
    sweeps = calls_to(monkeypatch, QueueState, "_sweep_mats")
    sh = Shell()
    for _ in range(50):
        sh.put(20, delay_ms=86_400_000)
    deferred = {id(run) for run in sh.state.by_id}
    for _ in range(10):
        sh.put(20)
    for _ in range(20):
        got = sh.run(c.Take(max=10))
        sh.run(c.Ack([c.LeaseRef(d.id, d.lease) for d in got]))  # type: ignore[attr-defined]
        s = sh.state
        listed = {id(run) for run in s.mat_runs}
        assert not listed & deferred  # never listed: nothing was taken out of them
        assert all(id(run) in listed for run in s.by_id if run.mat)
        assert s.in_mats <= 2 * len(s.messages) + 16  # swept as it grows
    assert len(sweeps) >= 5
    assert sh.run(c.Stats()).delayed == 1000  # type: ignore[attr-defined]
    assert sh.run(c.Stats()).total == 1000  # type: ignore[attr-defined]
