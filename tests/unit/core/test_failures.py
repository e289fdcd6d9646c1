"""Why a message failed (issue 36): a release may say why; the message keeps its last five
reasons with their times (the ``evq.failures`` attribute), shown by peek and browse, kept by
snapshots and replay, and carried into the dead-letter queue. A message of a run released
with a reason stays an object (its slot in the run cannot hold the reasons)."""

from __future__ import annotations

import pytest

from actors.core import commands as c
from actors.core import events as ev
from actors.core.snapshot import decode_snapshot, encode_snapshot, restore, snapshot
from actors.errors import BadRequest
from actors.settings import QueueSettings
from tests.unit.core.test_decide import T1, T2, Q
from tests.unit.core.test_runs import Shell


def fail(q: Q, now: int, reason: str | None) -> str:
    [d] = q.take(now)
    item = c.ReleaseItem(id=d.id, lease=d.lease, reason=reason)
    events, [result] = q.run(c.Release([item]), now)
    assert [e.reasons for e in events] == [None if reason is None else [reason]]  # type: ignore[attr-defined]
    return result.status


def test_a_message_keeps_its_last_five_reasons_with_their_times() -> None:
    q = Q()
    [mid] = q.put(T1, b"job")
    for n in range(7):
        assert fail(q, T1 + n, f"timeout {n}") == "ok"
    assert fail(q, T2, None) == "ok"  # a release that says nothing adds nothing
    view = q.peek(T2, mid)
    assert view.attributes == {ev.FAILURES: [[T1 + n, f"timeout {n}"] for n in range(2, 7)]}
    assert view.receive_count == 8
    assert q.replayed().messages[int(mid)].attributes == view.attributes
    restored = restore(decode_snapshot(encode_snapshot(snapshot(q.state))))
    assert restored.messages[int(mid)].attributes == view.attributes


def test_only_the_messages_released_with_a_reason_keep_one() -> None:
    q = Q()
    a, b = q.put(T1, b"a", b"b")
    da, db = q.take(T1, max=2)
    items = [
        c.ReleaseItem(id=da.id, lease=da.lease, reason="smtp down"),
        c.ReleaseItem(id=db.id, lease=db.lease),
    ]
    events, _ = q.run(c.Release(items), T2)
    assert events == [ev.MessagesReleased(T2, [int(a), int(b)], [T2, T2], ["smtp down", None])]
    assert q.peek(T2, a).attributes == {ev.FAILURES: [[T2, "smtp down"]]}
    assert q.peek(T2, b).attributes is None


@pytest.mark.parametrize("reason", ["x" * 1025, "é" * 513, 7])
def test_a_reason_past_1_kib_or_not_text_is_refused_and_nothing_changes(reason: object) -> None:
    q = Q()
    q.put(T1, b"a")
    [d] = q.take(T1)
    item = c.ReleaseItem(id=d.id, lease=d.lease, reason=reason)  # type: ignore[arg-type]
    q.fails(c.Release([item]), T2, BadRequest)


def test_a_dead_letter_carries_its_reasons_out() -> None:
    q = Q(QueueSettings(max_receives=2, dead_letter_queue="dlq"))
    q.put(T1, b"poison")
    fail(q, T1, "KeyError: 'to'")
    fail(q, T2, "KeyError: 'to'")
    [letter] = q.state.outbox.values()
    assert letter.attributes == {ev.FAILURES: [[T1, "KeyError: 'to'"], [T2, "KeyError: 'to'"]]}


def test_a_run_s_message_released_with_a_reason_stays_an_object_that_keeps_it() -> None:
    sh = Shell()
    ids = sh.put(10)
    taken = sh.run(c.Take(max=10))
    items = [
        c.ReleaseItem(id=d.id, lease=d.lease, delay_ms=5_000, reason="busy" if n == 4 else None)
        for n, d in enumerate(taken)
    ]
    sh.run(c.Release(items))
    s = sh.state
    assert list(s.messages) == [int(ids[4])]  # the nine others went back into the run
    view = sh.run(c.Peek(ids[4]))
    assert view.attributes == {ev.FAILURES: [[sh.now, "busy"]]}  # type: ignore[attr-defined]
    assert view.body == b"m4"  # type: ignore[attr-defined]
    again = sh.spilling(restore(decode_snapshot(encode_snapshot(snapshot(s)))))
    assert again.messages[int(ids[4])].attributes == {ev.FAILURES: [[sh.now, "busy"]]}
