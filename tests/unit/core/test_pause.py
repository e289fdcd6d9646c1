"""Pausing a queue (issue 36) in the pure engine: a paused queue's takes hand out nothing,
every other command goes on, and the state is an event of its own, so it survives replay,
snapshots and a change of settings."""

from __future__ import annotations

import pytest

from actors.core import commands as c
from actors.core import events as ev
from actors.core.snapshot import decode_snapshot, encode_snapshot, restore, snapshot
from actors.errors import BadRequest
from actors.settings import QueueSettings
from tests.unit.core.test_decide import T1, T2, Q, nm


def test_a_paused_queue_takes_nothing_and_a_resumed_one_hands_out_in_order() -> None:
    q = Q()
    q.put(T1, b"a", b"b")
    events, paused = q.run(c.Pause(True), T1)
    assert (events, paused) == ([ev.QueuePaused(T1, True)], True)
    assert q.take(T2, max=10) == []
    assert q.stats(T2).paused is True
    assert q.stats(T2).ready == 2  # nothing taken, nothing lost
    events, paused = q.run(c.Pause(False), T2)
    assert (events, paused) == ([ev.QueuePaused(T2, False)], False)
    assert [d.body for d in q.take(T2, max=10)] == [b"a", b"b"]
    assert q.stats(T2).paused is False


def test_pausing_twice_writes_one_event_and_resuming_an_unpaused_queue_none() -> None:
    q = Q()
    assert q.run(c.Pause(False), T1) == ([], False)
    assert q.run(c.Pause(True), T1)[0] == [ev.QueuePaused(T1, True)]
    assert q.run(c.Pause(True), T2) == ([], True)


def test_a_paused_queue_accepts_puts_acks_releases_and_leases_run_out() -> None:
    q = Q()
    q.put(T1, b"a", b"b", nm(b"later", delay_ms=5_000))
    [a, b] = q.take(T1, max=2)
    q.run(c.Pause(True), T1)
    assert q.put(T2, b"c") == ["4"]
    assert q.ack(T2, (a.id, a.lease)) == ["ok"]
    assert q.release(T2, b.id, b.lease) == ["ok"]
    later = T1 + 60_000  # the delayed message became ready meanwhile
    stats = q.stats(later)
    assert (stats.ready, stats.reserved, stats.delayed, stats.acked) == (3, 0, 0, 1)
    assert q.take(later, max=10) == []
    q.run(c.Pause(False), later)
    assert sorted(d.body for d in q.take(later, max=10)) == [b"b", b"c", b"later"]


def test_a_retried_take_gets_what_its_first_try_took_even_once_paused() -> None:
    q = Q()
    q.put(T1, b"a")
    first = q.run(c.Take(1, attempt="try-1"), T1)[1]
    q.run(c.Pause(True), T1)
    again = q.run(c.Take(1, attempt="try-1"), T2)[1]
    assert [(d.id, d.lease) for d in again] == [(d.id, d.lease) for d in first]
    assert q.run(c.Take(1, attempt="try-2"), T2)[1] == []


def test_a_move_task_takes_from_a_paused_queue() -> None:
    """An operator's redrive of a paused dead-letter queue still moves its messages."""
    q = Q()
    q.put(T1, b"a")
    q.run(c.Pause(True), T1)
    assert q.run(c.Take(1), T2)[1] == []
    assert [d.body for d in q.run(c.Take(1, mover=True), T2)[1]] == [b"a"]


def test_the_pause_survives_a_snapshot_replay_and_a_change_of_settings() -> None:
    q = Q()
    q.put(T1, b"a")
    q.run(c.Pause(True), T1)
    q.run(c.ChangeSettings(QueueSettings(visibility_timeout_ms=5_000)), T2)
    assert q.state.paused is True  # settings are not the pause: replacing them keeps it
    restored = restore(decode_snapshot(encode_snapshot(snapshot(q.state))))
    assert restored.paused is True
    assert q.replayed().paused is True
    q.run(c.Pause(False), T2)
    assert restore(decode_snapshot(encode_snapshot(snapshot(q.state)))).paused is False


def test_a_deleted_and_created_again_queue_is_not_paused() -> None:
    q = Q()
    q.run(c.Pause(True), T1)
    q.run(c.Drop(), T1)
    q.run(c.Create("q", QueueSettings()), T2)
    assert q.state.paused is False


@pytest.mark.parametrize("paused", [1, "yes", None])
def test_paused_must_be_a_boolean(paused: object) -> None:
    Q().fails(c.Pause(paused), T1, BadRequest)  # type: ignore[arg-type]
