"""The Python clients (evq/client.py, evq/client_wire.py).

Two parts: pure tests of request building, reply parsing, error mapping and the retry
policy (no socket); then WIRE-LEVEL TESTS OF THE CLIENT against ``fake_server.FakeServer``,
an in-memory stand-in on 127.0.0.1 — they check what the clients send and how they read
answers, not the real server.
"""

from __future__ import annotations

import asyncio
import base64
import pickle
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestServer

from actors import errors
from actors.errors import (
    BadRequest,
    Conflict,
    ErrorKind,
    Forbidden,
    InternalError,
    MessageNotFound,
    NotReady,
    Overloaded,
    QueueError,
    QueueExists,
    QueueNotFound,
    StaleLease,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from evq import client_wire as wire
from evq.client import AsyncClient, Client
from evq.client_wire import (
    Message,
    NewMessage,
    Resend,
    RetryPolicy,
    TransportError,
)
from tests.conftest import free_port
from tests.unit.gateway.fake_server import FakeServer, Fault

FAST = RetryPolicy(retries=3, backoff=0.01, max_backoff=0.05)


def _payload(call: wire.Call[Any], binary: bool = False) -> Any:
    prepared = wire.prepare(call, binary=binary)
    assert prepared.body is not None
    return (msgspec.msgpack if binary else msgspec.json).decode(prepared.body)


# ====================================================================== request building


def test_prepare_sets_json_headers_and_the_bearer_token() -> None:
    prepared = wire.prepare(wire.create_queue("q", {"fifo": None}), token="s3cret")
    assert prepared.method == "PUT"
    assert prepared.target == "/v1/queues/q"
    assert prepared.headers["Content-Type"] == "application/json"
    assert prepared.headers["Accept"] == "application/json"
    assert prepared.headers["Authorization"] == "Bearer s3cret"
    assert prepared.body == b"{}"  # None settings are left to the server


def test_prepare_in_binary_mode_uses_msgpack_both_ways() -> None:
    prepared = wire.prepare(wire.get_queue("q"), binary=True)
    assert prepared.headers["Accept"] == "application/msgpack"
    assert "Content-Type" not in prepared.headers  # no body, no content type
    assert prepared.body is None
    assert "Authorization" not in prepared.headers


def test_put_sends_text_as_body_and_other_bytes_as_body_b64() -> None:
    items = wire.as_messages(["héllo", b"bytes", b"\xff\x00"], {})
    doc = _payload(wire.put("q", items))
    bodies = [{k: v for k, v in m.items() if k.startswith("body")} for m in doc["messages"]]
    assert bodies == [
        {"body": "héllo"},
        {"body": "bytes"},
        {"body_b64": base64.b64encode(b"\xff\x00").decode()},
    ]


@pytest.mark.parametrize(
    ("body", "as_text"),
    [
        (b"a\n" * 40_000, False),  # 80 KB, one escape in two bytes: base64
        (b"\x00" * 65_536, True),  # at most 64 KiB: text whatever its escapes
        (b"\x00" * 65_537, False),  # 6 bytes of JSON for each: base64 is 4/3
        (b"abcdefghijklmn\n" * 10_000, True),  # one escape in 15 bytes: still text
        (b"abcdefghijklm\t" * 10_000, False),  # one in 14: base64
        (b'"' * 100_000, False),
        ("é".encode() * 100_000, True),  # UTF-8 travels unescaped
    ],
)
def test_large_text_goes_as_body_b64_when_its_json_escapes_would_cost_more(
    body: bytes, as_text: bool
) -> None:
    fields = wire.body_fields(body, binary=False)
    encoded = msgspec.json.encode(fields)
    if as_text and len(body) > 65_536:
        assert len(encoded) <= len(body) * 4 / 3 + 20
    assert ("body" in fields) == as_text
    assert wire.message_from({"id": "1", **msgspec.json.decode(encoded)}).body == body


def test_put_in_msgpack_sends_raw_bytes() -> None:
    items = wire.as_messages(["text", b"\xff\x00"], {})
    doc = _payload(wire.put("q", items, binary=True), binary=True)
    assert [m["body"] for m in doc["messages"]] == [b"text", b"\xff\x00"]


def test_every_put_message_gets_its_own_fresh_idempotency_key() -> None:
    keys = iter(["k1", "k2", "k3"])
    items = wire.as_messages(["a", NewMessage(body="b", idempotency_key="mine"), "c"], {})
    doc = _payload(wire.put("q", items, new_key=lambda: next(keys)))
    assert [m["idempotency_key"] for m in doc["messages"]] == ["k1", "mine", "k2"]
    random_keys = {wire.random_key() for _ in range(100)}
    assert len(random_keys) == 100
    assert all(0 < len(k) <= 256 for k in random_keys)


def test_put_without_auto_key_sends_only_the_callers_keys() -> None:
    items = wire.as_messages(["a", NewMessage(body="b", idempotency_key="mine")], {})
    doc = _payload(wire.put("q", items, auto_key=False))
    assert [m.get("idempotency_key") for m in doc["messages"]] == [None, "mine"]


def test_put_options_apply_to_bare_bodies_only() -> None:
    defaults = {"delay": 5, "group": "g", "attributes": {"a": "1"}, "activate_at": None}
    items = wire.as_messages(["a", NewMessage(body="b", activate_at=1.5)], defaults)
    doc = _payload(wire.put("q", items, auto_key=False))
    assert doc["messages"] == [
        {"body": "a", "delay": 5, "group": "g", "attributes": {"a": "1"}},
        {"body": "b", "activate_at": 1.5},
    ]


@pytest.mark.parametrize(
    ("messages", "defaults"),
    [
        pytest.param([], {}, id="no-message"),
        pytest.param(["a", "b"], {"id": "x"}, id="one-id-for-two"),
        pytest.param(["a", "b"], {"idempotency_key": "k"}, id="one-key-for-two"),
    ],
)
def test_as_messages_refuses_what_cannot_be_right(
    messages: list[str], defaults: dict[str, Any]
) -> None:
    with pytest.raises(BadRequest):
        wire.as_messages(messages, defaults)


def test_a_body_must_be_bytes_or_str() -> None:
    with pytest.raises(TypeError):
        wire.prepare(wire.put("q", [NewMessage(body=42)]))  # type: ignore[arg-type]


def test_take_is_resent_only_if_never_sent_and_holds_for_its_wait() -> None:
    call = wire.take("q", 10, wait=2.5, visibility_timeout=60)
    assert _payload(call) == {"max": 10, "wait": 2.5, "visibility_timeout": 60}
    assert (call.method, call.path) == ("POST", "/v1/queues/q/take")
    assert call.resend is Resend.IF_NOT_SENT
    assert call.hold == 2.5
    assert _payload(wire.take("q")) == {"max": 1}
    assert wire.purge("q").resend is Resend.IF_NOT_SENT
    assert wire.ack("q", [("1", "l")]).resend is Resend.ALWAYS
    assert wire.put("q", [NewMessage(body="x")]).resend is Resend.ALWAYS


def test_lease_calls_take_messages_or_id_lease_pairs() -> None:
    taken = Message(id="7", body=b"x", lease="L7")
    call = wire.release("q", [taken, ("8", "L8")], delay=3)
    assert _payload(call) == {
        "items": [{"id": "7", "lease": "L7", "delay": 3}, {"id": "8", "lease": "L8", "delay": 3}]
    }
    assert _payload(wire.touch("q", [taken], 90)) == {
        "items": [{"id": "7", "lease": "L7", "visibility_timeout": 90}]
    }
    with pytest.raises(BadRequest):
        wire.ack("q", [Message(id="9", body=b"x")])  # peeked, never taken: no lease


def test_paths_quote_names_keys_and_ids() -> None:
    assert wire.get_key("queue:orders").target == "/v1/keys/queue:orders"
    assert wire.get_key("a/b c").target == "/v1/keys/a%2Fb%20c"
    assert wire.get_message("q", "x/1").target == "/v1/queues/q/messages/x%2F1"
    call = wire.delete_message("q", "5", "le ase")
    assert call.target == "/v1/queues/q/messages/5?lease=le+ase"
    with pytest.raises(BadRequest):
        wire.get_queue("")


def test_watch_builds_the_long_poll_query() -> None:
    call = wire.watch("k", 7, 2.5)
    assert call.target == "/v1/watch/k?version=7&timeout=2.5"
    assert wire.watch("k", 0, 30).target == "/v1/watch/k?version=0&timeout=30"
    assert call.hold == 2.5
    assert wire.handle_reply(call, 204, b"") is None
    state = wire.handle_reply(call, 200, b'{"key":"k","version":8,"value":[1]}', "application/json")
    assert state == wire.KeyValue("k", 8, [1])


def test_browse_asks_for_one_page_of_a_state_and_reads_it() -> None:
    call = wire.browse("jobs q", "delayed", 50, after="delayed.17.3")
    prepared = wire.prepare(call)
    assert (prepared.method, prepared.body, prepared.hot) == ("GET", None, False)
    assert (
        prepared.target == "/v1/queues/jobs%20q/messages?state=delayed&limit=50&after=delayed.17.3"
    )
    assert wire.prepare(wire.browse("q")).target == "/v1/queues/q/messages?state=ready&limit=100"
    assert call.resend is Resend.ALWAYS  # it changes nothing
    doc = {
        "messages": [{"id": "1", "state": "delayed", "body_b64": "/w==", "activate_at": 2.5}],
        "next": "delayed.2500.1",
    }
    page = wire.handle_reply(call, 200, msgspec.json.encode(doc), "application/json")
    assert page == wire.MessagePage(
        [Message(id="1", state="delayed", body=b"\xff", activate_at=2.5)], "delayed.2500.1"
    )


def test_update_message_sends_only_the_given_fields() -> None:
    call = wire.update_message("q", "5", body=b"\xfe", lease="L")
    assert call.method == "PATCH"
    assert _payload(call) == {"lease": "L", "body_b64": "/g=="}
    assert _payload(wire.update_message("q", "5", delay=60)) == {"delay": 60}


# ====================================================================== reply parsing


def test_a_message_reads_body_body_b64_and_msgpack_bytes() -> None:
    doc = {
        "id": "1",
        "body": "hi",
        "activate_at": 1,
        "enqueued_at": 0.5,
        "receive_count": 2,
        "lease": "L",
        "lease_expires_at": 31,
        "attributes": None,
        "first_received_at": 1.0,
        "future_field": "ignored",
    }
    m = wire.message_from(doc)
    assert (m.body, m.body_text, m.activate_at, m.attributes, m.group) == (
        b"hi",
        "hi",
        1.0,
        {},
        None,
    )
    assert wire.message_from({"id": "2", "body_b64": "/wA="}).body == b"\xff\x00"
    assert wire.message_from({"id": "3", "body": b"\xff"}).body == b"\xff"


def test_message_doc_is_the_inverse_of_message_from() -> None:
    m = Message(id="1", body=b"\xff", lease="L", attributes={"a": "b"}, receive_count=1)
    doc = wire.message_doc(m)
    assert doc["body_b64"] == "/w=="
    assert "body" not in doc
    assert wire.message_from(doc) == m
    assert wire.message_from(wire.message_doc(m, binary=True)) == m


def test_queue_info_reads_settings_stats_and_created() -> None:
    raw = msgspec.json.encode(
        {
            "name": "q",
            "settings": {"visibility_timeout": 30, "fifo": False, "new": 1},
            "stats": {"ready": 3, "oldest_ready_age": None},
        }
    )
    info = wire.handle_reply(wire.get_queue("q"), 200, raw, "application/json; charset=utf-8")
    assert info.settings.visibility_timeout == 30.0
    assert info.stats is not None
    assert info.stats.ready == 3
    assert info.created is None


def test_replies_are_decoded_by_their_content_type() -> None:
    data = msgspec.msgpack.encode({"queues": ["a"]})
    assert wire.handle_reply(wire.list_queues(), 200, data, "application/msgpack") == ["a"]


def test_an_unreadable_success_reply_is_an_internal_error() -> None:
    with pytest.raises(InternalError) as info:
        wire.handle_reply(wire.list_queues(), 200, b'{"nope": 1}', "application/json")
    assert info.value.fields["status"] == 200
    with pytest.raises(InternalError):
        wire.handle_reply(wire.take("q"), 200, b'{"messages": [{"id": 5}]}', "application/json")


# ====================================================================== error mapping

CODES = [
    ("BadRequest", 400, BadRequest),
    ("Unauthorized", 401, Unauthorized),
    ("Forbidden", 403, Forbidden),
    ("QueueNotFound", 404, QueueNotFound),
    ("MessageNotFound", 404, MessageNotFound),
    ("QueueExists", 409, QueueExists),
    ("Conflict", 409, Conflict),
    ("StaleLease", 409, StaleLease),
    ("TooLarge", 413, TooLarge),
    ("Overloaded", 429, Overloaded),
    ("NotReady", 503, NotReady),
    ("Unavailable", 503, Unavailable),
    ("InternalError", 500, InternalError),
]


@pytest.mark.parametrize(("code", "status", "cls"), CODES, ids=[c for c, _, _ in CODES])
def test_each_error_code_raises_its_class_with_the_status(
    code: str, status: int, cls: type[QueueError]
) -> None:
    data = msgspec.json.encode({"error": {"code": code, "message": "it went wrong"}})
    with pytest.raises(cls) as info:
        wire.handle_reply(wire.get_queue("q"), status, data, "application/json")
    assert type(info.value) is cls
    assert info.value.code == code
    assert info.value.message == "it went wrong"
    assert info.value.fields == {"status": status}


def test_the_new_auth_errors_have_their_own_kinds_and_pickle() -> None:
    assert Unauthorized.kind is ErrorKind.UNAUTHORIZED
    assert Forbidden.kind is ErrorKind.FORBIDDEN
    assert {"Unauthorized", "Forbidden"} <= set(errors.__all__)
    e = pickle.loads(pickle.dumps(Forbidden("no", status=403)))
    assert type(e) is Forbidden
    assert e.fields == {"status": 403}


@pytest.mark.parametrize(
    ("status", "doc", "cls"),
    [
        (404, {"error": {"code": "NotFound", "message": "no route"}}, BadRequest),
        (405, "405: Method Not Allowed", BadRequest),
        (429, None, Overloaded),
        (503, {"status": "recovering"}, Unavailable),
        (502, "<html>bad gateway</html>", InternalError),
        (401, None, Unauthorized),
        (409, {"error": {"code": "SomethingNew"}}, Conflict),
    ],
)
def test_an_unknown_code_falls_back_to_the_status(status: int, doc: Any, cls: type) -> None:
    e = wire.error_from_reply(status, doc)
    assert type(e) is cls
    assert e.fields["status"] == status
    if isinstance(doc, dict) and "error" in doc:
        assert e.fields["code"] == doc["error"]["code"]  # the code we did not know, kept
    if isinstance(doc, str):
        assert doc in e.message


def test_an_error_keeps_extra_fields_and_retry_after() -> None:
    data = b'{"error": {"code": "Overloaded", "message": "busy", "queue": "q"}}'
    with pytest.raises(Overloaded) as info:
        wire.handle_reply(wire.take("q"), 429, data, "application/json", "2")
    assert info.value.fields == {"queue": "q", "status": 429, "retry_after": 2.0}


def test_a_non_json_error_body_is_quoted_in_the_message() -> None:
    with pytest.raises(BadRequest) as info:
        wire.handle_reply(wire.get_queue("q"), 404, b"404: Not Found", "text/plain")
    assert "404: Not Found" in info.value.message


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(None, None), ("1", 1.0), ("0.25", 0.25), ("-1", None), ("nan", None), ("Wed, 21 Oct", None)],
)
def test_retry_after_is_seconds_or_nothing(header: str | None, seconds: float | None) -> None:
    assert wire.parse_retry_after(header) == seconds


# ====================================================================== retry policy


def test_backoff_grows_exponentially_with_jitter_up_to_its_cap() -> None:
    policy = RetryPolicy(retries=10, backoff=0.1, max_backoff=2.0)
    rng = random.Random(1234)
    for attempt in range(10):
        ceiling = min(2.0, 0.1 * 2**attempt)
        pauses = [policy.pause(attempt, rng) for _ in range(50)]
        assert all(ceiling / 2 <= p <= ceiling for p in pauses)
        assert len(set(pauses)) > 1  # jittered
    assert policy.pause(10_000, rng) <= 2.0


def test_retry_after_is_a_floor_on_the_pause() -> None:
    policy = RetryPolicy(backoff=0.1)
    assert policy.pause(0, random.Random(1), retry_after=3.0) == 3.0


OVERLOADED = Overloaded("busy", status=429)
OVERLOADED_LONG = Overloaded("busy", status=429, retry_after=120.0)
NOT_READY = NotReady("recovering", status=503)
FENCED = errors.Fenced("moved", status=503)
NOT_SENT = TransportError("refused", sent=False)
MAYBE_SENT = TransportError("reset", sent=True)


@pytest.mark.parametrize(
    ("error", "resend", "attempt", "retried"),
    [
        (OVERLOADED, Resend.ALWAYS, 0, True),
        (OVERLOADED, Resend.IF_NOT_SENT, 0, True),
        (NOT_READY, Resend.IF_NOT_SENT, 2, True),
        (FENCED, Resend.ALWAYS, 0, True),
        (NOT_READY, Resend.ALWAYS, 3, False),  # retries used up
        (OVERLOADED_LONG, Resend.ALWAYS, 0, False),  # asks for more than max_retry_after
        (NOT_SENT, Resend.ALWAYS, 0, True),
        (NOT_SENT, Resend.IF_NOT_SENT, 0, True),
        (MAYBE_SENT, Resend.ALWAYS, 0, True),
        (MAYBE_SENT, Resend.IF_NOT_SENT, 0, False),  # take / purge: could double
        (InternalError("bug", status=500), Resend.ALWAYS, 0, False),
        (QueueNotFound("no", status=404), Resend.ALWAYS, 0, False),
        (StaleLease("stale", status=409), Resend.ALWAYS, 0, False),
        (Unavailable("unknown", status=503), Resend.IF_NOT_SENT, 0, True),
    ],
)
def test_what_is_retried(error: QueueError, resend: Resend, attempt: int, retried: bool) -> None:
    pause = RetryPolicy(retries=3).next_pause(attempt, error, resend, random.Random(7))
    assert (pause is not None) is retried


def test_a_transport_error_is_an_unavailable_that_pickles() -> None:
    e = pickle.loads(pickle.dumps(TransportError("gone", sent=True)))
    assert isinstance(e, Unavailable)
    assert e.fields == {"sent": True}
    assert e.code == "Unavailable"


# ====================================================================== wire level (fake server)
# Below: the clients against FakeServer, a stand-in for the real gateway. These are
# wire-level tests of the CLIENTS, not of the server.


class _Threaded:
    """The sync Client behind an async face: each call runs in a worker thread."""

    def __init__(self, client: Client) -> None:
        self.inner = client

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeServer, str]]:
    server = FakeServer()
    test_server = TestServer(server.app, host="127.0.0.1")
    await test_server.start_server()
    try:
        yield server, f"http://127.0.0.1:{test_server.port}"
    finally:
        await test_server.close()


@pytest.fixture(params=["async", "sync"])
async def make_client(
    request: pytest.FixtureRequest, fake: tuple[FakeServer, str]
) -> AsyncIterator[Callable[..., Any]]:
    """A factory of clients of the requested kind on the fake; closed afterwards."""
    made: list[Any] = []
    _, url = fake

    def make(**options: Any) -> Any:
        options.setdefault("retries", FAST)
        if request.param == "async":
            c: Any = AsyncClient(url, **options)
            made.append(c)
            return c
        sync = Client(url, **options)
        made.append(sync)
        return _Threaded(sync)

    yield make
    for c in made:
        result = c.close()
        if asyncio.iscoroutine(result):
            await result


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
async def test_every_endpoint_round_trips(
    fake: tuple[FakeServer, str], make_client: Callable[..., Any], binary: bool
) -> None:
    server, _ = fake
    c = make_client(binary=binary, token="t0k")
    assert await c.health() is True
    assert await c.ready() is True
    server.ready = False
    assert await c.ready() is False

    info = await c.create_queue("jobs", visibility_timeout=30, max_receives=None)
    assert (info.name, info.created, info.settings.visibility_timeout) == ("jobs", True, 30.0)
    assert (await c.create_queue("jobs", visibility_timeout=30)).created is False
    with pytest.raises(QueueExists) as exists:
        await c.create_queue("jobs", visibility_timeout=5)
    assert exists.value.fields["status"] == 409
    await c.create_queue("other")
    assert await c.list_queues() == ["jobs", "other"]
    assert (await c.update_queue("jobs", delay=0)).settings.delay == 0

    results = await c.put("jobs", ["one", b"\xff\x00two", NewMessage(body="three", delay=60)])
    assert [r.status for r in results] == ["created"] * 3
    stats = (await c.get_queue("jobs")).stats
    assert (stats.ready, stats.delayed, stats.total) == (2, 1, 3)

    taken = await c.take("jobs", 10, wait=0.05, visibility_timeout=20)
    assert sorted(m.body for m in taken) == [b"one", b"\xff\x00two"]
    assert all(m.lease and m.receive_count == 1 for m in taken)
    one = next(m for m in taken if m.body == b"one")
    assert (await c.get_message("jobs", one.id)).state == "reserved"
    touched = await c.touch("jobs", one, visibility_timeout=50)
    assert touched[0].ok
    assert touched[0].lease_expires_at is not None
    assert [r.status for r in await c.release("jobs", *taken, delay=0)] == ["ok", "ok"]
    assert [r.status for r in await c.ack("jobs", one)] == ["stale_lease"]

    again = await c.take("jobs", 1)
    with pytest.raises(StaleLease):
        await c.delete_message("jobs", again[0].id, lease="not-the-lease")
    with pytest.raises(Conflict):
        await c.update_message("jobs", again[0].id, delay=5)  # reserved: the lease is needed
    view = await c.reschedule("jobs", again[0], delay=30)
    assert (view.state, view.receive_count) == ("delayed", 0)
    updated = await c.update_message("jobs", view.id, body=b"\xfe\xff")
    assert updated.body == b"\xfe\xff"
    await c.delete_message("jobs", view.id)
    with pytest.raises(MessageNotFound) as missing:
        await c.get_message("jobs", view.id)
    assert missing.value.fields["status"] == 404

    last = await c.take("jobs", 5)
    assert [r.ok for r in await c.ack("jobs", *last)] == [True]
    assert await c.ack("jobs") == []
    await c.put("jobs", ["x", "y"])
    assert await c.purge("jobs") == 3  # x, y and the delayed "three"

    assert await c.set_key("app:cfg", {"n": 1}) == 1
    assert await c.get_key("app:cfg") == wire.KeyValue("app:cfg", 1, {"n": 1})
    assert await c.watch("app:cfg", 0, wait=5) == wire.KeyValue("app:cfg", 1, {"n": 1})
    assert await c.watch("app:cfg", 1, wait=0.05) is None

    await c.delete_queue("other")
    with pytest.raises(QueueNotFound):
        await c.get_queue("other")
    assert {s.headers.get("Authorization") for s in server.seen} == {"Bearer t0k"}
    expected = "application/msgpack" if binary else "application/json"
    assert {s.headers.get("Accept") for s in server.seen} == {expected}


async def test_a_429_with_retry_after_is_waited_out_then_retried(
    fake: tuple[FakeServer, str], make_client: Callable[..., Any]
) -> None:
    server, _ = fake
    c = make_client()
    await c.create_queue("q")
    server.inject("put", Fault(status=429, code="Overloaded", retry_after="0.3"))
    started = time.perf_counter()
    results = await c.put("q", "hello")
    assert time.perf_counter() - started >= 0.3
    assert results[0].created
    attempts = server.calls("put")
    assert len(attempts) == 2
    assert attempts[0].payload == attempts[1].payload  # the same bytes, the same key


async def test_503_is_retried_for_every_call_even_take(
    fake: tuple[FakeServer, str], make_client: Callable[..., Any]
) -> None:
    server, _ = fake
    c = make_client()
    await c.create_queue("q")
    await c.put("q", "job")
    server.inject("take", Fault(status=503, code="NotReady"), Fault(status=503, code="NotReady"))
    taken = await c.take("q")
    assert [m.body for m in taken] == [b"job"]
    assert len(server.calls("take")) == 3


async def test_retries_are_bounded(
    fake: tuple[FakeServer, str], make_client: Callable[..., Any]
) -> None:
    server, _ = fake
    c = make_client(retries=RetryPolicy(retries=2, backoff=0.01))
    server.inject("list_queues", *[Fault(status=503, code="NotReady")] * 5)
    with pytest.raises(NotReady) as info:
        await c.list_queues()
    assert info.value.fields["status"] == 503
    assert len(server.calls("list_queues")) == 3


async def test_a_put_resent_after_a_dropped_connection_keeps_its_idempotency_key(
    fake: tuple[FakeServer, str], make_client: Callable[..., Any]
) -> None:
    server, _ = fake
    c = make_client()
    await c.create_queue("q")
    server.inject("put", Fault(drop="after"))  # stored, but the reply is lost
    results = await c.put("q", ["a", "b"])
    attempts = server.calls("put")
    assert len(attempts) == 2
    keys = [[m["idempotency_key"] for m in s.payload["messages"]] for s in attempts]
    assert keys[0] == keys[1]
    assert len(set(keys[0])) == 2
    assert [r.status for r in results] == ["duplicate", "duplicate"]
    assert len(server.queues["q"].messages) == 2  # not four


async def test_a_take_is_not_resent_when_it_may_have_reached_the_server(
    fake: tuple[FakeServer, str], make_client: Callable[..., Any]
) -> None:
    server, _ = fake
    c = make_client()
    await c.create_queue("q")
    await c.put("q", "job")
    server.inject("take", Fault(drop="after"))
    with pytest.raises(TransportError) as info:
        await c.take("q")
    assert info.value.fields["sent"] is True
    assert len(server.calls("take")) == 1
    assert (await c.get_queue("q")).stats.reserved == 1  # leased; back after its timeout


async def test_a_dropped_connection_before_handling_is_resent_for_safe_calls(
    fake: tuple[FakeServer, str], make_client: Callable[..., Any]
) -> None:
    server, _ = fake
    c = make_client()
    server.inject("create_queue", Fault(drop="before"))
    assert (await c.create_queue("q")).created is True
    assert len(server.calls("create_queue")) == 2


async def test_no_server_is_a_transport_error_marked_not_sent() -> None:
    c = AsyncClient(f"http://127.0.0.1:{free_port()}", retries=FAST)
    try:
        with pytest.raises(TransportError) as info:
            await c.take("q")
    finally:
        await c.close()
    assert info.value.fields["sent"] is False
    sync = Client(f"http://127.0.0.1:{free_port()}", retries=FAST)
    with pytest.raises(TransportError) as sync_info:
        await asyncio.to_thread(sync.take, "q")
    sync.close()
    assert sync_info.value.fields["sent"] is False


async def test_a_client_keeps_one_connection_alive(
    fake: tuple[FakeServer, str], make_client: Callable[..., Any]
) -> None:
    server, _ = fake
    c = make_client()
    for _ in range(5):
        await c.list_queues()
    assert len({s.peer for s in server.seen}) == 1


async def test_watch_loop_yields_the_state_then_each_change(
    fake: tuple[FakeServer, str], make_client: Callable[..., Any]
) -> None:
    server, url = fake
    c = make_client()
    await c.set_key("k", "first")
    setter = AsyncClient(url)

    async def change_later() -> None:
        await asyncio.sleep(0.1)
        await setter.set_key("k", "second")

    if isinstance(c, AsyncClient):
        loop = c.watch_loop("k", wait=0.05)
        first = await anext(loop)
        task = asyncio.create_task(change_later())
        second = await anext(loop)
        await loop.aclose()
    else:
        gen = c.inner.watch_loop("k", wait=0.05)
        first = await asyncio.to_thread(next, gen)
        task = asyncio.create_task(change_later())
        second = await asyncio.to_thread(next, gen)
        gen.close()
    await task
    await setter.close()
    assert (first.version, first.value) == (1, "first")
    assert (second.version, second.value) == (2, "second")
    versions = [s.path for s in server.calls("watch")]
    assert versions[0].startswith("/v1/watch/k?version=0")
    assert all("version=1" in v for v in versions[1:])  # resubscribed with the version seen


async def test_the_sync_client_reconnects_when_the_server_closed_the_idle_connection(
    fake: tuple[FakeServer, str],
) -> None:
    server, url = fake
    c = Client(url, retries=0)
    try:
        await asyncio.to_thread(c.create_queue, "q")
        await asyncio.to_thread(c.put, "q", "job")
        hot = c._links[True]  # puts and takes go on the connection for hot commands
        assert hot is not None
        assert hot.sock is not None
        peer = hot.sock.getsockname()
        await server.close_connections()
        await asyncio.sleep(0.05)
        taken = await asyncio.to_thread(c.take, "q")  # a take is never resent: must not fail
        assert [m.body for m in taken] == [b"job"]
        again = c._links[True]
        assert again is not None
        assert again.sock is not None
        assert again.sock.getsockname() != peer
    finally:
        c.close()


# ====================================================================== several servers


def test_several_servers_come_as_a_list_or_one_string_with_commas() -> None:
    c = Client("http://a:1, http://b:2/evq/ ,")
    assert c.servers == ["http://a:1", "http://b:2/evq"]
    assert c.base_url == "http://a:1"
    assert AsyncClient(["http://a:1", "https://b"]).servers == ["http://a:1", "https://b"]
    for bad in ("", " , ", "http://a:1,ftp://b"):
        with pytest.raises(ValueError, match="base_url"):
            Client(bad)


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_client_moves_past_a_server_it_cannot_reach(
    fake: tuple[FakeServer, str], kind: str
) -> None:
    server, url = fake
    dead = f"http://127.0.0.1:{free_port()}"
    if kind == "async":
        c: Any = AsyncClient([dead, url], retries=FAST)
        created = await c.create_queue("q")
        results = await c.put("q", "job")
        await c.close()
    else:
        sync = Client(f"{dead},{url}", retries=FAST)
        created = await asyncio.to_thread(sync.create_queue, "q")
        results = await asyncio.to_thread(sync.put, "q", "job")
        sync.close()
        c = sync
    assert created.created is True
    assert [r.status for r in results] == ["created"]
    assert c.base_url == url  # and stays there
    assert len(server.calls("create_queue")) == 1


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_put_resent_to_the_next_server_keeps_its_idempotency_keys(
    fake: tuple[FakeServer, str], kind: str
) -> None:
    server, url = fake
    port = url.rsplit(":", 1)[1]
    # Two names of one server: the second stands for another gateway of the same cluster.
    urls = [f"http://127.0.0.1:{port}", f"http://localhost:{port}"]
    c: Any = (
        AsyncClient(urls, retries=FAST)
        if kind == "async"
        else _Threaded(Client(urls, retries=FAST))
    )
    try:
        await c.create_queue("q")
        server.inject("put", Fault(drop="after"))  # stored, but the reply is lost
        results = await c.put("q", ["a", "b"])
        attempts = server.calls("put")
        assert [s.headers["Host"].split(":")[0] for s in attempts] == ["127.0.0.1", "localhost"]
        keys = [[m["idempotency_key"] for m in s.payload["messages"]] for s in attempts]
        assert keys[0] == keys[1]
        assert [r.status for r in results] == ["duplicate", "duplicate"]
        assert len(server.queues["q"].messages) == 2

        # A take that may have reached the first is not resent; the next call goes on.
        server.inject("take", Fault(drop="after"))
        with pytest.raises(TransportError):
            await c.take("q")
        assert len(server.calls("take")) == 1
        stats = (await c.get_queue("q")).stats
        assert stats.reserved == 1  # leased by the lost take; back after its timeout
        assert server.calls("get_queue")[-1].headers["Host"].startswith("127.0.0.1")
    finally:
        result = c.close()
        if asyncio.iscoroutine(result):
            await result


def test_each_call_is_defined_once_for_both_clients() -> None:
    """The blocking and the asyncio client share one definition of every call: same name,
    signature and docstring; only iterating (browse_all, watch_loop) and the transport are
    each client's own. Each call is a plain function on its client class, so
    ``Client.put(client, ...)`` and ``unittest.mock.create_autospec`` work as for any
    method."""
    import inspect
    from unittest import mock

    from evq.client import AsyncClient as Async
    from evq.client import Client as Blocking
    from evq.client import _Base, _Endpoint

    shared = {n for n, v in vars(_Base).items() if isinstance(v, _Endpoint)}
    assert len(shared) >= 20
    public = {n for n in dir(Blocking) if not n.startswith("_")} - {"close"}
    assert public == {n for n in dir(Async) if not n.startswith("_")} - {"close"}
    assert public - shared == {"browse_all", "watch_loop"}
    blocking, awaiting = Blocking(), Async()
    for name in shared:
        built = vars(_Base)[name]
        assert vars(Blocking)[name].__wrapped__ is vars(Async)[name].__wrapped__, name
        assert inspect.iscoroutinefunction(getattr(Async, name)), name
        assert not inspect.iscoroutinefunction(getattr(Blocking, name)), name
        sync_method, async_method = getattr(blocking, name), getattr(awaiting, name)
        assert inspect.signature(sync_method) == inspect.signature(async_method), name
        assert "_Call" not in str(inspect.signature(sync_method)), name
        assert sync_method.__doc__, name
        assert sync_method.__doc__ == async_method.__doc__ == built.__doc__, name
    fake = mock.create_autospec(Blocking, instance=True)
    fake.put("q", "body", delay=5)
    fake.put.assert_called_once_with("q", "body", delay=5)
    with pytest.raises(TypeError):
        fake.put("q", "body", no_such_option=1)
    assert Blocking().release("") == []  # nothing to release: no request, no checks
