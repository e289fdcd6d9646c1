"""The put's fast loops decide exactly what the general ones do.

``decide._plain_put`` (a standard queue with server ids, messages with a body and perhaps a
delay or an activation time) and ``gateway.wire``'s conversion of such a message skip the
general loop's per-message calls. Hypothesis draws messages, valid and invalid, and each
fast loop must give the same events, replies and errors as the general one.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from actors.core import commands as c
from actors.core import decide
from actors.core.decide import execute
from actors.core.state import QueueState
from actors.errors import QueueError
from actors.ids import SequentialIds
from actors.settings import QueueSettings
from gateway import wire

NOW = 1_700_000_000_000

delays = st.one_of(
    st.none(),
    st.integers(min_value=-5, max_value=10**10),
    st.sampled_from([0, 1, 14 * 86_400_000, True]),
    st.floats(allow_nan=True),
)
bodies = st.one_of(st.binary(max_size=40), st.just(b"x" * 300), st.text(max_size=3))
plain = st.builds(
    c.NewMessage,
    body=bodies,
    delay_ms=delays,
    activate_at_ms=st.one_of(st.none(), st.integers(NOW - 10, NOW + 10**10)),
)
other = st.builds(
    c.NewMessage,
    body=st.just(b"b"),
    id=st.one_of(st.none(), st.just("client")),
    idempotency_key=st.one_of(st.none(), st.just("k")),
    group=st.one_of(st.none(), st.just("g")),
    attributes=st.one_of(st.none(), st.just({"a": "b"})),
)


def _queue(**settings: Any) -> QueueState:
    state = QueueState()
    execute(state, c.Create("q", QueueSettings(**settings)), NOW, SequentialIds())
    return state


def _outcome(decide_put: Any, state: QueueState, put: c.Put, ids: SequentialIds) -> Any:
    try:
        return decide_put(state, put, NOW, ids)
    except QueueError as exc:
        return type(exc).__name__, exc.message


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(plain, plain, plain, other), min_size=1, max_size=12),
    st.sampled_from([{}, {"max_message_bytes": 200}, {"max_messages": 5}, {"delay_ms": 1000}]),
)
def test_the_plain_loop_decides_what_the_general_one_does(
    messages: list[c.NewMessage], queue_settings: dict[str, Any]
) -> None:
    state = _queue(**queue_settings)
    execute(state, c.Put([c.NewMessage(body=b"before")]), NOW, SequentialIds())
    put = c.Put(messages)
    fast_ids, general_ids = SequentialIds(), SequentialIds()
    fast = _outcome(decide._put, state, put, fast_ids)
    general = _outcome(decide._any_put, state, put, general_ids)
    assert fast == general
    if not isinstance(fast[0], str):  # a put that happens draws as many ids either way
        assert fast_ids.next_id(NOW) == general_ids.next_id(NOW)


def test_a_message_that_is_not_plain_takes_the_general_loop() -> None:
    state = _queue()
    put = c.Put([c.NewMessage(body=b"a"), c.NewMessage(body=b"b", idempotency_key="k")])
    assert decide._plain_put(state, put.messages, NOW, SequentialIds()) is None
    events, results = decide._put(state, put, NOW, SequentialIds())
    assert [r.status for r in results] == ["created", "created"]
    assert events[0].items[1].key == "k"  # type: ignore[attr-defined]


def _general_message(m: wire.MessageIn) -> c.NewMessage:
    return c.NewMessage(
        body=wire.body_bytes(m.body, m.body_b64),  # type: ignore[arg-type]
        id=m.id,
        delay_ms=wire.ms(m.delay, "delay"),
        activate_at_ms=wire.ms(m.activate_at, "activate_at"),
        idempotency_key=m.idempotency_key,
        group=m.group,
        attributes=m.attributes,
    )


def _converted(convert: Any, m: wire.MessageIn) -> Any:
    try:
        return convert(m)
    except QueueError as exc:
        return type(exc).__name__, exc.message


@settings(max_examples=300, deadline=None)
@given(
    st.builds(
        wire.MessageIn,
        body=st.one_of(st.none(), st.text(max_size=3), st.binary(max_size=3), st.integers()),
        body_b64=st.one_of(st.none(), st.binary(max_size=3)),
        delay=st.one_of(
            st.none(), st.floats(), st.integers(-(10**20), 10**20), st.just(True), st.just("1")
        ),
        activate_at=st.one_of(st.none(), st.floats(min_value=0, max_value=2e9)),
        id=st.one_of(st.none(), st.just("i")),
    )
)
@example(wire.MessageIn(body="x", delay=0.0016))  # 1.6 ms: rounded, not cut
@example(wire.MessageIn(body="x", delay=float("inf")))
@example(wire.MessageIn(body="x", delay=float("nan")))
def test_the_gateway_converts_a_plain_message_as_the_general_conversion_does(
    m: wire.MessageIn,
) -> None:
    assert _converted(wire._new_message, m) == _converted(_general_message, m)


def test_the_harness_message_shape_is_converted_on_the_plain_path() -> None:
    body = b'{"messages": [{"body_b64": "aGk=", "delay": 0.0}, {"body": "yo", "delay": 2.5}]}'
    put = wire.put_command(wire.decode(body, wire.PutIn, msgpack=False))
    assert put.messages == [
        c.NewMessage(body=b"hi", delay_ms=0),
        c.NewMessage(body=b"yo", delay_ms=2500),
    ]
    assert msgspec.json.encode(put.messages[0]) == b'{"body":"aGk=","delay_ms":0}'


@pytest.mark.parametrize(
    ("seconds", "millis"),
    [
        (None, None),
        (0, 0),
        (0.0, 0),
        (1.5, 1500),
        (0.0016, 2),
        (-0.25, -250),
        (1e300, round(1e300 * 1000)),
    ],
)
def test_seconds_become_rounded_milliseconds(seconds: float | None, millis: int | None) -> None:
    got = wire.ms(seconds, "delay")
    assert got == millis
    assert got is None or type(got) is int


@pytest.mark.parametrize("seconds", [float("inf"), float("-inf"), float("nan"), True, "1", [1]])
def test_what_is_not_a_finite_number_of_seconds_is_refused(seconds: Any) -> None:
    with pytest.raises(QueueError, match="delay must be a number of seconds"):
        wire.ms(seconds, "delay")


@pytest.mark.parametrize("seconds", [1.7e308, -1.7e308, 1e306])
def test_seconds_past_any_time_in_milliseconds_are_refused_not_a_crash(seconds: float) -> None:
    # found by the conversion property test: finite seconds whose milliseconds are not
    with pytest.raises(QueueError, match="delay is out of range"):
        wire.ms(seconds, "delay")
