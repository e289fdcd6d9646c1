"""Per-queue limits (issue 36) in the pure engine: ``take_rate`` and ``put_rate`` (messages
a second, a leaky bucket that lets a second's worth go at once) and ``max_in_flight``
(messages reserved at once); settable live; a move task's takes and the dead-letter and
move puts (``redelivery``) are not held by them."""

from __future__ import annotations

import pytest

from actors.core import commands as c
from actors.core.state import allowance, spend
from actors.errors import BadRequest, Overloaded
from actors.settings import QueueSettings
from tests.unit.core.test_decide import T1, Q, nm


def test_a_take_rate_lets_a_second_s_worth_go_then_one_every_tenth_of_a_second() -> None:
    q = Q(QueueSettings(take_rate=10))
    q.put(T1, *[b"m"] * 200)
    assert len(q.take(T1, max=100)) == 10
    assert q.take(T1 + 50, max=100) == []
    assert q.state.take_wait_ms(T1 + 50) == 50
    assert len(q.take(T1 + 100, max=100)) == 1
    assert len(q.take(T1 + 350, max=100)) == 2
    assert len(q.take(T1 + 60_000, max=100)) == 10  # idle for a minute: still one second's
    assert q.replayed().take_tat == q.state.take_tat  # derived from the events alone


def test_a_take_rate_holds_on_average_over_many_takes() -> None:
    q = Q(QueueSettings(take_rate=50))
    q.put(T1, *[b"m"] * 1000)
    got = sum(len(q.take(T1 + t, max=7)) for t in range(0, 10_000, 13))
    assert 50 * 10 <= got <= 50 * 10 + 50  # ten seconds at 50/s, plus the first second's burst


def test_max_in_flight_caps_what_is_reserved_at_once() -> None:
    q = Q(QueueSettings(max_in_flight=3))
    q.put(T1, *[b"m"] * 10)
    taken = q.take(T1, max=10)
    assert len(taken) == 3
    assert q.take(T1, max=10) == []
    assert q.state.take_room(T1) == 0
    q.ack(T1, (taken[0].id, taken[0].lease))
    assert len(q.take(T1, max=10)) == 1


def test_a_put_rate_refuses_puts_past_it_with_when_to_retry() -> None:
    q = Q(QueueSettings(put_rate=5))
    for _ in range(5):
        q.put(T1, b"m")
    error = q.fails(c.Put([nm()]), T1, Overloaded)
    assert error.fields["retry_after_ms"] == 200
    q.put(T1 + 200, b"m")
    q.put(T1 + 10_000, *[b"m"] * 20)  # a batch goes when one may: then the rate catches up
    q.fails(c.Put([nm()]), T1 + 12_000, Overloaded)
    q.put(T1 + 13_200, b"m")  # 4 s of debt from T1 + 10 s, less the second's burst
    assert q.stats(T1 + 13_200).total == 27


def test_moves_and_dead_letters_are_not_held_by_the_limits() -> None:
    q = Q(QueueSettings(take_rate=1, put_rate=1, max_in_flight=1))
    q.put(T1, b"a")
    q.run(c.Put([nm(b"b")], redelivery=True), T1)  # a dead letter routed here
    q.run(c.Put([nm(b"c")], redelivery=True), T1)
    assert len(q.take(T1, max=5)) == 1
    assert len(q.run(c.Take(5, mover=True), T1)[1]) == 2


def test_the_limits_are_set_and_lifted_live() -> None:
    q = Q()
    q.put(T1, *[b"m"] * 10)
    q.run(c.PatchSettings({"max_in_flight": 2}), T1)
    assert len(q.take(T1, max=10)) == 2
    q.run(c.PatchSettings({"max_in_flight": None}), T1)
    assert len(q.take(T1, max=10)) == 8


@pytest.mark.parametrize(
    "changes",
    [{"take_rate": 0}, {"put_rate": 100_001}, {"max_in_flight": 0}, {"take_rate": 1.5}],
)
def test_limits_out_of_range_are_refused(changes: dict[str, object]) -> None:
    Q().fails(c.PatchSettings(changes), T1, BadRequest)


def test_the_bucket_arithmetic() -> None:
    assert allowance(0, 1_000, 100) == 100  # a second's worth at once
    tat = spend(0, 1_000, 100, 100)
    assert tat == 2_000_000
    assert allowance(tat, 1_000, 100) == 0
    assert allowance(tat, 1_010, 100) == 1
    assert allowance(spend(tat, 1_010, 1, 100), 1_010, 100) == 0
