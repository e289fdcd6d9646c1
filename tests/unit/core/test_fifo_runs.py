"""FIFO runs: a FIFO queue's ready put is one run too; each group holds its members still
in runs as sequence numbers (``Group.rest``) and only its head, and what is in flight, as
messages. The model test (test_model.py, the sixth walk and the spilling machine's FIFO
queues) checks that nothing a client sees changes; these check the representation."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from actors.core import commands as c
from actors.core import state as state_module
from actors.core.decide import execute
from actors.core.runs import RunRecord, group_names, pack_names
from actors.core.snapshot import decode_snapshot, encode_snapshot, logical, restore, snapshot
from actors.core.state import QueueState
from actors.errors import DataError
from tests.unit.core.test_runs import Shell, calls_to

GROUPS = 10


def fifo() -> Shell:
    return Shell("q.fifo", fifo=True)


def put(sh: Shell, n: int, groups: int = GROUPS) -> list[str]:
    """``n`` messages, message ``i`` in group ``g<i % groups>``; their ids."""
    news = [c.NewMessage(body=b"m%d" % i, group=f"g{i % groups}") for i in range(n)]
    return [r.id for r in sh.run(c.Put(news))]  # type: ignore[attr-defined]


def put_news(sh: Shell, news: list[c.NewMessage]) -> list[str]:
    return [r.id for r in sh.run(c.Put(news))]  # type: ignore[attr-defined]


def restored(sh: Shell) -> QueueState:
    return sh.spilling(restore(decode_snapshot(encode_snapshot(snapshot(sh.state)))))


def test_a_fifo_put_is_one_run_and_only_each_groups_head_is_a_message() -> None:
    sh = fifo()
    ids = put(sh, 1000)
    s = sh.state
    assert (len(s.by_id), s.grouped, len(s.messages), s.n_ready) == (1, 990, 10, 1000)
    assert sorted(str(m.id) for m in s.messages.values()) == sorted(ids[:GROUPS])  # the heads
    assert not s.runs  # take reaches a FIFO run through its groups' heads, not in put order
    assert {len(g.rest) - g.start for g in s.groups.values()} == {99}
    stats = sh.run(c.Stats())
    assert (stats.ready, stats.total) == (1000, 1000)
    view = sh.run(c.Peek(ids[555]))
    assert (view.body, view.state) == (b"m555", "ready")
    assert len(s.messages) == 10  # reading materializes nothing


def test_a_take_hands_out_a_stretch_of_one_group_in_order_and_acks_bring_the_next_head() -> None:
    sh = fifo()
    ids = put(sh, 1000)
    taken = sh.run(c.Take(max=5))
    # the oldest head's group, in order: g0's members are ids 0, 10, 20, ...
    assert [d.id for d in taken] == ids[0:50:10]
    assert [d.body for d in taken] == [b"m%d" % i for i in range(0, 50, 10)]
    s = sh.state
    assert s.grouped == 990 - 4  # the four behind the head left the run as they were taken
    assert sh.run(c.Ack([c.LeaseRef(d.id, d.lease) for d in taken])) is not None
    again = sh.run(c.Take(max=1000))
    # every group once more, each from where it stands: g0 from its sixth member
    g0 = [d.id for d in again if d.id in ids[0::10]]
    assert g0 == ids[50::10]
    assert len(again) == 995
    assert s.grouped == 0


def test_a_member_changed_out_of_turn_keeps_its_place_in_the_group() -> None:
    sh = fifo()
    ids = put(sh, 100)
    deep = ids[50]  # g0's sixth member
    assert sh.run(c.Update(id=deep, body=b"changed")) is not None
    sh.run(c.Delete(ids[30]))  # g0's fourth
    s = sh.state
    assert s.total == 99
    assert int(deep) not in s.messages  # its body changed in its run (Run.patches)
    taken = sh.run(c.Take(max=9))
    assert [d.id for d in taken] == [ids[i] for i in (0, 10, 20, 40, 50, 60, 70, 80, 90)]
    assert taken[4].body == b"changed"


def test_a_snapshot_holds_the_groups_in_their_runs_and_a_restore_takes_the_same() -> None:
    sh = fifo()
    put(sh, 300)
    sh.run(c.Take(max=7))
    state = restored(sh)
    assert logical(state) == logical(sh.state)
    assert (state.grouped, len(state.messages)) == (sh.state.grouped, len(sh.state.messages))
    take = c.Take(max=50)
    _, mine = execute(sh.state, take, sh.now, sh.ids)
    _, theirs = execute(state, take, sh.now, sh.ids)
    assert [d.id for d in theirs] == [d.id for d in mine]  # type: ignore[attr-defined]


@pytest.mark.parametrize("chunk", [1, 7, 1 << 23])
def test_a_restore_sorts_every_runs_slots_into_their_groups_in_order(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore sorts the slots of a chunk of runs into their groups at once (numpy): each
    group's ``rest`` is what the live state's holds, whatever the chunks, runs with slots
    taken out of turn among them, and the runs share the groups' names."""
    from actors.core import snapshot as snapshot_module

    monkeypatch.setattr(snapshot_module, "_CHUNK", chunk)
    sh = fifo()
    ids = put(sh, 300)
    put(sh, 90, groups=7)  # groups of another put's table, some new (g7, g8, g9 shared)
    put(sh, 40, groups=13)
    sh.run(c.Take(max=5))
    sh.run(c.Delete(ids[150]))  # slots out of turn: the run's ``out``
    sh.run(c.Update(id=ids[270], body=b"moved"))
    assert sh.state.total == 300 + 90 + 40 - 1
    assert any(run.out for run in sh.state.by_id)
    state = restored(sh)

    def rests(s: QueueState) -> dict[str | None, list[int]]:
        """Each group's members still in runs (the live state passes over ones that left)."""
        held = {
            name: [seq for seq in g.rest[g.start :] if s._grouped_slot(seq) is not None]
            for name, g in s.groups.items()
        }
        return {name: seqs for name, seqs in held.items() if seqs}

    live = rests(sh.state)
    assert rests(state) == live
    assert sum(map(len, live.values())) == state.grouped
    assert len(live) == 13
    names = {id(g.name) for g in state.groups.values()}
    assert all(id(name) in names for run in state.by_id for name in run.gnames or ())
    take = c.Take(max=1000)
    _, mine = execute(sh.state, take, sh.now, sh.ids)
    _, theirs = execute(state, take, sh.now, sh.ids)
    assert [d.id for d in theirs] == [d.id for d in mine]  # type: ignore[attr-defined]


def test_a_restored_group_whose_head_is_still_in_a_run_gets_it_at_the_first_advance() -> None:
    sh = fifo()
    ids = put(sh, 40, groups=2)
    snap = snapshot(sh.state)
    # a snapshot holding every member in the run (as none writes: heads are messages)
    [record] = snap.runs
    record = msgspec.structs.replace(record, next=0, out=[])
    snap = msgspec.structs.replace(snap, messages=[], runs=[record])
    state = sh.spilling(restore(decode_snapshot(encode_snapshot(snap))))
    assert state.unheaded
    state.advance(sh.now)
    assert not state.unheaded
    assert sorted(str(m.id) for m in state.messages.values()) == sorted(ids[:2])
    sh.state = state
    assert [d.id for d in sh.run(c.Take(max=3))] == ids[0:6:2]


def test_retention_ends_a_fifo_run_and_its_groups_with_it() -> None:
    sh = Shell("q.fifo", fifo=True, retention_ms=60_000)
    put(sh, 100)
    sh.run(c.Take(max=3))
    sh.now += 61_000
    stats = sh.run(c.Stats())
    s = sh.state
    assert (stats.total, s.grouped, len(s.messages), len(s.groups)) == (0, 0, 0, 0)
    ids = put(sh, 20)  # the groups start again
    assert [d.id for d in sh.run(c.Take(max=2))] == [ids[0], ids[10]]


def test_unspilling_a_fifo_queue_keeps_every_group_in_order() -> None:
    sh = fifo()
    ids = put(sh, 200)
    before = logical(sh.state)
    sh.state.unspill_all()
    s = sh.state
    assert (s.grouped, len(s.messages), s.by_id) == (0, 200, [])
    assert logical(s) == before
    assert [d.id for d in sh.run(c.Take(max=3))] == ids[0:30:10]


def test_a_damaged_group_table_is_refused() -> None:
    sh = fifo()
    put(sh, 20)
    [record] = snapshot(sh.state).runs
    for bad in (
        msgspec.structs.replace(record, group_of=record.group_of[:-2]),
        msgspec.structs.replace(record, groups=record.groups[:3]),  # a name cut short
        msgspec.structs.replace(record, groups=pack_names(["g0"])),  # too few names
    ):
        assert isinstance(bad, RunRecord)
        assert bad.malformed() is not None
        snap = msgspec.structs.replace(snapshot(sh.state), runs=[bad])
        with pytest.raises(DataError):
            decode_snapshot(encode_snapshot(snap))


def test_group_names_are_packed_into_one_bytes_object_and_back() -> None:
    names = ["g1", "é-tenant", "x" * 128, "with\nnewline"]
    assert group_names(pack_names(names)) == names
    assert group_names(b"") is None
    assert group_names(pack_names(names)[:-1]) is None  # cut short
    assert group_names(b"\x91\xa2\xff\xfe") is None  # not UTF-8
    assert group_names(b"\x91\x05") is None  # not a name


def test_a_restore_keeps_no_group_whose_members_all_left() -> None:
    """Found by review: a run's table names a group whose members it held have all left;
    a restore made that group again, empty, for good (Stats.groups counted it)."""
    sh = fifo()
    news = [c.NewMessage(body=b"a", group="A"), c.NewMessage(body=b"b", group="B")]
    ids = put_news(sh, [*news, c.NewMessage(body=b"a2", group="A")])
    taken = [*sh.run(c.Take(max=10)), *sh.run(c.Take(max=10))]  # A's stretch, then B
    [b] = [d for d in taken if d.id == ids[1]]
    sh.run(c.Ack([c.LeaseRef(b.id, b.lease)]))
    assert sh.run(c.Stats()).groups == 1
    sh.state = restored(sh)
    assert sorted(sh.state.groups) == ["A"]
    assert sh.run(c.Stats()).groups == 1


@pytest.mark.parametrize("spill", [True, False])
def test_a_state_rebuilt_from_its_log_hands_out_no_head_of_a_group_in_flight(spill: bool) -> None:
    """Found by review (older than FIFO runs): a rebuilt state kept the ready entry a take
    consumed live; released in the millisecond of its put, the head was ready again with
    that entry's key, and a take handed it out while its group's second was in flight."""
    sh = fifo()
    sh.state.spill = spill
    put_news(sh, [c.NewMessage(body=b"a", group="g"), c.NewMessage(body=b"b", group="g")])
    first, _ = sh.run(c.Take(max=2))
    rebuilt = sh.spilling(QueueState())
    rebuilt.spill = spill
    for event in sh.events:
        rebuilt.apply(event)
    sh.state = rebuilt
    sh.run(c.Release([c.ReleaseItem(id=first.id, lease=first.lease)]))
    assert sh.run(c.Take(max=10)) == []  # the group's second is still in flight


def test_members_deleted_out_of_turn_leave_neither_objects_nor_numbers_behind() -> None:
    """Found by review: each member deleted behind the head stayed in its group as a gone
    object until the head reached it (8,001 objects for one message left), and each was
    cut out of ``rest`` by moving what followed it."""
    sh = fifo()
    ids = put(sh, 1000, groups=1)
    for mid in reversed(ids[1:]):
        sh.run(c.Delete(mid))
    [group] = sh.state.groups.values()
    assert len(group.msgs) < 200  # swept: not 1,000 gone ones
    assert sh.state.total == 1
    assert [d.id for d in sh.run(c.Take(max=10))] == ids[:1]


def test_a_fifo_queue_with_a_delay_holds_its_puts_as_runs_until_they_are_due() -> None:
    """An SQS FIFO queue's DelaySeconds delays every message of a put alike: the put is one
    run, waiting; its members are in their groups at once (a group's order is put order),
    delayed; only each group's head is a message (in the delayed heap); at the time the
    whole run is ready, and takes hand out each group's stretch in order."""
    sh = Shell("q.fifo", fifo=True, delay_ms=30_000)
    first = put(sh, 100)
    sh.now += 10_000
    second = put(sh, 100)  # due 10 s after the first
    s = sh.state
    assert (len(s.by_id), s.grouped, len(s.messages)) == (2, 190, 10)  # 10 heads, delayed
    stats = sh.run(c.Stats())
    assert (stats.ready, stats.delayed, stats.total) == (0, 200, 200)
    page = sh.run(c.Browse(state="delayed", limit=15))
    assert [m.id for m in page.messages] == first[:15]  # type: ignore[attr-defined]
    assert sh.run(c.Browse(state="ready", limit=5)).messages == []  # type: ignore[attr-defined]
    assert sh.run(c.Take(max=10)) == []
    before = logical(s)
    sh.state = restored(sh)
    assert logical(sh.state) == before
    sh.now += 20_000  # the first put is due, the second not yet
    assert sh.run(c.Stats()).ready == 100  # type: ignore[attr-defined]
    got = sh.run(c.Take(max=10))
    assert [d.id for d in got] == first[0:100:10]  # g0's members of the first put only
    sh.run(c.Ack([c.LeaseRef(d.id, d.lease) for d in got]))
    sh.now += 10_000
    assert sh.run(c.Stats()).ready == 190  # type: ignore[attr-defined]
    order: dict[str, list[str]] = {}
    while got := sh.run(c.Take(max=10)):
        for d in got:
            order.setdefault(d.group, []).append(d.id)  # type: ignore[attr-defined]
        sh.run(c.Ack([c.LeaseRef(d.id, d.lease) for d in got]))
    want = {f"g{k}": first[k::10] + second[k::10] for k in range(1, 10)}
    want["g0"] = second[0::10]
    assert order == want  # each group in put order, across the two runs


def test_a_fifo_put_due_later_waits_behind_a_ready_head_of_its_group() -> None:
    sh = fifo()
    ready = put(sh, 2, groups=1)
    later = put_news(
        sh, [c.NewMessage(body=b"d%d" % i, group="g0", delay_ms=5_000) for i in range(3)]
    )
    assert [d.id for d in sh.run(c.Take(max=10))] == ready  # the stretch ends at a delayed one
    assert len(sh.state.messages) == 2
    sh.now += 5_000
    taken_again = sh.run(c.Take(max=10))
    assert taken_again == []  # the group is busy: ready's two are in flight
    sh.now += 30_000  # their leases run out: back, and the group's order holds
    assert [d.id for d in sh.run(c.Take(max=10))] == [*ready, *later]


def test_waiting_fifo_runs_are_not_swept_again_at_every_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A FIFO queue's runs due later wait in ``later`` with their slots counted delayed (not
    in ``deferred``): the sweep of ``later``'s stale entries weighs them against the
    delayed messages, so live waiting runs alone never set it off (against ``deferred``,
    10k of them made every command walk them all: 25 ms a take at 10M)."""
    monkeypatch.setattr(state_module, "_COMPACT_SLACK", 16)
    seen = calls_to(monkeypatch, state_module, "_waits")
    sh = fifo()
    for _ in range(60):
        put_news(sh, [c.NewMessage(body=b"m", group=f"g{i}", delay_ms=3_600_000) for i in range(3)])
    assert len(sh.state.later) == 60
    seen.clear()
    for _ in range(20):
        sh.run(c.Stats())
        sh.run(c.Take(max=10))
    assert len(seen) < 60  # not a sweep of the 60 waiting runs a command
    assert sh.run(c.Stats()).delayed == 180  # type: ignore[attr-defined]


def spread_fifo(sh: Shell, n: int, groups: int, delay: Callable[[int], int]) -> list[str]:
    """``n`` messages, message ``i`` in group ``g<i % groups>``, due ``delay(i)`` ms on."""
    news = [
        c.NewMessage(body=b"m%d" % i, group=f"g{i % groups}", delay_ms=delay(i)) for i in range(n)
    ]
    return put_news(sh, news)


def test_a_fifo_put_each_message_due_at_its_own_time_is_one_run_its_slots_ready_in_place() -> None:
    """A FIFO put whose messages are each due at a later time of their own is one spread
    run: its members join their groups at the put, only the heads are messages; a slot whose
    time came is ready where it stands (a take's stretch reaches it), one still to come
    stops the stretch. A snapshot restores which are which; retention ends the lot."""
    sh = Shell("q.fifo", fifo=True, retention_ms=60_000)
    # g0: due at 3, 1, 2 s (in put order); g1: 1, 2, 3 s
    times = [3000, 1000, 1000, 2000, 2000, 3000]
    ids = spread_fifo(sh, 6, 2, times.__getitem__)
    s = sh.state
    assert (len(s.by_id), s.grouped, len(s.messages)) == (1, 4, 2)  # one run, two heads
    assert s.by_id[0].acts is not None
    assert s.by_id[0].gnames == ["g0", "g1"]
    stats = sh.run(c.Stats())
    assert (stats.ready, stats.delayed) == (0, 6)  # type: ignore[attr-defined]
    sh.now += 1000  # g1's head and g0's second are due: only g1's head can go
    stats = sh.run(c.Stats())
    assert (stats.ready, stats.delayed) == (2, 4)  # type: ignore[attr-defined]
    page = sh.run(c.Browse(state="ready", limit=10))
    assert [m.id for m in page.messages] == [ids[1], ids[2]]  # type: ignore[attr-defined]
    page = sh.run(c.Browse(state="delayed", limit=10))
    assert [m.id for m in page.messages] == [ids[3], ids[4], ids[0], ids[5]]  # type: ignore[attr-defined]
    assert [d.id for d in sh.run(c.Take(max=10))] == [ids[1]]  # g1's next is due at 2 s
    before = logical(s)
    sh.state = restored(sh)  # half woken: what is reached stays ready in the run
    assert logical(sh.state) == before
    assert sh.state.grouped == 4
    assert sh.state.by_id[0].unreached() == 3
    sh.now += 2000  # everything due; g1 is busy until its lease runs out
    got = sh.run(c.Take(max=10))
    assert [d.id for d in got] == [ids[0], ids[2], ids[4]]  # g0 in put order, all ready
    assert sh.state.grouped == 2  # g1: ids 3 and 5
    assert not sh.state.by_id[0].waiting
    sh.now += 60_000  # past retention
    sh.run(c.Stats())
    assert (sh.state.total, sh.state.n_ready, sh.state.n_delayed) == (0, 0, 0)


def test_a_spread_fifo_run_restored_at_every_step_counts_what_is_ready_and_what_waits() -> None:
    """A restore between any two of its times holds the same queue (its counts, its
    groups, what a take would hand out) as the state it was taken from."""
    for step in range(0, 6000, 500):
        sh = fifo()
        spread_fifo(sh, 40, 4, lambda i: 1000 + (i * 7919) % 5000)
        sh.now += step
        sh.run(c.Stats())
        live = sh.state
        again = restored(sh)
        assert (again.n_ready, again.n_delayed, again.grouped) == (
            live.n_ready,
            live.n_delayed,
            live.grouped,
        ), step
        assert logical(again) == logical(live)
        sh.state = again
        taken = [d.id for d in sh.run(c.Take(max=40))]
        sh.state = live
        assert [d.id for d in sh.run(c.Take(max=40))] == taken


def test_retention_ends_a_spread_fifo_run_reached_or_not() -> None:
    """Retention ends a spread FIFO run whatever its slots are (times are refused past
    retention, so all were reached by then: counted ready, blocked behind their heads)."""
    sh = Shell("q.fifo", fifo=True, retention_ms=60_000)
    spread_fifo(sh, 8, 2, lambda i: [10, 55, 50, 58, 20, 30, 57, 40][i] * 1000)
    sh.now += 35_000  # three reached (g0's head among them), five to come (g1's head too)
    stats = sh.run(c.Stats())
    assert (stats.ready, stats.delayed) == (3, 5)  # type: ignore[attr-defined]
    assert sh.state.by_id[0].unreached() == 4  # the heads are messages
    sh.state = restored(sh)
    sh.now += 25_000
    stats = sh.run(c.Stats())
    assert (stats.ready, stats.delayed, stats.total) == (0, 0, 0)  # type: ignore[attr-defined]
    assert (sh.state.n_ready, sh.state.n_delayed, sh.state.grouped) == (0, 0, 0)
