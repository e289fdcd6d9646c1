"""The error family, queue settings validation and queue names (actors/errors.py, settings.py)."""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest

from actors import errors
from actors.core import events as ev
from actors.errors import (
    BadRequest,
    Conflict,
    DataError,
    ErrorKind,
    Fenced,
    Forbidden,
    InternalError,
    MessageNotFound,
    Moving,
    NotReady,
    Overloaded,
    QueueError,
    QueueExists,
    QueueNotFound,
    StaleLease,
    TaskNotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
    WrongShard,
)
from actors.settings import QueueSettings, validate_queue_name

S = QueueSettings
MIB = 1024 * 1024
MAX_VT = 12 * 3600 * 1000
MAX_RETENTION = 365 * 24 * 3600 * 1000
MAX_IDEMPOTENCY = 7 * 24 * 3600 * 1000

# ---------------------------------------------------------------- errors

ERRORS = [
    (QueueError, ErrorKind.INTERNAL, "InternalError"),
    (BadRequest, ErrorKind.INVALID, "BadRequest"),
    (Unauthorized, ErrorKind.UNAUTHORIZED, "Unauthorized"),
    (Forbidden, ErrorKind.FORBIDDEN, "Forbidden"),
    (TooLarge, ErrorKind.TOO_LARGE, "TooLarge"),
    (QueueNotFound, ErrorKind.NOT_FOUND, "QueueNotFound"),
    (MessageNotFound, ErrorKind.NOT_FOUND, "MessageNotFound"),
    (TaskNotFound, ErrorKind.NOT_FOUND, "TaskNotFound"),
    (QueueExists, ErrorKind.CONFLICT, "QueueExists"),
    (Conflict, ErrorKind.CONFLICT, "Conflict"),
    (StaleLease, ErrorKind.CONFLICT, "StaleLease"),
    (Overloaded, ErrorKind.OVERLOADED, "Overloaded"),
    (NotReady, ErrorKind.UNAVAILABLE, "NotReady"),
    (Unavailable, ErrorKind.UNAVAILABLE, "Unavailable"),
    (WrongShard, ErrorKind.UNAVAILABLE, "WrongShard"),
    (Moving, ErrorKind.UNAVAILABLE, "Moving"),
    (Fenced, ErrorKind.FENCED, "Fenced"),
    (DataError, ErrorKind.DATA, "DataError"),
    (InternalError, ErrorKind.INTERNAL, "InternalError"),
]
ERROR_IDS = [cls.__name__ for cls, _, _ in ERRORS]

FIELDS = [
    pytest.param({}, id="no-fields"),
    pytest.param({"queue": "orders"}, id="one-field"),
    pytest.param({"id": 42, "lease": "1001", "nested": {"a": [1, 2]}, "none": None}, id="mixed"),
]


def test_the_error_table_covers_every_queue_error_in_the_module() -> None:
    defined = {
        obj for obj in vars(errors).values() if inspect.isclass(obj) and issubclass(obj, QueueError)
    }
    assert defined == {cls for cls, _, _ in ERRORS}


def test_error_codes_are_unique_among_subclasses() -> None:
    codes = [code for cls, _, code in ERRORS if cls is not QueueError]
    assert len(codes) == len(set(codes))


def test_the_api_error_codes_all_exist() -> None:
    codes = {code for _, _, code in ERRORS}
    api = {"BadRequest", "QueueNotFound", "MessageNotFound", "QueueExists", "Conflict"}
    api |= {"StaleLease", "TooLarge", "Overloaded", "NotReady"}
    assert api <= codes


@pytest.mark.parametrize(("cls", "kind", "code"), ERRORS, ids=ERROR_IDS)
def test_each_error_has_its_kind_and_code(
    cls: type[QueueError], kind: ErrorKind, code: str
) -> None:
    assert cls.kind is kind
    assert cls.code == code
    e = cls("something went wrong", queue="q")
    assert e.kind is kind
    assert e.code == code
    assert isinstance(e, QueueError)
    assert isinstance(e, Exception)


@pytest.mark.parametrize(("cls", "kind", "code"), ERRORS, ids=ERROR_IDS)
def test_each_error_keeps_its_message_and_fields(
    cls: type[QueueError], kind: ErrorKind, code: str
) -> None:
    e = cls("no such queue", queue="orders", attempt=2)
    assert e.message == "no such queue"
    assert str(e) == "no such queue"
    assert e.args == ("no such queue",)
    assert e.fields == {"queue": "orders", "attempt": 2}


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("fields", FIELDS)
@pytest.mark.parametrize(("cls", "kind", "code"), ERRORS, ids=ERROR_IDS)
def test_each_error_survives_a_pickle_round_trip(
    cls: type[QueueError], kind: ErrorKind, code: str, fields: dict[str, object], protocol: int
) -> None:
    original = cls("it broke", **fields)
    copied = pickle.loads(pickle.dumps(original, protocol=protocol))
    assert type(copied) is cls
    assert copied.message == "it broke"
    assert str(copied) == "it broke"
    assert copied.fields == fields
    assert (copied.kind, copied.code) == (kind, code)
    assert copied == original
    assert hash(copied) == hash(original)


@pytest.mark.parametrize(("cls", "kind", "code"), ERRORS, ids=ERROR_IDS)
def test_a_pickled_error_is_still_caught_by_its_class_and_the_root(
    cls: type[QueueError], kind: ErrorKind, code: str
) -> None:
    data = pickle.dumps(cls("raised far away", queue="q"))
    with pytest.raises(cls) as info:
        raise pickle.loads(data)
    assert isinstance(info.value, QueueError)
    assert info.value.fields == {"queue": "q"}


@pytest.mark.parametrize(("cls", "kind", "code"), ERRORS, ids=ERROR_IDS)
def test_each_error_survives_a_deep_copy(cls: type[QueueError], kind: ErrorKind, code: str) -> None:
    original = cls("copied", ids=[1, 2])
    copied = copy.deepcopy(original)
    assert type(copied) is cls
    assert copied == original
    assert copied.fields is not original.fields


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (Conflict("x", id="1"), Conflict("x", id="1"), True),
        (Conflict("x", id="1"), Conflict("x", id="2"), False),
        (Conflict("x"), Conflict("y"), False),
        (Conflict("x"), StaleLease("x"), False),
        (QueueError("x"), InternalError("x"), False),
    ],
)
def test_errors_are_equal_only_with_the_same_type_message_and_fields(
    a: QueueError, b: QueueError, equal: bool
) -> None:
    assert (a == b) is equal
    assert (a != b) is not equal
    if equal:
        assert hash(a) == hash(b)


def test_an_error_is_not_equal_to_a_non_error() -> None:
    assert Conflict("x") != "x"
    assert Conflict("x") != ValueError("x")


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("q", S()),
        ("q", S(id_mode="client")),
        ("q", S(visibility_timeout_ms=0)),
        ("q", S(visibility_timeout_ms=MAX_VT)),
        ("q", S(retention_ms=1_000)),
        ("q", S(retention_ms=MAX_RETENTION)),
        ("q", S(max_message_bytes=1)),
        ("q", S(max_message_bytes=64 * MIB)),
        ("q", S(delay_ms=0)),
        ("q", S(delay_ms=MAX_RETENTION)),
        ("q", S(idempotency_window_ms=0)),
        ("q", S(idempotency_window_ms=MAX_IDEMPOTENCY)),
        ("q", S(max_receives=1)),
        ("q", S(max_receives=1000)),
        ("q", S(max_receives=3, dead_letter_queue="q-dlq")),
        ("q.fifo", S(fifo=True, max_receives=3, dead_letter_queue="q-dlq.fifo")),
        ("q.fifo", S(fifo=True)),
        ("q.fifo", S(fifo=True, content_based_dedup=True)),
    ],
)
def test_validate_accepts_settings_within_range(name: str, settings: QueueSettings) -> None:
    assert settings.validate(name) is settings


@pytest.mark.parametrize(
    ("name", "settings", "field"),
    [
        ("q", S(visibility_timeout_ms=-1), "visibility_timeout"),
        ("q", S(visibility_timeout_ms=MAX_VT + 1), "visibility_timeout"),
        ("q", S(visibility_timeout_ms=True), "visibility_timeout"),
        ("q", S(visibility_timeout_ms=1.5), "visibility_timeout"),
        ("q", S(visibility_timeout_ms="30"), "visibility_timeout"),
        ("q", S(retention_ms=999), "retention"),
        ("q", S(retention_ms=MAX_RETENTION + 1), "retention"),
        ("q", S(retention_ms=False), "retention"),
        ("q", S(max_message_bytes=0), "max_message_bytes"),
        ("q", S(max_message_bytes=64 * MIB + 1), "max_message_bytes"),
        ("q", S(max_message_bytes=None), "max_message_bytes"),
        ("q", S(delay_ms=-1), "delay"),
        ("q", S(delay_ms=MAX_RETENTION + 1), "delay"),
        ("q", S(idempotency_window_ms=-1), "idempotency_window"),
        ("q", S(idempotency_window_ms=MAX_IDEMPOTENCY + 1), "idempotency_window"),
        ("q", S(max_receives=0), "max_receives"),
        ("q", S(max_receives=1001), "max_receives"),
        ("q", S(max_receives=True), "max_receives"),
    ],
)
def test_validate_rejects_a_field_out_of_range(
    name: str, settings: QueueSettings, field: str
) -> None:
    with pytest.raises(BadRequest) as info:
        settings.validate(name)
    assert info.value.fields == {"field": field}


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        pytest.param("q", S(dead_letter_queue="dlq"), id="dlq-without-max-receives"),
        pytest.param("q", S(max_receives=2, dead_letter_queue="q"), id="own-dlq"),
        pytest.param("q", S(max_receives=2, dead_letter_queue="bad name"), id="bad-dlq-name"),
        pytest.param("q", S(max_receives=2, dead_letter_queue=""), id="empty-dlq-name"),
        pytest.param("q", S(fifo=True), id="fifo-without-suffix"),
        pytest.param("q.fifo", S(), id="suffix-without-fifo"),
        pytest.param("q", S(content_based_dedup=True), id="content-dedup-without-fifo"),
        pytest.param("q", S(id_mode="bogus"), id="unknown-id-mode"),
        pytest.param("q", S(id_mode="Server"), id="id-mode-is-case-sensitive"),
    ],
)
def test_validate_rejects_contradictory_settings(name: str, settings: QueueSettings) -> None:
    with pytest.raises(BadRequest):
        settings.validate(name)


def test_settings_that_validate_survive_the_event_log_codec() -> None:
    settings = S(id_mode="client", max_receives=5, dead_letter_queue="dlq", delay_ms=10)
    event = ev.QueueCreated(1, "q", settings.validate("q"))
    assert ev.decode_event(ev.encode_event(event)) == event


# ---------------------------------------------------------------- queue names


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "Z",
        "0",
        "_",
        "-",
        "orders",
        "Orders_2024-v1",
        "x" * 80,
        "x.fifo",
        "x" * 80 + ".fifo",
        "fifo",
    ],
)
def test_validate_queue_name_accepts_and_returns_a_good_name(name: str) -> None:
    assert validate_queue_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("", id="empty"),
        pytest.param("x" * 81, id="81-chars"),
        pytest.param("x" * 81 + ".fifo", id="81-chars-fifo"),
        pytest.param(".fifo", id="only-suffix"),
        pytest.param("q.FIFO", id="upper-case-suffix"),
        pytest.param("q.fifo.fifo", id="double-suffix"),
        pytest.param("q.fif", id="partial-suffix"),
        pytest.param("q.fifox", id="suffix-plus"),
        pytest.param("dot.ted", id="other-dot"),
        pytest.param("has space", id="space"),
        pytest.param("slash/name", id="slash"),
        pytest.param("ünïcode", id="non-ascii"),
        pytest.param("q\n", id="trailing-newline"),
        pytest.param(" q", id="leading-space"),
        pytest.param(None, id="none"),
        pytest.param(5, id="int"),
        pytest.param(b"orders", id="bytes"),
        pytest.param("__evq-keys-00", id="reserved"),
    ],
)
def test_validate_queue_name_rejects_a_bad_name(name: object) -> None:
    with pytest.raises(BadRequest) as info:
        validate_queue_name(name)
    assert info.value.fields == {"name": str(name)[:100]}


def test_reserved_names_are_valid_only_internally() -> None:
    assert validate_queue_name("__evq-keys-00", internal=True) == "__evq-keys-00"
