"""The engine's Observer: what it is told about the transitions it makes by itself."""

from __future__ import annotations

from actors.core import events as ev
from actors.core.state import QueuedMessage, QueueState
from actors.settings import QueueSettings

T0 = 1_000_000


class Recorder:
    """An Observer that notes each call with what the message looked like at that moment."""

    def __init__(self, state: QueueState) -> None:
        self.state = state
        self.calls: list[tuple[object, ...]] = []

    def lease_expired(self, m: QueuedMessage) -> None:
        self.calls.append(("lease_expired", m.id, m.deadline_ms, m.id in self.state.messages))

    def retention_expired(self, m: QueuedMessage, at_ms: int) -> None:
        self.calls.append(("retention_expired", m.id, at_ms, m.id in self.state.messages))

    def dead_lettered(self, m: QueuedMessage, lease_deadline_ms: int) -> None:
        self.calls.append(("dead_lettered", m.id, lease_deadline_ms, m.seq in self.state.outbox))

    def made_available(self, m: QueuedMessage) -> None:
        self.calls.append(("made_available", m.id, m.activate_at_ms))


def observed(**settings: object) -> tuple[QueueState, Recorder]:
    state = QueueState()
    recorder = Recorder(state)
    state.observer = recorder
    state.apply(ev.QueueCreated(T0, "q", QueueSettings(**settings)))  # type: ignore[arg-type]
    return state, recorder


def test_time_and_events_tell_the_observer_each_transition_in_order() -> None:
    state, seen = observed(max_receives=2, retention_ms=3_600_000)
    state.apply(ev.MessagesPut(T0, [ev.PutItem(1, b"a", T0 + 500), ev.PutItem(2, b"b", T0)]))
    assert seen.calls == [("made_available", 2, T0)]  # 1 is delayed until T0 + 500
    state.advance(T0 + 500)
    assert seen.calls[-1] == ("made_available", 1, T0 + 500)

    seen.calls.clear()
    state.apply(ev.MessagesTaken(T0 + 600, [1, 2], [11, 12], T0 + 1_600))
    state.advance(T0 + 1_600)  # both leases run out; 1 receive each, so both come back
    assert seen.calls == [
        ("lease_expired", 1, T0 + 1_600, True),
        ("made_available", 1, T0 + 1_600),
        ("lease_expired", 2, T0 + 1_600, True),
        ("made_available", 2, T0 + 1_600),
    ]

    seen.calls.clear()
    state.apply(ev.MessagesTaken(T0 + 2_000, [1, 2], [13, 14], T0 + 3_000))
    state.apply(ev.MessagesReleased(T0 + 2_100, [2], [T0 + 2_100]))  # its 2nd receive: gone
    assert seen.calls == [("dead_lettered", 2, 0, True)]  # 0: by release
    state.advance(T0 + 3_000)
    assert seen.calls[1:] == [
        ("lease_expired", 1, T0 + 3_000, True),
        ("dead_lettered", 1, T0 + 3_000, True),  # by its lease, at its deadline
    ]
    assert state.dead_lettered == 2


def test_retention_tells_the_observer_before_the_message_goes() -> None:
    state, seen = observed(retention_ms=60_000)
    state.apply(ev.MessagesPut(T0, [ev.PutItem(7, b"x", T0 + 120_000)]))
    state.advance(T0 + 60_000)
    assert seen.calls == [("retention_expired", 7, T0 + 60_000, True)]
    assert 7 not in state.messages
    assert state.expired_total == 1


def test_a_state_without_an_observer_makes_the_same_transitions() -> None:
    def run(state: QueueState) -> tuple[int, int, int]:
        state.apply(ev.QueueCreated(T0, "q", QueueSettings(max_receives=1)))
        state.apply(ev.MessagesPut(T0, [ev.PutItem(1, b"a", T0)]))
        state.apply(ev.MessagesTaken(T0, [1], [1], T0 + 10))
        state.advance(T0 + 10)
        return state.dead_lettered, len(state.outbox), state.n_ready

    watched = QueueState()
    watched.observer = Recorder(watched)
    assert run(QueueState()) == run(watched) == (1, 1, 0)
