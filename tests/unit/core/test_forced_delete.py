"""An admin deletes a reserved message without its lease (issue 36, ``Delete.force``): it
is gone at once, and its lease holder's ack, release and touch are answered ``stale_lease``
(not ``not_found``) until the lease would have ended; replay and snapshots keep that."""

from __future__ import annotations

from actors.core import commands as c
from actors.core import events as ev
from actors.core.snapshot import decode_snapshot, encode_snapshot, restore, snapshot
from actors.errors import Conflict, MessageNotFound
from tests.unit.core.test_decide import T1, T2, VT, Q


def test_a_forced_delete_of_a_reserved_message_makes_its_holder_s_lease_stale() -> None:
    q = Q()
    [mid] = q.put(T1, b"stuck")
    [d] = q.take(T1)
    q.fails(c.Delete(mid), T2, Conflict)  # without force, a reserved one needs its lease
    events, _ = q.run(c.Delete(mid, force=True), T2)
    assert events == [ev.MessagesDeleted(T2, [int(mid)], True)]
    assert q.stats(T2).total == 0
    ref = [c.LeaseRef(d.id, d.lease)]
    assert [r.status for r in q.run(c.Ack(ref), T2)[1]] == ["stale_lease"]
    assert [r.status for r in q.run(c.Ack(ref, lenient=True), T2)[1]] == ["stale_lease"]
    release = c.Release([c.ReleaseItem(id=d.id, lease=d.lease)])
    assert [r.status for r in q.run(release, T2)[1]] == ["stale_lease"]
    touch = c.Touch([c.TouchItem(id=d.id, lease=d.lease)])
    assert [r.status for r in q.run(touch, T2)[1]] == ["stale_lease"]
    for state in (q.replayed(), restore(decode_snapshot(encode_snapshot(snapshot(q.state))))):
        assert state.forced == {mid: T1 + VT}
    # once the lease would have ended, the id is simply unknown
    assert [r.status for r in q.run(c.Ack(ref), T1 + VT + 1)[1]] == ["not_found"]


def test_a_forced_delete_of_a_ready_message_is_a_plain_delete() -> None:
    q = Q()
    [mid] = q.put(T1, b"a")
    events, _ = q.run(c.Delete(mid, force=True), T2)
    assert events == [ev.MessagesDeleted(T2, [int(mid)], False)]
    assert q.state.forced == {}
    q.fails(c.Delete(mid, force=True), T2, MessageNotFound)


def test_forced_entries_are_dropped_once_their_leases_are_over() -> None:
    q = Q()
    a, b = q.put(T1, b"a", b"b")
    q.take(T1, max=2)
    q.run(c.Delete(a, force=True), T2)
    assert set(q.state.forced) == {a}
    q.run(c.ChangeSettings(q.settings), T1 + VT + 5)  # time passes
    [d] = q.take(T1 + VT + 5)  # b came back when its lease ran out
    q.run(c.Delete(d.id, force=True), T1 + VT + 6)
    assert set(q.state.forced) == {b}  # a's entry went with its lease
