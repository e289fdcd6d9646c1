"""Table-driven tests of the pure engine: every command and every error of ``decide``.

Each test builds a queue with :class:`Q`, runs commands through ``execute`` with explicit
``now_ms`` values and :class:`~actors.ids.SequentialIds` (message ids 1, 2, …; leases 1001,
1002, …), and asserts the events and replies. :meth:`Q.run` also checks, after every
command, that the live state equals the state rebuilt by replaying every event emitted so
far; :meth:`Q.fails` checks that a rejected command leaves the state exactly as it was.
"""

from __future__ import annotations

import hashlib
import typing
from collections.abc import Callable

import pytest

from actors.core import browse as browse_module
from actors.core import commands as c
from actors.core import decide as decide_module
from actors.core import events as ev
from actors.core import replies as rp
from actors.core.decide import execute
from actors.core.snapshot import decode_snapshot, encode_snapshot, restore, snapshot
from actors.core.state import QueueState
from actors.errors import (
    BadRequest,
    Conflict,
    MessageNotFound,
    QueueError,
    QueueExists,
    QueueNotFound,
    StaleLease,
    TaskNotFound,
    TooLarge,
)
from actors.ids import IdSource, SequentialIds
from actors.settings import QueueSettings

S = QueueSettings
T0 = 1_700_000_000_000  # the queue is created at T0
T1 = T0 + 1_000  # messages are put at T1
T2 = T1 + 500  # most follow-up commands run at T2
VT = 30_000  # the default visibility timeout
MAX_VT = 12 * 3600 * 1000
FIFO = S(fifo=True)
SUPERSCRIPT_TWO = "\u00b2"  # str.isdigit() is true, int() rejects it


# ---------------------------------------------------------------- harness


def state_bytes(state: QueueState) -> bytes:
    """The logical state, as a snapshot encodes it (indexes are not part of it)."""
    return encode_snapshot(snapshot(state))


class Q:
    """A queue under test: its live state, its id source, and every event it emitted."""

    def __init__(
        self,
        settings: QueueSettings | None = None,
        *,
        name: str | None = None,
        ids: IdSource | None = None,
        now: int = T0,
    ) -> None:
        self.settings = settings if settings is not None else S()
        self.name = name or ("q.fifo" if self.settings.fifo else "q")
        self.state = QueueState()
        self.ids: IdSource = ids if ids is not None else SequentialIds()
        self.log: list[ev.Event] = []
        events, created = self.run(c.Create(self.name, self.settings), now)
        assert events == [ev.QueueCreated(now, self.name, self.settings)]
        assert created is True

    def run(self, command: object, now: int) -> tuple[list[ev.Event], typing.Any]:
        """Execute ``command`` at ``now``; check the replay equivalence; return both results."""
        events, reply = execute(self.state, command, now, self.ids)
        self.log.extend(events)
        self.assert_replays()
        return events, reply

    def fails(self, command: object, now: int, error: type[QueueError]) -> QueueError:
        """Assert ``command`` raises exactly ``error`` at ``now`` and changes nothing."""
        self.state.advance(now)  # what execute does first; a projection, not a change
        before = state_bytes(self.state)
        logged = len(self.log)
        with pytest.raises(error) as info:
            execute(self.state, command, now, self.ids)
        assert type(info.value) is error
        assert state_bytes(self.state) == before
        assert len(self.log) == logged
        self.assert_replays()
        return info.value

    def replayed(self) -> QueueState:
        """A fresh state with every logged event applied."""
        rebuilt = QueueState()
        for event in self.log:
            rebuilt.apply(event)
        return rebuilt

    def assert_replays(self, now: int | None = None) -> None:
        """Advance both the live and the replayed state to ``now`` (default: the live clock)
        and compare them."""
        now = self.state.clock_ms if now is None else max(now, self.state.clock_ms)
        self.state.advance(now)
        rebuilt = self.replayed()
        rebuilt.advance(now)
        assert state_bytes(rebuilt) == state_bytes(self.state)

    # -- shorthands ------------------------------------------------------------

    def put(self, now: int, *messages: bytes | c.NewMessage) -> list[str]:
        """Put messages (bare bodies or NewMessage); return the ids of the results."""
        batch = [m if isinstance(m, c.NewMessage) else c.NewMessage(body=m) for m in messages]
        _, results = self.run(c.Put(batch), now)
        return [r.id for r in results]

    def take(self, now: int, max: int = 1, vt: int | None = None) -> list[rp.Delivery]:
        return self.run(c.Take(max, vt), now)[1]  # type: ignore[no-any-return]

    def ack(self, now: int, *refs: tuple[str, str]) -> list[str]:
        _, results = self.run(c.Ack([c.LeaseRef(mid, lease) for mid, lease in refs]), now)
        return [r.status for r in results]

    def release(self, now: int, mid: str, lease: str, **kw: int) -> list[str]:
        _, results = self.run(c.Release([c.ReleaseItem(id=mid, lease=lease, **kw)]), now)
        return [r.status for r in results]

    def stats(self, now: int) -> rp.StatsView:
        events, view = self.run(c.Stats(), now)
        assert events == []
        assert view.now_ms == self.state.clock_ms
        return view  # type: ignore[no-any-return]

    def peek(self, now: int, mid: str) -> rp.MessageView:
        events, view = self.run(c.Peek(mid), now)
        assert events == []
        return view  # type: ignore[no-any-return]

    def bodies(self, now: int, max: int = 1) -> bytes:
        """Take up to ``max`` and return the bodies joined (one letter per message)."""
        return b"".join(d.body for d in self.take(now, max))


def counts(view: rp.StatsView, *names: str) -> dict[str, typing.Any]:
    return {name: getattr(view, name) for name in names}


def nm(body: bytes = b"m", **kw: typing.Any) -> c.NewMessage:
    return c.NewMessage(body=body, **kw)


def content_key(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class StuckIds:
    """An id source whose time-based ids collide: every candidate is 7."""

    def __init__(self) -> None:
        self._lease = 0

    def next_id(self, now_ms: int) -> int:
        return 7

    def next_lease(self) -> int:
        self._lease += 1
        return self._lease


# ---------------------------------------------------------------- create


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("jobs", S()),
        ("a", S(id_mode="client")),
        ("x" * 80, S(visibility_timeout_ms=0, retention_ms=1_000)),
        ("Mixed_Case-09", S(max_message_bytes=1, delay_ms=5_000)),
        ("orders.fifo", S(fifo=True, content_based_dedup=True)),
        ("work", S(max_receives=3, dead_letter_queue="work-dlq")),
        ("drop", S(max_receives=1)),
    ],
)
def test_create_emits_queue_created_and_makes_the_queue(name: str, settings: QueueSettings) -> None:
    q = Q(settings, name=name)  # asserts the QueueCreated event and the True reply
    assert q.state.created
    assert q.state.name == name
    assert q.state.settings == settings
    assert q.stats(T1).total == 0


def test_create_again_with_the_same_settings_emits_nothing_and_reports_not_created() -> None:
    q = Q(S(visibility_timeout_ms=5_000))
    events, created = q.run(c.Create("q", S(visibility_timeout_ms=5_000)), T1)
    assert events == []
    assert created is False
    assert q.state.settings == S(visibility_timeout_ms=5_000)


@pytest.mark.parametrize(
    "other",
    [
        S(),
        S(visibility_timeout_ms=5_001),
        S(visibility_timeout_ms=5_000, id_mode="client"),
        S(visibility_timeout_ms=5_000, max_receives=3),
        S(visibility_timeout_ms=5_000, retention_ms=10_000),
    ],
)
def test_create_again_with_other_settings_raises_queue_exists(other: QueueSettings) -> None:
    q = Q(S(visibility_timeout_ms=5_000))
    error = q.fails(c.Create("q", other), T1, QueueExists)
    assert error.fields == {"queue": "q"}
    assert q.state.settings == S(visibility_timeout_ms=5_000)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "x" * 81,
        "x" * 81 + ".fifo",
        "has space",
        "dot.ted",
        "ünïcode",
        "slash/name",
        "q.FIFO",
        ".fifo",
        "q.fifo.fifo",
        "q\n",
    ],
)
def test_create_rejects_a_bad_queue_name(name: str) -> None:
    state = QueueState()
    settings = S(fifo=name.endswith(".fifo"))
    with pytest.raises(BadRequest):
        execute(state, c.Create(name, settings), T0, SequentialIds())
    assert not state.created


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("q", S(visibility_timeout_ms=-1)),
        ("q", S(visibility_timeout_ms=MAX_VT + 1)),
        ("q", S(retention_ms=999)),
        ("q", S(max_message_bytes=0)),
        ("q", S(max_message_bytes=64 * 1024 * 1024 + 1)),
        ("q", S(delay_ms=-1)),
        ("q", S(idempotency_window_ms=-1)),
        ("q", S(max_receives=0)),
        ("q", S(max_receives=1001)),
        ("q", S(dead_letter_queue="dlq")),
        ("q", S(max_receives=2, dead_letter_queue="q")),
        ("q", S(max_receives=2, dead_letter_queue="bad name")),
        ("q", S(fifo=True)),
        ("q.fifo", S()),
        ("q", S(content_based_dedup=True)),
    ],
)
def test_create_rejects_bad_settings(name: str, settings: QueueSettings) -> None:
    state = QueueState()
    with pytest.raises(BadRequest):
        execute(state, c.Create(name, settings), T0, SequentialIds())
    assert not state.created


# ---------------------------------------------------------------- queue not found

NOT_CREATED_COMMANDS = [
    c.ChangeSettings(S()),
    c.PatchSettings({"visibility_timeout_ms": 1_000}),
    c.Describe(),
    c.Put([nm()]),
    c.Take(),
    c.Ack([c.LeaseRef("1", "1001")]),
    c.Release([c.ReleaseItem(id="1", lease="1001")]),
    c.Touch([c.TouchItem(id="1", lease="1001")]),
    c.Update(id="1", body=b"x"),
    c.Reschedule(id="1", delay_ms=0),
    c.Peek("1"),
    c.PeekReady(),
    c.Browse(),
    c.Delete("1"),
    c.Purge(),
    c.Pause(True),
    c.Stats(),
    c.ConfirmDeadLetters([1]),
    c.SetKey("k", 1),
    c.GetKey("k"),
    c.Checkpoint(),
    c.MoveBodies([1]),
    c.Drop(),
    c.HandOver(0, 1, 1),
    c.TakeOver(0, 1),
    c.StartMove("t"),
    c.CancelMove("t"),
    c.ListMoves(),
    c.MoveProgress("t", 1),
    c.EndMove("t", "COMPLETED"),
]


def test_the_not_found_table_covers_every_command_but_create() -> None:
    every = set(typing.get_args(c.Command))
    assert {type(x) for x in NOT_CREATED_COMMANDS} == every - {c.Create}


@pytest.mark.parametrize("command", NOT_CREATED_COMMANDS, ids=lambda x: type(x).__name__)
def test_any_command_on_a_queue_never_created_raises_queue_not_found(command: object) -> None:
    state = QueueState()
    with pytest.raises(QueueNotFound):
        execute(state, command, T0, SequentialIds())
    assert not state.created
    untouched = QueueState()
    untouched.advance(T0)
    assert state_bytes(state) == state_bytes(untouched)


def test_drop_ends_the_history_and_a_later_create_starts_a_new_queue() -> None:
    q = Q()
    q.put(T1, b"a", b"b")
    events, reply = q.run(c.Drop(), T2)
    assert events == [ev.QueueDeleted(T2)]
    assert reply is None
    assert not q.state.created
    assert q.state.messages == {}
    assert (q.state.n_ready, q.state.enqueued_total) == (0, 0)
    with pytest.raises(QueueNotFound):
        execute(q.state, c.Stats(), T2, q.ids)
    events, created = q.run(c.Create("q", S(visibility_timeout_ms=5_000)), T2 + 1)
    assert created is True
    assert q.state.settings.visibility_timeout_ms == 5_000
    assert q.state.n_ready == 0


def test_a_checkpoint_records_a_marker_and_changes_nothing_else() -> None:
    q = Q()
    [mid] = q.put(T1, b"a")
    before = {k: (m.state, m.body) for k, m in q.state.messages.items()}
    events, reply = q.run(c.Checkpoint(), T2)
    assert events == [ev.Checkpoint(T2)]
    assert reply is None
    assert {k: (m.state, m.body) for k, m in q.state.messages.items()} == before
    assert [d.id for d in q.take(T2)] == [mid]


@pytest.mark.parametrize("created", [False, True])
def test_an_unknown_command_is_a_bad_request(created: bool) -> None:
    if created:
        Q().fails(object(), T1, BadRequest)
    else:
        with pytest.raises(BadRequest):
            execute(QueueState(), object(), T0, SequentialIds())


# ---------------------------------------------------------------- change settings


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S(), S(visibility_timeout_ms=5_000)),
        (S(), S(max_receives=3, dead_letter_queue="dlq", retention_ms=60_000)),
        (S(id_mode="client"), S(id_mode="client", delay_ms=1_000)),
        (FIFO, S(fifo=True, content_based_dedup=True)),
        (S(max_receives=3), S()),
    ],
)
def test_change_settings_emits_settings_changed_and_applies_them(
    old: QueueSettings, new: QueueSettings
) -> None:
    q = Q(old)
    events, reply = q.run(c.ChangeSettings(new), T1)
    assert events == [ev.SettingsChanged(T1, new)]
    assert reply == new
    assert q.state.settings == new


def test_change_settings_to_the_same_settings_emits_nothing() -> None:
    q = Q(S(visibility_timeout_ms=5_000))
    events, reply = q.run(c.ChangeSettings(S(visibility_timeout_ms=5_000)), T1)
    assert events == []
    assert reply == S(visibility_timeout_ms=5_000)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param(S(), S(id_mode="client"), id="id_mode-server-to-client"),
        pytest.param(S(id_mode="client"), S(), id="id_mode-client-to-server"),
        pytest.param(S(), S(fifo=True), id="fifo-on"),
        pytest.param(FIFO, S(), id="fifo-off"),
        pytest.param(S(), S(visibility_timeout_ms=-1), id="bad-visibility"),
        pytest.param(S(), S(retention_ms=0), id="bad-retention"),
        pytest.param(S(), S(dead_letter_queue="q", max_receives=1), id="own-dlq"),
    ],
)
def test_change_settings_rejects_immutable_or_invalid_fields(
    old: QueueSettings, new: QueueSettings
) -> None:
    q = Q(old)
    q.fails(c.ChangeSettings(new), T1, BadRequest)
    assert q.state.settings == old


def test_changed_visibility_timeout_applies_to_the_next_take() -> None:
    q = Q()
    q.put(T1, b"a")
    q.run(c.ChangeSettings(S(visibility_timeout_ms=5_000)), T1)
    [d] = q.take(T2)
    assert d.lease_expires_at_ms == T2 + 5_000


def test_changed_default_delay_applies_to_later_puts() -> None:
    q = Q()
    q.run(c.ChangeSettings(S(delay_ms=4_000)), T1)
    events, _ = q.run(c.Put([nm(b"a")]), T2)
    assert events == [ev.MessagesPut(T2, [ev.PutItem(1, b"a", T2 + 4_000)])]


def test_shortened_retention_removes_messages_already_older_than_it() -> None:
    q = Q()
    q.put(T1, b"a")
    q.run(c.ChangeSettings(S(retention_ms=10_000)), T1 + 20_000)
    assert counts(q.stats(T1 + 20_001), "total", "expired") == {"total": 0, "expired": 1}


# ---------------------------------------------------------------- put

FIFO_DEDUP = S(fifo=True, content_based_dedup=True, idempotency_window_ms=10_000)


@pytest.mark.parametrize(
    ("settings", "messages", "items", "results"),
    [
        pytest.param(
            S(),
            [nm(b"a"), nm(b"b")],
            [ev.PutItem(1, b"a", T1), ev.PutItem(2, b"b", T1)],
            [("1", "created"), ("2", "created")],
            id="server-ids-in-order",
        ),
        pytest.param(
            S(id_mode="client"),
            [nm(b"a", id="x"), nm(b"b", id="y-2")],
            [ev.PutItem("x", b"a", T1), ev.PutItem("y-2", b"b", T1)],
            [("x", "created"), ("y-2", "created")],
            id="client-ids",
        ),
        pytest.param(
            S(id_mode="client"),
            [nm(b"a", id="i" * 256)],
            [ev.PutItem("i" * 256, b"a", T1)],
            [("i" * 256, "created")],
            id="client-id-of-256-chars",
        ),
        pytest.param(
            S(id_mode="client"),
            [nm(b"a", id="x"), nm(b"a", id="x")],
            [ev.PutItem("x", b"a", T1)],
            [("x", "created"), ("x", "duplicate")],
            id="client-id-twice-in-a-batch-same-body",
        ),
        pytest.param(
            S(),
            [nm(b"a", delay_ms=5_000)],
            [ev.PutItem(1, b"a", T1 + 5_000)],
            [("1", "created")],
            id="delay",
        ),
        pytest.param(
            S(),
            [nm(b"a", activate_at_ms=T1 + 7_000)],
            [ev.PutItem(1, b"a", T1 + 7_000)],
            [("1", "created")],
            id="activate-at-future",
        ),
        pytest.param(
            S(),
            [nm(b"a", activate_at_ms=T1 - 60_000)],
            [ev.PutItem(1, b"a", T1 - 60_000)],
            [("1", "created")],
            id="activate-at-past-as-priority",
        ),
        pytest.param(
            S(delay_ms=2_000),
            [nm(b"a"), nm(b"b", delay_ms=0)],
            [ev.PutItem(1, b"a", T1 + 2_000), ev.PutItem(2, b"b", T1)],
            [("1", "created"), ("2", "created")],
            id="queue-default-delay-and-override",
        ),
        pytest.param(
            S(retention_ms=10_000),
            [nm(b"a", delay_ms=9_999)],
            [ev.PutItem(1, b"a", T1 + 9_999)],
            [("1", "created")],
            id="delay-just-inside-retention",
        ),
        pytest.param(
            S(max_message_bytes=3),
            [nm(b"abc")],
            [ev.PutItem(1, b"abc", T1)],
            [("1", "created")],
            id="body-of-exactly-max-bytes",
        ),
        pytest.param(
            S(),
            [nm(b"a", attributes={"k": "v", "trace": "t-1"})],
            [ev.PutItem(1, b"a", T1, None, None, {"k": "v", "trace": "t-1"})],
            [("1", "created")],
            id="attributes",
        ),
        pytest.param(
            S(),
            [nm(b"a", idempotency_key="k1")],
            [ev.PutItem(1, b"a", T1, "k1")],
            [("1", "created")],
            id="idempotency-key",
        ),
        pytest.param(
            S(),
            [nm(b"a", idempotency_key="k"), nm(b"b", idempotency_key="k")],
            [ev.PutItem(1, b"a", T1, "k")],
            [("1", "created"), ("1", "duplicate")],
            id="idempotency-key-twice-in-a-batch",
        ),
        pytest.param(
            S(),
            [nm(b"a", group="g")],
            [ev.PutItem(1, b"a", T1, None, "g")],
            [("1", "created")],
            id="group-on-a-standard-queue",
        ),
        pytest.param(
            FIFO,
            [nm(b"a", group="g"), nm(b"b", group="h" * 128)],
            [ev.PutItem(1, b"a", T1, None, "g"), ev.PutItem(2, b"b", T1, None, "h" * 128)],
            [("1", "created"), ("2", "created")],
            id="fifo-groups",
        ),
        pytest.param(
            FIFO_DEDUP,
            [nm(b"a", group="g"), nm(b"a", group="h"), nm(b"b", group="g")],
            [
                ev.PutItem(1, b"a", T1, content_key(b"a"), "g"),
                ev.PutItem(2, b"b", T1, content_key(b"b"), "g"),
            ],
            [("1", "created"), ("1", "duplicate"), ("2", "created")],
            id="content-based-dedup",
        ),
        pytest.param(
            FIFO_DEDUP,
            [nm(b"a", group="g", idempotency_key="k"), nm(b"a", group="g")],
            [
                ev.PutItem(1, b"a", T1, "k", "g"),
                ev.PutItem(2, b"a", T1, content_key(b"a"), "g"),
            ],
            [("1", "created"), ("2", "created")],
            id="explicit-key-overrides-content-dedup",
        ),
    ],
)
def test_put_emits_messages_put_and_reports_each_message(
    settings: QueueSettings,
    messages: list[c.NewMessage],
    items: list[ev.PutItem],
    results: list[tuple[str, str]],
) -> None:
    q = Q(settings)
    events, reply = q.run(c.Put(messages), T1)
    assert events == [ev.MessagesPut(T1, items)]
    assert reply == [rp.PutResult(mid, status) for mid, status in results]
    for item in items:
        view = q.peek(T1, str(item.id))
        assert view.state == ("ready" if item.activate_at_ms <= T1 else "delayed")
        assert (view.body, view.activate_at_ms, view.enqueued_at_ms) == (
            item.body,
            item.activate_at_ms,
            T1,
        )
        assert (view.attributes, view.group, view.receive_count) == (
            item.attributes,
            item.group,
            0,
        )
    stats = q.stats(T1)
    assert stats.total == stats.enqueued == len(items)


def test_put_accepts_a_batch_of_1000_messages() -> None:
    q = Q()
    ids = q.put(T1, *[b"m"] * 1000)
    assert ids == [str(i) for i in range(1, 1001)]
    assert q.stats(T1).ready == 1000


def test_server_ids_stay_strictly_increasing_when_the_id_source_collides() -> None:
    q = Q(ids=StuckIds())
    assert q.put(T1, b"a", b"b", b"c") == ["7", "8", "9"]
    assert q.put(T2, b"d") == ["10"]
    assert q.state.last_id == 10


def test_server_ids_are_not_reused_after_the_messages_are_gone() -> None:
    q = Q(ids=StuckIds())
    q.put(T1, b"a", b"b")
    q.run(c.Purge(), T2)
    assert q.put(T2, b"c") == ["9"]


def test_put_of_an_existing_client_id_with_the_same_body_is_a_duplicate() -> None:
    q = Q(S(id_mode="client"))
    q.put(T1, nm(b"a", id="x"))
    events, results = q.run(c.Put([nm(b"a", id="x"), nm(b"b", id="y")]), T2)
    assert events == [ev.MessagesPut(T2, [ev.PutItem("y", b"b", T2)])]
    assert results == [rp.PutResult("x", "duplicate"), rp.PutResult("y", "created")]
    assert q.peek(T2, "x").enqueued_at_ms == T1


@pytest.mark.parametrize(
    "batch",
    [
        pytest.param([nm(b"other", id="x")], id="later-put"),
        pytest.param([nm(b"b", id="y"), nm(b"other", id="x")], id="later-put-in-a-batch"),
    ],
)
def test_put_of_an_existing_client_id_with_another_body_is_a_conflict(
    batch: list[c.NewMessage],
) -> None:
    q = Q(S(id_mode="client"))
    q.put(T1, nm(b"a", id="x"))
    error = q.fails(c.Put(batch), T2, Conflict)
    assert error.fields == {"id": "x"}
    assert q.peek(T2, "x").body == b"a"


def test_put_of_one_client_id_twice_in_a_batch_with_other_bodies_is_a_conflict() -> None:
    q = Q(S(id_mode="client"))
    q.fails(c.Put([nm(b"a", id="x"), nm(b"b", id="x")]), T1, Conflict)
    assert q.stats(T1).total == 0


def test_a_client_id_can_be_put_again_once_its_message_is_acked() -> None:
    q = Q(S(id_mode="client"))
    q.put(T1, nm(b"a", id="x"))
    [d] = q.take(T1)
    assert q.ack(T1, (d.id, d.lease)) == ["ok"]
    events, results = q.run(c.Put([nm(b"other", id="x")]), T2)
    assert events == [ev.MessagesPut(T2, [ev.PutItem("x", b"other", T2)])]
    assert results == [rp.PutResult("x", "created")]


@pytest.mark.parametrize(
    ("retry_after", "status", "mid"),
    [
        (0, "duplicate", "1"),
        (5_000, "duplicate", "1"),
        (9_999, "duplicate", "1"),
        (10_000, "created", "2"),
        (50_000, "created", "2"),
    ],
)
def test_idempotency_key_answers_with_the_original_id_only_within_the_window(
    retry_after: int, status: str, mid: str
) -> None:
    q = Q(S(idempotency_window_ms=10_000))
    assert q.put(T1, nm(b"a", idempotency_key="k")) == ["1"]
    now = T1 + retry_after
    events, results = q.run(c.Put([nm(b"a", idempotency_key="k")]), now)
    assert results == [rp.PutResult(mid, status)]
    if status == "created":
        assert events == [ev.MessagesPut(now, [ev.PutItem(2, b"a", now, "k")])]
    else:
        assert events == []
    assert q.stats(now).total == (2 if status == "created" else 1)


def test_idempotency_key_answers_with_the_original_id_even_after_it_was_acked() -> None:
    q = Q(S(idempotency_window_ms=10_000))
    q.put(T1, nm(b"a", idempotency_key="k"))
    [d] = q.take(T1)
    q.ack(T1, (d.id, d.lease))
    events, results = q.run(c.Put([nm(b"a", idempotency_key="k")]), T2)
    assert events == []
    assert results == [rp.PutResult("1", "duplicate")]


def test_idempotency_key_on_a_client_id_queue_answers_with_the_first_client_id() -> None:
    q = Q(S(id_mode="client"))
    q.put(T1, nm(b"a", id="x", idempotency_key="k"))
    events, results = q.run(c.Put([nm(b"a", id="y", idempotency_key="k")]), T2)
    assert events == []
    assert results == [rp.PutResult("x", "duplicate")]


@pytest.mark.parametrize(
    ("retry_after", "body", "status", "mid"),
    [
        (0, b"a", "duplicate", "1"),
        (9_999, b"a", "duplicate", "1"),
        (9_999, b"b", "created", "2"),
        (10_000, b"a", "created", "2"),
    ],
)
def test_content_based_dedup_on_fifo_uses_the_body_hash_within_the_window(
    retry_after: int, body: bytes, status: str, mid: str
) -> None:
    q = Q(FIFO_DEDUP)
    q.put(T1, nm(b"a", group="g"))
    now = T1 + retry_after
    events, results = q.run(c.Put([nm(body, group="other")]), now)
    assert results == [rp.PutResult(mid, status)]
    expected = [ev.PutItem(2, body, now, content_key(body), "other")]
    assert events == ([ev.MessagesPut(now, expected)] if status == "created" else [])


@pytest.mark.parametrize(
    ("settings", "messages", "error"),
    [
        pytest.param(S(), [], BadRequest, id="no-messages"),
        pytest.param(S(), [nm()] * 1001, BadRequest, id="1001-messages"),
        pytest.param(S(), [nm(b"")], BadRequest, id="empty-body"),
        pytest.param(S(), [nm("text")], BadRequest, id="body-not-bytes"),
        pytest.param(S(max_message_bytes=3), [nm(b"abcd")], TooLarge, id="oversized-body"),
        pytest.param(
            S(max_message_bytes=3), [nm(b"abc"), nm(b"abcd")], TooLarge, id="oversized-in-batch"
        ),
        pytest.param(
            S(), [nm(delay_ms=1, activate_at_ms=T1 + 1)], BadRequest, id="delay-and-activate-at"
        ),
        pytest.param(S(), [nm(delay_ms=-1)], BadRequest, id="negative-delay"),
        pytest.param(S(), [nm(delay_ms=True)], BadRequest, id="bool-delay"),
        pytest.param(S(), [nm(delay_ms=1.5)], BadRequest, id="float-delay"),
        pytest.param(S(), [nm(activate_at_ms=1.5e12)], BadRequest, id="float-activate-at"),
        pytest.param(S(), [nm(activate_at_ms="soon")], BadRequest, id="text-activate-at"),
        pytest.param(
            S(retention_ms=10_000), [nm(delay_ms=10_000)], BadRequest, id="delay-at-retention"
        ),
        pytest.param(
            S(retention_ms=10_000),
            [nm(activate_at_ms=T1 + 10_000)],
            BadRequest,
            id="activate-at-beyond-retention",
        ),
        pytest.param(S(), [nm(id="x")], BadRequest, id="id-on-server-id-queue"),
        pytest.param(S(id_mode="client"), [nm()], BadRequest, id="missing-client-id"),
        pytest.param(S(id_mode="client"), [nm(id="")], BadRequest, id="empty-client-id"),
        pytest.param(S(id_mode="client"), [nm(id="i" * 257)], BadRequest, id="long-client-id"),
        pytest.param(S(id_mode="client"), [nm(id="a\nb")], BadRequest, id="unprintable-id"),
        pytest.param(S(id_mode="client"), [nm(id=5)], BadRequest, id="int-client-id"),
        pytest.param(FIFO, [nm()], BadRequest, id="fifo-missing-group"),
        pytest.param(FIFO, [nm(group="")], BadRequest, id="fifo-empty-group"),
        pytest.param(FIFO, [nm(group="g" * 129)], BadRequest, id="fifo-long-group"),
        pytest.param(FIFO, [nm(group=5)], BadRequest, id="fifo-int-group"),
        pytest.param(S(), [nm(group="")], BadRequest, id="empty-group-on-standard"),
        pytest.param(S(), [nm(attributes=["k"])], BadRequest, id="attributes-not-a-map"),
        pytest.param(
            S(),
            [nm(attributes={f"k{i}": "v" for i in range(65)})],
            BadRequest,
            id="65-attributes",
        ),
        pytest.param(S(), [nm(attributes={"": "v"})], BadRequest, id="empty-attribute-name"),
        pytest.param(S(), [nm(attributes={5: "v"})], BadRequest, id="int-attribute-name"),
        pytest.param(S(), [nm(attributes={"k" * 257: "v"})], BadRequest, id="long-attr-name"),
        pytest.param(S(), [nm(idempotency_key="")], BadRequest, id="empty-idempotency-key"),
        pytest.param(S(), [nm(idempotency_key="k" * 257)], BadRequest, id="long-key"),
        pytest.param(S(), [nm(idempotency_key=5)], BadRequest, id="int-idempotency-key"),
        pytest.param(S(), [nm(b"ok"), nm(b"")], BadRequest, id="bad-second-message"),
    ],
)
def test_put_rejects_a_bad_batch_whole(
    settings: QueueSettings, messages: list[c.NewMessage], error: type[QueueError]
) -> None:
    q = Q(settings)
    q.fails(c.Put(messages), T1, error)
    assert q.stats(T1).total == 0


def test_put_accepts_64_attributes_and_names_of_256_chars() -> None:
    attributes = {f"k{i}": "v" for i in range(63)} | {"n" * 256: "v"}
    q = Q()
    assert q.put(T1, nm(attributes=attributes)) == ["1"]
    assert q.peek(T1, "1").attributes == attributes


# ---------------------------------------------------------------- take

BAD_MAX = [0, -1, 1001, True, False, 1.5, "1"]


@pytest.mark.parametrize("kind", [c.Take, c.PeekReady])
@pytest.mark.parametrize("max_", BAD_MAX)
def test_take_and_peek_ready_reject_a_max_outside_1_to_1000(kind: type, max_: object) -> None:
    q = Q()
    q.put(T1, b"a")
    q.fails(kind(max_), T2, BadRequest)
    assert q.stats(T2).ready == 1


def test_take_of_an_empty_queue_returns_nothing_and_emits_nothing() -> None:
    q = Q()
    assert q.run(c.Take(10), T1) == ([], [])


def test_take_emits_messages_taken_and_delivers_the_message_under_a_lease() -> None:
    q = Q()
    q.put(T1, nm(b"a", attributes={"k": "v"}), nm(b"b"))
    events, deliveries = q.run(c.Take(2), T2)
    assert events == [ev.MessagesTaken(T2, [1, 2], [1001, 1002], T2 + VT)]
    assert deliveries == [
        rp.Delivery("1", b"a", T1, T1, 1, "1001", T2 + VT, {"k": "v"}, None, T2),
        rp.Delivery("2", b"b", T1, T1, 1, "1002", T2 + VT, None, None, T2),
    ]
    assert counts(q.stats(T2), "ready", "reserved") == {"ready": 0, "reserved": 2}
    assert q.peek(T2, "1") == rp.MessageView(
        "1", "reserved", b"a", T1, T1, 1, T2 + VT, {"k": "v"}, None
    )


@pytest.mark.parametrize(
    ("activations", "after", "expected"),
    [
        pytest.param([0, 0, 0], 0, b"abc", id="arrival-order-at-equal-times"),
        pytest.param([0, -5_000, -1_000], 0, b"bca", id="past-activation-as-priority"),
        pytest.param([-10, -20, -10, -20], 0, b"bdac", id="equal-times-group-together"),
        pytest.param([0, 1_000], 0, b"a", id="delayed-left-out"),
        pytest.param([0, 1_000], 999, b"a", id="delayed-left-out-until-due"),
        pytest.param([0, 1_000], 1_000, b"ab", id="delayed-handed-out-when-due"),
        pytest.param([2_000, 1_000, 3_000], 5_000, b"bac", id="due-in-activation-order"),
        pytest.param([500, -500], 1_000, b"ba", id="past-before-due"),
    ],
)
def test_take_hands_out_ready_messages_by_activation_time_then_arrival(
    activations: list[int], after: int, expected: bytes
) -> None:
    q = Q()
    bodies = [bytes([97 + i]) for i in range(len(activations))]
    q.put(T1, *[nm(b, activate_at_ms=T1 + a) for b, a in zip(bodies, activations, strict=True)])
    assert q.bodies(T1 + after, max=10) == expected


def test_take_skips_messages_still_delayed() -> None:
    q = Q()
    q.put(T1, nm(b"a", delay_ms=1_000))
    assert q.take(T1 + 999) == []
    assert q.stats(T1 + 999).delayed == 1
    [d] = q.take(T1 + 1_000)
    assert (d.body, d.activate_at_ms) == (b"a", T1 + 1_000)


def test_take_hands_out_at_most_max_and_the_rest_on_the_next_take() -> None:
    q = Q()
    q.put(T1, b"a", b"b", b"c", b"d", b"e")
    assert q.bodies(T2, max=2) == b"ab"
    assert q.bodies(T2, max=2) == b"cd"
    assert q.bodies(T2, max=2) == b"e"
    assert q.bodies(T2, max=2) == b""


def test_take_of_1000_hands_out_1000() -> None:
    q = Q()
    q.put(T1, *[b"m"] * 1000)
    assert len(q.take(T2, max=1000)) == 1000
    assert q.stats(T2).reserved == 1000


def test_a_take_stops_before_the_body_that_would_pass_64_mib() -> None:
    mib = 1024 * 1024
    q = Q(S(max_message_bytes=64 * mib))
    q.put(T1, b"a" * 30 * mib, b"b" * 30 * mib, b"c" * 5 * mib)
    assert [len(d.body) // mib for d in q.take(T2, max=10)] == [30, 30]
    assert [len(d.body) // mib for d in q.take(T2, max=10)] == [5]


@pytest.mark.parametrize(
    ("bodies", "takes"),
    [
        ([b"aaa", b"bbb", b"ccc"], [b"aaabbb", b"ccc"]),  # 9 bytes would pass 7
        ([b"aaaaaaaaaa", b"b", b"c"], [b"aaaaaaaaaa", b"bc"]),  # one larger than 7: alone
        ([b"aaaa", b"bbbbb", b"cc"], [b"aaaa", b"bbbbbcc"]),  # stops at b, although c fits
    ],
)
def test_a_take_hands_out_messages_until_their_bodies_would_pass_the_bound(
    monkeypatch: pytest.MonkeyPatch, bodies: list[bytes], takes: list[bytes]
) -> None:
    monkeypatch.setattr(decide_module, "MAX_TAKE_BYTES", 7)
    q = Q()
    q.put(T1, *bodies)
    _, peeked = q.run(c.PeekReady(10), T2)
    assert b"".join(v.body for v in peeked) == takes[0]
    assert [q.bodies(T2, max=10) for _ in takes] == takes


def test_a_fifo_take_ends_with_a_run_that_stops_at_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(decide_module, "MAX_TAKE_BYTES", 7)
    q = fifo((b"aaa", "g"), (b"bbb", "g"), (b"ccc", "g"), (b"x", "h"))
    assert q.bodies(T2, max=10) == b"aaabbb"  # not x: the take ends where g's run stopped
    assert q.bodies(T2, max=10) == b"x"  # g is busy until a and b are done


@pytest.mark.parametrize(
    ("vt", "deadline"),
    [(None, T2 + VT), (0, T2), (5_000, T2 + 5_000), (MAX_VT, T2 + MAX_VT)],
)
def test_take_leases_for_the_queue_or_the_given_visibility_timeout(
    vt: int | None, deadline: int
) -> None:
    q = Q()
    q.put(T1, b"a")
    events, [d] = q.run(c.Take(1, vt), T2)
    assert events == [ev.MessagesTaken(T2, [1], [1001], deadline)]
    assert d.lease_expires_at_ms == deadline
    if deadline > T2:  # a zero timeout gives a lease that has already run out
        assert q.peek(T2, "1").lease_expires_at_ms == deadline


@pytest.mark.parametrize("vt", [-1, MAX_VT + 1, True, 1.5])
def test_take_rejects_a_visibility_timeout_out_of_bounds(vt: object) -> None:
    q = Q()
    q.put(T1, b"a")
    q.fails(c.Take(1, vt), T2, BadRequest)


def test_a_zero_visibility_timeout_lease_expires_right_after_the_take() -> None:
    q = Q()
    q.put(T1, b"a")
    [d] = q.take(T2, vt=0)
    assert q.ack(T2 + 1, (d.id, d.lease)) == ["stale_lease"]
    assert q.stats(T2 + 1).ready == 1


@pytest.mark.parametrize("takes", [1, 2, 3, 5])
def test_each_take_gives_a_fresh_lease_and_counts_the_receive(takes: int) -> None:
    q = Q(S(visibility_timeout_ms=1_000))
    q.put(T1, b"a")
    leases = []
    for n in range(takes):
        [d] = q.take(T1 + n * 1_000)
        assert d.receive_count == n + 1
        assert d.lease == str(1001 + n)
        assert d.first_taken_ms == T1
        assert d.enqueued_at_ms == T1
        leases.append(d.lease)
    now = T1 + (takes - 1) * 1_000 + 10
    for old in leases[:-1]:
        assert q.ack(now, ("1", old)) == ["stale_lease"]
    assert q.ack(now, ("1", leases[-1])) == ["ok"]


def test_an_expired_lease_puts_the_message_back_with_its_receive_count() -> None:
    q = Q(S(visibility_timeout_ms=1_000))
    q.put(T1, b"a")
    q.take(T1)
    view = q.peek(T1 + 1_000, "1")
    assert (view.state, view.receive_count, view.lease_expires_at_ms) == ("ready", 1, None)
    [d] = q.take(T1 + 1_000)
    assert d.receive_count == 2


# ---------------------------------------------------------------- ack / release / touch

KINDS = ["ack", "release", "touch"]
LEASED = S(visibility_timeout_ms=10_000)


def leased() -> Q:
    """Three messages put at T1; "1" and "2" taken at T1 under "1001" and "1002"; "3" ready."""
    q = Q(LEASED)
    q.put(T1, b"a", b"b", b"c")
    assert [(d.id, d.lease) for d in q.take(T1, max=2)] == [("1", "1001"), ("2", "1002")]
    return q


def lease_command(kind: str, items: list[tuple[str, str]]) -> object:
    if kind == "ack":
        return c.Ack([c.LeaseRef(mid, lease) for mid, lease in items])
    if kind == "release":
        return c.Release([c.ReleaseItem(id=mid, lease=lease) for mid, lease in items])
    return c.Touch([c.TouchItem(id=mid, lease=lease) for mid, lease in items])


def ok_events(kind: str, now: int, ids: list[ev.MessageId]) -> list[ev.Event]:
    if kind == "ack":
        return [ev.MessagesAcked(now, ids)]
    if kind == "release":
        return [ev.MessagesReleased(now, ids, [now] * len(ids))]
    return [ev.LeasesExtended(now, ids, [now + 10_000] * len(ids))]


STATUS_CASES = [
    pytest.param("1", "1001", "ok", id="current-lease"),
    pytest.param("1", "1002", "stale_lease", id="foreign-lease-of-another-message"),
    pytest.param("2", "1001", "stale_lease", id="foreign-lease-the-other-way"),
    pytest.param("1", "999", "stale_lease", id="made-up-lease"),
    pytest.param("1", "", "stale_lease", id="empty-lease"),
    pytest.param("3", "1001", "stale_lease", id="message-not-reserved"),
    pytest.param("3", "0", "stale_lease", id="never-taken-message-lease-0"),
    pytest.param("4", "1001", "not_found", id="unknown-id"),
    pytest.param("x", "1001", "not_found", id="non-numeric-id"),
    pytest.param("", "1001", "not_found", id="empty-id"),
    pytest.param("-1", "1001", "not_found", id="negative-id"),
    pytest.param("9" * 25, "1001", "not_found", id="id-of-25-digits"),
    pytest.param(SUPERSCRIPT_TWO, "1001", "not_found", id="unicode-digit-id"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("mid", "lease", "status"), STATUS_CASES)
def test_lease_commands_report_a_status_per_item(
    kind: str, mid: str, lease: str, status: str
) -> None:
    q = leased()
    events, results = q.run(lease_command(kind, [(mid, lease)]), T2)
    deadline = T2 + 10_000 if (kind, status) == ("touch", "ok") else None
    assert results == [rp.ItemResult(mid, status, deadline)]
    assert events == (ok_events(kind, T2, [1]) if status == "ok" else [])


@pytest.mark.parametrize(
    ("kind", "state", "lease_expires_at", "total"),
    [
        ("ack", None, None, 2),
        ("release", "ready", None, 3),
        ("touch", "reserved", T2 + 10_000, 3),
    ],
)
def test_a_lease_command_with_the_current_lease_changes_the_message(
    kind: str, state: str | None, lease_expires_at: int | None, total: int
) -> None:
    q = leased()
    q.run(lease_command(kind, [("1", "1001")]), T2)
    assert q.stats(T2).total == total
    if state is None:
        q.fails(c.Peek("1"), T2, MessageNotFound)
    else:
        view = q.peek(T2, "1")
        assert (view.state, view.lease_expires_at_ms, view.receive_count) == (
            state,
            lease_expires_at,
            1,
        )
    assert q.peek(T2, "2").state == "reserved"


@pytest.mark.parametrize("kind", KINDS)
def test_a_lease_command_reports_each_item_of_a_mixed_batch(kind: str) -> None:
    q = leased()
    items = [("1", "1001"), ("2", "9"), ("7", "1001"), ("3", "1003")]
    events, results = q.run(lease_command(kind, items), T2)
    assert [r.status for r in results] == ["ok", "stale_lease", "not_found", "stale_lease"]
    assert [r.id for r in results] == ["1", "2", "7", "3"]
    assert events == ok_events(kind, T2, [1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("after", "status"),
    [(9_999, "ok"), (10_000, "stale_lease"), (60_000, "stale_lease")],
)
def test_a_lease_is_stale_once_it_expires_even_if_nobody_took_the_message_again(
    kind: str, after: int, status: str
) -> None:
    q = leased()
    _, [result] = q.run(lease_command(kind, [("1", "1001")]), T1 + after)
    assert result.status == status
    if status != "ok":
        assert q.peek(T1 + after, "1").state == "ready"


@pytest.mark.parametrize(
    ("kind", "statuses", "events"),
    [
        pytest.param("ack", ["ok", "not_found"], [ev.MessagesAcked(T2, [1])], id="ack"),
        pytest.param(
            "release",
            ["ok", "stale_lease"],
            [ev.MessagesReleased(T2, [1], [T2])],
            id="release",
        ),
        pytest.param(
            "touch",
            ["ok", "ok"],
            [ev.LeasesExtended(T2, [1, 1], [T2 + 10_000, T2 + 10_000])],
            id="touch",
        ),
    ],
)
def test_a_message_twice_in_one_batch_is_handled_as_if_sent_one_after_the_other(
    kind: str, statuses: list[str], events: list[ev.Event]
) -> None:
    q = leased()
    emitted, results = q.run(lease_command(kind, [("1", "1001"), ("1", "1001")]), T2)
    assert [r.status for r in results] == statuses
    assert emitted == events


def test_a_second_release_of_a_message_dead_lettered_by_the_first_is_not_found() -> None:
    q = Q(dlq_settings(1))
    q.put(T1, b"a")
    [d] = q.take(T1)
    item = c.ReleaseItem(id=d.id, lease=d.lease)
    events, results = q.run(c.Release([item, item]), T2)
    assert [r.status for r in results] == ["ok", "not_found"]
    assert events == [ev.MessagesReleased(T2, [1], [T2])]
    assert list(q.state.outbox) == [1]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1001])
def test_lease_commands_take_1_to_1000_items(kind: str, n: int) -> None:
    q = leased()
    q.fails(lease_command(kind, [("1", "1001")] * n), T2, BadRequest)


@pytest.mark.parametrize("kind", KINDS)
def test_lease_commands_take_a_batch_of_1000_items(kind: str) -> None:
    q = leased()
    events, results = q.run(lease_command(kind, [("1", "1001")] + [("3", "0")] * 999), T2)
    assert len(results) == 1000
    assert [r.status for r in results[:2]] == ["ok", "stale_lease"]
    assert events == ok_events(kind, T2, [1])


def test_lease_commands_on_a_client_id_queue_find_messages_by_their_string_id() -> None:
    q = Q(S(id_mode="client"))
    q.put(T1, nm(b"a", id="007"), nm(b"b", id="x"))
    [d] = q.take(T1)
    assert q.ack(T2, ("7", d.lease), ("x", d.lease), ("007", d.lease)) == [
        "not_found",
        "stale_lease",
        "ok",
    ]


@pytest.mark.parametrize(
    ("delay", "activate_at", "when", "state", "taken_next"),
    [
        pytest.param(None, None, T2, "ready", "3", id="now"),
        pytest.param(0, None, T2, "ready", "3", id="zero-delay"),
        pytest.param(5_000, None, T2 + 5_000, "delayed", "3", id="delay"),
        pytest.param(None, T2 + 3_000, T2 + 3_000, "delayed", "3", id="activate-at"),
        pytest.param(None, T1 - 60_000, T1 - 60_000, "ready", "1", id="past-as-priority"),
    ],
)
def test_release_puts_the_message_back_at_the_asked_activation_time(
    delay: int | None, activate_at: int | None, when: int, state: str, taken_next: str
) -> None:
    q = leased()
    item = c.ReleaseItem(id="1", lease="1001", delay_ms=delay, activate_at_ms=activate_at)
    events, results = q.run(c.Release([item]), T2)
    assert events == [ev.MessagesReleased(T2, [1], [when])]
    assert results == [rp.ItemResult("1", "ok")]
    assert q.peek(T2, "1") == rp.MessageView("1", state, b"a", when, T1, 1, None, None, None)
    [d] = q.take(T2)
    assert d.id == taken_next


@pytest.mark.parametrize(
    "item",
    [
        pytest.param(c.ReleaseItem(id="1", lease="1001", delay_ms=1, activate_at_ms=T2), id="both"),
        pytest.param(c.ReleaseItem(id="1", lease="1001", delay_ms=-1), id="negative-delay"),
        pytest.param(c.ReleaseItem(id="1", lease="1001", delay_ms=True), id="bool-delay"),
        pytest.param(
            c.ReleaseItem(id="1", lease="1001", delay_ms=S().retention_ms), id="beyond-retention"
        ),
        pytest.param(c.ReleaseItem(id="9", lease="1", delay_ms=-1), id="bad-item-of-unknown-id"),
    ],
)
def test_release_rejects_a_bad_activation_time(item: c.ReleaseItem) -> None:
    q = leased()
    q.fails(c.Release([c.ReleaseItem(id="2", lease="1002"), item]), T2, BadRequest)
    assert q.stats(T2).reserved == 2


def test_release_keeps_the_receive_count_for_the_next_take() -> None:
    q = leased()
    assert q.release(T2, "1", "1001") == ["ok"]
    q.release(T2, "2", "1002")
    deliveries = q.take(T2, max=3)
    assert [(d.id, d.receive_count) for d in deliveries] == [("3", 1), ("1", 2), ("2", 2)]


def test_touch_extends_the_lease_and_prevents_its_expiry() -> None:
    q = leased()
    _, [result] = q.run(c.Touch([c.TouchItem(id="1", lease="1001")]), T1 + 9_000)
    assert result == rp.ItemResult("1", "ok", T1 + 19_000)
    assert q.peek(T1 + 9_000, "1").lease_expires_at_ms == T1 + 19_000
    assert q.stats(T1 + 15_000).reserved == 2 - 1  # "2" expired at T1 + 10_000, "1" did not
    assert q.ack(T1 + 18_999, ("1", "1001")) == ["ok"]


def test_a_touched_lease_still_expires_at_its_new_deadline() -> None:
    q = leased()
    q.run(c.Touch([c.TouchItem(id="1", lease="1001")]), T1 + 9_000)
    assert q.ack(T1 + 19_000, ("1", "1001")) == ["stale_lease"]


@pytest.mark.parametrize(
    ("vt", "deadline"),
    [(None, T2 + 10_000), (0, T2), (2_000, T2 + 2_000), (MAX_VT, T2 + MAX_VT)],
)
def test_touch_uses_the_queue_or_the_given_visibility_timeout(
    vt: int | None, deadline: int
) -> None:
    q = leased()
    item = c.TouchItem(id="1", lease="1001", visibility_timeout_ms=vt)
    events, results = q.run(c.Touch([item]), T2)
    assert events == [ev.LeasesExtended(T2, [1], [deadline])]
    assert results == [rp.ItemResult("1", "ok", deadline)]
    if deadline > T2:  # a zero timeout ends the lease at once
        assert q.peek(T2, "1").lease_expires_at_ms == deadline


def test_touch_can_shorten_a_lease() -> None:
    q = leased()
    q.run(c.Touch([c.TouchItem(id="1", lease="1001", visibility_timeout_ms=0)]), T2)
    assert q.ack(T2 + 1, ("1", "1001")) == ["stale_lease"]


@pytest.mark.parametrize("vt", [-1, MAX_VT + 1, True, 1.5])
def test_touch_rejects_a_visibility_timeout_out_of_bounds(vt: object) -> None:
    q = leased()
    q.fails(c.Touch([c.TouchItem(id="1", lease="1001", visibility_timeout_ms=vt)]), T2, BadRequest)


def test_a_shell_that_asks_learns_each_acked_messages_time_in_the_queue() -> None:
    q = Q()
    q.put(T1, b"a", b"b", b"c")
    q.state.ack_waits = []
    a, b = q.take(T2, max=2)
    assert q.ack(T2 + 700, (a.id, a.lease), (b.id, "not-the-lease")) == ["ok", "stale_lease"]
    q.run(c.Ack([c.LeaseRef("3", "old")], lenient=True), T2 + 800)  # deleted, not acked
    q.run(c.Drop(), T2 + 900)
    assert q.state.ack_waits == [T2 + 700 - T1]  # kept over the queue's end: the shell's list
    other = Q()
    other.put(T1, b"x")
    [x] = other.take(T1)
    other.ack(T2, (x.id, x.lease))
    assert other.state.ack_waits is None


# ------------------------------------------------ lenient (the SQS face's old receipt handles)


def test_a_lenient_ack_with_an_old_lease_deletes_a_message_taken_again() -> None:
    q = Q(S(visibility_timeout_ms=1_000))
    [mid] = q.put(T1, b"a")
    [first] = q.take(T1)
    [second] = q.take(T1 + 1_000)  # the first lease ended; taken again
    assert q.ack(T1 + 1_000, (mid, first.lease)) == ["stale_lease"]  # the native API
    events, results = q.run(c.Ack([c.LeaseRef(mid, first.lease)], lenient=True), T1 + 1_000)
    assert [r.status for r in results] == ["ok"]
    assert events == [ev.MessagesDeleted(T1 + 1_000, [1])]
    assert q.ack(T1 + 1_000, (mid, second.lease)) == ["not_found"]
    assert counts(q.stats(T1 + 1_000), "total", "acked") == {"total": 0, "acked": 0}
    q.assert_replays()


@pytest.mark.parametrize("later", [0, 1_000, 5_000], ids=["reserved", "ready", "delayed"])
def test_a_lenient_ack_deletes_the_message_in_any_state(later: int) -> None:
    q = Q(S(visibility_timeout_ms=1_000))
    [mid] = q.put(T1, b"a")
    [d] = q.take(T1)
    if later == 5_000:
        q.release(T1, mid, d.lease, delay_ms=10_000)
    _, results = q.run(c.Ack([c.LeaseRef(mid, "123"), c.LeaseRef("99", "1")], True), T1 + later)
    assert [r.status for r in results] == ["ok", "not_found"]
    assert q.stats(T1 + later).total == 0


def test_a_lenient_ack_with_the_current_lease_is_an_ack() -> None:
    q = Q(S())
    [mid] = q.put(T1, b"a")
    [d] = q.take(T1)
    events, _ = q.run(c.Ack([c.LeaseRef(mid, d.lease), c.LeaseRef(mid, d.lease)], True), T2)
    assert events == [ev.MessagesAcked(T2, [1])]
    assert q.stats(T2).acked == 1


def test_lenient_touch_and_release_act_on_the_current_lease_of_a_reserved_message() -> None:
    q = Q(S(visibility_timeout_ms=1_000))
    [mid] = q.put(T1, b"a")
    [old] = q.take(T1)
    [new] = q.take(T1 + 1_000)
    touch = c.Touch([c.TouchItem(id=mid, lease=old.lease, visibility_timeout_ms=30_000)], True)
    _, [touched] = q.run(touch, T1 + 1_500)
    assert (touched.status, touched.lease_expires_at_ms) == ("ok", T1 + 31_500)
    assert q.peek(T1 + 20_000, mid).state == "reserved"
    assert q.ack(T1 + 20_000, (mid, new.lease)) == ["ok"]  # the current holder keeps its lease
    t = T1 + 30_000
    [mid2] = q.put(t, b"b")
    [old] = q.take(t, vt=100)
    [new] = q.take(t + 100)
    _, [released] = q.run(c.Release([c.ReleaseItem(id=mid2, lease=old.lease)], True), t + 200)
    assert released.status == "ok"
    assert q.peek(t + 200, mid2).state == "ready"
    q.assert_replays()


def test_lenient_touch_and_release_of_a_message_not_in_flight_are_stale() -> None:
    q = Q(S())
    [mid] = q.put(T1, b"a")
    touch = c.Touch([c.TouchItem(id=mid, lease="5", visibility_timeout_ms=1_000)], True)
    assert [r.status for r in q.run(touch, T2)[1]] == ["stale_lease"]
    release = c.Release([c.ReleaseItem(id=mid, lease="5"), c.ReleaseItem(id="9", lease="5")], True)
    assert [r.status for r in q.run(release, T2)[1]] == ["stale_lease", "not_found"]


# ---------------------------------------------------------------- update / reschedule

UPD = S(max_message_bytes=8, retention_ms=1_000_000)


def one(state: str, settings: QueueSettings = UPD) -> Q:
    """Message "1" (body b"old", put at T1) in ``state``; reserved under "1001" until T1+VT."""
    q = Q(settings)
    if state == "delayed":
        q.put(T1, nm(b"old", delay_ms=60_000))
    else:
        q.put(T1, b"old")
    if state == "reserved":
        q.take(T1)
    return q


def view(
    state: str, body: bytes, activate_at: int, rc: int = 0, expires: int | None = None
) -> rp.MessageView:
    return rp.MessageView("1", state, body, activate_at, T1, rc, expires, None, None)


BEFORE = {
    "ready": view("ready", b"old", T1),
    "delayed": view("delayed", b"old", T1 + 60_000),
    "reserved": view("reserved", b"old", T1, 1, T1 + VT),
}


@pytest.mark.parametrize(
    ("state", "command", "event", "after"),
    [
        pytest.param(
            "ready",
            c.Update(id="1", body=b"new"),
            ev.MessageUpdated(T2, 1, b"new", None),
            view("ready", b"new", T1),
            id="body-of-ready",
        ),
        pytest.param(
            "ready",
            c.Update(id="1", body=b"12345678"),
            ev.MessageUpdated(T2, 1, b"12345678", None),
            view("ready", b"12345678", T1),
            id="body-of-max-bytes",
        ),
        pytest.param(
            "delayed",
            c.Update(id="1", body=b"new"),
            ev.MessageUpdated(T2, 1, b"new", None),
            view("delayed", b"new", T1 + 60_000),
            id="body-of-delayed",
        ),
        pytest.param(
            "reserved",
            c.Update(id="1", lease="1001", body=b"new"),
            ev.MessageUpdated(T2, 1, b"new", None),
            view("reserved", b"new", T1, 1, T1 + VT),
            id="body-of-reserved-keeps-reservation",
        ),
        pytest.param(
            "reserved",
            c.Update(id="1", lease="1001", delay_ms=5_000),
            ev.MessageUpdated(T2, 1, None, T2 + 5_000),
            view("delayed", b"old", T2 + 5_000),
            id="delay-of-reserved-ends-lease",
        ),
        pytest.param(
            "reserved",
            c.Reschedule(id="1", lease="1001", activate_at_ms=T2),
            ev.MessageUpdated(T2, 1, None, T2),
            view("ready", b"old", T2),
            id="reschedule-reserved-to-now",
        ),
        pytest.param(
            "reserved",
            c.Update(id="1", lease="1001", body=b"new", delay_ms=0),
            ev.MessageUpdated(T2, 1, b"new", T2),
            view("ready", b"new", T2),
            id="body-and-time-of-reserved",
        ),
        pytest.param(
            "ready",
            c.Reschedule(id="1", delay_ms=5_000),
            ev.MessageUpdated(T2, 1, None, T2 + 5_000),
            view("delayed", b"old", T2 + 5_000),
            id="reschedule-ready-later",
        ),
        pytest.param(
            "ready",
            c.Reschedule(id="1", activate_at_ms=T1 - 9_000),
            ev.MessageUpdated(T2, 1, None, T1 - 9_000),
            view("ready", b"old", T1 - 9_000),
            id="reschedule-ready-to-the-past",
        ),
        pytest.param(
            "delayed",
            c.Reschedule(id="1", delay_ms=0),
            ev.MessageUpdated(T2, 1, None, T2),
            view("ready", b"old", T2),
            id="reschedule-delayed-to-now",
        ),
        pytest.param(
            "delayed",
            c.Reschedule(id="1", activate_at_ms=T2 + 1_000),
            ev.MessageUpdated(T2, 1, None, T2 + 1_000),
            view("delayed", b"old", T2 + 1_000),
            id="reschedule-delayed-sooner",
        ),
        pytest.param(
            "delayed",
            c.Update(id="1", body=b"x", activate_at_ms=T2 - 1),
            ev.MessageUpdated(T2, 1, b"x", T2 - 1),
            view("ready", b"x", T2 - 1),
            id="body-and-time-of-delayed",
        ),
    ],
)
def test_update_emits_message_updated_and_replies_with_the_new_view(
    state: str, command: object, event: ev.MessageUpdated, after: rp.MessageView
) -> None:
    q = one(state)
    assert q.peek(T2, "1") == BEFORE[state]
    events, reply = q.run(command, T2)
    assert events == [event]
    assert reply == after
    assert q.peek(T2, "1") == after


def test_update_of_the_body_keeps_the_reservation_and_its_lease() -> None:
    q = one("reserved")
    q.run(c.Update(id="1", lease="1001", body=b"new"), T2)
    assert q.take(T2) == []
    assert q.ack(T2, ("1", "1001")) == ["ok"]


@pytest.mark.parametrize("kind", [c.Update, c.Reschedule])
def test_rescheduling_a_reserved_message_ends_its_lease_and_resets_its_receive_count(
    kind: type,
) -> None:
    q = one("reserved", S(max_receives=1, visibility_timeout_ms=VT))
    q.run(kind(id="1", lease="1001", delay_ms=1_000), T2)
    assert counts(q.stats(T2), "reserved", "delayed") == {"reserved": 0, "delayed": 1}
    assert q.ack(T2, ("1", "1001")) == ["stale_lease"]
    [d] = q.take(T2 + 1_000)
    assert (d.id, d.receive_count, d.lease) == ("1", 1, "1002")
    assert q.stats(T2 + 1_000).dead_lettered == 0


@pytest.mark.parametrize(
    ("state", "command", "error"),
    [
        pytest.param("reserved", c.Update(id="1", body=b"new"), Conflict, id="no-lease"),
        pytest.param(
            "reserved", c.Reschedule(id="1", delay_ms=0), Conflict, id="reschedule-no-lease"
        ),
        pytest.param(
            "reserved", c.Update(id="1", lease="1002", body=b"new"), StaleLease, id="stale-lease"
        ),
        pytest.param(
            "reserved",
            c.Reschedule(id="1", lease="999", delay_ms=0),
            StaleLease,
            id="reschedule-stale-lease",
        ),
        pytest.param(
            "ready", c.Update(id="1", lease="1001", body=b"new"), StaleLease, id="lease-on-ready"
        ),
        pytest.param(
            "delayed",
            c.Reschedule(id="1", lease="1001", delay_ms=0),
            StaleLease,
            id="lease-on-delayed",
        ),
        pytest.param("ready", c.Update(id="1"), BadRequest, id="nothing-to-change"),
        pytest.param("ready", c.Reschedule(id="1"), BadRequest, id="reschedule-nothing"),
        pytest.param("reserved", c.Update(id="1", lease="1001"), BadRequest, id="only-a-lease"),
        pytest.param("ready", c.Update(id="2", body=b"new"), MessageNotFound, id="unknown-id"),
        pytest.param(
            "ready", c.Reschedule(id="x", delay_ms=0), MessageNotFound, id="non-numeric-id"
        ),
        pytest.param("ready", c.Update(id="1", body=b""), BadRequest, id="empty-body"),
        pytest.param("ready", c.Update(id="1", body=b"123456789"), TooLarge, id="oversized"),
        pytest.param(
            "reserved",
            c.Update(id="1", lease="1001", body=b"123456789"),
            TooLarge,
            id="oversized-reserved",
        ),
        pytest.param(
            "ready",
            c.Update(id="1", delay_ms=1, activate_at_ms=T2),
            BadRequest,
            id="delay-and-activate-at",
        ),
        pytest.param("ready", c.Reschedule(id="1", delay_ms=-1), BadRequest, id="negative-delay"),
        pytest.param(
            "ready", c.Reschedule(id="1", delay_ms=1_000_000), BadRequest, id="beyond-retention"
        ),
        pytest.param(
            "ready",
            c.Reschedule(id="1", activate_at_ms=T2 + 1_000_000),
            BadRequest,
            id="activate-at-beyond-retention",
        ),
    ],
)
def test_update_and_reschedule_reject_bad_requests(
    state: str, command: object, error: type[QueueError]
) -> None:
    q = one(state)
    q.fails(command, T2, error)
    assert q.peek(T2, "1") == BEFORE[state]


@pytest.mark.parametrize("kind", [c.Update, c.Reschedule])
def test_update_with_a_lease_that_expired_is_stale(kind: type) -> None:
    q = one("reserved")
    q.fails(kind(id="1", lease="1001", delay_ms=0), T1 + VT, StaleLease)


# ---------------------------------------------------------------- peek / peek ready


@pytest.mark.parametrize("state", ["ready", "delayed", "reserved"])
def test_peek_shows_a_message_in_each_state_and_emits_nothing(state: str) -> None:
    q = one(state)
    assert q.run(c.Peek("1"), T2) == ([], BEFORE[state])


@pytest.mark.parametrize("mid", ["2", "x", "", "-1", "01x", "9" * 25, SUPERSCRIPT_TWO])
def test_peek_of_an_unknown_id_raises_message_not_found(mid: str) -> None:
    q = one("ready")
    error = q.fails(c.Peek(mid), T2, MessageNotFound)
    assert error.fields == {"id": mid}


def test_peek_ready_shows_the_next_messages_in_take_order_without_reserving_them() -> None:
    q = Q()
    q.put(T1, nm(b"a"), nm(b"b", activate_at_ms=T1 - 1_000), nm(b"c", delay_ms=5_000), nm(b"d"))
    events, views = q.run(c.PeekReady(10), T2)
    assert events == []
    assert [(v.id, v.state) for v in views] == [("2", "ready"), ("1", "ready"), ("4", "ready")]
    assert q.run(c.PeekReady(1), T2)[1] == views[:1]
    assert counts(q.stats(T2), "ready", "reserved") == {"ready": 3, "reserved": 0}
    assert [d.id for d in q.take(T2, max=10)] == ["2", "1", "4"]


def test_peek_ready_of_an_empty_queue_is_an_empty_list() -> None:
    assert Q().run(c.PeekReady(5), T1) == ([], [])


# ---------------------------------------------------------------- browse


@pytest.fixture(params=["walk", "scan"])
def browse_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Pages found by walking the state's heap only, or by scanning its messages only (a
    page takes whichever is cheaper; both must list the same)."""
    budget = 10**9 if request.param == "walk" else -1
    monkeypatch.setattr(browse_module, "walk_budget", lambda state, want: budget)
    return str(request.param)


def browse(
    q: Q, now: int, state: str = "ready", limit: int = 100, after: str | None = None
) -> tuple[list[str], str | None]:
    """One page: the ids listed and the next cursor (checking that nothing was emitted)."""
    events, page = q.run(c.Browse(state, limit, after), now)
    assert events == []
    assert all(v.state == state for v in page.messages)
    return [v.id for v in page.messages], page.next


def browse_all(q: Q, now: int, state: str, limit: int) -> list[str]:
    """Every page from the start, concatenated."""
    listed, after = browse(q, now, state, limit)
    return listed + browse_all_after(q, now, state, after, limit)


def browse_all_after(q: Q, now: int, state: str, after: str | None, limit: int = 1) -> list[str]:
    """The pages after cursor ``after``, concatenated (at most 50 pages: a cursor that
    does not move on fails instead of looping)."""
    listed: list[str] = []
    for _ in range(50):
        if after is None:
            return listed
        more, after = browse(q, now, state, limit, after)
        listed += more
    raise AssertionError(f"still paging after 50 pages: {listed}")


def mixed() -> Q:
    """Messages 1-8 in every state, each state in an order unlike arrival: ready 8, 3, 4
    (8 was activated in the past); delayed 6, 7, 5; reserved 2, 1 (2 expires first)."""
    q = Q()
    q.put(T1, nm(b"1"), nm(b"2"), nm(b"3"), nm(b"4"))
    q.take(T1, vt=60_000)  # 1, lease 1001
    q.take(T1, vt=5_000)  # 2, lease 1002
    q.put(T1, nm(b"5", delay_ms=9_000), nm(b"6", delay_ms=3_000), nm(b"7", delay_ms=3_000))
    q.put(T1, nm(b"8", activate_at_ms=T1 - 1_000))
    return q


MIXED = {"ready": ["8", "3", "4"], "delayed": ["6", "7", "5"], "reserved": ["2", "1"]}


def test_mixed_queue_holds_what_the_browse_tables_expect() -> None:
    q = mixed()
    states = {mid: q.peek(T1, mid).state for mid in "12345678"}
    assert states == {mid: state for state, ids in MIXED.items() for mid in ids}


@pytest.mark.usefixtures("browse_path")
@pytest.mark.parametrize("state", list(MIXED))
def test_browse_lists_a_state_in_its_order_and_changes_nothing(state: str) -> None:
    q = mixed()
    before = state_bytes(q.state)
    assert browse(q, T1, state) == (MIXED[state], None)
    assert state_bytes(q.state) == before
    assert browse(q, T1, state) == (MIXED[state], None)  # the heaps are as they were


@pytest.mark.usefixtures("browse_path")
def test_browse_of_ready_lists_what_take_hands_out_in_take_order() -> None:
    q = mixed()
    listed, _ = browse(q, T1, "ready")
    assert [d.id for d in q.take(T1, max=10)] == listed


def test_browse_shows_each_message_as_peek_does() -> None:
    q = mixed()
    for state in ("ready", "delayed", "reserved"):
        _, page = q.run(c.Browse(state), T1)
        assert page.messages == [q.peek(T1, v.id) for v in page.messages]


@pytest.mark.usefixtures("browse_path")
@pytest.mark.parametrize("state", ["ready", "delayed", "reserved"])
@pytest.mark.parametrize("limit", [1, 2, 3])
def test_browse_pages_follow_one_another_to_the_end(state: str, limit: int) -> None:
    q = mixed()
    whole, _ = browse(q, T1, state)
    assert browse_all(q, T1, state, limit) == whole
    first, after = browse(q, T1, state, limit)
    assert first == whole[:limit]
    assert (after is None) == (len(whole) <= limit)


@pytest.mark.usefixtures("browse_path")
def test_browse_cursor_names_the_state_and_the_key_of_the_last_message() -> None:
    q = mixed()
    assert browse(q, T1, "ready", 1) == (["8"], f"ready.{T1 - 1_000}.8")
    assert browse(q, T1, "delayed", 2) == (["6", "7"], f"delayed.{T1 + 3_000}.7")
    assert browse(q, T1, "reserved", 1) == (["2"], f"reserved.{T1 + 5_000}.2")


@pytest.mark.usefixtures("browse_path")
def test_browse_of_an_empty_state_is_an_empty_last_page() -> None:
    assert browse(Q(), T1, "delayed") == ([], None)
    assert browse(mixed(), T1, "reserved", after=f"reserved.{T1 + 10**9}.1") == ([], None)


@pytest.mark.usefixtures("browse_path")
def test_paging_while_the_queue_changes_lists_every_message_that_stayed_exactly_once() -> None:
    q = Q(S(visibility_timeout_ms=VT))
    q.put(T1, *[nm(bytes([65 + i])) for i in range(8)])  # 1-8, all ready at T1
    first, after = browse(q, T1, "ready", 3)
    assert first == ["1", "2", "3"]
    taken = q.take(T2, max=2)  # 1 and 2 leave (already listed)
    q.put(T2, nm(b"i", activate_at_ms=T1 - 1), nm(b"j"))  # 9: behind the cursor; 10: ahead
    q.ack(T2, *[(d.id, d.lease) for d in taken])
    q.take(T2 + 1, max=1)  # 9 leaves, unlisted: it came in behind the cursor
    q.run(c.Delete("5"), T2 + 2)  # 5 leaves before it is listed
    second, after = browse(q, T2 + 3, "ready", 3, after)
    third, last = browse(q, T2 + 3, "ready", 3, after)
    assert (second, third, last) == (["4", "6", "7"], ["8", "10"], None)


@pytest.mark.usefixtures("browse_path")
def test_paging_reserved_messages_lists_one_that_stayed_once_while_leases_end_around_it() -> None:
    q = Q()
    q.put(T1, *[nm(bytes([65 + i])) for i in range(5)])
    taken = {d.id: d for d in (q.take(T1 + i, vt=10_000)[0] for i in range(5))}
    first, after = browse(q, T1 + 5, "reserved", 2)
    assert first == ["1", "2"]
    q.ack(T1 + 6, ("3", taken["3"].lease))  # gone before it is listed
    q.take(T1 + 10_001, vt=50_000)  # 1's lease ran out; it is taken again: expires last
    rest = browse_all_after(q, T1 + 10_002, "reserved", after)
    assert rest == ["4", "5", "1"]  # 1 re-entered with a new key ahead of the cursor


@pytest.mark.usefixtures("browse_path")
@pytest.mark.parametrize(("vt", "listed"), [(20_000, ["2", "1"]), (1_000, ["2"])])
def test_a_touch_moves_a_reserved_message_to_its_new_place_in_the_order(
    vt: int, listed: list[str]
) -> None:
    q = Q()
    q.put(T1, nm(b"a"), nm(b"b"))
    [a] = q.take(T1, vt=5_000)
    q.take(T1, vt=10_000)
    first, after = browse(q, T1, "reserved", 1)
    assert first == ["1"]
    q.run(c.Touch([c.TouchItem(id="1", lease=a.lease, visibility_timeout_ms=vt)]), T1 + 100)
    assert browse_all_after(q, T1 + 100, "reserved", after) == listed


@pytest.mark.usefixtures("browse_path")
def test_browse_skips_stale_index_entries_and_lists_a_message_once() -> None:
    q = Q()
    q.put(T1, nm(b"a"), nm(b"b"))
    [a] = q.take(T1, vt=5_000)
    for _ in range(3):  # three entries of message 1 with the same key
        q.run(c.Touch([c.TouchItem(id="1", lease=a.lease, visibility_timeout_ms=5_000)]), T1)
    [b] = q.take(T1, vt=5_000)
    q.release(T1, b.id, b.lease, delay_ms=60_000)  # 2's reserved entry is stale now
    assert browse(q, T1, "reserved") == (["1"], None)
    assert browse(q, T1, "delayed") == (["2"], None)


@pytest.mark.usefixtures("browse_path")
def test_a_page_stops_at_8_mib_of_bodies_but_holds_at_least_one_message() -> None:
    mib = 1024 * 1024
    q = Q(S(max_message_bytes=16 * mib))
    q.put(T1, nm(b"a" * 3 * mib), nm(b"b" * 3 * mib), nm(b"c" * 3 * mib), nm(b"d" * 9 * mib))
    first, after = browse(q, T1, "ready", 10)
    assert first == ["1", "2"]
    second, after = browse(q, T1, "ready", 10, after)
    assert second == ["3"]
    assert browse(q, T1, "ready", 10, after) == (["4"], None)


def test_browse_of_a_fifo_queue_lists_every_ready_message_blocked_groups_too() -> None:
    q = fifo((b"a", "g"), (b"b", "g"), (b"x", "h"), (b"y", "h"))
    q.put(T1, nm(b"z", group="k", activate_at_ms=T1 - 10))
    assert [d.body for d in q.take(T2)] == [b"z"]  # group k is busy now
    assert [d.body for d in q.take(T2, max=2)] == [b"a", b"b"]  # g's run
    assert browse(q, T2, "ready") == (["3", "4"], None)
    q.release(T2, "1", "1002")  # a comes back: g stays blocked by b
    assert browse_all(q, T2, "ready", 1) == ["3", "4", "1"]
    assert browse(q, T2, "reserved") == (["2", "5"], None)


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(c.Browse("dead"), id="unknown-state"),
        pytest.param(c.Browse(""), id="empty-state"),
        pytest.param(c.Browse(None), id="no-state"),  # type: ignore[arg-type]
        pytest.param(c.Browse("ready", 0), id="limit-0"),
        pytest.param(c.Browse("ready", 1001), id="limit-1001"),
        pytest.param(c.Browse("ready", True), id="limit-bool"),
        pytest.param(c.Browse("ready", 1.5), id="limit-float"),  # type: ignore[arg-type]
        pytest.param(c.Browse("ready", 10, "x"), id="cursor-junk"),
        pytest.param(c.Browse("ready", 10, ""), id="cursor-empty"),
        pytest.param(c.Browse("ready", 10, "ready.1"), id="cursor-short"),
        pytest.param(c.Browse("ready", 10, "ready.-1.2"), id="cursor-negative"),
        pytest.param(c.Browse("ready", 10, "ready.1.2.3"), id="cursor-long"),
        pytest.param(c.Browse("ready", 10, "ready.1." + "9" * 20), id="cursor-huge"),
        pytest.param(c.Browse("ready", 10, f"delayed.{T1}.1"), id="cursor-of-delayed"),
        pytest.param(c.Browse("ready", 10, 7), id="cursor-int"),  # type: ignore[arg-type]
    ],
)
def test_browse_rejects_a_bad_state_limit_or_cursor(command: c.Browse) -> None:
    q = mixed()
    q.fails(command, T1, BadRequest)


# ---------------------------------------------------------------- delete


@pytest.mark.parametrize(
    ("state", "lease"),
    [("ready", None), ("delayed", None), ("reserved", "1001")],
)
def test_delete_emits_messages_deleted_and_the_message_is_gone(
    state: str, lease: str | None
) -> None:
    q = one(state)
    assert q.run(c.Delete("1", lease), T2) == ([ev.MessagesDeleted(T2, [1])], None)
    q.fails(c.Peek("1"), T2, MessageNotFound)
    assert q.stats(T2).total == 0
    assert q.ack(T2, ("1", "1001")) == ["not_found"]


@pytest.mark.parametrize(
    ("state", "mid", "lease", "error"),
    [
        pytest.param("reserved", "1", None, Conflict, id="reserved-needs-a-lease"),
        pytest.param("reserved", "1", "1002", StaleLease, id="stale-lease"),
        pytest.param("ready", "1", "1001", StaleLease, id="lease-on-ready"),
        pytest.param("delayed", "1", "1001", StaleLease, id="lease-on-delayed"),
        pytest.param("ready", "2", None, MessageNotFound, id="unknown-id"),
        pytest.param("ready", SUPERSCRIPT_TWO, None, MessageNotFound, id="unicode-digit-id"),
    ],
)
def test_delete_rejects_a_missing_or_stale_lease_and_unknown_ids(
    state: str, mid: str, lease: str | None, error: type[QueueError]
) -> None:
    q = one(state)
    q.fails(c.Delete(mid, lease), T2, error)
    assert q.peek(T2, "1") == BEFORE[state]


# ---------------------------------------------------------------- purge


@pytest.mark.parametrize(
    ("ready", "delayed", "reserved"),
    [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (3, 2, 2)],
)
def test_purge_deletes_every_message_and_reports_the_count(
    ready: int, delayed: int, reserved: int
) -> None:
    q = Q()
    if ready + delayed + reserved:
        q.put(T1, *[b"r"] * (ready + reserved), *[nm(b"d", delay_ms=9_000)] * delayed)
    leases = [(d.id, d.lease) for d in q.take(T1, max=reserved)] if reserved else []
    n = ready + delayed + reserved
    events, purged = q.run(c.Purge(), T2)
    assert purged == n
    assert events == ([ev.QueuePurged(T2)] if n else [])
    stats = q.stats(T2)
    assert counts(stats, "ready", "delayed", "reserved", "total", "purged") == {
        "ready": 0,
        "delayed": 0,
        "reserved": 0,
        "total": 0,
        "purged": n,
    }
    assert q.take(T2 + 10_000, max=10) == []
    for ref in leases:
        assert q.ack(T2, ref) == ["not_found"]
    assert q.state.next_due_ms() is None


def test_a_purged_queue_takes_new_messages() -> None:
    q = Q()
    q.put(T1, b"a")
    q.run(c.Purge(), T2)
    assert q.put(T2, b"b") == ["2"]
    assert q.bodies(T2) == b"b"


# ---------------------------------------------------------------- stats


def stats_scene() -> Q:
    """At T1: a (T1), b (T1 - 2000), c (delayed to T1 + 10000), d (T1); b taken for 5 s."""
    q = Q(S(visibility_timeout_ms=5_000))
    q.put(
        T1,
        nm(b"a"),
        nm(b"b", activate_at_ms=T1 - 2_000),
        nm(b"c", delay_ms=10_000),
        nm(b"d"),
    )
    assert q.bodies(T1) == b"b"
    return q


@pytest.mark.parametrize(
    ("after", "ready", "delayed", "reserved", "oldest"),
    [
        (0, 2, 1, 1, 0),
        (3_000, 2, 1, 1, 3_000),
        (4_999, 2, 1, 1, 4_999),
        (5_000, 3, 1, 0, 5_000),
        (10_000, 4, 0, 0, 10_000),
    ],
)
def test_stats_count_messages_by_state_and_age_the_oldest_ready(
    after: int, ready: int, delayed: int, reserved: int, oldest: int
) -> None:
    q = stats_scene()
    stats = q.stats(T1 + after)
    assert stats == rp.StatsView(
        ready=ready,
        delayed=delayed,
        reserved=reserved,
        total=4,
        oldest_ready_age_ms=oldest,
        dead_lettered=0,
        dead_letter_pending=0,
        expired=0,
        acked=0,
        enqueued=4,
        purged=0,
        groups=0,
        now_ms=T1 + after,
    )


def test_stats_age_a_prioritised_message_from_its_activation_time() -> None:
    q = Q()
    q.put(T1, nm(b"a", activate_at_ms=T1 - 7_000))
    assert q.stats(T2).oldest_ready_age_ms == T2 - T1 + 7_000


def test_stats_of_an_empty_queue_are_zero_with_no_oldest_age() -> None:
    stats = Q().stats(T1)
    assert counts(stats, "ready", "delayed", "reserved", "total", "oldest_ready_age_ms") == {
        "ready": 0,
        "delayed": 0,
        "reserved": 0,
        "total": 0,
        "oldest_ready_age_ms": None,
    }


def test_stats_count_acked_and_enqueued_messages() -> None:
    q = stats_scene()
    assert q.ack(T1, ("2", "1001")) == ["ok"]
    assert counts(q.stats(T1), "acked", "enqueued", "total") == {
        "acked": 1,
        "enqueued": 4,
        "total": 3,
    }


# ---------------------------------------------------------------- dead letters

DLQ_VT = 1_000


def dlq_settings(max_receives: int) -> QueueSettings:
    return S(max_receives=max_receives, dead_letter_queue="dlq", visibility_timeout_ms=DLQ_VT)


def end_lease(q: Q, how: str, d: rp.Delivery, now: int) -> None:
    """End the lease of ``d`` (taken at ``now``) by expiry or a release."""
    if how == "release":
        assert q.release(now + 100, d.id, d.lease) == ["ok"]
    elif how == "release-with-delay":
        assert q.release(now + 100, d.id, d.lease, delay_ms=500) == ["ok"]
    else:
        q.assert_replays(now + DLQ_VT)  # the lease expires on its own


@pytest.mark.parametrize("how", ["expiry", "release", "release-with-delay"])
@pytest.mark.parametrize("max_receives", [1, 2, 3])
def test_a_message_is_dead_lettered_when_its_last_allowed_lease_ends(
    max_receives: int, how: str
) -> None:
    q = Q(dlq_settings(max_receives))
    q.put(T1, b"a")
    for attempt in range(1, max_receives + 1):
        now = T1 + attempt * 10_000
        [d] = q.take(now)
        assert d.receive_count == attempt
        end_lease(q, how, d, now)
        stats = q.stats(now + 5_000)
        if attempt < max_receives:
            assert counts(stats, "total", "dead_lettered") == {"total": 1, "dead_lettered": 0}
            assert q.state.outbox == {}
    assert counts(stats, "total", "ready", "reserved", "dead_lettered", "dead_letter_pending") == {
        "total": 0,
        "ready": 0,
        "reserved": 0,
        "dead_lettered": 1,
        "dead_letter_pending": 1,
    }
    assert list(q.state.outbox) == [1]
    dead = q.state.outbox[1]
    assert (dead.body, dead.receive_count) == (b"a", max_receives)
    q.fails(c.Peek("1"), now + 5_000, MessageNotFound)
    assert q.take(now + 60_000) == []


def test_a_redelivered_message_keeps_its_server_id_unless_the_queue_has_it() -> None:
    q = Q(S())
    [own] = q.put(T1, b"mine")
    moved = [
        c.NewMessage(body=b"a", id="123456789"),
        c.NewMessage(body=b"b", id=own),  # taken here: a new id
        c.NewMessage(body=b"c", id="123456789"),  # taken earlier in the batch
        c.NewMessage(body=b"d", id="not-a-server-id"),
        c.NewMessage(body=b"e", id=str(2**63)),  # out of range
    ]
    _, results = q.run(c.Put(moved, redelivery=True), T2)
    got = [r.id for r in results]
    assert got[0] == "123456789"
    assert len(set(got) | {own}) == 6
    assert all(int(i) > int(own) for i in got[1:])  # drawn after everything this queue has
    assert q.peek(T2, "123456789").body == b"a"
    [later] = q.put(T2, b"later")
    assert int(later) > max(int(i) for i in got)
    q.assert_replays()


def test_a_server_id_queue_still_refuses_ids_outside_redelivery() -> None:
    q = Q(S())
    q.fails(c.Put([c.NewMessage(body=b"a", id="5")]), T1, BadRequest)


def test_an_ack_on_the_last_allowed_receive_deletes_the_message_normally() -> None:
    q = Q(dlq_settings(1))
    q.put(T1, b"a")
    [d] = q.take(T1)
    assert q.ack(T2, (d.id, d.lease)) == ["ok"]
    stats = q.stats(T2 + 10_000)
    assert counts(stats, "acked", "dead_lettered") == {"acked": 1, "dead_lettered": 0}
    assert q.state.outbox == {}


def test_a_queue_without_a_dead_letter_queue_still_moves_dead_letters_to_the_outbox() -> None:
    q = Q(S(max_receives=1, visibility_timeout_ms=DLQ_VT))
    q.put(T1, b"a")
    q.take(T1)
    assert q.stats(T1 + DLQ_VT).dead_letter_pending == 1


def two_dead_letters() -> Q:
    q = Q(dlq_settings(1))
    q.put(T1, b"a", b"b")
    q.take(T1, max=2)
    q.assert_replays(T1 + DLQ_VT)
    assert list(q.state.outbox) == [1, 2]
    return q


@pytest.mark.parametrize(
    ("confirm", "routed"),
    [
        ([1], [1]),
        ([2, 1], [2, 1]),
        ([1, 99], [1]),
        ([99], []),
        ([], []),
        ([1, 1], [1]),
    ],
)
def test_confirm_dead_letters_removes_them_from_the_outbox(
    confirm: list[int], routed: list[int]
) -> None:
    q = two_dead_letters()
    events, n = q.run(c.ConfirmDeadLetters(confirm), T2 + DLQ_VT)
    assert events == ([ev.DeadLettersRouted(T2 + DLQ_VT, routed)] if routed else [])
    assert n == len(routed)
    assert sorted(q.state.outbox) == sorted({1, 2} - set(routed))
    stats = q.stats(T2 + DLQ_VT)
    assert counts(stats, "dead_lettered", "dead_letter_pending") == {
        "dead_lettered": 2,
        "dead_letter_pending": 2 - len(routed),
    }


def test_a_reused_client_id_does_not_overwrite_a_pending_dead_letter() -> None:
    q = Q(S(id_mode="client", max_receives=1, visibility_timeout_ms=DLQ_VT))
    q.put(T1, nm(b"first", id="x"))
    q.take(T1)
    assert q.stats(T1 + DLQ_VT).dead_letter_pending == 1
    q.put(T1 + DLQ_VT, nm(b"second", id="x"))
    q.take(T1 + DLQ_VT)
    stats = q.stats(T1 + 2 * DLQ_VT)
    assert counts(stats, "dead_lettered", "dead_letter_pending") == {
        "dead_lettered": 2,
        "dead_letter_pending": 2,
    }


# ---------------------------------------------------------------- retention

RETENTION = 10_000
RET = S(retention_ms=RETENTION, visibility_timeout_ms=60_000)


def retained(state: str) -> tuple[Q, str | None]:
    """Message "1", put at T1, in ``state`` until past T1 + RETENTION; and its lease."""
    q = Q(RET)
    if state == "priority":
        q.put(T1, nm(b"a", activate_at_ms=T1 - 50_000))
    elif state == "delayed":
        q.put(T1, nm(b"a", delay_ms=5_000))
        q.run(c.Reschedule(id="1", delay_ms=9_000), T1 + 4_000)  # active at T1 + 13_000
    else:
        q.put(T1, b"a")
    lease = q.take(T1)[0].lease if state == "reserved" else None
    return q, lease


@pytest.mark.parametrize("state", ["ready", "priority", "delayed", "reserved"])
def test_retention_removes_a_message_in_any_state_once_it_is_old_enough(state: str) -> None:
    q, lease = retained(state)
    view = q.peek(T1 + RETENTION - 1, "1")
    assert view.state == ("ready" if state == "priority" else state)
    stats = q.stats(T1 + RETENTION)
    assert counts(stats, "total", "ready", "delayed", "reserved", "expired") == {
        "total": 0,
        "ready": 0,
        "delayed": 0,
        "reserved": 0,
        "expired": 1,
    }
    q.fails(c.Peek("1"), T1 + RETENTION, MessageNotFound)
    assert q.take(T1 + RETENTION + 5_000) == []
    if lease is not None:
        assert q.ack(T1 + RETENTION, ("1", lease)) == ["not_found"]
    assert q.state.next_due_ms() is None


def test_retention_counts_from_each_message_s_arrival() -> None:
    q = Q(RET)
    q.put(T1, b"a")
    q.put(T1 + 3_000, b"b")
    assert q.bodies(T1 + RETENTION + 2_999, max=10) == b"b"
    assert counts(q.stats(T1 + RETENTION + 2_999), "total", "expired") == {
        "total": 1,
        "expired": 1,
    }
    assert counts(q.stats(T1 + RETENTION + 3_000), "total", "expired") == {
        "total": 0,
        "expired": 2,
    }


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([20_000], id="one-step"),
        pytest.param([5_000, 20_000], id="two-steps"),
    ],
)
def test_a_message_dead_lettered_before_its_retention_ends_stays_in_the_outbox(
    steps: list[int],
) -> None:
    q = Q(S(retention_ms=RETENTION, max_receives=1, visibility_timeout_ms=DLQ_VT))
    q.put(T1, b"a", b"b")
    q.take(T1)  # "1" is dead-lettered at T1 + 1000; both are past retention at T1 + 10000
    for step in steps:
        stats = q.stats(T1 + step)
    assert counts(stats, "total", "expired", "dead_lettered", "dead_letter_pending") == {
        "total": 0,
        "expired": 1,
        "dead_lettered": 1,
        "dead_letter_pending": 1,
    }
    assert list(q.state.outbox) == [1]


# ---------------------------------------------------------------- FIFO


def fifo(*specs: tuple[bytes, str], **kw: typing.Any) -> Q:
    """A FIFO queue with messages (body, group) put at T1 in this order."""
    q = Q(S(fifo=True, **kw))
    q.put(T1, *[nm(body, group=group) for body, group in specs])
    return q


def test_fifo_hands_out_a_group_in_strict_order_one_at_a_time() -> None:
    q = fifo((b"a", "g"), (b"b", "g"), (b"c", "g"))
    for expected in (b"a", b"b", b"c"):
        [d] = q.take(T2, max=1)
        assert d.body == expected
        assert d.group == "g"
        assert q.take(T2, max=10) == []
        assert q.ack(T2, (d.id, d.lease)) == ["ok"]
    assert q.stats(T2).groups == 0


def test_fifo_a_take_hands_out_a_run_of_one_group_in_order_up_to_max() -> None:
    q = fifo((b"a", "g"), (b"b", "g"), (b"c", "g"), (b"x", "h"))
    taken = q.take(T2, max=2)
    assert [d.body for d in taken] == [b"a", b"b"]
    assert {d.group for d in taken} == {"g"}
    assert q.bodies(T2, max=10) == b"x"  # g is blocked while any of its run is out


def test_fifo_a_group_stays_blocked_until_its_whole_run_is_done() -> None:
    q = fifo((b"a", "g"), (b"b", "g"), (b"c", "g"))
    a, b = q.take(T2, max=2)
    assert q.ack(T2, (b.id, b.lease)) == ["ok"]
    assert q.take(T2, max=10) == []  # a still out
    assert q.ack(T2, (a.id, a.lease)) == ["ok"]
    assert q.bodies(T2, max=10) == b"c"


def test_fifo_a_head_back_while_its_run_is_out_is_offered_once_the_group_is_free() -> None:
    q = fifo((b"a", "g"), (b"b", "g"), (b"c", "g"))
    [a] = q.take(T1, max=1, vt=1_000)
    assert q.release(T1, a.id, a.lease) == ["ok"]
    a, b = q.take(T1, max=2, vt=1_000)
    q.run(c.Touch([c.TouchItem(id=b.id, lease=b.lease, visibility_timeout_ms=60_000)]), T1)
    assert q.take(T1 + 1_000, max=10) == []  # a's lease ended, b is still out
    assert q.ack(T1 + 1_000, (b.id, b.lease)) == ["ok"]
    assert q.bodies(T1 + 1_000, max=10) == b"ac"


def test_fifo_a_take_fills_up_from_the_next_group() -> None:
    q = fifo((b"a", "g"), (b"b", "g"), (b"x", "h"), (b"y", "h"), (b"z", "h"))
    assert q.bodies(T2, max=4) == b"abxy"


def test_fifo_blocks_a_group_while_one_of_its_messages_is_reserved() -> None:
    q = fifo((b"a", "g"), (b"b", "g"), (b"x", "h"), (b"y", "h"))
    assert q.bodies(T2, max=1) == b"a"
    assert q.bodies(T2, max=1) == b"x"
    assert q.bodies(T2, max=10) == b""
    stats = q.stats(T2)
    assert counts(stats, "ready", "reserved", "groups") == {"ready": 2, "reserved": 2, "groups": 2}


def test_fifo_serves_other_groups_in_activation_then_arrival_order() -> None:
    q = Q(FIFO)
    q.put(
        T1,
        nm(b"a", group="g"),
        nm(b"b", group="g"),
        nm(b"x", group="h", activate_at_ms=T1 - 1_000),
        nm(b"p", group="i"),
    )
    assert q.bodies(T2, max=10) == b"xabp"


@pytest.mark.parametrize(
    ("finish", "next_body"),
    [
        pytest.param("ack", b"b", id="ack-unblocks-the-next"),
        pytest.param("delete", b"b", id="delete-unblocks-the-next"),
        pytest.param("release", b"ab", id="release-keeps-the-head"),
        pytest.param("expiry", b"ab", id="expiry-keeps-the-head"),
    ],
)
def test_fifo_unblocks_a_group_when_its_reserved_message_is_done(
    finish: str, next_body: bytes
) -> None:
    q = fifo((b"a", "g"), (b"b", "g"), visibility_timeout_ms=1_000)
    [d] = q.take(T1)
    now = T1 + 500
    if finish == "ack":
        assert q.ack(now, (d.id, d.lease)) == ["ok"]
    elif finish == "delete":
        q.run(c.Delete(d.id, d.lease), now)
    elif finish == "release":
        assert q.release(now, d.id, d.lease) == ["ok"]
    else:
        now = T1 + 1_000
    assert q.bodies(now, max=10) == next_body


def test_fifo_a_delayed_head_blocks_its_group() -> None:
    q = Q(FIFO)
    q.put(T1, nm(b"a", group="g", delay_ms=5_000), nm(b"b", group="g"), nm(b"x", group="h"))
    assert q.bodies(T1, max=10) == b"x"
    assert q.bodies(T1 + 4_999, max=10) == b""
    assert q.bodies(T1 + 5_000, max=10) == b"ab"


def test_fifo_a_head_released_with_a_delay_blocks_its_group_until_due() -> None:
    q = fifo((b"a", "g"), (b"b", "g"))
    [d] = q.take(T1)
    q.release(T2, d.id, d.lease, delay_ms=3_000)
    assert q.bodies(T2 + 2_999, max=10) == b""
    assert q.bodies(T2 + 3_000, max=10) == b"ab"


def test_fifo_a_head_rescheduled_later_blocks_its_group() -> None:
    q = fifo((b"a", "g"), (b"b", "g"))
    q.run(c.Reschedule(id="1", delay_ms=3_000), T2)
    assert q.bodies(T2, max=10) == b""
    assert q.bodies(T2 + 3_000, max=10) == b"ab"


def test_fifo_deleting_a_delayed_head_unblocks_the_next() -> None:
    q = Q(FIFO)
    q.put(T1, nm(b"a", group="g", delay_ms=5_000), nm(b"b", group="g"))
    q.run(c.Delete("1"), T2)
    assert q.bodies(T2, max=10) == b"b"


def test_fifo_a_dead_lettered_head_unblocks_the_next() -> None:
    q = fifo((b"a", "g"), (b"b", "g"), max_receives=1, visibility_timeout_ms=1_000)
    assert q.bodies(T1) == b"a"
    assert q.bodies(T1 + 1_000, max=10) == b"b"
    assert list(q.state.outbox) == [1]


def test_fifo_retention_of_a_reserved_head_unblocks_the_next() -> None:
    q = Q(S(fifo=True, retention_ms=RETENTION, visibility_timeout_ms=60_000))
    q.put(T1, nm(b"a", group="g"))
    q.put(T1 + 5_000, nm(b"b", group="g"))
    assert q.bodies(T1 + 5_000) == b"a"
    assert q.bodies(T1 + RETENTION, max=10) == b"b"


def test_fifo_peek_ready_shows_the_runs_of_unblocked_groups() -> None:
    q = fifo((b"a", "g"), (b"b", "g"), (b"x", "h"), (b"y", "h"))
    q.take(T2)
    _, views = q.run(c.PeekReady(10), T2)
    assert [v.body for v in views] == [b"x", b"y"]


def test_fifo_stats_count_groups_and_age_only_takeable_heads() -> None:
    q = fifo((b"a", "g"), (b"b", "g"))
    q.take(T1)
    stats = q.stats(T2)
    assert counts(stats, "groups", "ready", "reserved", "oldest_ready_age_ms") == {
        "groups": 1,
        "ready": 1,
        "reserved": 1,
        "oldest_ready_age_ms": None,
    }


def test_fifo_purge_drops_every_group() -> None:
    q = fifo((b"a", "g"), (b"b", "h"))
    q.take(T1)
    q.run(c.Purge(), T2)
    assert q.stats(T2).groups == 0
    q.put(T2, nm(b"c", group="g"))
    assert q.bodies(T2) == b"c"


# ---------------------------------------------------------------- move tasks


def test_a_move_task_runs_one_at_a_time_and_keeps_its_progress_and_end() -> None:
    q = Q(S())
    q.put(T1, b"a", b"b", b"c")
    q.put(T1, nm(b"later", delay_ms=60_000))
    _, task = q.run(c.StartMove("t1", None, 10), T2)
    assert (task.task, task.to_move, task.moved, task.status) == ("t1", 3, 0, "RUNNING")
    assert q.state.active_move == task
    q.fails(c.StartMove("t2", "other"), T2, Conflict)
    q.run(c.MoveProgress("t1", 2), T2)
    assert q.run(c.CancelMove("t1"), T2)[1] == 2
    events, moved = q.run(c.CancelMove("t1"), T2)  # asked again: nothing new
    assert (events, moved) == ([], 2)
    q.run(c.MoveProgress("t1", 3), T2 + 1)
    q.run(c.EndMove("t1", "CANCELLED"), T2 + 2)
    assert q.state.active_move is None
    [ended] = q.run(c.ListMoves(), T2 + 2)[1]
    assert (ended.moved, ended.status, ended.started_at_ms) == (3, "CANCELLED", T2)
    q.fails(c.CancelMove("t1"), T2 + 2, Conflict)  # not running any more
    q.fails(c.CancelMove("nope"), T2 + 2, TaskNotFound)
    q.fails(c.StartMove("t1"), T2 + 2, Conflict)  # ids are not reused
    q.assert_replays()


def test_a_queue_remembers_its_ten_latest_move_tasks_newest_first() -> None:
    q = Q(S())
    for i in range(12):
        q.run(c.StartMove(f"t{i}"), T1 + i)
        q.run(c.EndMove(f"t{i}", "COMPLETED"), T1 + i)
    listed = q.run(c.ListMoves(), T2)[1]
    assert [t.task for t in listed] == [f"t{i}" for i in range(11, 1, -1)]
    restored = restore(decode_snapshot(encode_snapshot(snapshot(q.state))))
    assert restored.move_tasks == q.state.move_tasks


def test_progress_and_ends_of_a_task_that_is_not_running_change_nothing() -> None:
    q = Q(S())
    q.run(c.StartMove("t1"), T1)
    q.run(c.EndMove("t1", "FAILED", "QueueNotFound"), T1)
    assert q.run(c.MoveProgress("t1", 5), T2)[0] == []
    assert q.run(c.EndMove("t1", "COMPLETED"), T2)[0] == []
    [task] = q.run(c.ListMoves(), T2)[1]
    assert (task.status, task.reason, task.moved) == ("FAILED", "QueueNotFound", 0)


@pytest.mark.parametrize(
    "command",
    [
        c.StartMove(""),
        c.StartMove("t", rate=0),
        c.StartMove("t", rate=501),
        c.StartMove("t", destination="bad name!"),
        c.StartMove("t", destination="q"),  # itself
        c.EndMove("t", "DONE"),
    ],
)
def test_bad_move_task_commands_are_refused(command: object) -> None:
    q = Q(S())
    q.fails(command, T1, BadRequest)


# ---------------------------------------------------------------- next_due_ms


def due_empty() -> tuple[Q, int | None]:
    return Q(RET), None


def due_ready() -> tuple[Q, int | None]:
    q = Q(RET)
    q.put(T1, b"a")
    return q, T1 + RETENTION


def due_delayed() -> tuple[Q, int | None]:
    q = Q(RET)
    q.put(T1, b"a", nm(b"b", delay_ms=3_000))
    return q, T1 + 3_000


def due_reserved() -> tuple[Q, int | None]:
    q = Q(RET)
    q.put(T1, b"a")
    q.take(T1, vt=1_000)
    return q, T1 + 1_000


def due_touched() -> tuple[Q, int | None]:
    q = Q(RET)
    q.put(T1, b"a")
    [d] = q.take(T1, vt=1_000)
    q.run(c.Touch([c.TouchItem(id=d.id, lease=d.lease, visibility_timeout_ms=5_000)]), T2)
    return q, T2 + 5_000  # the lease's first deadline (T1 + 1000) no longer counts


def due_rescheduled() -> tuple[Q, int | None]:
    q = Q(RET)
    q.put(T1, nm(b"a", delay_ms=3_000))
    q.run(c.Reschedule(id="1", delay_ms=6_000), T2)
    return q, T2 + 6_000


def due_acked() -> tuple[Q, int | None]:
    q = Q(RET)
    q.put(T1, b"a")
    [d] = q.take(T1)
    q.ack(T2, (d.id, d.lease))
    return q, None


def due_purged() -> tuple[Q, int | None]:
    q = Q(RET)
    q.put(T1, nm(b"a", delay_ms=3_000))
    q.run(c.Purge(), T2)
    return q, None


def due_dead_lettered() -> tuple[Q, int | None]:
    q = Q(S(retention_ms=RETENTION, max_receives=1))
    q.put(T1, b"a")
    q.take(T1, vt=1_000)
    q.assert_replays(T1 + 1_000)
    return q, None


@pytest.mark.parametrize(
    "scene",
    [
        due_empty,
        due_ready,
        due_delayed,
        due_reserved,
        due_touched,
        due_rescheduled,
        due_acked,
        due_purged,
        due_dead_lettered,
    ],
    ids=lambda f: f.__name__,
)
def test_next_due_ms_is_the_earliest_pending_transition_or_none(
    scene: Callable[[], tuple[Q, int | None]],
) -> None:
    q, due = scene()
    assert q.state.next_due_ms() == due


@pytest.mark.parametrize(
    ("scene", "changed"),
    [
        (due_ready, ("total", 0)),
        (due_delayed, ("delayed", 0)),
        (due_reserved, ("reserved", 0)),
        (due_rescheduled, ("ready", 1)),
    ],
    ids=lambda x: getattr(x, "__name__", None),
)
def test_advancing_to_next_due_ms_performs_the_transition_and_not_before(
    scene: Callable[[], tuple[Q, int | None]], changed: tuple[str, int]
) -> None:
    q, due = scene()
    assert due is not None
    name, value = changed
    assert getattr(q.stats(due - 1), name) != value
    assert getattr(q.stats(due), name) == value
    assert q.state.next_due_ms() != due


# ---------------------------------------------------------------- replay at later times


@pytest.mark.parametrize(
    "settings",
    [
        S(visibility_timeout_ms=2_000, retention_ms=30_000),
        S(id_mode="client", visibility_timeout_ms=2_000, retention_ms=30_000),
        S(fifo=True, visibility_timeout_ms=2_000, retention_ms=30_000),
        S(max_receives=2, visibility_timeout_ms=2_000, retention_ms=30_000),
    ],
    ids=["standard", "client-ids", "fifo", "max-receives"],
)
def test_replayed_events_equal_the_live_state_as_time_moves_on(settings: QueueSettings) -> None:
    q = Q(settings)
    client = settings.id_mode == "client"
    for i in range(6):
        q.put(
            T1 + i * 700,
            nm(
                bytes([97 + i]),
                id=f"m{i}" if client else None,
                group=f"g{i % 2}" if settings.fifo else None,
                delay_ms=(i % 3) * 1_500,
                idempotency_key=f"k{i}",
            ),
        )
    now = T1 + 5_000
    deliveries = q.take(now, max=3)
    q.ack(now + 100, (deliveries[0].id, deliveries[0].lease))
    if len(deliveries) > 1:
        q.release(now + 200, deliveries[1].id, deliveries[1].lease, delay_ms=1_000)
    for later in range(now, now + 40_000, 1_300):
        q.take(later, max=2)
        q.assert_replays(later + 650)


# ---------------------------------------------------------------- PatchSettings / Describe


def test_patch_settings_changes_only_the_named_settings() -> None:
    q = Q(S(visibility_timeout_ms=7_000, retention_ms=60_000))
    events, new = q.run(c.PatchSettings({"visibility_timeout_ms": 5_000}), T1)
    assert new == S(visibility_timeout_ms=5_000, retention_ms=60_000)
    assert events == [ev.SettingsChanged(T1, new)]
    assert q.state.settings == new


def test_patch_settings_without_a_change_emits_nothing() -> None:
    q = Q(S(visibility_timeout_ms=7_000))
    events, new = q.run(c.PatchSettings({"visibility_timeout_ms": 7_000}), T1)
    assert events == []
    assert new == q.settings


@pytest.mark.parametrize(
    "changes",
    [
        {"fifo": True},
        {"id_mode": "client"},
        {"nope": 1},
        {"visibility_timeout_ms": "soon"},
        {"visibility_timeout_ms": -1},
        {"max_receives": 0},
        {"dead_letter_queue": "q"},
    ],
    ids=["fifo", "id-mode", "unknown", "wrong-type", "negative", "zero-receives", "own-dlq"],
)
def test_patch_settings_rejects_bad_changes(changes: dict) -> None:
    Q().fails(c.PatchSettings(changes), T1, BadRequest)


def test_describe_gives_name_settings_and_stats() -> None:
    q = Q(S(visibility_timeout_ms=9_000))
    q.put(T1, b"a", b"b")
    _, d = q.run(c.Describe(), T2)
    assert d.name == "q"
    assert d.settings == q.settings
    assert (d.stats.ready, d.stats.total, d.stats.oldest_ready_age_ms) == (2, 2, T2 - T1)


# ------------------------------------------------------------------ watch keys (key partitions)


def test_set_key_versions_grow_and_survive_a_snapshot_round_trip() -> None:
    from actors.core import replies as rp
    from actors.core.snapshot import decode_snapshot, encode_snapshot, restore, snapshot

    state = QueueState()
    ids = SequentialIds()
    execute(state, c.Create("__evq-keys-00", QueueSettings()), 1, ids)
    assert execute(state, c.GetKey("k"), 2, ids)[1] == rp.KeyView("k", 0, None)
    events, reply = execute(state, c.SetKey("k", {"a": [1, 2]}), 3, ids)
    assert reply == rp.KeyView("k", 1, {"a": [1, 2]})
    assert [type(e).__name__ for e in events] == ["KeySet"]
    _, reply = execute(state, c.SetKey("k", "two"), 4, ids)
    assert reply.version == 2
    restored = restore(decode_snapshot(encode_snapshot(snapshot(state))))
    assert execute(restored, c.GetKey("k"), 5, ids)[1] == rp.KeyView("k", 2, "two")
    _, reply = execute(restored, c.SetKey("k", None), 6, ids)
    assert reply.version == 3  # versions keep growing after a restore


@pytest.mark.parametrize("key", ["", "x" * 257, "bad\nkey", 7])
def test_invalid_keys_are_bad_requests(key: object) -> None:
    state = QueueState()
    ids = SequentialIds()
    execute(state, c.Create("__evq-keys-00", QueueSettings()), 1, ids)
    with pytest.raises(BadRequest):
        execute(state, c.SetKey(key, 1), 2, ids)  # type: ignore[arg-type]


# ---------------------------------------------------------------- take attempts (SQS FIFO)

ATTEMPT_WINDOW = 5 * 60 * 1000


def _fifo_with_two_groups() -> Q:
    q = Q(FIFO)
    q.put(T1, nm(b"a1", group="a"), nm(b"a2", group="a"), nm(b"b1", group="b"))
    return q


def test_a_take_retried_with_its_attempt_id_gets_the_same_messages_and_leases() -> None:
    q = _fifo_with_two_groups()
    events, first = q.run(c.Take(2, attempt="try-1"), T2)
    assert [e.attempt for e in events] == ["try-1"]  # type: ignore[attr-defined]
    assert [d.body for d in first] == [b"a1", b"a2"]
    events, again = q.run(c.Take(2, attempt="try-1"), T2 + 1_000)
    assert (events, again) == ([], first)  # nothing reserved anew, same receive counts
    # another attempt finds the group busy and the other group's message, as any take
    assert [d.body for d in q.take(T2 + 1_000, max=2)] == [b"b1"]


@pytest.mark.parametrize(
    "change", ["ack", "release", "touch", "lease-expired", "window-over", "other-attempt"]
)
def test_an_attempt_whose_take_changed_since_takes_anew(change: str) -> None:
    q = _fifo_with_two_groups()
    [d1, _] = q.run(c.Take(2, attempt="try-1"), T2)[1]
    now = T2 + 1_000
    if change == "ack":
        assert q.ack(now, (d1.id, d1.lease)) == ["ok"]
    elif change == "release":
        assert q.release(now, d1.id, d1.lease) == ["ok"]
    elif change == "touch":
        q.run(c.Touch([c.TouchItem(id=d1.id, lease=d1.lease)]), now)
    elif change == "lease-expired":
        now = T2 + VT
    elif change == "window-over":  # leases longer than the window: the window still ends
        q = _fifo_with_two_groups()
        q.run(c.Take(2, visibility_timeout_ms=2 * ATTEMPT_WINDOW, attempt="try-1"), T2)
        now = T2 + ATTEMPT_WINDOW
    else:
        q.run(c.Take(1, attempt="try-2"), now)  # takes b1; try-1's own take is intact...
        events, again = q.run(c.Take(2, attempt="try-1"), now)
        assert events == []  # ...and still found
        assert [d.body for d in again] == [b"a1", b"a2"]
        return
    events, taken = q.run(c.Take(2, attempt="try-1"), now)
    assert [e.attempt for e in events] == ["try-1"]  # type: ignore[attr-defined]
    if change == "lease-expired":  # a1 came back: taken a second time, beside b1
        assert sorted((d.body, d.receive_count) for d in taken) == [(b"a1", 2), (b"b1", 1)]
    else:  # group a is still busy with what the first take reserved
        assert [d.body for d in taken] == [b"b1"]
    assert d1.lease not in {d.lease for d in taken}  # never the first take's lease again


def test_attempts_survive_a_snapshot_and_the_oldest_are_forgotten() -> None:
    q = _fifo_with_two_groups()
    first = q.run(c.Take(1, attempt="try-1"), T2)[1]
    restored = restore(decode_snapshot(encode_snapshot(snapshot(q.state))))
    assert restored.attempts == q.state.attempts
    events, again = execute(restored, c.Take(1, attempt="try-1"), T2 + 10, SequentialIds())
    assert (events, again) == ([], first)
    # a later take with an attempt forgets attempts older than the window
    q.run(c.Take(1, attempt="try-late"), T2 + ATTEMPT_WINDOW + 1)
    assert list(q.state.attempts) == ["try-late"]


@pytest.mark.parametrize("attempt", ["", "x" * 129, "é", "tab\there", 7])
def test_a_bad_attempt_id_is_a_bad_request(attempt: object) -> None:
    q = _fifo_with_two_groups()
    q.fails(c.Take(1, attempt=attempt), T2, BadRequest)  # type: ignore[arg-type]
