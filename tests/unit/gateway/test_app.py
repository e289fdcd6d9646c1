"""The native API through real HTTP: ``make_app`` over a ``LocalDirectory`` of two shards.

Every endpoint of WIRE.md in JSON and the message endpoints in msgpack; every error code
with its status; the queue behaviours a client relies on (delays, leases, redelivery, long
polls, dead letters, FIFO groups, deduplication); limits (429, 413) and lifecycle (503 while
recovering, long polls answered on shutdown). Timing tests use short timeouts and poll.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest

from actors.log.store import LocalDirStore
from actors.shard import placement
from gateway import native
from gateway.app import IN_FLIGHT, AppOptions
from tests.unit.gateway.conftest import (
    JSON,
    MSGPACK,
    Api,
    GatedStore,
    Reply,
    Serve,
    eventually,
    until,
)

BINARY = b"\x00\xff\xfe binary \x80"  # not UTF-8
B64 = base64.b64encode(BINARY).decode()

STATS_FIELDS = {
    "ready",
    "delayed",
    "reserved",
    "total",
    "oldest_ready_age",
    "dead_lettered",
    "dead_letter_pending",
    "expired",
    "acked",
    "enqueued",
    "purged",
}
DELIVERY_FIELDS = {
    "id",
    "body",
    "activate_at",
    "enqueued_at",
    "receive_count",
    "lease",
    "lease_expires_at",
    "attributes",
    "first_received_at",
}
VIEW_FIELDS = {
    "id",
    "state",
    "body",
    "activate_at",
    "enqueued_at",
    "receive_count",
    "lease_expires_at",
    "attributes",
    "group",
    "failures",
}
DEFAULT_SETTINGS = {
    "id_mode": "server",
    "visibility_timeout": 30.0,
    "max_receives": None,
    "dead_letter_queue": None,
    "retention": 345600.0,
    "max_message_bytes": 8388608,
    "fifo": False,
    "delay": 0.0,
    "idempotency_window": 900.0,
    "content_based_dedup": False,
    "max_messages": None,
    "take_rate": None,
    "put_rate": None,
    "max_in_flight": None,
    "fair": False,
}


class Raw(bytes):
    """A request body sent as these bytes, not encoded."""


async def send(api: Api, method: str, path: str, body: Any = None, fmt: str = "json") -> Reply:
    if isinstance(body, Raw):
        return await api.call(method, path, raw=bytes(body), fmt=fmt)
    if body is None:
        return await api.call(method, path)
    return await api.call(method, path, body, fmt=fmt)


def assert_error(reply: Reply, status: int, code: str) -> None:
    assert (reply.status, reply.code) == (status, code), reply
    assert isinstance(reply.doc["error"]["message"], str)
    assert reply.doc["error"]["message"]


async def take_eventually(api: Api, queue: str, within: float = 3.0, **options: Any) -> Any:
    """Poll take (no wait) until it hands something out."""

    async def attempt() -> list[dict[str, Any]]:
        return await api.take(queue, **options)

    return await eventually(attempt, within)


def waiting_takes(api: Api) -> int:
    return api.app[native.WAITING_TAKES][0]  # type: ignore[no-any-return]


# ====================================================================== queues


async def test_put_queue_answers_201_then_200_for_the_same_or_no_settings(api: Api) -> None:
    created = await api.call("PUT", "/v1/queues/q", {"visibility_timeout": 5, "max_receives": 3})
    assert created.status == 201
    expected = {**DEFAULT_SETTINGS, "visibility_timeout": 5.0, "max_receives": 3}
    assert created.doc == {"name": "q", "settings": expected, "created": True}
    for again in ({}, {"visibility_timeout": 5}, {"max_receives": 3, "fifo": False}, None):
        reply = await send(api, "PUT", "/v1/queues/q", again)
        assert reply.status == 200, (again, reply)
        assert reply.doc == {"name": "q", "settings": expected, "created": False}


@pytest.mark.parametrize(
    "other",
    [
        {"visibility_timeout": 6},
        {"id_mode": "client"},
        {"max_receives": 4},
        {"retention": 1000},
        {"max_message_bytes": 10},
        {"visibility_timeout": 5, "delay": 1},
    ],
)
async def test_put_queue_with_other_settings_is_queue_exists(api: Api, other: Any) -> None:
    await api.create("q", visibility_timeout=5)
    reply = await api.call("PUT", "/v1/queues/q", other)
    assert_error(reply, 409, "QueueExists")
    assert (await api.ok("GET", "/v1/queues/q"))["settings"]["visibility_timeout"] == 5.0


async def test_a_name_ending_in_fifo_makes_a_fifo_queue(api: Api) -> None:
    doc = await api.create("jobs.fifo")
    assert doc["settings"]["fifo"] is True
    assert (await api.create("a" * 80 + ".fifo"))["settings"]["fifo"] is True
    assert (await api.create("b" * 80))["settings"]["fifo"] is False


async def test_list_queues_is_sorted_across_shards(api: Api) -> None:
    names = ["b", "a", "c-1", "Z_9", "jobs.fifo"]
    assert {placement(n, 2) for n in names} == {0, 1}  # both shards hold some
    for name in names:
        await api.create(name)
    assert await api.ok("GET", "/v1/queues") == {"queues": sorted(names)}


async def test_get_queue_shows_settings_and_every_stats_field(api: Api) -> None:
    await api.create("q")
    now = time.time()
    await api.put("q", {"body": "old", "activate_at": now - 10}, "new", {"body": "d", "delay": 60})
    doc = await api.ok("GET", "/v1/queues/q")
    assert doc["name"] == "q"
    assert doc["settings"] == DEFAULT_SETTINGS
    stats = doc["stats"]
    assert set(stats) >= STATS_FIELDS
    assert {k: stats[k] for k in STATS_FIELDS - {"oldest_ready_age"}} == {
        "ready": 2,
        "delayed": 1,
        "reserved": 0,
        "total": 3,
        "dead_lettered": 0,
        "dead_letter_pending": 0,
        "expired": 0,
        "acked": 0,
        "enqueued": 3,
        "purged": 0,
    }
    assert 9.9 <= stats["oldest_ready_age"] < 15  # "old" has been ready for 10 s

    [old] = await api.take("q")
    assert old["body"] == "old"
    assert await api.ack("q", old) == ["ok"]
    stats = await api.stats("q")
    assert (stats["ready"], stats["reserved"], stats["total"], stats["acked"]) == (1, 0, 2, 1)
    assert 0 <= stats["oldest_ready_age"] < 5
    [new] = await api.take("q")
    stats = await api.stats("q")
    assert (stats["ready"], stats["reserved"], stats["oldest_ready_age"]) == (0, 1, None)
    assert new["body"] == "new"


async def test_patch_queue_changes_the_visibility_timeout_that_takes_use(api: Api) -> None:
    await api.create("q")
    doc = await api.ok("PATCH", "/v1/queues/q", {"visibility_timeout": 0.2, "delay": 0})
    assert doc["name"] == "q"
    assert doc["settings"] == {**DEFAULT_SETTINGS, "visibility_timeout": 0.2}
    assert set(doc["stats"]) >= STATS_FIELDS
    assert (await api.ok("GET", "/v1/queues/q"))["settings"]["visibility_timeout"] == 0.2

    await api.put("q", "x")
    before = time.time()
    [first] = await api.take("q")
    assert first["lease_expires_at"] - before < 1.0  # 0.2 s, not the 30 s default
    again = await take_eventually(api, "q")
    assert again[0]["receive_count"] == 2


async def test_delete_queue_then_get_is_404_and_the_name_is_reusable(api: Api) -> None:
    await api.create("q", visibility_timeout=7)
    await api.put("q", "a", "b")
    reply = await api.call("DELETE", "/v1/queues/q")
    assert (reply.status, reply.doc) == (204, None)
    assert_error(await api.call("GET", "/v1/queues/q"), 404, "QueueNotFound")
    assert_error(await api.call("POST", "/v1/queues/q/take", {}), 404, "QueueNotFound")
    assert await api.ok("GET", "/v1/queues") == {"queues": []}

    doc = await api.create("q")  # 201 again, with new settings
    assert doc["settings"]["visibility_timeout"] == 30.0
    stats = await api.stats("q")
    assert (stats["total"], stats["enqueued"]) == (0, 0)
    assert await api.take("q", max=10) == []


async def test_purge_deletes_every_message_and_counts_them(api: Api) -> None:
    await api.create("q")
    await api.put("q", "a", "b", {"body": "c", "delay": 60})
    await api.take("q")
    assert await api.ok("POST", "/v1/queues/q/purge") == {"purged": 3}
    stats = await api.stats("q")
    assert (stats["total"], stats["ready"], stats["reserved"], stats["delayed"]) == (0, 0, 0, 0)
    assert stats["purged"] == 3
    assert await api.ok("POST", "/v1/queues/q/purge") == {"purged": 0}
    assert await api.take("q", max=10) == []


# ====================================================================== messages (JSON)


async def test_put_take_ack_round_trip_with_the_documented_shapes(api: Api) -> None:
    await api.create("q", visibility_timeout=10)
    before = time.time()
    reply = await api.call(
        "POST",
        "/v1/queues/q/messages",
        {"messages": [{"body": "héllo", "attributes": {"k": "v"}}, {"body": "two"}]},
    )
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith(JSON)
    results = reply.doc["results"]
    assert [r["status"] for r in results] == ["created", "created"]
    ids = [r["id"] for r in results]
    assert all(i.isdigit() for i in ids)
    assert int(ids[0]) < int(ids[1])  # in request order

    messages = await api.take("q", max=10)
    assert [m["id"] for m in messages] == ids
    first, second = messages
    assert set(first) == DELIVERY_FIELDS
    assert first["body"] == "héllo"
    assert first["attributes"] == {"k": "v"}
    assert second["attributes"] == {}
    assert first["receive_count"] == 1
    assert isinstance(first["lease"], str)
    assert first["lease"] != second["lease"]
    assert before - 1 < first["enqueued_at"] <= first["activate_at"] <= time.time() + 1
    assert 9 < first["lease_expires_at"] - before < 11
    assert first["first_received_at"] <= first["lease_expires_at"]

    assert await api.ack("q", *messages) == ["ok", "ok"]
    assert (await api.stats("q"))["total"] == 0


async def test_get_message_shows_its_state_as_it_moves(api: Api) -> None:
    await api.create("q")
    [mid] = await api.put("q", {"body": "x", "delay": 0.2, "attributes": {"a": "b"}})
    view = await api.ok("GET", f"/v1/queues/q/messages/{mid}")
    assert set(view) == VIEW_FIELDS
    assert view["id"] == mid
    assert (view["state"], view["body"], view["receive_count"]) == ("delayed", "x", 0)
    assert (view["lease_expires_at"], view["attributes"], view["group"]) == (None, {"a": "b"}, None)

    [taken] = await take_eventually(api, "q")
    view = await api.ok("GET", f"/v1/queues/q/messages/{mid}")
    assert (view["state"], view["receive_count"]) == ("reserved", 1)
    assert view["lease_expires_at"] == taken["lease_expires_at"]

    await api.items("q", "release", {"id": mid, "lease": taken["lease"]})
    view = await api.ok("GET", f"/v1/queues/q/messages/{mid}")
    assert (view["state"], view["receive_count"], view["lease_expires_at"]) == ("ready", 1, None)


async def test_patch_message_changes_body_and_activation(api: Api) -> None:
    await api.create("q")
    [mid] = await api.put("q", "old")
    view = await api.ok("PATCH", f"/v1/queues/q/messages/{mid}", {"body": "new"})
    assert (view["id"], view["state"], view["body"]) == (mid, "ready", "new")
    view = await api.ok("PATCH", f"/v1/queues/q/messages/{mid}", {"delay": 60})
    assert view["state"] == "delayed"
    assert view["activate_at"] > time.time() + 50
    assert await api.take("q") == []
    view = await api.ok("PATCH", f"/v1/queues/q/messages/{mid}", {"activate_at": time.time() - 1})
    assert view["state"] == "ready"
    view = await api.ok("PATCH", f"/v1/queues/q/messages/{mid}", {"body_b64": B64})
    assert "body" not in view
    assert view["body_b64"] == B64
    [taken] = await api.take("q")
    assert taken["body_b64"] == B64


async def test_delete_message_of_a_ready_message_needs_no_lease(api: Api) -> None:
    await api.create("q")
    [mid, other] = await api.put("q", "a", "b")
    reply = await api.call("DELETE", f"/v1/queues/q/messages/{mid}")
    assert (reply.status, reply.doc) == (204, None)
    assert_error(await api.call("GET", f"/v1/queues/q/messages/{mid}"), 404, "MessageNotFound")
    assert [m["id"] for m in await api.take("q", max=10)] == [other]


# ====================================================================== msgpack and formats


@pytest.mark.parametrize("put_fmt", ["json", "msgpack"])
@pytest.mark.parametrize("read_fmt", ["json", "msgpack"])
async def test_binary_bodies_round_trip_as_bytes_or_body_b64(
    api: Api, put_fmt: str, read_fmt: str
) -> None:
    await api.create("q")
    message = {"body": BINARY} if put_fmt == "msgpack" else {"body_b64": B64}
    reply = await api.call("POST", "/v1/queues/q/messages", {"messages": [message]}, fmt=put_fmt)
    assert reply.status == 200, reply
    [mid] = [r["id"] for r in reply.doc["results"]]

    def check_body(doc: dict[str, Any]) -> None:
        if read_fmt == "msgpack":
            assert doc["body"] == BINARY
            assert "body_b64" not in doc
        else:
            assert doc["body_b64"] == B64
            assert "body" not in doc

    accept = MSGPACK if read_fmt == "msgpack" else None
    view = await api.call("GET", f"/v1/queues/q/messages/{mid}", accept=accept)
    assert view.status == 200
    check_body(view.doc)
    taken = await api.call("POST", "/v1/queues/q/take", {"max": 1}, fmt=read_fmt)
    assert taken.status == 200
    [delivery] = taken.doc["messages"]
    check_body(delivery)
    assert delivery["id"] == mid


@pytest.mark.parametrize(
    ("fmt", "accept", "expected"),
    [
        ("json", None, JSON),
        ("json", MSGPACK, MSGPACK),
        ("msgpack", None, MSGPACK),
        ("msgpack", JSON, JSON),
    ],
)
async def test_the_reply_format_is_the_requests_or_the_accept_headers(
    api: Api, fmt: str, accept: str | None, expected: str
) -> None:
    await api.create("q")
    await api.put("q", "text")
    for method, path, doc in [
        ("POST", "/v1/queues/q/take", {"max": 1}),
        ("POST", "/v1/queues/q/messages", {"messages": [{"body": "more"}]}),
        ("POST", "/v1/queues/nope/take", {"max": 1}),  # errors too
    ]:
        reply = await api.call(method, path, doc, fmt=fmt, accept=accept)
        assert reply.headers["Content-Type"].startswith(expected), (path, reply)
        assert isinstance(reply.doc, dict), reply
    listing = await api.call("GET", "/v1/queues", accept=accept)
    assert listing.headers["Content-Type"].startswith(accept or JSON)
    assert listing.doc == {"queues": ["q"]}


async def test_every_message_endpoint_speaks_msgpack(api: Api) -> None:
    await api.create("q", visibility_timeout=10)

    async def mp(method: str, path: str, doc: Any = None, status: int = 200) -> Any:
        reply = await api.call(method, path, doc, fmt="msgpack")
        assert reply.status == status, reply
        if status != 204:
            assert reply.headers["Content-Type"].startswith(MSGPACK)
        return reply.doc

    put = await mp(
        "POST",
        "/v1/queues/q/messages",
        {"messages": [{"body": BINARY, "attributes": {"k": "v"}}, {"body": "a str"}]},
    )
    ids = [r["id"] for r in put["results"]]
    assert [r["status"] for r in put["results"]] == ["created", "created"]
    a, b = (await mp("POST", "/v1/queues/q/take", {"max": 2}))["messages"]
    assert set(a) == DELIVERY_FIELDS
    assert (a["body"], a["attributes"], b["body"]) == (BINARY, {"k": "v"}, b"a str")

    touched = await mp(
        "POST", "/v1/queues/q/touch", {"items": [{"id": a["id"], "lease": a["lease"]}]}
    )
    [result] = touched["results"]
    assert (result["id"], result["status"]) == (a["id"], "ok")
    assert result["lease_expires_at"] >= a["lease_expires_at"]

    released = await mp(
        "POST", "/v1/queues/q/release", {"items": [{"id": b["id"], "lease": b["lease"]}]}
    )
    assert released == {"results": [{"id": b["id"], "status": "ok"}]}

    view = await mp("GET", f"/v1/queues/q/messages/{b['id']}")
    assert (view["state"], view["body"]) == ("ready", b"a str")
    view = await mp("PATCH", f"/v1/queues/q/messages/{b['id']}", {"body": BINARY + b"!"})
    assert view["body"] == BINARY + b"!"

    acked = await mp("POST", "/v1/queues/q/ack", {"items": [{"id": a["id"], "lease": a["lease"]}]})
    assert acked == {"results": [{"id": a["id"], "status": "ok"}]}
    await mp("DELETE", f"/v1/queues/q/messages/{b['id']}", status=204)
    assert ids == [a["id"], b["id"]]
    assert (await api.stats("q"))["total"] == 0


# ====================================================================== errors: 400


NOW_PLUS_CENTURY = 4_000_000_000.0  # far beyond the default retention (4 days)


def _bad(method: str, path: str, body: Any, label: str, fmt: str = "json") -> Any:
    return pytest.param(method, path, body, fmt, id=label)


BAD_REQUESTS = [
    # put
    _bad("POST", "/v1/queues/q/messages", Raw(b'{"messages": ['), "put-malformed-json"),
    _bad("POST", "/v1/queues/q/messages", Raw(b""), "put-empty-body"),
    _bad("POST", "/v1/queues/q/messages", Raw(b"[1, 2]"), "put-not-an-object"),
    _bad("POST", "/v1/queues/q/messages", {"messages": [{"body": "x"}], "x": 1}, "put-unknown"),
    _bad("POST", "/v1/queues/q/messages", {"messages": [{"bdy": "x"}]}, "put-unknown-in-msg"),
    _bad("POST", "/v1/queues/q/messages", {"messages": "x"}, "put-messages-not-a-list"),
    _bad("POST", "/v1/queues/q/messages", {"messages": [{"body": 5}]}, "put-body-a-number"),
    _bad("POST", "/v1/queues/q/messages", {"messages": [{"body": "x", "delay": "1"}]}, "delay-str"),
    _bad("POST", "/v1/queues/q/messages", {"messages": [{"body": "x", "delay": -1}]}, "delay<0"),
    _bad(
        "POST",
        "/v1/queues/q/messages",
        {"messages": [{"body": "x", "delay": 1, "activate_at": 1}]},
        "put-delay-and-activate_at",
    ),
    _bad(
        "POST",
        "/v1/queues/q/messages",
        {"messages": [{"body": "x", "activate_at": NOW_PLUS_CENTURY}]},
        "put-activate-beyond-retention",
    ),
    _bad(
        "POST",
        "/v1/queues/q/messages",
        {"messages": [{"body": "x", "body_b64": "eA=="}]},
        "put-body-and-body_b64",
    ),
    _bad("POST", "/v1/queues/q/messages", {"messages": [{"body_b64": "!!"}]}, "put-bad-base64"),
    _bad("POST", "/v1/queues/q/messages", {"messages": [{}]}, "put-no-body"),
    _bad("POST", "/v1/queues/q/messages", {"messages": [{"body": ""}]}, "put-empty-message"),
    _bad("POST", "/v1/queues/q/messages", {"messages": []}, "put-no-messages"),
    _bad("POST", "/v1/queues/q/messages", {"messages": [{"body": "x"}] * 1001}, "put-1001"),
    _bad("POST", "/v1/queues/q/messages", {"messages": [{"body": "x", "id": "m"}]}, "put-id"),
    _bad(
        "POST",
        "/v1/queues/q/messages",
        {"messages": [{"body": "x", "attributes": {"a": 1}}]},
        "put-attribute-not-a-str",
    ),
    _bad("POST", "/v1/queues/q/messages", {"messages": [{"body": "x", "group": ""}]}, "group-''"),
    _bad("POST", "/v1/queues/q/messages", Raw(b"\xc1"), "put-malformed-msgpack", "msgpack"),
    _bad(
        "POST",
        "/v1/queues/q/messages",
        {"messages": [{"body": 5}]},
        "put-msgpack-body-a-number",
        "msgpack",
    ),
    # take
    _bad("POST", "/v1/queues/q/take", {"max": 0}, "take-max-0"),
    _bad("POST", "/v1/queues/q/take", {"max": 1001}, "take-max-1001"),
    _bad("POST", "/v1/queues/q/take", {"max": 0, "wait": 1}, "take-max-0-waiting"),
    _bad("POST", "/v1/queues/q/take", {"max": 1001, "wait": 1}, "take-max-1001-waiting"),
    _bad("POST", "/v1/queues/q/take", {"max": "1"}, "take-max-a-string"),
    _bad("POST", "/v1/queues/q/take", {"wait": 300.5}, "take-wait>300"),
    _bad("POST", "/v1/queues/q/take", {"wait": -1}, "take-wait<0"),
    _bad("POST", "/v1/queues/q/take", {"visibility_timeout": -1}, "take-vt<0"),
    _bad("POST", "/v1/queues/q/take", {"visibility_timeout": 43201}, "take-vt>12h"),
    _bad("POST", "/v1/queues/q/take", {"maximum": 1}, "take-unknown-field"),
    _bad("POST", "/v1/queues/q/take", Raw(b"nope"), "take-malformed"),
    # ack / release / touch
    _bad("POST", "/v1/queues/q/ack", {"items": []}, "ack-no-items"),
    _bad("POST", "/v1/queues/q/ack", Raw(b""), "ack-empty-body"),
    _bad("POST", "/v1/queues/q/ack", {"items": [{"id": "1"}]}, "ack-no-lease"),
    _bad("POST", "/v1/queues/q/ack", {"items": [{"id": 1, "lease": "1"}]}, "ack-id-a-number"),
    _bad(
        "POST",
        "/v1/queues/q/ack",
        {"items": [{"id": "1", "lease": "1"}] * 1001},
        "ack-1001-items",
    ),
    _bad(
        "POST",
        "/v1/queues/q/release",
        {"items": [{"id": "1", "lease": "1", "delay": -1}]},
        "release-delay<0",
    ),
    _bad(
        "POST",
        "/v1/queues/q/release",
        {"items": [{"id": "1", "lease": "1", "wait": 1}]},
        "release-unknown-field",
    ),
    _bad(
        "POST",
        "/v1/queues/q/touch",
        {"items": [{"id": "1", "lease": "1", "visibility_timeout": -1}]},
        "touch-vt<0",
    ),
    # one message
    _bad("PATCH", "/v1/queues/q/messages/1", {}, "patch-message-nothing"),
    _bad("PATCH", "/v1/queues/q/messages/1", Raw(b""), "patch-message-empty-body"),
    _bad("PATCH", "/v1/queues/q/messages/1", {"body": "x", "body_b64": "eA=="}, "patch-both"),
    _bad("PATCH", "/v1/queues/q/messages/1", {"delay": -1}, "patch-message-delay<0"),
    _bad("PATCH", "/v1/queues/q/messages/1", {"lease": 5, "delay": 1}, "patch-lease-a-number"),
    _bad("PATCH", "/v1/queues/q/messages/1", {"state": "ready"}, "patch-message-unknown"),
    # queues
    _bad("PUT", "/v1/queues/new", Raw(b"{"), "create-malformed"),
    _bad("PUT", "/v1/queues/new", {"visibilty_timeout": 1}, "create-unknown-setting"),
    _bad("PUT", "/v1/queues/new", {"visibility_timeout": -1}, "create-vt<0"),
    _bad("PUT", "/v1/queues/new", {"visibility_timeout": "1"}, "create-vt-a-string"),
    _bad("PUT", "/v1/queues/new", {"id_mode": "other"}, "create-bad-id-mode"),
    _bad("PUT", "/v1/queues/new", {"fifo": True}, "create-fifo-without-.fifo"),
    _bad("PUT", "/v1/queues/new.fifo", {"fifo": False}, "create-.fifo-not-fifo"),
    _bad("PUT", "/v1/queues/new", {"dead_letter_queue": "dlq"}, "create-dlq-no-max-receives"),
    _bad(
        "PUT",
        "/v1/queues/new",
        {"dead_letter_queue": "new", "max_receives": 1},
        "create-own-dlq",
    ),
    _bad(
        "PUT",
        "/v1/queues/new",
        {"dead_letter_queue": "bad name", "max_receives": 1},
        "create-bad-dlq-name",
    ),
    _bad("PUT", "/v1/queues/new", {"max_receives": 0}, "create-max-receives-0"),
    _bad("PUT", "/v1/queues/new", {"retention": 0.5}, "create-retention<1s"),
    _bad("PUT", "/v1/queues/new", {"max_message_bytes": 0}, "create-max-message-bytes-0"),
    _bad("PUT", "/v1/queues/new", {"content_based_dedup": True}, "create-dedup-not-fifo"),
    _bad("PATCH", "/v1/queues/q", {}, "patch-queue-nothing"),
    _bad("PATCH", "/v1/queues/q", Raw(b""), "patch-queue-empty-body"),
    _bad("PATCH", "/v1/queues/q", {"id_mode": "client"}, "patch-queue-id-mode"),
    _bad("PATCH", "/v1/queues/q", {"fifo": True}, "patch-queue-fifo"),
    _bad("PATCH", "/v1/queues/q", {"visibility_timeout": -1}, "patch-queue-vt<0"),
    _bad("PATCH", "/v1/queues/q", {"colour": "red"}, "patch-queue-unknown"),
    # queue names
    _bad("PUT", "/v1/queues/" + "a" * 81, None, "name-81-chars"),
    _bad("GET", "/v1/queues/" + "a" * 81, None, "get-name-81-chars"),
    _bad("PUT", "/v1/queues/a b", None, "name-with-space"),
    _bad("PUT", "/v1/queues/é", None, "name-unicode"),
    _bad("PUT", "/v1/queues/q.fifo.fifo", None, "name-double-fifo"),
    _bad("PUT", "/v1/queues/.fifo", None, "name-only-suffix"),
    _bad("PUT", "/v1/queues/a.b", None, "name-with-dot"),
    _bad("POST", "/v1/queues/a b/messages", {"messages": [{"body": "x"}]}, "put-bad-name"),
    _bad("POST", "/v1/queues/é/take", {"max": 1}, "take-bad-name"),
    _bad("DELETE", "/v1/queues/a b", None, "delete-bad-name"),
    _bad("GET", "/v1/queues/a b/messages/1", None, "get-message-bad-name"),
]


@pytest.mark.parametrize(("method", "path", "body", "fmt"), BAD_REQUESTS)
async def test_invalid_requests_are_400_bad_request(
    api: Api, method: str, path: str, body: Any, fmt: str
) -> None:
    await api.create("q")
    reply = await send(api, method, path, body, fmt)
    assert_error(reply, 400, "BadRequest")
    assert reply.headers["Content-Type"].startswith(MSGPACK if fmt == "msgpack" else JSON)
    # Nothing happened: no queue appeared, none changed, no message was put.
    assert await api.ok("GET", "/v1/queues") == {"queues": ["q"]}
    doc = await api.ok("GET", "/v1/queues/q")
    assert doc["settings"] == DEFAULT_SETTINGS
    assert doc["stats"]["enqueued"] == 0


@pytest.mark.parametrize("fixed", [{"id_mode": "server"}, {"fifo": False}])
async def test_patch_queue_accepts_id_mode_or_fifo_at_their_current_values(
    api: Api, fixed: dict[str, Any]
) -> None:
    # WIRE.md: they cannot change, but the settings document from GET may be sent back.
    await api.create("q")
    doc = await api.ok("PATCH", "/v1/queues/q", {**fixed, "delay": 1})
    assert doc["settings"]["delay"] == 1.0
    assert (await api.ok("GET", "/v1/queues/q"))["settings"]["delay"] == 1.0


@pytest.mark.parametrize("change", [{"id_mode": "client"}, {"fifo": True}])
async def test_patch_queue_changing_id_mode_or_fifo_is_400_and_changes_nothing(
    api: Api, change: dict[str, Any]
) -> None:
    await api.create("q")
    reply = await api.call("PATCH", "/v1/queues/q", {**change, "delay": 1})
    assert_error(reply, 400, "BadRequest")
    assert (await api.ok("GET", "/v1/queues/q"))["settings"]["delay"] == 0.0


async def test_a_fifo_queue_refuses_a_message_without_group(api: Api) -> None:
    await api.create("f.fifo")
    reply = await api.call("POST", "/v1/queues/f.fifo/messages", {"messages": [{"body": "x"}]})
    assert_error(reply, 400, "BadRequest")


# ====================================================================== errors: 404, 405


NOT_FOUND = [
    ("GET", "/v1/queues/nope", None, "QueueNotFound"),
    ("PATCH", "/v1/queues/nope", {"visibility_timeout": 1}, "QueueNotFound"),
    ("DELETE", "/v1/queues/nope", None, "QueueNotFound"),
    ("POST", "/v1/queues/nope/purge", None, "QueueNotFound"),
    ("POST", "/v1/queues/nope/messages", {"messages": [{"body": "x"}]}, "QueueNotFound"),
    ("POST", "/v1/queues/nope/take", {"max": 1}, "QueueNotFound"),
    ("POST", "/v1/queues/nope/take", {"max": 1, "wait": 0.5}, "QueueNotFound"),
    ("POST", "/v1/queues/nope/ack", {"items": [{"id": "1", "lease": "1"}]}, "QueueNotFound"),
    ("POST", "/v1/queues/nope/release", {"items": [{"id": "1", "lease": "1"}]}, "QueueNotFound"),
    ("POST", "/v1/queues/nope/touch", {"items": [{"id": "1", "lease": "1"}]}, "QueueNotFound"),
    ("GET", "/v1/queues/nope/messages/1", None, "QueueNotFound"),
    ("PATCH", "/v1/queues/nope/messages/1", {"delay": 1}, "QueueNotFound"),
    ("DELETE", "/v1/queues/nope/messages/1", None, "QueueNotFound"),
    ("GET", "/v1/queues/q/messages/424242", None, "MessageNotFound"),
    ("GET", "/v1/queues/q/messages/not-a-number", None, "MessageNotFound"),
    ("PATCH", "/v1/queues/q/messages/424242", {"delay": 1}, "MessageNotFound"),
    ("DELETE", "/v1/queues/q/messages/424242", None, "MessageNotFound"),
    ("DELETE", "/v1/queues/q/messages/424242?lease=1", None, "MessageNotFound"),
    ("GET", "/v1/nothing", None, "NotFound"),
    ("GET", "/nothing", None, "NotFound"),
    ("POST", "/v1/queues/q/nothing", {}, "NotFound"),
    ("GET", "/v1/queues/q/messages/1/more", None, "NotFound"),
]


@pytest.mark.parametrize(("method", "path", "body", "code"), NOT_FOUND)
async def test_unknown_queues_messages_and_routes_are_404(
    api: Api, method: str, path: str, body: Any, code: str
) -> None:
    await api.create("q")
    await api.put("q", "x")
    reply = await send(api, method, path, body)
    assert_error(reply, 404, code)
    assert await api.ok("GET", "/v1/queues") == {"queues": ["q"]}  # nothing was created


METHOD_NOT_ALLOWED = [
    ("POST", "/v1/queues", {"GET"}),
    ("DELETE", "/v1/queues", {"GET"}),
    ("POST", "/v1/queues/q", {"GET", "PUT", "PATCH", "DELETE"}),
    ("GET", "/v1/queues/q/take", {"POST"}),
    ("GET", "/v1/queues/q/purge", {"POST"}),
    ("PUT", "/v1/queues/q/messages", {"POST"}),
    ("PUT", "/v1/queues/q/messages/1", {"GET", "PATCH", "DELETE"}),
    ("POST", "/healthz", {"GET"}),
]


@pytest.mark.parametrize(("method", "path", "allowed"), METHOD_NOT_ALLOWED)
async def test_a_wrong_method_is_405(api: Api, method: str, path: str, allowed: set[str]) -> None:
    await api.create("q")
    reply = await api.call(method, path)
    assert_error(reply, 405, "MethodNotAllowed")


async def test_a_405_names_the_allowed_methods(api: Api) -> None:
    # RFC 9110 §15.5.6: "The origin server MUST generate an Allow header field" in a 405.
    await api.create("q")
    missing = {}
    for method, path, allowed in METHOD_NOT_ALLOWED:
        reply = await api.call(method, path)
        assert reply.status == 405
        given = {m.strip() for m in reply.headers.get("Allow", "").split(",") if m.strip()}
        if not given >= allowed:
            missing[f"{method} {path}"] = sorted(allowed - given)
    assert missing == {}


# ====================================================================== errors: 409


async def test_a_client_id_reused_with_another_body_is_conflict(api: Api) -> None:
    await api.create("c", id_mode="client")
    path = "/v1/queues/c/messages"
    first = await api.ok("POST", path, {"messages": [{"id": "job-1", "body": "a"}]})
    assert first == {"results": [{"id": "job-1", "status": "created"}]}
    again = await api.ok("POST", path, {"messages": [{"id": "job-1", "body": "a"}]})
    assert again == {"results": [{"id": "job-1", "status": "duplicate"}]}
    clash = await api.call("POST", path, {"messages": [{"id": "job-1", "body": "b"}]})
    assert_error(clash, 409, "Conflict")
    assert_error(await api.call("POST", path, {"messages": [{"body": "a"}]}), 400, "BadRequest")

    batch = [{"id": "x", "body": "1"}, {"id": "job-1", "body": "a"}, {"id": "x", "body": "1"}]
    doc = await api.ok("POST", path, {"messages": batch})
    assert doc["results"] == [
        {"id": "x", "status": "created"},
        {"id": "job-1", "status": "duplicate"},
        {"id": "x", "status": "duplicate"},
    ]
    view = await api.ok("GET", "/v1/queues/c/messages/job-1")
    assert view["body"] == "a"
    assert (await api.stats("c"))["total"] == 2


async def test_an_idempotency_key_retry_gets_the_same_id_as_duplicate(api: Api) -> None:
    await api.create("q")
    path = "/v1/queues/q/messages"
    msg = {"body": "a", "idempotency_key": "order-7"}
    first = await api.ok("POST", path, {"messages": [msg]})
    [(mid, status)] = [(r["id"], r["status"]) for r in first["results"]]
    assert status == "created"
    retry = await api.ok("POST", path, {"messages": [msg, {"body": "b"}, msg]})
    assert [r["status"] for r in retry["results"]] == ["duplicate", "created", "duplicate"]
    assert retry["results"][0]["id"] == retry["results"][2]["id"] == mid
    stats = await api.stats("q")
    assert (stats["total"], stats["enqueued"]) == (2, 2)


async def test_a_reserved_message_needs_its_current_lease_to_change_or_delete(api: Api) -> None:
    await api.create("q", visibility_timeout=10)
    [mid] = await api.put("q", "old")
    [taken] = await api.take("q")
    lease = taken["lease"]
    path = f"/v1/queues/q/messages/{mid}"

    assert_error(await api.call("PATCH", path, {"body": "new"}), 409, "Conflict")
    assert_error(await api.call("PATCH", path, {"body": "new", "lease": "0"}), 409, "StaleLease")
    assert_error(await api.call("DELETE", path), 409, "Conflict")
    assert_error(await api.call("DELETE", path, params={"lease": "0"}), 409, "StaleLease")

    view = await api.ok("PATCH", path, {"body": "new", "lease": lease})
    assert (view["state"], view["body"], view["receive_count"]) == ("reserved", "new", 1)
    assert view["lease_expires_at"] == taken["lease_expires_at"]

    # A new activation time ends the lease and starts the receive count again.
    view = await api.ok("PATCH", path, {"delay": 0.2, "lease": lease})
    assert (view["state"], view["receive_count"], view["lease_expires_at"]) == ("delayed", 0, None)
    assert await api.ack("q", taken) == ["stale_lease"]
    assert_error(await api.call("DELETE", path, params={"lease": lease}), 409, "StaleLease")
    assert_error(await api.call("PATCH", path, {"body": "x", "lease": lease}), 409, "StaleLease")

    [again] = await take_eventually(api, "q")
    assert (again["id"], again["body"], again["receive_count"]) == (mid, "new", 1)
    reply = await api.call("DELETE", path, params={"lease": again["lease"]})
    assert reply.status == 204
    assert_error(await api.call("GET", path), 404, "MessageNotFound")


# ====================================================================== errors: 413


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
async def test_a_request_body_over_the_apps_limit_is_413(serve: Serve, fmt: str) -> None:
    api = await serve(AppOptions(max_body_bytes=1024))
    await api.create("q")
    big = {"messages": [{"body": "x" * 2000}]}
    reply = await api.call("POST", "/v1/queues/q/messages", big, fmt=fmt)
    assert_error(reply, 413, "TooLarge")
    assert "1024" in reply.doc["error"]["message"]
    assert reply.headers["Content-Type"].startswith(MSGPACK if fmt == "msgpack" else JSON)
    small = await api.call("POST", "/v1/queues/q/messages", {"messages": [{"body": "x" * 900}]})
    assert small.status == 200
    assert (await api.stats("q"))["enqueued"] == 1


async def test_a_message_over_the_queues_max_message_bytes_is_413(api: Api) -> None:
    await api.create("q", max_message_bytes=10)
    [mid] = await api.put("q", "x" * 10)
    reply = await api.call("POST", "/v1/queues/q/messages", {"messages": [{"body": "x" * 11}]})
    assert_error(reply, 413, "TooLarge")
    batch = {"messages": [{"body": "ok"}, {"body": "é" * 6}]}  # 12 bytes of UTF-8
    assert_error(await api.call("POST", "/v1/queues/q/messages", batch), 413, "TooLarge")
    patch = await api.call("PATCH", f"/v1/queues/q/messages/{mid}", {"body": "y" * 11})
    assert_error(patch, 413, "TooLarge")
    assert (await api.stats("q"))["enqueued"] == 1  # the refused batch put nothing


# ====================================================================== errors: 429


async def test_past_max_requests_the_gateway_answers_429_with_retry_after(
    serve: Serve, data_dir: Any
) -> None:
    store = GatedStore(LocalDirStore(data_dir))
    api = await serve(AppOptions(max_requests=1), store=store)
    await api.create("q")
    store.hold("put_if_absent", 1)
    put = asyncio.ensure_future(api.put("q", "held"))
    await until(lambda: store.waiting["put_if_absent"] == 1 and api.app[IN_FLIGHT][0] == 1)

    for method, path, doc in [
        ("GET", "/v1/queues", None),
        ("POST", "/v1/queues/q/take", {"max": 1}),
        ("PUT", "/v1/queues/other", {}),
    ]:
        reply = await send(api, method, path, doc)
        assert_error(reply, 429, "Overloaded")
        assert reply.headers["Retry-After"] == "1"
    assert (await api.call("GET", "/healthz")).status == 200  # service endpoints stay up

    store.release("put_if_absent")
    assert len(await put) == 1
    assert await api.ok("GET", "/v1/queues") == {"queues": ["q"]}


async def test_an_overloaded_answer_to_a_msgpack_request_is_msgpack(
    serve: Serve, data_dir: Any
) -> None:
    store = GatedStore(LocalDirStore(data_dir))
    api = await serve(AppOptions(max_requests=1), store=store)
    await api.create("q")
    store.hold("put_if_absent", 1)
    put = asyncio.ensure_future(api.put("q", "held"))
    await until(lambda: api.app[IN_FLIGHT][0] == 1)
    reply = await api.call("POST", "/v1/queues/q/take", {"max": 1}, fmt="msgpack")
    store.release("put_if_absent")
    await put
    assert_error(reply, 429, "Overloaded")
    assert reply.headers["Content-Type"].startswith(MSGPACK)  # WIRE: the request's type


async def test_past_max_waiting_per_shard_commands_are_refused_with_429(
    serve: Serve, data_dir: Any
) -> None:
    store = GatedStore(LocalDirStore(data_dir))
    api = await serve(AppOptions(max_waiting_per_shard=1), store=store)
    await api.create("q")
    await api.create("other")
    store.hold("put_if_absent", 1)
    first = asyncio.ensure_future(api.put("q", "in flight"))
    await until(lambda: store.waiting["put_if_absent"] == 1)

    # One more command may wait behind the call in flight; the rest are refused at once.
    more = [
        asyncio.ensure_future(
            api.call("POST", "/v1/queues/q/messages", {"messages": [{"body": str(i)}]})
        )
        for i in range(5)
    ]

    async def refused() -> list[Reply]:
        done = [t.result() for t in more if t.done()]
        return done if len(done) == 4 else []

    for reply in await eventually(refused):
        assert_error(reply, 429, "Overloaded")
        assert reply.headers["Retry-After"] == "1"
    assert len(await api.put("other", "another queue is not held back")) == 1

    store.release("put_if_absent")
    assert len(await first) == 1
    replies = await asyncio.gather(*more)
    assert sorted(r.status for r in replies) == [200, 429, 429, 429, 429]
    assert (await api.stats("q"))["enqueued"] == 2


async def test_past_max_waiting_takes_a_long_poll_is_refused_with_429(serve: Serve) -> None:
    api = await serve(AppOptions(max_waiting_takes=1))
    await api.create("q")
    waiting = asyncio.ensure_future(api.take("q", wait=5))
    await until(lambda: waiting_takes(api) == 1)

    reply = await api.call("POST", "/v1/queues/q/take", {"max": 1, "wait": 1})
    assert_error(reply, 429, "Overloaded")
    assert reply.headers["Retry-After"] == "1"
    assert await api.take("q") == []  # a take that does not wait is not counted

    await api.put("q", "x")
    [message] = await waiting
    assert message["body"] == "x"
    assert waiting_takes(api) == 0
    await api.put("q", "y")
    assert [m["body"] for m in await api.take("q", wait=1)] == ["y"]


# ====================================================================== 503 and lifecycle


async def test_readyz_is_503_until_recovery_finishes_and_queues_wait_for_it(
    serve: Serve, data_dir: Any
) -> None:
    first = await serve()
    await first.create("q")
    await first.put("q", "survivor")
    await first.client.close()  # closes the queues and the store

    store = GatedStore(LocalDirStore(data_dir))
    store.hold("list")  # recovery starts by listing the store's queues
    api = await serve(store=store, ready=False)
    reply = await api.call("GET", "/readyz")
    assert reply.status == 503, reply
    assert reply.doc["status"] == "recovering"
    assert [s["ready"] for s in reply.doc["shards"]] == [False, False]
    assert reply.headers["Retry-After"] == "1"
    assert (await api.ok("GET", "/healthz"))["status"] == "ok"
    for method, path, doc in [
        ("GET", "/v1/queues/q", None),
        ("POST", "/v1/queues/q/take", {"max": 1}),
        ("POST", "/v1/queues/q/messages", {"messages": [{"body": "x"}]}),
    ]:
        reply = await send(api, method, path, doc)
        assert_error(reply, 503, "NotReady")
        assert reply.headers["Retry-After"] == "1"

    store.release("list")
    await api.wait_ready()
    assert await api.ok("GET", "/readyz") == {"status": "ready"}
    assert [m["body"] for m in await api.take("q")] == ["survivor"]


async def test_healthz_and_readyz_of_a_ready_server(api: Api) -> None:
    assert (await api.ok("GET", "/healthz"))["status"] == "ok"
    assert await api.ok("GET", "/readyz") == {"status": "ready"}


@pytest.mark.parametrize("how", ["app.shutdown", "server.close"])
async def test_on_shutdown_a_waiting_long_poll_answers_an_empty_list(api: Api, how: str) -> None:
    await api.create("q")
    waiting = asyncio.ensure_future(api.call("POST", "/v1/queues/q/take", {"max": 1, "wait": 30}))
    await until(lambda: waiting_takes(api) == 1)
    started = time.monotonic()
    if how == "app.shutdown":
        await api.app.shutdown()
    else:
        await api.client.server.close()
    reply = await asyncio.wait_for(waiting, 5)
    assert (reply.status, reply.doc) == (200, {"messages": []})
    assert time.monotonic() - started < 3


# ====================================================================== behaviours


async def test_a_delay_is_honoured(api: Api) -> None:
    await api.create("q")
    started = time.monotonic()
    [mid] = await api.put("q", {"body": "later", "delay": 0.3})
    early, stats = await api.take("q"), await api.stats("q")
    if time.monotonic() - started < 0.3:  # a loaded machine may stall past the delay
        assert early == []
        assert stats["delayed"] == 1
    [message] = early or await take_eventually(api, "q")
    assert time.monotonic() - started >= 0.29
    assert (message["id"], message["body"]) == (mid, "later")
    assert message["activate_at"] - message["enqueued_at"] == pytest.approx(0.3, abs=0.002)


async def test_a_queue_default_delay_applies_to_every_put(api: Api) -> None:
    await api.create("q", delay=0.2)
    started = time.monotonic()
    await api.put("q", "x")
    early = await api.take("q")
    if time.monotonic() - started < 0.2:  # a loaded machine may stall past the delay
        assert early == []
    [message] = early or await take_eventually(api, "q")
    assert time.monotonic() - started >= 0.19
    assert message["activate_at"] - message["enqueued_at"] == pytest.approx(0.2, abs=0.002)


async def test_take_hands_out_messages_in_activation_order(api: Api) -> None:
    await api.create("q")
    now = time.time()
    await api.put(
        "q",
        "normal",
        {"body": "urgent", "activate_at": now - 60},
        {"body": "soonish", "activate_at": now - 30},
        "normal-2",
    )
    order = [m["body"] for m in await api.take("q", max=10)]
    assert order == ["urgent", "soonish", "normal", "normal-2"]


async def test_an_expired_lease_redelivers_with_receive_count_2(api: Api) -> None:
    await api.create("q", visibility_timeout=30)
    [mid] = await api.put("q", "x")
    before = time.time()
    [first] = await api.take("q", visibility_timeout=0.2)
    assert first["receive_count"] == 1
    assert first["lease_expires_at"] - before < 1.0
    assert await api.take("q") == []  # reserved until the lease expires

    [second] = await take_eventually(api, "q", visibility_timeout=10)
    assert (second["id"], second["receive_count"]) == (mid, 2)
    assert second["lease"] != first["lease"]
    assert second["first_received_at"] == first["first_received_at"]
    assert second["lease_expires_at"] >= first["lease_expires_at"] + 9
    assert await api.ack("q", first) == ["stale_lease"]
    assert await api.ack("q", second) == ["ok"]


async def test_touch_extends_a_lease(api: Api) -> None:
    await api.create("q")
    await api.put("q", "x")
    [taken] = await api.take("q", visibility_timeout=0.3)
    [result] = await api.items(
        "q", "touch", {"id": taken["id"], "lease": taken["lease"], "visibility_timeout": 5}
    )
    assert result["status"] == "ok"
    assert result["lease_expires_at"] > taken["lease_expires_at"] + 4
    await asyncio.sleep(0.5)  # past the first lease
    assert await api.take("q") == []
    view = await api.ok("GET", f"/v1/queues/q/messages/{taken['id']}")
    assert (view["state"], view["lease_expires_at"]) == ("reserved", result["lease_expires_at"])
    assert await api.ack("q", taken) == ["ok"]


# Items: "good:a" = a's id and lease; "bad:a" = a's id, another lease; "ready" = a message
# that is not reserved; "missing" = an id that was never used.
PER_ITEM = [
    (
        "ack",
        ["good:a", "bad:b", "missing", "good:a", "ready"],
        ["ok", "stale_lease", "not_found", "not_found", "stale_lease"],
    ),
    (
        "release",
        ["bad:a", "good:a", "good:a", "missing", "ready", "good:b"],
        ["stale_lease", "ok", "stale_lease", "not_found", "stale_lease", "ok"],
    ),
    (
        "touch",
        ["good:a", "bad:b", "missing", "ready", "good:a"],
        ["ok", "stale_lease", "not_found", "stale_lease", "ok"],
    ),
]


@pytest.mark.parametrize(("verb", "items", "statuses"), PER_ITEM)
async def test_ack_release_touch_answer_a_status_per_item(
    api: Api, verb: str, items: list[str], statuses: list[str]
) -> None:
    await api.create("q")
    await api.put("q", "a", "b")
    taken = {m["body"]: m for m in await api.take("q", max=2)}
    [ready] = await api.put("q", "c")
    missing = "424242"

    def item(spec: str) -> dict[str, str]:
        kind, _, which = spec.partition(":")
        if kind == "missing":
            return {"id": missing, "lease": "1"}
        if kind == "ready":
            return {"id": ready, "lease": "1"}
        m = taken[which]
        return {"id": m["id"], "lease": m["lease"] if kind == "good" else "0"}

    sent = [item(s) for s in items]
    results = await api.items("q", verb, *sent)
    assert [r["id"] for r in results] == [i["id"] for i in sent]
    assert [r["status"] for r in results] == statuses
    for r in results:
        assert ("lease_expires_at" in r) == (verb == "touch" and r["status"] == "ok"), r


async def test_release_with_a_delay_puts_the_message_back_later(api: Api) -> None:
    await api.create("q")
    await api.put("q", "x")
    [taken] = await api.take("q")
    started = time.monotonic()
    [result] = await api.items(
        "q", "release", {"id": taken["id"], "lease": taken["lease"], "delay": 0.3}
    )
    assert result["status"] == "ok"
    assert await api.take("q") == []
    [again] = await take_eventually(api, "q")
    assert time.monotonic() - started >= 0.29
    assert again["receive_count"] == 2


async def test_a_long_poll_take_returns_as_soon_as_a_put_arrives(api: Api) -> None:
    await api.create("q")
    waiting = asyncio.ensure_future(api.take("q", max=5, wait=5))
    await until(lambda: waiting_takes(api) == 1)
    await asyncio.sleep(0.05)  # let it look at the empty queue and settle down to wait
    assert not waiting.done()
    started = time.monotonic()
    await api.put("q", "wake up")
    [message] = await asyncio.wait_for(waiting, 5)
    assert time.monotonic() - started < 1.0  # well before the 5 s wait
    assert message["body"] == "wake up"


async def test_a_long_poll_take_answers_empty_after_the_wait(api: Api) -> None:
    await api.create("q")
    started = time.monotonic()
    assert await api.take("q", wait=0.3) == []
    assert 0.29 <= time.monotonic() - started < 2
    assert waiting_takes(api) == 0


async def test_a_long_poll_take_wakes_for_a_put_made_durable_with_its_first_empty_look(
    serve: Serve, data_dir: Any
) -> None:
    # With two write slots (S3 stores have 8), a later segment can land before an earlier
    # one; both are then released together. A take whose first, empty look waited on the
    # earlier segment must still see the message the later one made ready.
    store = GatedStore(LocalDirStore(data_dir), write_slots=2)
    # No put waits in the gateway: a call for each of the held put, the take's first look
    # (which waits behind the held put) and the later put.
    api = await serve(AppOptions(batch_split_at=1, batch_in_flight=3), store=store)
    await api.create("q")
    store.hold("put_if_absent", 1)
    earlier = asyncio.ensure_future(api.put("q", {"body": "not yet", "delay": 60}))
    await until(lambda: store.waiting["put_if_absent"] == 1)

    waiting = asyncio.ensure_future(api.take("q", wait=2))
    await asyncio.sleep(0.1)  # its first look found nothing and waits on the held write
    written = store.finished["put_if_absent"]
    later = asyncio.ensure_future(api.put("q", "now"))
    await until(lambda: store.finished["put_if_absent"] == written + 1)

    started = time.monotonic()
    store.release("put_if_absent")
    await asyncio.gather(earlier, later)
    messages = await asyncio.wait_for(waiting, 5)
    assert [m["body"] for m in messages] == ["now"]
    assert time.monotonic() - started < 1.0, "the take slept through the put"


async def test_a_long_poll_take_abandoned_by_its_client_reserves_nothing(api: Api) -> None:
    await api.create("q")
    abandoned = asyncio.ensure_future(api.take("q", wait=10))
    await until(lambda: waiting_takes(api) == 1)
    abandoned.cancel()  # the client hangs up
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    await until(lambda: waiting_takes(api) == 0)
    await api.put("q", "for a live client")
    [message] = await api.take("q")
    assert (message["body"], message["receive_count"]) == ("for a live client", 1)


@pytest.mark.parametrize("auto_create", [True, False])
async def test_auto_create_makes_a_queue_on_first_put(serve: Serve, auto_create: bool) -> None:
    api = await serve(AppOptions(auto_create=auto_create))
    put = {"messages": [{"body": "x"}]}
    reply = await api.call("POST", "/v1/queues/made/messages", put)
    fifo = await api.call(
        "POST", "/v1/queues/made.fifo/messages", {"messages": [{"body": "x", "group": "g"}]}
    )
    if not auto_create:
        assert_error(reply, 404, "QueueNotFound")
        assert_error(fifo, 404, "QueueNotFound")
        assert await api.ok("GET", "/v1/queues") == {"queues": []}
        return
    assert (reply.status, reply.doc["results"][0]["status"]) == (200, "created")
    assert fifo.status == 200, fifo
    assert await api.ok("GET", "/v1/queues") == {"queues": ["made", "made.fifo"]}
    assert (await api.ok("GET", "/v1/queues/made.fifo"))["settings"]["fifo"] is True
    assert [m["body"] for m in await api.take("made")] == ["x"]
    # Only puts create: a take on an unknown queue is still a 404.
    assert_error(await api.call("POST", "/v1/queues/other/take", {}), 404, "QueueNotFound")


@pytest.mark.parametrize("how", ["release", "expire"])
async def test_after_max_receives_a_message_moves_to_the_dead_letter_queue(
    api: Api, how: str
) -> None:
    assert placement("src", 2) != placement("dead", 2)  # routed across shards
    await api.create("dead")
    await api.create("src", max_receives=2, dead_letter_queue="dead", visibility_timeout=0.2)
    [mid] = await api.put("src", {"body_b64": B64, "attributes": {"k": "v"}})

    for receive in (1, 2):
        [taken] = await take_eventually(api, "src")
        assert (taken["id"], taken["receive_count"]) == (mid, receive)
        if how == "release":
            [result] = await api.items("src", "release", {"id": mid, "lease": taken["lease"]})
            assert result["status"] == "ok"

    [dead] = await take_eventually(api, "dead")
    assert (dead["id"], dead["body_b64"], dead["receive_count"]) == (mid, B64, 1)
    assert dead["attributes"] == {
        "k": "v",
        "evq.source_queue": "src",
        "evq.source_id": mid,
        "evq.sent_at": round(taken["enqueued_at"] * 1000),
    }
    assert_error(await api.call("GET", f"/v1/queues/src/messages/{mid}"), 404, "MessageNotFound")

    async def routed() -> dict[str, Any] | None:
        stats = await api.stats("src")
        return stats if stats["dead_letter_pending"] == 0 else None

    stats = await eventually(routed)
    assert (stats["dead_lettered"], stats["total"]) == (1, 0)
    assert await api.take("src") == []
    assert (await api.stats("dead"))["enqueued"] == 1


async def test_a_fifo_group_hands_out_its_next_message_only_after_the_first_is_acked(
    api: Api,
) -> None:
    await api.create("f.fifo")
    await api.put(
        "f.fifo",
        {"body": "g1-first", "group": "g1"},
        {"body": "g1-second", "group": "g1"},
        {"body": "g2-first", "group": "g2"},
    )
    first = await api.take("f.fifo", max=1)
    assert [(m["body"], m["group"]) for m in first] == [("g1-first", "g1")]
    [g2] = await api.take("f.fifo", max=10)  # g1 is blocked by its reserved head
    assert (g2["body"], g2["group"]) == ("g2-first", "g2")
    assert await api.take("f.fifo", max=10) == []

    assert await api.ack("f.fifo", g2) == ["ok"]
    assert await api.take("f.fifo", max=10) == []  # g2 is empty, g1 still blocked
    assert await api.ack("f.fifo", first[0]) == ["ok"]
    [second] = await api.take("f.fifo", max=10)
    assert (second["body"], second["group"]) == ("g1-second", "g1")


async def test_a_fifo_take_hands_out_a_run_of_one_group_first(api: Api) -> None:
    await api.create("f.fifo")
    await api.put(
        "f.fifo",
        {"body": "g1-first", "group": "g1"},
        {"body": "g1-second", "group": "g1"},
        {"body": "g2-first", "group": "g2"},
    )
    taken = await api.take("f.fifo", max=10)
    assert [m["body"] for m in taken] == ["g1-first", "g1-second", "g2-first"]


async def test_a_fifo_group_is_blocked_until_a_release_too(api: Api) -> None:
    await api.create("f.fifo")
    await api.put("f.fifo", {"body": "1", "group": "g"}, {"body": "2", "group": "g"})
    [head] = await api.take("f.fifo", max=1)
    assert head["body"] == "1"
    assert await api.take("f.fifo", max=10) == []
    await api.items("f.fifo", "release", {"id": head["id"], "lease": head["lease"]})
    [again] = await api.take("f.fifo", max=1)  # the head again, not "2"
    assert (again["body"], again["receive_count"]) == ("1", 2)
