"""The front door's fast path (gateway/fast.py) on a real server, byte for byte.

Every hot-command test elsewhere already runs through the fast path (the ``Api`` fixture sends
hot commands on raw keep-alive connections); this file tests the fast path's own mechanics
on bare sockets: pipelined requests answered in order, requests cut into any pieces, a
connection given back to aiohttp (as its first request or mid-connection, alone or
pipelined), ``Connection: close``, msgpack, errors equal to aiohttp's, auth, limits,
metrics, a client that hangs up during a long poll, and graceful shutdown.

Who answered shows in the reply: aiohttp adds a ``Server`` header, the fast path does not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, NamedTuple

import msgspec
import pytest

from actors.log.store import LocalDirStore
from gateway import fast as fast_module
from gateway import limits
from gateway.app import AppOptions
from gateway.auth import Token
from gateway.fast import FAST, PIPELINE_BUFFER, FastHttp
from gateway.hot import WAITING_TAKES
from gateway.limits import FAST_CONNECTIONS, IN_FLIGHT, PENALTIES
from tests.unit.gateway.conftest import JSON, MSGPACK, Api, GatedStore, Serve, until
from tests.unit.gateway.test_metrics import scrape

BINARY = b"\x00\xff binary \x80"


class Answer(NamedTuple):
    """One HTTP reply as it came off the wire (header names in lower case)."""

    version: str
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def doc(self) -> Any:
        kind = self.headers.get("content-type", "").split(";")[0]
        decode = msgspec.msgpack.decode if kind == MSGPACK else msgspec.json.decode
        return decode(self.body)

    @property
    def code(self) -> str:
        return self.doc["error"]["code"]  # type: ignore[no-any-return]

    @property
    def fast(self) -> bool:
        """Whether the fast path wrote this reply (aiohttp's carry a Server header)."""
        return "server" not in self.headers


def http(
    method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    """One HTTP/1.1 request; a header given as "" is left out."""
    given = {"Host": "127.0.0.1", "Content-Length": str(len(body)), **(headers or {})}
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in given.items() if v)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def post(target: str, doc: Any, *, msgpack: bool = False, **headers: str) -> bytes:
    """A POST of ``doc`` as JSON or msgpack; ``Content_Type=…`` style keywords add headers."""
    body = (msgspec.msgpack if msgpack else msgspec.json).encode(doc)
    named = {k.replace("_", "-"): v for k, v in headers.items()}
    return http("POST", target, body, {"Content-Type": MSGPACK if msgpack else JSON, **named})


def put(queue: str, *bodies: str, **headers: str) -> bytes:
    return post(
        f"/v1/queues/{queue}/messages", {"messages": [{"body": b} for b in bodies]}, **headers
    )


def take(queue: str, max: int = 1, wait: float = 0, **headers: str) -> bytes:
    return post(f"/v1/queues/{queue}/take", {"max": max, "wait": wait}, **headers)


class Conn:
    """A bare client connection: exact bytes out, whole replies in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def send(self, *requests: bytes) -> None:
        self.writer.write(b"".join(requests))

    async def send_in_pieces(self, data: bytes, size: int) -> None:
        for i in range(0, len(data), size):
            self.writer.write(data[i : i + size])
            await self.writer.drain()

    async def reply(self) -> Answer:
        """The next final reply (a ``100 Continue`` before it is skipped)."""
        while True:
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
            status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
            version, status, _ = status_line.split(" ", 2)
            if status != "100":
                break
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        size = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(self.reader.readexactly(size), 5)
        return Answer(version, int(status), headers, body)

    async def ask(self, *requests: bytes) -> list[Answer]:
        """Send ``requests`` in one write (pipelined); their replies, in order."""
        self.send(*requests)
        return [await self.reply() for _ in requests]

    async def closed(self) -> bool:
        """Whether the server ends the connection without writing anything more."""
        return await asyncio.wait_for(self.reader.read(), 5) == b""

    def close(self) -> None:
        self.writer.close()


Connect = Callable[[Api], Awaitable[Conn]]


@pytest.fixture
def connect() -> Iterator[Connect]:
    """``await connect(api)``: a new bare connection to ``api``'s server, closed at the end."""
    opened: list[Conn] = []

    async def open_(api: Api) -> Conn:
        server = api.client.server
        conn = Conn(*await asyncio.open_connection(server.host, server.port))
        opened.append(conn)
        return conn

    yield open_
    for conn in opened:
        conn.close()


def server_side(api: Api, conn: Conn) -> FastHttp | None:
    """The fast path's protocol serving ``conn``, if the fast path serves it."""
    me = conn.writer.get_extra_info("sockname")
    for fast in api.app[FAST_CONNECTIONS]:
        if fast.transport is not None and fast.transport.get_extra_info("peername") == me:
            return fast  # type: ignore[no-any-return]
    return None


def buffered(api: Api, conn: Conn) -> bytes | None:
    """What the fast path holds of ``conn``'s requests, not yet served."""
    fast = server_side(api, conn)
    return None if fast is None or fast.task is not None else bytes(fast.buf)


def waiting_takes(api: Api) -> int:
    return api.app[WAITING_TAKES][0]  # type: ignore[no-any-return]


def ok(answer: Answer, *, fast: bool = True) -> Any:
    """The document of a 200 reply from the fast path (or, ``fast=False``, aiohttp)."""
    assert (answer.status, answer.fast) == (200, fast), answer
    return answer.doc


# ------------------------------------------------------------------ pipelining and pieces


async def test_pipelined_requests_are_answered_in_order_until_connection_close(
    api: Api, connect: Connect
) -> None:
    await api.create("q")
    conn = await connect(api)
    one, two, missing, three, took = await conn.ask(
        put("q", "a"), put("q", "b", "c"), take("nope"), put("q", "d", "e", "f"), take("q", 10)
    )
    ids = [r["id"] for a in (one, two, three) for r in ok(a)["results"]]
    assert [len(ok(a)["results"]) for a in (one, two, three)] == [1, 2, 3]
    assert (missing.status, missing.code, missing.fast) == (404, "QueueNotFound", True)
    messages = ok(took)["messages"]
    assert sorted(m["body"] for m in messages) == list("abcdef")
    assert sorted(m["id"] for m in messages) == sorted(ids)
    for answer in (one, two, missing, three, took):
        assert answer.version == "HTTP/1.1"
        assert int(answer.headers["content-length"]) == len(answer.body)
        assert "connection" not in answer.headers  # HTTP/1.1: kept alive
        assert answer.headers["date"].endswith("GMT")
    leases = [{"id": m["id"], "lease": m["lease"]} for m in messages]
    [last] = await conn.ask(post("/v1/queues/q/ack", {"items": leases}, Connection="close"))
    assert [r["status"] for r in ok(last)["results"]] == ["ok"] * 6
    assert last.headers["connection"] == "close"
    assert await conn.closed()
    assert (await api.stats("q"))["total"] == 0


@pytest.mark.parametrize("piece", [1, 2, 7, 100])
async def test_requests_cut_into_any_pieces_are_served(
    api: Api, connect: Connect, piece: int
) -> None:
    await api.create("q")
    conn = await connect(api)
    await conn.send_in_pieces(put("q", "a") + put("q", "b", "c") + take("q", 3), piece)
    one, two, took = [await conn.reply() for _ in range(3)]
    assert [len(ok(a)["results"]) for a in (one, two)] == [1, 2]
    assert sorted(m["body"] for m in ok(took)["messages"]) == ["a", "b", "c"]


async def test_a_body_that_comes_after_its_head_is_waited_for(api: Api, connect: Connect) -> None:
    await api.create("q")
    request = put("q", "late")
    end = request.index(b"\r\n\r\n") + 4
    head, body = request[:end], request[end:]
    conn = await connect(api)
    await conn.send_in_pieces(head, 1)
    # The fast path holds the whole head and waits for the body: no request runs yet.
    await until(lambda: buffered(api, conn) == head)
    await conn.send_in_pieces(body[:5], 5)
    await until(lambda: buffered(api, conn) == head + body[:5])
    [answer] = await conn.ask(body[5:])
    assert len(ok(answer)["results"]) == 1
    assert [m["body"] for m in await api.take("q")] == ["late"]


# ------------------------------------------------------------------ given back to aiohttp


def chunked(*chunks: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (*chunks, b""))


CHUNKED = http(
    "POST",
    "/v1/queues/q/messages",
    chunked(b'{"mes', b'sages":[{"body":"x"}]}'),
    {"Content-Type": JSON, "Transfer-Encoding": "chunked", "Content-Length": ""},
)
PUT_X = put("q", "x")


@pytest.mark.parametrize(
    ("first", "kept"),
    [
        (CHUNKED, True),
        (put("q", "x", Expect="100-continue"), True),
        (PUT_X.replace(b"/messages ", b"/messages?via=aiohttp "), True),
        (PUT_X.replace(b"/q/", b"/%71/"), True),  # percent-encoded "q"
        (PUT_X.replace(b"HTTP/1.1", b"HTTP/1.0"), False),
    ],
    ids=["chunked", "expect", "query-string", "percent-encoded", "http-1.0"],
)
async def test_a_first_request_the_fast_path_declines_is_aiohttps(
    api: Api, connect: Connect, first: bytes, kept: bool
) -> None:
    await api.create("q")
    conn = await connect(api)
    [answer] = await conn.ask(first)
    assert len(ok(answer, fast=False)["results"]) == 1
    if kept:
        [took] = await conn.ask(take("q"))  # the same connection goes on (with aiohttp)
        assert [m["body"] for m in ok(took, fast=False)["messages"]] == ["x"]
    else:
        assert await conn.closed()
        assert [m["body"] for m in await api.take("q")] == ["x"]
    assert server_side(api, conn) is None


TAKE_A = take("q")


@pytest.mark.parametrize(
    ("other", "check", "left"),
    [
        (http("GET", "/v1/queues/q"), lambda doc: doc["stats"]["total"] == 1, ["a", "b"]),
        (http("GET", "/healthz"), lambda doc: doc["status"] == "ok", ["a", "b"]),
        (TAKE_A.replace(b"/take ", b"/take?x=1 "), lambda doc: doc["messages"], ["b"]),
        (TAKE_A.replace(b"/q/", b"/%71/"), lambda doc: doc["messages"], ["b"]),
    ],
    ids=["get-queue", "healthz", "query-string", "percent-encoded"],
)
@pytest.mark.parametrize("pipelined", [False, True])
async def test_a_request_after_hot_ones_that_the_fast_path_does_not_serve_goes_to_aiohttp(
    api: Api,
    connect: Connect,
    other: bytes,
    check: Callable[[Any], bool],
    left: list[str],
    pipelined: bool,
) -> None:
    await api.create("q")
    conn = await connect(api)
    sequence = [put("q", "a"), other, put("q", "b"), take("q", 10)]
    if pipelined:
        answers = await conn.ask(*sequence)
    else:
        answers = [(await conn.ask(request))[0] for request in sequence]
    first, given_back, then, took = answers
    assert len(ok(first)["results"]) == 1
    assert check(ok(given_back, fast=False)), given_back
    # whoever serves the hot requests after it, they are answered right
    assert (then.status, took.status) == (200, 200)
    assert len(then.doc["results"]) == 1
    assert sorted(m["body"] for m in took.doc["messages"]) == left


async def test_nothing_pipelined_after_connection_close_is_served(
    api: Api, connect: Connect
) -> None:
    # A reply too big for the socket buffers, which the client does not read yet, keeps
    # the closing connection open: the request pipelined after it must still not run
    # (RFC 9112, 9.6). The client would see no answer, retry, and put a duplicate.
    await api.create("q")
    for _ in range(4):
        await api.put("q", "x" * (3 * 1024 * 1024))
    conn = await connect(api)
    conn.send(take("q", 4, Connection="close"), put("q", "ghost"))
    await until(lambda: server_side(api, conn) is not None)
    fast = server_side(api, conn)
    assert fast is not None
    await until(lambda: fast.transport is None or fast.transport.is_closing())
    assert fast.task is None  # it answered the take and started nothing after it
    last = await conn.reply()
    assert (last.status, last.headers["connection"]) == (200, "close")
    assert len(last.doc["messages"]) == 4
    assert await conn.closed()
    assert (await api.stats("q"))["enqueued"] == 4


async def test_a_client_pipelining_without_reading_cannot_fill_the_gateways_memory(
    api: Api, connect: Connect
) -> None:
    # While a take waits, the client pipelines 16 MiB of puts and reads nothing: the gateway
    # stops reading at PIPELINE_BUFFER (TCP holds the rest back), then serves every put, in
    # order, once the take is answered.
    await api.create("q")
    conn = await connect(api)
    body = "x" * (64 * 1024)
    puts = [put("q", body) for _ in range(256)]
    conn.send(take("q", 1, wait=1.0), *puts)
    await until(lambda: server_side(api, conn) is not None)
    fast = server_side(api, conn)
    assert fast is not None
    await until(lambda: fast.paused)
    await asyncio.sleep(0.2)  # what the kernel still had for it has arrived by now
    assert fast.task is not None  # still the take
    assert len(fast.buf) < PIPELINE_BUFFER + 256 * 1024  # + one read of the transport
    took = await conn.reply()
    assert ok(took)["messages"] == []
    answers = [await conn.reply() for _ in puts]
    assert all(len(ok(a)["results"]) == 1 for a in answers)
    assert not fast.paused
    assert (await api.stats("q"))["enqueued"] == len(puts)
    conn.close()


async def test_a_request_that_fails_unexpectedly_is_answered_and_the_connection_goes_on(
    api: Api, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failure outside the verbs' own error handling (here: encoding a take's answer)
    # used to leave the request unanswered and the connection busy for good; with reading
    # paused behind it, not even a hang-up would be noticed (found in review).
    from gateway import fast as fast_module

    await api.create("q")
    real_encode, failures = fast_module._encode, [1]

    def encode(doc: Any, binary: bool) -> bytes:
        if failures and "messages" in doc:
            failures.pop()
            raise RuntimeError("boom")
        return real_encode(doc, binary)

    monkeypatch.setattr(fast_module, "_encode", encode)
    conn = await connect(api)
    puts = [put("q", "x" * (64 * 1024)) for _ in range(8)]
    conn.send(take("q", 1, wait=0.5), *puts)
    await until(lambda: server_side(api, conn) is not None)
    fast = server_side(api, conn)
    assert fast is not None
    await until(lambda: fast.paused)  # 512 KiB behind the waiting take
    failed = await conn.reply()
    assert (failed.status, failed.code) == (500, "InternalError")
    answers = [await conn.reply() for _ in puts]
    assert all(len(ok(a)["results"]) == 1 for a in answers)
    assert not fast.paused
    assert (await api.stats("q"))["enqueued"] == len(puts)
    conn.close()


# ------------------------------------------------------------------ formats, errors


async def test_msgpack_in_msgpack_out_and_json_otherwise(api: Api, connect: Connect) -> None:
    await api.create("q")
    conn = await connect(api)
    answers = await conn.ask(
        post("/v1/queues/q/messages", {"messages": [{"body": BINARY}]}, msgpack=True),
        take("q", Accept=MSGPACK),  # a JSON request that asks for msgpack
        put("q", "j"),
        post("/v1/queues/q/take", {"max": 1}, msgpack=True, Accept=JSON),
        take("nope", Accept=MSGPACK),
        http("POST", "/v1/queues/q/take", b"\xc1", {"Content-Type": "application/x-msgpack"}),
    )
    kinds = [a.headers["content-type"] for a in answers]
    assert kinds == [MSGPACK, MSGPACK, JSON, JSON, MSGPACK, MSGPACK]
    [result] = ok(answers[0])["results"]  # Answer.doc: msgspec.msgpack.decode
    [message] = ok(answers[1])["messages"]
    assert (message["id"], message["body"]) == (result["id"], BINARY)  # msgpack bin: bytes
    assert [m["body"] for m in ok(answers[3])["messages"]] == ["j"]
    missing, bad = answers[4:]
    assert (missing.status, missing.code, missing.fast) == (404, "QueueNotFound", True)
    assert (bad.status, bad.code, bad.fast) == (400, "BadRequest", True)


ERRORS = [
    ("/v1/queues/q/messages", b"{not json", JSON, 400, "BadRequest"),
    ("/v1/queues/q/messages", b'{"messages": [{"colour": 1}]}', JSON, 400, "BadRequest"),
    ("/v1/queues/q/take", b'{"max": 1, "wait": 301}', JSON, 400, "BadRequest"),
    ("/v1/queues/q/ack", b"\x81\xa5items\x01", MSGPACK, 400, "BadRequest"),
    ("/v1/queues/" + "a" * 81 + "/take", b"{}", JSON, 400, "BadRequest"),
    ("/v1/queues/nope/take", b'{"max": 1}', JSON, 404, "QueueNotFound"),
    ("/v1/queues/nope/messages", b'{"messages": []}', MSGPACK, 404, "QueueNotFound"),
]


@pytest.mark.parametrize(
    ("path", "body", "kind", "status", "code"),
    ERRORS,
    ids=["malformed", "unknown-field", "wait-301", "msgpack-type", "long-name", "404", "404-mp"],
)
async def test_errors_through_the_fast_path_are_aiohttps_and_the_connection_stays(
    api: Api, connect: Connect, path: str, body: bytes, kind: str, status: int, code: str
) -> None:
    await api.create("q")
    if kind == MSGPACK and body.startswith(b"{"):
        body = msgspec.msgpack.encode(msgspec.json.decode(body))
    fast, slow = await connect(api), await connect(api)
    [mine] = await fast.ask(http("POST", path, body, {"Content-Type": kind}))
    [theirs] = await slow.ask(http("POST", path + "?via=aiohttp", body, {"Content-Type": kind}))
    assert (mine.fast, theirs.fast) == (True, False)
    assert (mine.status, mine.code) == (status, code), mine
    assert mine.status == theirs.status
    assert mine.headers["content-type"] == theirs.headers["content-type"].split(";")[0] == kind
    assert mine.doc == theirs.doc
    [after] = await fast.ask(put("q", "after"))
    assert len(ok(after)["results"]) == 1  # kept alive after an error


async def test_a_body_over_the_limit_is_aiohttps_413_and_the_connection_goes_on(
    serve: Serve, connect: Connect
) -> None:
    api = await serve(AppOptions(max_body_bytes=1024))
    await api.create("q")
    conn = await connect(api)
    big, small = await conn.ask(put("q", "x" * 2000), put("q", "small"))
    # The fast path gives an oversized request back; aiohttp reads its body and answers.
    assert (big.status, big.code, big.fast) == (413, "TooLarge", False)
    assert "1024" in big.doc["error"]["message"]
    assert "connection" not in big.headers
    assert len(ok(small, fast=False)["results"]) == 1
    assert (await api.stats("q"))["enqueued"] == 1


# ------------------------------------------------------------------ auth


WRITER = Token(name="writer", token="writer-token-0123456789", queues={"orders*": "write"})
READER = Token(name="reader", token="reader-token-0123456789", queues={"*": "read"})
SLOW = Token(name="slow", token="slow-token-0123456789", queues={"*": "write"}, rate=0.01, burst=2)


def bearer(token: Token | str) -> str:
    return f"Bearer {token.token if isinstance(token, Token) else token}"


async def test_tokens_on_the_fast_path(serve: Serve, connect: Connect) -> None:
    api = await serve(AppOptions(tokens=[WRITER, READER, SLOW], auto_create=True))
    conn = await connect(api)  # every answer on this one keep-alive connection
    *denied, passed = await conn.ask(
        put("orders", "a"),
        put("orders", "a", Authorization=bearer("not-a-token-at-all-000")),
        put("orders", "a", Authorization="Basic eDp5"),
        put("orders", "a", Authorization=bearer(READER)),
        put("billing", "a", Authorization=bearer(WRITER)),
        put("orders", "a", Authorization=bearer(READER), Accept=MSGPACK),
        put("orders", "a", Authorization=bearer(WRITER)),
    )
    assert [(a.status, a.code) for a in denied] == [(401, "Unauthorized")] * 3 + [
        (403, "Forbidden")
    ] * 3
    assert all(a.fast for a in denied)
    assert all(a.headers["www-authenticate"] == 'Bearer realm="evq"' for a in denied[:3])
    assert "www-authenticate" not in denied[3].headers
    assert denied[5].headers["content-type"] == MSGPACK
    assert len(ok(passed)["results"]) == 1
    # a token over its rate: 429 with the wait in Retry-After
    *passed_twice, limited = await conn.ask(*[put("any", "s", Authorization=bearer(SLOW))] * 3)
    assert [(a.status, a.fast) for a in passed_twice] == [(200, True), (200, True)]
    assert (limited.status, limited.code, limited.fast) == (429, "Overloaded", True)
    assert int(limited.headers["retry-after"]) >= 50
    assert "connection" not in limited.headers
    [took] = await conn.ask(take("orders", Authorization=bearer(WRITER)))
    assert [m["body"] for m in ok(took)["messages"]] == ["a"]


# ------------------------------------------------------------------ limits


async def test_past_max_requests_the_fast_path_answers_429_and_keeps_the_connection(
    serve: Serve, connect: Connect, data_dir: Any
) -> None:
    store = GatedStore(LocalDirStore(data_dir))
    api = await serve(AppOptions(max_requests=1), store=store)
    await api.create("q")
    store.hold("put_if_absent", 1)
    holder, other = await connect(api), await connect(api)
    holder.send(put("q", "held"))
    await until(lambda: store.waiting["put_if_absent"] == 1 and api.app[IN_FLIGHT][0] == 1)
    refused = await other.ask(take("q"), take("q", Accept=MSGPACK))
    for answer in refused:
        assert (answer.status, answer.code, answer.fast) == (429, "Overloaded", True)
        assert answer.headers["retry-after"] == "1"
        assert "connection" not in answer.headers
    assert refused[1].headers["content-type"] == MSGPACK
    store.release("put_if_absent")
    assert len(ok(await holder.reply())["results"]) == 1
    [took] = await other.ask(take("q"))
    assert [m["body"] for m in ok(took)["messages"]] == ["held"]


async def test_past_max_connections_the_fast_path_answers_429_and_closes(
    serve: Serve, connect: Connect
) -> None:
    api = await serve(AppOptions(max_connections=4))
    await api.create("q")
    runner = api.client.server.runner
    assert runner is not None
    doorway: Any = runner.server  # gateway.door.Doorway; its .server is aiohttp's
    room = 4 - limits.connections(api.app, doorway.server)  # the Api's own connections
    assert room >= 1
    admitted = []
    for _ in range(room):
        admitted.append(await connect(api))
        assert len(ok((await admitted[-1].ask(put("q", "in")))[0])["results"]) == 1
    extra = await connect(api)
    extra.send(put("q", "out"), put("q", "out"))
    refused = await extra.reply()
    assert (refused.status, refused.code, refused.fast) == (429, "Overloaded", True)
    assert (refused.headers["connection"], refused.headers["retry-after"]) == ("close", "1")
    assert await extra.closed()
    gone = server_side(api, admitted[0])
    assert gone is not None
    admitted[0].close()
    await until(lambda: gone not in api.app[FAST_CONNECTIONS])
    [again] = await (await connect(api)).ask(put("q", "again"))
    assert len(ok(again)["results"]) == 1
    assert (await api.stats("q"))["enqueued"] == room + 1


# ------------------------------------------------------------------ metrics


async def test_requests_the_fast_path_serves_are_counted_once(api: Api, connect: Connect) -> None:
    await api.create("q")
    put_route, take_route = "/v1/queues/{name}/messages", "/v1/queues/{name}/take"

    async def counts() -> dict[tuple[str, str], float]:
        """(route, status) -> POST requests answered; (route, "timed") -> of them timed."""
        found = {}
        for samples in (await scrape(api)).values():
            for s in samples:
                if s.name == "evq_http_requests_total" and s.labels["method"] == "POST":
                    found[(s.labels["route"], s.labels["status"])] = s.value
                elif s.name == "evq_http_request_duration_seconds_count":
                    found[(s.labels["route"], "timed")] = s.value
        return found

    before = await counts()
    conn = await connect(api)
    answers = await conn.ask(put("q", "a"), put("q", "b"), put("q", "c"), take("q", 2), take("x"))
    assert [(a.status, a.fast) for a in answers] == [(200, True)] * 4 + [(404, True)]
    [given_back] = await conn.ask(put("q", "d").replace(b"/messages ", b"/messages?x=1 "))
    assert ok(given_back, fast=False)  # aiohttp counts it, the fast path does not too
    after = await counts()

    def delta(route: str, status: str) -> float:
        return after.get((route, status), 0) - before.get((route, status), 0)

    assert delta(put_route, "200") == 4
    assert delta(take_route, "200") == 1
    assert delta(take_route, "404") == 1
    assert delta(put_route, "timed") == 4
    assert delta(take_route, "timed") == 2


# ------------------------------------------------------------------ hanging up, shutdown


@pytest.mark.parametrize("how", ["close", "half-close"])
async def test_a_client_that_hangs_up_during_a_long_poll_leaves_nothing_behind(
    api: Api, connect: Connect, how: str
) -> None:
    await api.create("q")
    conn = await connect(api)
    conn.send(take("q", wait=30), put("q", "never"))  # the put waits behind the take
    await until(lambda: waiting_takes(api) == 1)
    fast = server_side(api, conn)
    assert fast is not None
    if how == "close":
        conn.close()
    else:
        conn.writer.write_eof()  # a client that stops sending: the server hangs up too
        assert await conn.closed()
    await until(lambda: waiting_takes(api) == 0 and fast not in api.app[FAST_CONNECTIONS])
    _, took = await (await connect(api)).ask(put("q", "for a live client"), take("q"))
    [message] = ok(took)["messages"]
    assert (message["body"], message["receive_count"]) == ("for a live client", 1)
    assert (await api.stats("q"))["enqueued"] == 1  # the pipelined put never ran


async def test_on_shutdown_idle_fast_connections_close_and_a_waiting_take_answers(
    api: Api, connect: Connect, serve: Serve
) -> None:
    await api.create("q")
    await api.create("empty")
    idle, busy = await connect(api), await connect(api)
    [answer] = await idle.ask(put("q", "kept"))
    assert len(ok(answer)["results"]) == 1
    busy.send(take("empty", wait=30), put("q", "never"))
    await until(lambda: waiting_takes(api) == 1)
    await asyncio.wait_for(api.client.server.close(), 10)
    assert await idle.closed()
    last = await busy.reply()
    assert (last.status, last.doc, last.headers["connection"]) == (200, {"messages": []}, "close")
    assert await busy.closed()
    again = await serve()  # the same data: nothing after the take ran
    assert (await again.stats("q"))["total"] == 1


# ------------------------------------------------------------------ found by fuzzing


async def test_a_hot_request_asking_for_an_upgrade_is_answered_not_dropped(
    api: Api, connect: Connect
) -> None:
    """httptools raises its upgrade signal outside HttpParserError: the fast path used to let
    it escape and drop the connection unanswered (tests/data/fuzz/http_head/)."""
    conn = await connect(api)
    request = put("q", "x", Connection="Upgrade", Upgrade="websocket")
    [answer] = await conn.ask(request)
    assert not answer.fast  # given back to aiohttp, which answers it
    assert answer.status in (200, 400, 404)


@pytest.mark.parametrize("msgpack", [False, True], ids=["json", "msgpack"])
async def test_a_body_whose_strings_are_not_utf8_is_a_400(
    api: Api, connect: Connect, msgpack: bool
) -> None:
    """msgspec raises UnicodeDecodeError, not DecodeError, for such a string: it was a 500
    (tests/data/fuzz/native_*/)."""
    conn = await connect(api)
    body = (
        b"\x81\xa8messages\x91\x81\xa4bo\xffy\xa1x"
        if msgpack
        else (b'{"messages": [{"body": "\xff\xfe"}]}')
    )
    kind = MSGPACK if msgpack else JSON
    [answer] = await conn.ask(http("POST", "/v1/queues/q/messages", body, {"Content-Type": kind}))
    assert answer.status == 400
    assert answer.code == "BadRequest"


# ------------------------------------------------------------------ slow requests


@pytest.fixture
def quick_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast_module, "REQUEST_S", 0.3)


@pytest.mark.parametrize("cut", ["head", "body"])
async def test_a_request_that_stops_coming_is_answered_408_and_closed(
    api: Api, connect: Connect, quick_deadline: None, cut: str
) -> None:
    """A slowloris (a head or a body trickled, or stopped) holds a connection for
    REQUEST_S, not for ever."""
    await api.create("q")
    conn = await connect(api)
    request = put("q", "x" * 100)
    head_end = request.index(b"\r\n\r\n") + 4
    conn.send(request[: head_end - 10] if cut == "head" else request[: head_end + 20])
    answer = await conn.reply()
    assert answer.status == 408
    assert answer.code == "RequestTimeout"
    assert await conn.closed()


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "aiohttp"])
async def test_a_slow_request_that_keeps_coming_is_served(
    api: Api, connect: Connect, monkeypatch: pytest.MonkeyPatch, fast: bool
) -> None:
    """~1.1 KiB every 0.5 s: 3 s in all, twice the deadline, but progress within each. A
    put with a query string is aiohttp's, whose body the middleware reads."""
    monkeypatch.setattr(fast_module, "REQUEST_S", 1.5)
    await api.create("q")
    conn = await connect(api)
    body = msgspec.json.encode({"messages": [{"body": "y" * 6000}]})
    target = "/v1/queues/q/messages" + ("" if fast else "?wait=0")
    request = http("POST", target, body, {"Content-Type": JSON})
    for i in range(0, len(request), 1100):
        conn.send(request[i : i + 1100])
        await asyncio.sleep(0.5)
    answer = await conn.reply()
    assert answer.status == 200
    assert answer.fast is fast


@pytest.mark.parametrize("route", ["native", "sqs"])
async def test_a_body_that_stops_coming_on_aiohttp_routes_is_answered_408_and_closed(
    api: Api, connect: Connect, quick_deadline: None, route: str
) -> None:
    """The same deadline for the bodies aiohttp's routes read (here a put with a query
    string, which is not the fast path's, and an SQS request): a trickled body holds its
    connection for REQUEST_S, not for ever."""
    await api.create("q")
    conn = await connect(api)
    if route == "native":
        request = http(
            "POST",
            "/v1/queues/q/messages?wait=0",
            b'{"messages": [{"body": "x"}]}',
            {"Content-Type": JSON},
        )
    else:
        request = http(
            "POST",
            "/",
            b"Action=ListQueues&Version=2012-11-05",
            {"Content-Type": "application/x-www-form-urlencoded"},
        )
    conn.send(request[:-5])
    answer = await conn.reply()
    assert not answer.fast
    assert answer.status == 408
    assert answer.code == "RequestTimeout"
    assert await conn.closed()


# ------------------------------------------------------------------ hostile requests


def offences(api: Api) -> dict[str, int]:
    """The requests that failed as HTTP, by reason, counted against their senders."""
    return dict(api.app[PENALTIES].penalties.offences)


SMUGGLED = {
    "cl-te": b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
    "te-cl": b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
    "two-cl": b"Content-Length: 29\r\nContent-Length: 4\r\n",
    "plus-cl": b"Content-Length: +29\r\n",
    "te-list": b"Transfer-Encoding: chunked, identity\r\n",
}


@pytest.mark.parametrize("lengths", list(SMUGGLED.values()), ids=list(SMUGGLED))
async def test_a_smuggling_head_is_answered_400_and_closed_and_nothing_in_it_runs(
    api: Api, connect: Connect, lengths: bytes
) -> None:
    """Two ways to tell where a body ends: the fast path answers 400 itself (aiohttp did,
    at three times the cost and a traceback in the log each) and closes, so neither the body
    nor the put hidden in it is ever read as a request; the sender has one offence."""
    await api.create("q")
    conn = await connect(api)
    body = b'{"messages": [{"body": "x"}]}'
    hidden = http("POST", "/v1/queues/q/messages", body, {"Content-Type": JSON})
    head = b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    conn.send(head + lengths + b"\r\n" + body + hidden)
    answer = await conn.reply()
    assert (answer.status, answer.code, answer.fast) == (400, "BadRequest", True)
    assert answer.doc["error"]["message"].startswith("malformed HTTP request: ")
    assert answer.headers["connection"] == "close"
    assert await conn.closed()
    assert (await api.stats("q"))["total"] == 0
    assert offences(api) == {"malformed": 1}
    assert api.app[PENALTIES].penalties.peers["127.0.0.1"].offences == 1  # its sender's


async def test_a_head_past_the_fast_paths_limit_is_aiohttps_to_refuse_not_served(
    api: Api, connect: Connect
) -> None:
    """A 64 KiB header that came in one read was parsed by the fast path and the put served
    (the attacks' run found it); aiohttp's limits decide now: 400, counted, nothing put."""
    await api.create("q")
    conn = await connect(api)
    conn.send(put("q", "x", X_Big="a" * 65536))
    answer = await conn.reply()
    assert (answer.status, answer.fast) == (400, False)
    assert (await api.stats("q"))["total"] == 0
    assert offences(api) == {"malformed": 1}


async def test_aiohttps_parse_errors_are_counted_and_not_logged_as_errors(
    api: Api, connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp logs each request that does not parse with its traceback at ERROR: a flood
    of them was a flood of the log too. Counted against the sender instead."""
    conn = await connect(api)
    conn.send(http("GET", "/v1/queues", b"", {f"X-{i}": "v" for i in range(200)}))
    answer = await conn.reply()
    assert (answer.status, answer.fast) == (400, False)
    assert b"Too many headers" in answer.body
    assert offences(api) == {"malformed": 1}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    families = await scrape(api)
    samples = {(x.name, x.labels.get("reason")): x.value for x in families["evq_http_offences"]}
    assert samples == {("evq_http_offences_total", "malformed"): 1}
    refused = families["evq_refused_connections"]
    assert [x.value for x in refused] == [0]


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "aiohttp"])
async def test_a_request_answered_408_is_an_offence_of_its_sender(
    api: Api, connect: Connect, quick_deadline: None, fast: bool
) -> None:
    await api.create("q")
    conn = await connect(api)
    target = "/v1/queues/q/messages" + ("" if fast else "?wait=0")
    request = http("POST", target, b'{"messages": [{"body": "x"}]}', {"Content-Type": JSON})
    conn.send(request[:-5])
    assert (await conn.reply()).status == 408
    assert offences(api) == {"too_slow": 1}


# ------------------------------------------------------------------ pipelining's turns


async def test_pipelined_requests_wait_for_a_turn_and_other_clients_do_not(
    api: Api, connect: Connect
) -> None:
    """Every turn taken: a pipelining connection's first request is served (it is not
    pipelined), the next ones wait; another client's request is served meanwhile; a turn
    freed, the waiting ones are served in order."""
    await api.create("q")
    turns = api.app[FAST].turns
    turns.free = 0  # every turn taken
    pipeliner = await connect(api)
    pipeliner.send(put("q", "a"), put("q", "b"), put("q", "c"))
    ok(await pipeliner.reply())
    side = server_side(api, pipeliner)
    assert side is not None
    await until(lambda: side.queued)
    other = await connect(api)
    ok((await other.ask(put("q", "other")))[0])  # one request at a time: never waits
    ok((await other.ask(put("q", "other")))[0])
    assert side.queued
    assert (await api.stats("q"))["total"] == 3
    turns.done()  # a turn ends: the pipeliner's two wait no more
    answers = [await pipeliner.reply() for _ in range(2)]
    assert all(len(ok(a)["results"]) == 1 for a in answers)
    taken = await api.take("q", 10)
    assert [m["body"] for m in taken] == ["a", "other", "other", "b", "c"]
    assert (turns.free, list(turns.waiting)) == (1, [])


async def test_many_pipelining_connections_are_all_served_in_order(
    api: Api, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api.app[FAST].turns, "free", 1)
    await api.create("q")
    conns = [await connect(api) for _ in range(6)]
    for i, conn in enumerate(conns):
        conn.send(*(put("q", f"{i}-{j}") for j in range(8)))
    for i, conn in enumerate(conns):
        answers = [await conn.reply() for _ in range(8)]
        assert all(len(ok(a)["results"]) == 1 for a in answers), i
    bodies = [m["body"] for m in await api.take("q", 100)]
    for i in range(6):  # each connection's in the order it sent them
        assert [b for b in bodies if b.startswith(f"{i}-")] == [f"{i}-{j}" for j in range(8)]
    assert api.app[FAST].turns.free == 1


async def test_a_client_that_reads_no_replies_is_served_only_what_the_buffers_hold(
    api: Api, connect: Connect
) -> None:
    """Takes of 256 KiB messages pipelined, the replies never read: once the socket's
    buffers and the transport's are full, nothing more is served (no message more is
    taken); once the client reads, the rest are."""
    await api.create("q")
    count = 60
    for _ in range(count // 10):
        await api.put("q", *["m" * (256 * 1024)] * 10)
    conn = await connect(api)
    conn.send(*(take("q", 1) for _ in range(count)))  # the client reads nothing yet
    await until(lambda: server_side(api, conn) is not None)
    side = server_side(api, conn)
    assert side is not None
    await until(lambda: side.blocked, within=10)
    await asyncio.sleep(0.5)
    taken = (await api.stats("q"))["reserved"]
    assert taken < count // 2, taken  # ~4 MiB in the kernel's buffers: ~16 replies
    assert side.blocked
    answers = [await conn.reply() for _ in range(count)]
    assert all(len(ok(a)["messages"]) == 1 for a in answers)
    assert (await api.stats("q"))["reserved"] == count
