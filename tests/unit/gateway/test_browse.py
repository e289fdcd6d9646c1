"""Browsing a queue through real HTTP: ``GET /v1/queues/{name}/messages?state=&limit=&after=``
on ``make_app`` over a ``LocalDirectory`` of two shards — each state in its order, pages and
their cursor while the queue changes, JSON and msgpack, errors, and the ``read`` rule."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from actors.errors import BadRequest, QueueNotFound
from evq.client import AsyncClient, Client, Message, MessagePage
from gateway.app import AppOptions
from gateway.auth import Token
from tests.unit.gateway.conftest import MSGPACK, Api, Reply, Serve

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
BINARY = b"\x00\xff\xfe binary \x80"


async def page(api: Api, queue: str, accept: str | None = None, **query: Any) -> Reply:
    """One page (the query as given); must answer 200."""
    params = {k: str(v) for k, v in query.items()}
    reply = await api.call("GET", f"/v1/queues/{queue}/messages", params=params, accept=accept)
    assert reply.status == 200, reply
    assert set(reply.doc) == {"messages", "next"}
    return reply


async def listing(api: Api, queue: str, state: str, limit: int) -> list[str]:
    """Every page from the start, following ``next`` (at most 100 pages)."""
    ids: list[str] = []
    after = None
    for _ in range(100):
        query = {"state": state, "limit": limit, **({"after": after} if after else {})}
        doc = (await page(api, queue, **query)).doc
        ids += [m["id"] for m in doc["messages"]]
        after = doc["next"]
        if after is None:
            return ids
    raise AssertionError("the cursor never reached the end")


async def test_each_state_is_listed_in_its_order_with_the_message_fields(api: Api) -> None:
    await api.create("q", visibility_timeout=60)
    a, b, c = await api.put("q", "a", "b", {"body": "c", "attributes": {"k": "v"}})
    [early] = await api.put("q", {"body": "early", "activate_at": 1_000_000})  # activated long ago
    late, soon = await api.put("q", {"body": "late", "delay": 600}, {"body": "soon", "delay": 60})
    [taken] = await api.take("q", 1)  # "early": first in take order
    short = (await api.take("q", 1, visibility_timeout=5))[0]  # "a", expiring first

    ready = (await page(api, "q", state="ready")).doc
    assert [m["id"] for m in ready["messages"]] == [b, c]
    assert ready["next"] is None
    assert all(set(m) == VIEW_FIELDS and m["state"] == "ready" for m in ready["messages"])
    assert ready["messages"][1]["attributes"] == {"k": "v"}
    assert ready["messages"][1]["body"] == "c"
    delayed = (await page(api, "q", state="delayed")).doc["messages"]
    assert [m["id"] for m in delayed] == [soon, late]
    reserved = (await page(api, "q", state="reserved")).doc["messages"]
    assert [m["id"] for m in reserved] == [a, early]
    assert [m["lease_expires_at"] for m in reserved] == [
        short["lease_expires_at"],
        taken["lease_expires_at"],
    ]
    assert all(m["receive_count"] == 1 and "lease" not in m for m in reserved)
    assert (await api.stats("q"))["reserved"] == 2  # browsing changed nothing


async def test_without_a_query_it_lists_ready_messages_100_to_a_page(api: Api) -> None:
    await api.create("q")
    ids = await api.put("q", *[str(i) for i in range(130)])
    first = (await page(api, "q")).doc
    assert [m["id"] for m in first["messages"]] == ids[:100]
    rest = (await page(api, "q", after=first["next"])).doc
    assert [m["id"] for m in rest["messages"]] == ids[100:]
    assert rest["next"] is None


async def test_pages_of_a_changing_queue_list_each_message_that_stayed_once(api: Api) -> None:
    await api.create("q")
    ids = await api.put("q", *"abcdefgh")
    first = (await page(api, "q", limit=3)).doc
    assert [m["id"] for m in first["messages"]] == ids[:3]
    taken = await api.take("q", 2)  # listed ones leave
    assert [m["id"] for m in taken] == ids[:2]
    await api.ack("q", *taken)
    [ahead] = await api.put("q", "i")
    await api.call("DELETE", f"/v1/queues/q/messages/{ids[4]}")
    after, seen = first["next"], []
    while after is not None:
        doc = (await page(api, "q", limit=2, after=after)).doc
        seen += [m["id"] for m in doc["messages"]]
        after = doc["next"]
    assert seen == [ids[3], *ids[5:], ahead]


@pytest.mark.parametrize("limit", [1, 3, 1000])
async def test_following_next_lists_the_whole_state_whatever_the_page_size(
    api: Api, limit: int
) -> None:
    await api.create("q")
    ids = await api.put("q", *[{"body": str(i), "delay": 100 + (i * 7) % 11} for i in range(12)])
    whole = (await page(api, "q", state="delayed", limit=1000)).doc["messages"]
    assert sorted(m["id"] for m in whole) == sorted(ids)
    assert await listing(api, "q", "delayed", limit) == [m["id"] for m in whole]


async def test_bodies_are_bytes_in_msgpack_and_body_b64_in_json(api: Api) -> None:
    await api.create("q")
    await api.call("POST", "/v1/queues/q/messages", {"messages": [{"body": BINARY}]}, fmt="msgpack")
    packed = await page(api, "q", accept=MSGPACK)
    assert packed.headers["Content-Type"].startswith(MSGPACK)
    assert packed.doc["messages"][0]["body"] == BINARY
    [doc] = (await page(api, "q")).doc["messages"]
    assert base64.b64decode(doc["body_b64"]) == BINARY
    assert "body" not in doc


@pytest.mark.parametrize(
    ("query", "status", "code"),
    [
        ({"state": "dead"}, 400, "BadRequest"),
        ({"state": ""}, 400, "BadRequest"),
        ({"limit": "0"}, 400, "BadRequest"),
        ({"limit": "1001"}, 400, "BadRequest"),
        ({"limit": "-1"}, 400, "BadRequest"),
        ({"limit": "ten"}, 400, "BadRequest"),
        ({"limit": "9" * 30}, 400, "BadRequest"),
        ({"after": "somewhere"}, 400, "BadRequest"),
        ({"after": ""}, 400, "BadRequest"),
        ({"after": "delayed.1700000000000.1"}, 400, "BadRequest"),  # a listing of another state
        ({"state": "reserved", "after": "ready.1.1"}, 400, "BadRequest"),
    ],
)
async def test_a_bad_state_limit_or_cursor_is_a_bad_request(
    api: Api, query: dict[str, str], status: int, code: str
) -> None:
    await api.create("q")
    await api.put("q", "a")
    reply = await api.call("GET", "/v1/queues/q/messages", params=query)
    assert (reply.status, reply.code) == (status, code), reply
    assert query_names_the_problem(query, reply.doc["error"]["message"])


def query_names_the_problem(query: dict[str, str], message: str) -> bool:
    """The error message names the parameter at fault."""
    name = "after" if "after" in query else next(iter(query))
    return name in message or (name == "after" and "cursor" in message)


async def test_an_unknown_queue_is_404_and_a_bad_name_400(api: Api) -> None:
    reply = await api.call("GET", "/v1/queues/nope/messages")
    assert (reply.status, reply.code) == (404, "QueueNotFound")
    reply = await api.call("GET", "/v1/queues/no%20pe/messages")
    assert (reply.status, reply.code) == (400, "BadRequest")


async def test_browsing_needs_read_on_the_queue(serve: Serve) -> None:
    admin = Token(name="admin", token="admin-token-0123456789", queues={"*": "admin"})
    reader = Token(name="reader", token="reader-token-0123456789", queues={"jobs*": "read"})
    api = await serve(AppOptions(tokens=[admin, reader]))
    for name in ("jobs", "billing"):
        assert await status(api, "PUT", f"/v1/queues/{name}", admin) == 201
    for method in ("GET", "HEAD"):  # aiohttp answers HEAD with the GET handler
        assert await status(api, method, "/v1/queues/jobs/messages", reader) == 200
        assert await status(api, method, "/v1/queues/billing/messages", reader) == 403
        assert await status(api, method, "/v1/queues/jobs/messages", None) == 401


async def status(api: Api, method: str, path: str, token: Token | None) -> int:
    headers = {"Authorization": f"Bearer {token.token}"} if token is not None else {}
    data = b"{}" if method == "PUT" else None
    async with api.client.request(method, path, headers=headers, data=data) as resp:
        await resp.read()
        return resp.status


# ---------------------------------------------------------------- the Python clients


def url_of(api: Api) -> str:
    server = api.client.server
    return f"http://{server.host}:{server.port}"


def sync_browse(url: str, binary: bool) -> tuple[MessagePage, MessagePage, list[Message]]:
    """What the blocking client sees: two pages, then everything."""
    with Client(url, binary=binary, retries=0) as c:
        first = c.browse("q", limit=2)
        second = c.browse("q", limit=2, after=first.next)
        return first, second, list(c.browse_all("q", limit=2))


async def async_browse(url: str, binary: bool) -> tuple[MessagePage, MessagePage, list[Message]]:
    """What the asyncio client sees: two pages, then everything."""
    async with AsyncClient(url, binary=binary, retries=0) as c:
        first = await c.browse("q", limit=2)
        second = await c.browse("q", limit=2, after=first.next)
        return first, second, [m async for m in c.browse_all("q", limit=2)]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_the_clients_browse_a_page_at_a_time_or_all_at_once(
    api: Api, kind: str, binary: bool
) -> None:
    await api.create("q")
    ids = await api.put("q", "a", {"body_b64": base64.b64encode(BINARY).decode()}, "c", "d", "e")
    url = url_of(api)
    if kind == "sync":
        first, second, whole = await asyncio.to_thread(sync_browse, url, binary)
    else:
        first, second, whole = await async_browse(url, binary)
    assert [m.id for m in first.messages] == ids[:2]
    assert first.messages[1].body == BINARY
    assert {(m.state, m.lease) for m in first.messages} == {("ready", None)}
    assert first.next is not None
    assert [m.id for m in second.messages] == ids[2:4]
    assert [m.id for m in whole] == ids
    assert [m.body for m in whole] == [b"a", BINARY, b"c", b"d", b"e"]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_the_clients_raise_the_servers_browse_errors(api: Api, kind: str) -> None:
    await api.create("q")

    async def attempt(queue: str, **options: Any) -> None:
        if kind == "sync":

            def run() -> None:
                with Client(url_of(api), retries=0) as c:
                    c.browse(queue, **options)

            await asyncio.to_thread(run)
        else:
            async with AsyncClient(url_of(api), retries=0) as c:
                await c.browse(queue, **options)

    with pytest.raises(BadRequest, match="state"):
        await attempt("q", state="dead")
    with pytest.raises(BadRequest, match="limit"):
        await attempt("q", limit=0)
    with pytest.raises(BadRequest, match="cursor"):
        await attempt("q", state="delayed", after="ready.1.1")
    with pytest.raises(QueueNotFound):
        await attempt("nope")
