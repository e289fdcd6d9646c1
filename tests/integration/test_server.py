"""``evq serve`` as a black box: every endpoint through the Python clients (JSON and
msgpack), every error code with its HTTP status, and the queue semantics that need a real
clock, real shards and real sockets (delays, order, leases, dead letters, FIFO, long polls).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from actors.errors import (
    BadRequest,
    Conflict,
    MessageNotFound,
    Overloaded,
    QueueError,
    QueueExists,
    QueueNotFound,
    StaleLease,
    TooLarge,
)
from actors.shard import placement
from evq.client import AsyncClient, Client, NewMessage
from tests.integration.conftest import SHARDS, Names, ServerFactory
from tests.integration.server import Server, eventually, request, session_pids

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BINARY = pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
# Server clock vs. ours: the same machine, but times travel as milliseconds.
SLACK = 0.05


@pytest.fixture
def wire_client(server: Server, binary: bool) -> Iterator[Client]:
    """A client of the shared server speaking JSON or msgpack, without retries."""
    with Client(server.url, retries=0, timeout=20, binary=binary) as c:
        yield c


def status_of(exc: pytest.ExceptionInfo[QueueError]) -> int:
    """The HTTP status the client recorded with the error."""
    return int(exc.value.fields["status"])


# ------------------------------------------------------------------ service


def test_health_and_readiness(server: Server, client: Client) -> None:
    assert client.health() is True
    assert client.ready() is True
    assert request("GET", server.url + "/healthz") == (200, {"status": "ok", "pid": server.pid})
    assert request("GET", server.url + "/readyz") == (200, {"status": "ready"})


def test_the_local_ray_runs_no_autoscaler_monitor_and_no_dashboard_api_server(
    server: Server,
) -> None:
    """The server's own Ray runtime (actors/localray.py): its head, node and shards, without
    the two processes of a head a local runtime never uses."""
    commands = []
    for pid in session_pids(os.getsid(server.pid)):
        with contextlib.suppress(OSError):
            commands.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "))
    text = b"\n".join(commands).decode(errors="replace")
    assert "gcs_server" in text, text
    assert "raylet" in text, text
    assert text.count("ray::ShardActor") == SHARDS, text
    assert "/autoscaler/_private/monitor.py" not in text, text
    assert "dashboard/dashboard.py" not in text, text


async def test_health_and_readiness_async(server: Server) -> None:
    async with AsyncClient(server.url, retries=0, timeout=20) as c:
        assert await c.health() is True
        assert await c.ready() is True


# ------------------------------------------------------------------ queues


@BINARY
def test_queue_endpoints(wire_client: Client, names: Names) -> None:
    c = wire_client
    name = names()
    info = c.create_queue(name, visibility_timeout=12, retention=3600, max_message_bytes=4096)
    assert info.created is True
    assert info.name == name
    assert (info.settings.visibility_timeout, info.settings.retention) == (12.0, 3600.0)
    assert info.settings.max_message_bytes == 4096
    again = c.create_queue(name, visibility_timeout=12)
    assert again.created is False
    assert again.settings == info.settings
    assert name in c.list_queues()
    assert c.list_queues() == sorted(c.list_queues())

    c.put(name, ["a", "b", "c"])
    described = c.get_queue(name)
    assert described.settings == info.settings
    assert described.stats is not None
    assert (described.stats.ready, described.stats.total, described.stats.enqueued) == (3, 3, 3)
    assert described.stats.oldest_ready_age is not None

    patched = c.update_queue(name, visibility_timeout=5, delay=1)
    assert patched.settings.visibility_timeout == 5.0
    assert patched.settings.delay == 1.0
    assert patched.stats is not None
    assert patched.stats.total == 3
    assert c.get_queue(name).settings.visibility_timeout == 5.0

    assert c.purge(name) == 3
    stats = c.get_queue(name).stats
    assert stats is not None
    assert (stats.total, stats.purged) == (0, 3)

    c.delete_queue(name)
    assert name not in c.list_queues()
    with pytest.raises(QueueNotFound) as err:
        c.get_queue(name)
    assert status_of(err) == 404


def test_queue_statuses_on_the_wire(server: Server, names: Names) -> None:
    """The HTTP statuses API.md fixes for queue calls, seen without the client."""
    url = f"{server.url}/v1/queues/{names()}"
    status, doc = request("PUT", url, {"visibility_timeout": 7})
    assert status == 201
    assert doc["created"] is True
    assert request("PUT", url, {"visibility_timeout": 7})[0] == 200
    assert request("PUT", url, {})[0] == 200  # only the given settings must match
    status, doc = request("PUT", url, {"visibility_timeout": 8})
    assert (status, doc["error"]["code"]) == (409, "QueueExists")
    status, doc = request("PUT", url, {"visibilty_timeout": 8})  # typo: unknown field
    assert (status, doc["error"]["code"]) == (400, "BadRequest")
    status, doc = request("POST", url + "/messages", {"messages": [{"body": "x"}]})
    assert status == 200
    assert doc["results"][0]["status"] == "created"
    assert request("POST", url + "/purge", {}) == (200, {"purged": 1})
    assert request("DELETE", url)[0] == 204
    status, doc = request("GET", url)
    assert (status, doc["error"]["code"]) == (404, "QueueNotFound")


async def test_queue_endpoints_async(server: Server, names: Names) -> None:
    name = names()
    for binary in (False, True):
        async with AsyncClient(server.url, retries=0, timeout=20, binary=binary) as c:
            info = await c.create_queue(name, visibility_timeout=9)
            assert info.created is True  # deleted at the end of each round
            assert name in await c.list_queues()
            changed = await c.update_queue(name, max_receives=4)
            assert changed.settings.max_receives == 4
            await c.put(name, [b"\x00\x01", "z"])
            assert await c.purge(name) == 2
            described = await c.get_queue(name)
            assert described.stats is not None
            assert described.stats.purged == 2
            await c.delete_queue(name)
            with pytest.raises(QueueNotFound):
                await c.get_queue(name)


# ------------------------------------------------------------------ messages


@BINARY
def test_message_endpoints(wire_client: Client, names: Names) -> None:
    c = wire_client
    name = names()
    c.create_queue(name)
    raw = bytes(range(256))  # not UTF-8: body_b64 in JSON, bin in msgpack
    put = c.put(
        name,
        [raw, "text é ✓", NewMessage(body="with attributes", attributes={"k": "v"})],
    )
    assert [r.status for r in put] == ["created"] * 3
    ids = [r.id for r in put]
    assert len(set(ids)) == 3

    view = c.get_message(name, ids[0])
    assert (view.state, view.body, view.receive_count) == ("ready", raw, 0)
    assert view.lease_expires_at is None

    before = time.time()
    taken = c.take(name, 3, visibility_timeout=30)
    assert [m.id for m in taken] == ids
    assert [m.body for m in taken] == [raw, "text é ✓".encode(), b"with attributes"]
    assert taken[2].attributes == {"k": "v"}
    for m in taken:
        assert m.receive_count == 1
        assert m.lease
        assert m.lease_expires_at is not None
        assert before - SLACK <= m.lease_expires_at - 30 <= time.time() + SLACK
    m0, m1, m2 = taken
    assert c.get_message(name, m0.id).state == "reserved"

    [touched] = c.touch(name, m0, visibility_timeout=120)
    assert touched.ok
    assert touched.lease_expires_at is not None
    assert touched.lease_expires_at >= before + 120 - SLACK

    [released] = c.release(name, m1)
    assert released.ok
    assert c.get_message(name, m1.id).state == "ready"

    changed = c.update_message(name, m2, body=b"changed \xff")
    assert changed.body == b"changed \xff"
    assert c.get_message(name, m2.id).body == b"changed \xff"

    assert [r.status for r in c.ack(name, m0)] == ["ok"]
    assert [r.status for r in c.ack(name, m0)] == ["not_found"]

    [again] = c.take(name)
    assert (again.id, again.receive_count) == (m1.id, 2)
    later = c.reschedule(name, again, delay=60)
    assert (later.state, later.receive_count) == ("delayed", 0)
    assert later.activate_at >= before + 60 - SLACK

    c.delete_message(name, m1.id)  # delayed: no lease needed
    with pytest.raises(MessageNotFound) as err:
        c.get_message(name, m1.id)
    assert status_of(err) == 404
    c.delete_message(name, m2)  # reserved: with its lease
    stats = c.get_queue(name).stats
    assert stats is not None
    assert (stats.total, stats.acked, stats.enqueued) == (0, 1, 3)


@BINARY
def test_idempotent_and_client_id_puts(wire_client: Client, names: Names) -> None:
    c = wire_client
    name = names()
    c.create_queue(name)
    [first] = c.put(name, "once", idempotency_key="key-1")
    [second] = c.put(name, "once", idempotency_key="key-1")
    assert (first.status, second.status) == ("created", "duplicate")
    assert second.id == first.id

    ids = names("ids")
    assert c.create_queue(ids, id_mode="client").settings.id_mode == "client"
    assert c.put(ids, "body", id="job-1")[0].status == "created"
    assert c.put(ids, "body", id="job-1")[0].status == "duplicate"
    with pytest.raises(Conflict) as err:
        c.put(ids, "another body", id="job-1")
    assert status_of(err) == 409
    assert c.get_message(ids, "job-1").body == b"body"


async def test_message_endpoints_async(server: Server, names: Names) -> None:
    for binary in (False, True):
        name = names()
        async with AsyncClient(server.url, retries=0, timeout=20, binary=binary) as c:
            await c.create_queue(name)
            ids = [r.id for r in await c.put(name, [b"\xfe\x00", "two", "three"])]
            assert (await c.get_message(name, ids[1])).body == b"two"
            taken = await c.take(name, 3, visibility_timeout=30)
            assert [m.body for m in taken] == [b"\xfe\x00", b"two", b"three"]
            [touched] = await c.touch(name, taken[0], visibility_timeout=60)
            assert touched.ok
            assert [r.status for r in await c.release(name, taken[1], delay=30)] == ["ok"]
            assert (await c.get_message(name, ids[1])).state == "delayed"
            updated = await c.update_message(name, taken[2], body="3")
            assert updated.body == b"3"
            moved = await c.reschedule(name, taken[2], delay=30)
            assert moved.state == "delayed"
            assert [r.status for r in await c.ack(name, taken[0])] == ["ok"]
            await c.delete_message(name, ids[1])
            with pytest.raises(MessageNotFound):
                await c.get_message(name, ids[1])
            stats = (await c.get_queue(name)).stats
            assert stats is not None
            assert (stats.total, stats.delayed) == (1, 1)


# ------------------------------------------------------------------ errors


@BINARY
def test_error_codes_and_statuses(wire_client: Client, names: Names) -> None:
    """Each error code of API.md the native API can produce here, with its status."""
    c = wire_client
    name, missing = names(), names("missing")
    c.create_queue(name, max_message_bytes=100, visibility_timeout=30)

    def expect(kind: type[QueueError], status: int, call: object, *args: object, **kw: object):
        with pytest.raises(kind) as err:
            call(*args, **kw)  # type: ignore[operator]
        assert type(err.value) is kind, err.value
        assert status_of(err) == status, err.value
        assert err.value.code == kind.__name__
        return err.value

    expect(BadRequest, 400, c.create_queue, "bad name!")
    expect(BadRequest, 400, c.create_queue, names(), visibility_timeout=-1)
    expect(BadRequest, 400, c.create_queue, names(), dead_letter_queue=name)  # no max_receives
    expect(BadRequest, 400, c.create_queue, names("x"), fifo=True)  # not named .fifo
    expect(BadRequest, 400, c.take, name, 0)
    expect(BadRequest, 400, c.take, name, 1001)
    expect(BadRequest, 400, c.take, name, 1, wait=301)
    expect(BadRequest, 400, c.update_queue, name, id_mode="client")
    expect(QueueNotFound, 404, c.get_queue, missing)
    expect(QueueNotFound, 404, c.put, missing, "x")
    expect(QueueNotFound, 404, c.take, missing)
    expect(QueueNotFound, 404, c.purge, missing)
    expect(QueueNotFound, 404, c.delete_queue, missing)
    expect(QueueNotFound, 404, c.get_message, missing, "1")
    expect(MessageNotFound, 404, c.get_message, name, "12345")
    expect(MessageNotFound, 404, c.update_message, name, "12345", body="x")
    expect(MessageNotFound, 404, c.delete_message, name, "12345")
    expect(QueueExists, 409, c.create_queue, name, visibility_timeout=31)
    expect(TooLarge, 413, c.put, name, b"x" * 101)

    c.put(name, "payload")
    [m] = c.take(name)
    expect(Conflict, 409, c.delete_message, name, m.id)  # reserved, no lease
    expect(Conflict, 409, c.update_message, name, m.id, body="y")
    expect(StaleLease, 409, c.delete_message, name, m.id, lease="not-the-lease")
    expect(StaleLease, 409, c.update_message, name, m.id, body="y", lease="not-the-lease")
    assert [r.status for r in c.ack(name, (m.id, "not-the-lease"))] == ["stale_lease"]
    assert [r.status for r in c.ack(name, ("12345", "x"))] == ["not_found"]
    assert [r.status for r in c.ack(name, m)] == ["ok"]


def test_unknown_fields_are_rejected(server: Server, names: Names) -> None:
    name = names()
    url = f"{server.url}/v1/queues/{name}"
    assert request("PUT", url, {})[0] == 201
    cases = [
        ("POST", "/messages", {"messages": [{"body": "x", "dealy": 1}]}),
        ("POST", "/messages", {"messages": []}),
        ("POST", "/messages", {"messages": [{"body": "x", "body_b64": "eA=="}]}),
        ("POST", "/take", {"max": 1, "visibility": 3}),
        ("POST", "/ack", {"items": [{"id": "1"}]}),
    ]
    for method, path, doc in cases:
        status, reply = request(method, url + path, doc)
        assert (status, reply["error"]["code"]) == (400, "BadRequest"), (path, doc, reply)
    status, reply = request("POST", url + "/messages", data=b"{not json")
    assert (status, reply["error"]["code"]) == (400, "BadRequest")


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with tiny limits: two requests at once, 64 KiB bodies."""
    factory = ServerFactory(tmp_path_factory.mktemp("limited"))
    try:
        yield factory("--shards", "1", "--max-requests", "2", "--max-body-bytes", "65536")
    finally:
        factory.close()


async def test_overloaded_429_and_body_limit_413(limited: Server, names: Names) -> None:
    name = names()
    async with AsyncClient(limited.url, retries=0, timeout=20) as c:
        await c.create_queue(name)
        with pytest.raises(TooLarge) as big:
            await c.put(name, b"x" * 70_000)  # under the queue's limit, over the server's
        assert big.value.fields["status"] == 413
        assert "65536" in big.value.message

        # Two long polls hold both request slots: a third request is turned away.
        waiting = [asyncio.ensure_future(c.take(name, wait=3)) for _ in range(2)]
        await asyncio.sleep(0.5)
        assert not any(w.done() for w in waiting)
        with pytest.raises(Overloaded) as busy:
            await c.get_queue(name)
        assert busy.value.fields["status"] == 429
        assert busy.value.fields["retry_after"] == 1.0
        with pytest.raises(Overloaded):
            await c.put(name, "x")
        assert await asyncio.wait_for(asyncio.gather(*waiting), 10) == [[], []]

        # Free again; a retrying client rides over a 429.
        await c.put(name, "after")
        other = names("other")
        await c.create_queue(other)
        async with AsyncClient(limited.url, retries=5, timeout=20) as patient:
            waiting = [asyncio.ensure_future(c.take(other, wait=1.5)) for _ in range(2)]
            await asyncio.sleep(0.3)
            stats = (await patient.get_queue(name)).stats
            assert stats is not None
            assert stats.ready == 1
            assert await asyncio.wait_for(asyncio.gather(*waiting), 10) == [[], []]


# ------------------------------------------------------------------ semantics


def test_delays_are_honoured(client: Client, names: Names) -> None:
    name = names()
    c = client
    c.create_queue(name)
    start = time.time()
    [r] = c.put(name, "later", delay=1.0)
    view = c.get_message(name, r.id)
    assert view.state == "delayed"
    assert start + 1.0 - SLACK <= view.activate_at <= time.time() + 1.0 + SLACK
    assert c.take(name) == []
    stats = c.get_queue(name).stats
    assert stats is not None
    assert (stats.delayed, stats.ready) == (1, 0)
    [m] = c.take(name, wait=5)
    got = time.time()
    assert m.id == r.id
    assert got >= view.activate_at - SLACK
    assert got - view.activate_at < 2.0

    # A queue's default delay applies to every put; activate_at wins when given.
    slow = names("slow")
    c.create_queue(slow, delay=30)
    [d] = c.put(slow, "default delay")
    assert c.get_message(slow, d.id).state == "delayed"
    [now] = c.put(slow, "explicit", activate_at=time.time() - 1)
    assert c.take(slow)[0].id == now.id


def test_order_is_by_activation_time(client: Client, names: Names) -> None:
    name = names()
    c = client
    c.create_queue(name)
    now = time.time()
    results = c.put(
        name,
        [
            NewMessage(body="plain-1"),
            NewMessage(body="ten-ago", activate_at=now - 10),
            NewMessage(body="soon", delay=0.6),
            NewMessage(body="thirty-ago", activate_at=now - 30),
            NewMessage(body="plain-2"),
        ],
    )
    assert [r.status for r in results] == ["created"] * 5
    taken = c.take(name, 10)
    assert [m.body for m in taken] == [b"thirty-ago", b"ten-ago", b"plain-1", b"plain-2"]
    assert [m.activate_at for m in taken] == sorted(m.activate_at for m in taken)
    [soon] = c.take(name, 10, wait=5)
    assert soon.body == b"soon"

    # A released message comes back at its new activation time, behind earlier ones.
    c.put(name, "fresh")
    c.release(name, taken[0], activate_at=time.time() - 60)
    assert [m.body for m in c.take(name, 2)] == [b"thirty-ago", b"fresh"]


def test_lease_expiry_redelivers_and_old_lease_is_stale(client: Client, names: Names) -> None:
    name = names()
    c = client
    c.create_queue(name, visibility_timeout=30)
    [r] = c.put(name, "work")
    [first] = c.take(name, visibility_timeout=0.5)
    assert (first.id, first.receive_count) == (r.id, 1)
    assert c.take(name) == []  # still leased
    [second] = c.take(name, wait=5)
    assert second.id == r.id
    assert second.receive_count == 2  # kept across the expiry
    assert second.lease != first.lease
    assert second.first_received_at == first.first_received_at
    # The expired lease stays stale, everywhere.
    assert [x.status for x in c.ack(name, first)] == ["stale_lease"]
    assert [x.status for x in c.release(name, first)] == ["stale_lease"]
    assert [x.status for x in c.touch(name, first)] == ["stale_lease"]
    with pytest.raises(StaleLease) as err:
        c.update_message(name, first, body="x")
    assert err.value.fields["status"] == 409
    with pytest.raises(StaleLease):
        c.delete_message(name, first)
    assert [x.status for x in c.ack(name, second)] == ["ok"]
    with pytest.raises(MessageNotFound):
        c.get_message(name, r.id)


def _dlq_pairs(names: Names) -> list[tuple[str, str]]:
    """(queue, dead-letter queue) pairs: two on the same shard, two across shards."""
    same, across = [], []
    while len(same) < 2 or len(across) < 2:
        src, dlq = names("src"), names("dlq")
        bucket = same if placement(src, SHARDS) == placement(dlq, SHARDS) else across
        if len(bucket) < 2:
            bucket.append((src, dlq))
    return same + across


def test_dead_letters_reach_their_queue_on_any_shard(client: Client, names: Names) -> None:
    c = client
    pairs = _dlq_pairs(names)
    assert {placement(s, SHARDS) != placement(d, SHARDS) for s, d in pairs} == {True, False}
    for i, (src, dlq) in enumerate(pairs):
        c.create_queue(dlq)
        c.create_queue(src, max_receives=2, dead_letter_queue=dlq, visibility_timeout=30)
        c.put(src, f"poison-{i}", attributes={"pair": str(i)})
        c.put(src, f"fine-{i}")
    for i, (src, _dlq) in enumerate(pairs):
        for attempt in (1, 2):
            taken = {m.body: m for m in c.take(src, 2)}
            poison = taken[f"poison-{i}".encode()]
            assert poison.receive_count == attempt
            if attempt == 1:
                c.release(src, *taken.values())  # both come back
            elif i % 2:
                c.release(src, poison)  # the last receive ends: dead
            else:
                [t] = c.touch(src, poison, visibility_timeout=0.2)  # or let it expire
                assert t.ok
            if attempt == 2:
                c.ack(src, taken[f"fine-{i}".encode()])
    for i, (src, dlq) in enumerate(pairs):
        [letter] = c.take(dlq, 5, wait=10)
        assert letter.body == f"poison-{i}".encode()
        assert letter.attributes == {
            "pair": str(i),
            "evq.source_queue": src,  # where the dead letter came from
            "evq.source_id": letter.id,  # it kept its id
            "evq.sent_at": letter.attributes["evq.sent_at"],  # when it was put into src
        }
        sent_at = letter.attributes["evq.sent_at"] / 1000
        assert letter.enqueued_at - 60 < sent_at < letter.enqueued_at
        assert letter.receive_count == 1  # a fresh start in the dead-letter queue

        def settled(src: str = src) -> bool:
            stats = c.get_queue(src).stats
            assert stats is not None
            return stats.dead_lettered == 1 and stats.total == 0

        eventually(settled, timeout=10, what=f"{src} dead-lettered")
        dstats = c.get_queue(dlq).stats
        assert dstats is not None
        assert (dstats.total, dstats.reserved) == (1, 1)


def test_fifo_groups_block_until_acked(client: Client, names: Names) -> None:
    c = client
    name = names(fifo=True)
    info = c.create_queue(name)
    assert info.settings.fifo is True
    with pytest.raises(BadRequest):
        c.put(name, "no group")
    c.put(name, ["a1", "a2", "a3"], group="a")
    c.put(name, ["b1", "b2"], group="b")
    first = c.take(name, 2)
    assert [m.body for m in first] == [b"a1", b"a2"]  # a run of one group, in order
    assert {m.group for m in first} == {"a"}
    [b1] = c.take(name, 1)
    assert b1.body == b"b1"
    assert c.take(name, 10) == []  # both groups blocked by what they have out
    a1, a2 = first
    c.ack(name, a2)
    assert c.take(name, 10) == []  # a1 is still out
    c.ack(name, a1)
    [a3] = c.take(name, 10)
    assert a3.body == b"a3"
    c.release(name, b1)  # b's head comes back, still first of its group
    b1, b2 = c.take(name, 10)
    assert (b1.body, b1.receive_count, b2.body) == (b"b1", 2, b"b2")


async def test_long_poll_take_wakes_on_put(server: Server, names: Names) -> None:
    name = names()
    async with (
        AsyncClient(server.url, retries=0, timeout=20) as consumer,
        AsyncClient(server.url, retries=0, timeout=20, binary=True) as producer,
    ):
        await producer.create_queue(name)
        loop = asyncio.get_running_loop()
        started = loop.time()
        empty = await consumer.take(name, wait=0.5)
        assert empty == []
        assert 0.4 <= loop.time() - started < 3

        waiting = asyncio.ensure_future(consumer.take(name, 5, wait=20))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        put_at = loop.time()
        [r] = await producer.put(name, b"wake up")
        [m] = await asyncio.wait_for(waiting, 10)
        assert (m.id, m.body) == (r.id, b"wake up")
        assert loop.time() - put_at < 1.5

        # Several waiters: each put wakes one of them, nobody gets a message twice.
        waiters = [asyncio.ensure_future(consumer.take(name, 1, wait=20)) for _ in range(3)]
        await asyncio.sleep(0.5)
        ids = [x.id for x in await producer.put(name, ["1", "2", "3"])]
        got = await asyncio.wait_for(asyncio.gather(*waiters), 10)
        assert sorted(m.id for batch in got for m in batch) == sorted(ids)


def test_retention_expires_old_messages(client: Client, names: Names) -> None:
    name = names()
    client.create_queue(name, retention=1)
    [old] = client.put(name, "old")
    [r] = client.take(name, visibility_timeout=30)  # a reserved message expires too
    assert r.id == old.id

    def expired() -> bool:
        stats = client.get_queue(name).stats
        return stats is not None and stats.expired == 1

    eventually(expired, timeout=5, interval=0.1, what="the old message expired")
    with pytest.raises(MessageNotFound):
        client.get_message(name, old.id)
    assert [x.status for x in client.ack(name, r)] == ["not_found"]
    stats = client.get_queue(name).stats
    assert stats is not None
    assert (stats.total, stats.reserved, stats.acked) == (0, 0, 0)


async def test_abandoned_long_poll_does_not_hide_a_later_message(
    server: Server, names: Names
) -> None:
    """A consumer that gave up on its long poll (closed the connection) must not receive
    the next message in its absence: that message would stay invisible, with a receive
    counted, for a whole visibility timeout."""
    name = names()
    async with AsyncClient(server.url, retries=0, timeout=20) as c:
        await c.create_queue(name, visibility_timeout=30)
        async with aiohttp.ClientSession() as session:
            with pytest.raises(TimeoutError):
                async with session.post(
                    f"{server.url}/v1/queues/{name}/take",
                    json={"max": 1, "wait": 20},
                    timeout=aiohttp.ClientTimeout(total=1),
                ):
                    pass
        await asyncio.sleep(0.5)  # the connection is closed; the server has noticed
        [put] = await c.put(name, "for a live consumer")
        taken = await c.take(name, wait=3)
        stats = (await c.get_queue(name)).stats
        assert [(m.id, m.receive_count) for m in taken] == [(put.id, 1)], (
            f"the message went to the abandoned long poll: {stats}"
        )
