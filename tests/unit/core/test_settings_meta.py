"""``QueueSettings.meta``: what other APIs keep about a queue, stored and replayed as given.

The SQS API keeps tags, the creation time and attributes without an engine equivalent here.
The engine checks only the shape (a bounded map of strings) and otherwise ignores it.
"""

from __future__ import annotations

import msgspec
import pytest

from actors.core import commands as c
from actors.core import events as ev
from actors.core.decide import execute
from actors.core.snapshot import decode_snapshot, encode_snapshot, restore, snapshot
from actors.core.state import QueueState
from actors.errors import BadRequest, QueueExists
from actors.ids import SequentialIds
from actors.settings import (
    MAX_META_ENTRIES,
    MAX_META_KEY_CHARS,
    MAX_META_VALUE_CHARS,
    QueueSettings,
)

T0 = 1_700_000_000_000
META = {"sqs.created": "1700000000", "sqs.tag:team": "payments"}


def created(settings: QueueSettings) -> tuple[QueueState, list[ev.Event]]:
    state = QueueState()
    events, _ = execute(state, c.Create("q", settings), T0, SequentialIds())
    return state, events


def replayed(events: list[ev.Event]) -> QueueState:
    state = QueueState()
    for event in events:
        state.apply(event)
    return state


def test_meta_defaults_to_none_and_old_settings_decode_without_it() -> None:
    assert QueueSettings().meta is None
    fields = QueueSettings.__struct_fields__
    # appended (then max_messages, take_rate, put_rate, max_in_flight, fair): array-like
    # settings of old logs still decode
    appended = ("meta", "max_messages", "take_rate", "put_rate", "max_in_flight", "fair")
    assert fields[-len(appended) :] == appended
    old = msgspec.msgpack.encode([getattr(QueueSettings(), f) for f in fields[: -len(appended)]])
    assert msgspec.msgpack.decode(old, type=QueueSettings) == QueueSettings()


def test_meta_given_at_creation_is_kept_and_replays() -> None:
    state, events = created(QueueSettings(meta=META))
    assert state.settings.meta == META
    assert replayed(events).settings.meta == META


def test_patching_meta_replaces_it_and_keeps_the_other_settings() -> None:
    state, events = created(QueueSettings(visibility_timeout_ms=5000, meta=META))
    new_meta = {"sqs.tag:team": "billing"}
    more, reply = execute(state, c.PatchSettings({"meta": new_meta}), T0 + 1, SequentialIds())
    assert more == [
        ev.SettingsChanged(T0 + 1, QueueSettings(visibility_timeout_ms=5000, meta=new_meta))
    ]
    assert reply.meta == new_meta
    assert replayed(events + more).settings == state.settings


def test_meta_survives_a_snapshot() -> None:
    state, _ = created(QueueSettings(meta=META))
    back = restore(decode_snapshot(encode_snapshot(snapshot(state))))
    assert back.settings.meta == META


def test_creating_again_with_other_meta_is_a_conflict() -> None:
    state, _ = created(QueueSettings(meta=META))
    with pytest.raises(QueueExists):
        execute(state, c.Create("q", QueueSettings(meta={})), T0 + 1, SequentialIds())


@pytest.mark.parametrize(
    "meta",
    [
        {"": "x"},
        {"k" * (MAX_META_KEY_CHARS + 1): "x"},
        {"k": "v" * (MAX_META_VALUE_CHARS + 1)},
        {f"k{i}": "v" for i in range(MAX_META_ENTRIES + 1)},
    ],
    ids=["empty-key", "long-key", "long-value", "too-many"],
)
def test_meta_out_of_bounds_is_a_bad_request(meta: dict[str, str]) -> None:
    with pytest.raises(BadRequest):
        QueueSettings(meta=meta).validate("q")
    state, _ = created(QueueSettings())
    with pytest.raises(BadRequest):
        execute(state, c.PatchSettings({"meta": meta}), T0 + 1, SequentialIds())
    assert state.settings.meta is None


def test_meta_values_must_be_strings() -> None:
    state, _ = created(QueueSettings())
    with pytest.raises(BadRequest):
        execute(state, c.PatchSettings({"meta": {"k": 1}}), T0 + 1, SequentialIds())


def test_meta_at_the_limits_is_accepted() -> None:
    meta = {f"k{i}": "" for i in range(MAX_META_ENTRIES - 1)}
    meta["k" * MAX_META_KEY_CHARS] = "v" * MAX_META_VALUE_CHARS
    state, _ = created(QueueSettings(meta=meta))
    assert state.settings.meta == meta
