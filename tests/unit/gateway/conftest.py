"""Fixtures for the gateway's HTTP tests: the real app over an in-process directory.

``serve(...)`` starts ``make_app(LocalDirectory(store, count=2), options)`` behind
pytest-aiohttp's test server (real HTTP on 127.0.0.1, no Ray) and returns an :class:`Api`,
a thin caller that encodes requests as JSON or msgpack and decodes the replies by their
Content-Type. :class:`GatedStore` holds chosen store calls until the test lets them go, so
"a write is in flight" or "recovery has not finished" are states a test sets up, not races.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.parse
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict, CIMultiDictProxy

from actors.directory import LocalDirectory
from actors.log.store import LocalDirStore, ObjectStore
from gateway.app import AppOptions, make_app
from gateway.door import DoorRunner
from tests.unit.gateway.sqs_support import SqsServer, client_of, running

T = TypeVar("T")

JSON = "application/json"
MSGPACK = "application/msgpack"
_NOTHING: Any = object()


class Reply(NamedTuple):
    """One HTTP answer: status, decoded document (None when empty), headers."""

    status: int
    doc: Any
    headers: CIMultiDictProxy[str]

    @property
    def code(self) -> str | None:
        """The error code of an error reply."""
        if isinstance(self.doc, dict) and isinstance(self.doc.get("error"), dict):
            return self.doc["error"].get("code")  # type: ignore[no-any-return]
        return None


HOT = re.compile(r"/v1/queues/[^/?]+/(messages|take|ack|release|touch)")


class RawHttp:
    """Minimal HTTP/1.1 keep-alive connections (as the shared load generator's), one request
    in flight on each: every connection's first request is a hot command, so the front
    door's fast path serves it and the hot commands after it (gateway/fast.py)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened: list[asyncio.StreamWriter] = []

    async def request(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Any:
        while self.idle:
            reader, writer = self.idle.pop()
            if not writer.is_closing():
                break
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            self.opened.append(writer)
        target = urllib.parse.quote(path, safe="/:?=&%")  # as aiohttp's client sends it
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in {**headers, "Content-Length": len(body)}.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = head.decode("latin-1").split("\r\n")[:-2]
            found: CIMultiDict[str] = CIMultiDict()
            for line in header_lines:
                name, _, value = line.partition(":")
                found.add(name.strip(), value.strip())
            content = await reader.readexactly(int(found.get("Content-Length", "0")))
        except BaseException:
            writer.close()  # a caller that gives up hangs up, as aiohttp's client does
            raise
        if found.get("Connection", "").lower() == "close":
            writer.close()
        else:
            self.idle.append((reader, writer))
        return int(status_line.split(" ")[1]), found, content

    def close(self) -> None:
        for writer in self.opened:
            writer.close()


class Api:
    """Calls the native API of one test server: the hot commands on a connection of their
    own that the fast path serves, everything else through aiohttp's client."""

    def __init__(self, client: TestClient[web.Request, web.Application]) -> None:
        self.client = client
        server = client.server
        self.raw = RawHttp(str(server.host), int(server.port or 0))

    @property
    def app(self) -> web.Application:
        """The application under test (its AppKeys hold the gateway's counters)."""
        app = self.client.server.app
        assert app is not None
        return app

    async def call(
        self,
        method: str,
        path: str,
        doc: Any = _NOTHING,
        *,
        raw: bytes | None = None,
        fmt: str = "json",
        accept: str | None = None,
        params: dict[str, str] | None = None,
    ) -> Reply:
        """Send ``doc`` (encoded as ``fmt``) or ``raw`` bytes; decode the answer."""
        headers = {}
        data = raw
        if doc is not _NOTHING:
            data = (msgspec.msgpack if fmt == "msgpack" else msgspec.json).encode(doc)
        if data is not None:
            headers["Content-Type"] = MSGPACK if fmt == "msgpack" else JSON
        if accept is not None:
            headers["Accept"] = accept
        if method == "POST" and params is None and HOT.fullmatch(path):
            status, found, content = await self.raw.request(method, path, data or b"", headers)
            return Reply(status, _decoded(content, found.get("Content-Type", "")), found)  # type: ignore[arg-type]
        async with self.client.request(
            method, path, data=data, headers=headers, params=params
        ) as resp:
            content = await resp.read()
            return Reply(resp.status, _decoded(content, resp.content_type), resp.headers)

    async def ok(self, method: str, path: str, doc: Any = _NOTHING, status: int = 200) -> Any:
        """A call that must answer ``status``; its document."""
        reply = await self.call(method, path, doc)
        assert reply.status == status, reply
        return reply.doc

    # -- shortcuts for the common calls (JSON)

    async def create(self, name: str, **settings: Any) -> dict[str, Any]:
        reply = await self.call("PUT", f"/v1/queues/{name}", settings)
        assert reply.status == 201, reply
        return reply.doc  # type: ignore[no-any-return]

    async def put(self, name: str, *messages: str | dict[str, Any]) -> list[str]:
        """Put messages (a str is a body); return their ids."""
        docs = [{"body": m} if isinstance(m, str) else m for m in messages]
        doc = await self.ok("POST", f"/v1/queues/{name}/messages", {"messages": docs})
        return [r["id"] for r in doc["results"]]

    async def take(self, name: str, max: int = 1, **options: Any) -> list[dict[str, Any]]:
        doc = await self.ok("POST", f"/v1/queues/{name}/take", {"max": max, **options})
        return doc["messages"]  # type: ignore[no-any-return]

    async def items(self, name: str, verb: str, *items: dict[str, Any]) -> list[dict[str, Any]]:
        """ack / release / touch; the per-item results."""
        doc = await self.ok("POST", f"/v1/queues/{name}/{verb}", {"items": list(items)})
        return doc["results"]  # type: ignore[no-any-return]

    async def ack(self, name: str, *deliveries: dict[str, Any]) -> list[str]:
        results = await self.items(
            name, "ack", *({"id": d["id"], "lease": d["lease"]} for d in deliveries)
        )
        return [r["status"] for r in results]

    async def stats(self, name: str) -> dict[str, Any]:
        return (await self.ok("GET", f"/v1/queues/{name}"))["stats"]  # type: ignore[no-any-return]

    async def wait_ready(self, within: float = 5.0) -> None:
        async def ready() -> bool:
            return (await self.call("GET", "/readyz")).status == 200

        await eventually(ready, within)


def _decoded(content: bytes, content_type: str) -> Any:
    content_type = content_type.split(";")[0].strip()
    if content and content_type == MSGPACK:
        return msgspec.msgpack.decode(content)
    if content and content_type == JSON:
        return msgspec.json.decode(content)
    return content.decode() if content else None


async def eventually(
    check: Callable[[], Awaitable[T]], within: float = 3.0, interval: float = 0.01
) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {within}s (last: {result!r})")
        await asyncio.sleep(interval)


async def until(predicate: Callable[[], bool], within: float = 3.0) -> None:
    """Poll a synchronous condition (e.g. a gateway counter)."""

    async def check() -> bool:
        return predicate()

    await eventually(check, within)


class GatedStore:
    """A store that passes every call to ``inner``, except that ``hold(op, n)`` makes the
    next ``n`` calls of ``op`` wait until ``release(op)``. Counts started and finished calls."""

    def __init__(self, inner: ObjectStore, *, write_slots: int | None = None) -> None:
        self.inner = inner
        self.url = inner.url
        self.write_slots = write_slots or inner.write_slots
        self.started: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self._holds: dict[str, tuple[list[int], asyncio.Event]] = {}

    def hold(self, op: str, n: int = 1_000_000) -> None:
        self._holds[op] = ([n], asyncio.Event())

    def release(self, op: str) -> None:
        hold = self._holds.pop(op, None)
        if hold is not None:
            hold[1].set()

    def release_all(self) -> None:
        for op in list(self._holds):
            self.release(op)

    async def _gate(self, op: str) -> None:
        self.started[op] += 1
        hold = self._holds.get(op)
        if hold is not None and hold[0][0] > 0:
            hold[0][0] -= 1
            self.waiting[op] += 1
            try:
                await hold[1].wait()
            finally:
                self.waiting[op] -= 1

    async def get(self, key: str) -> bytes:
        await self._gate("get")
        try:
            return await self.inner.get(key)
        finally:
            self.finished["get"] += 1

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        await self._gate("put_if_absent")
        try:
            return await self.inner.put_if_absent(key, data)
        finally:
            self.finished["put_if_absent"] += 1

    async def put(self, key: str, data: bytes) -> None:
        await self._gate("put")
        try:
            await self.inner.put(key, data)
        finally:
            self.finished["put"] += 1

    async def list(self, prefix: str) -> list[str]:
        await self._gate("list")
        try:
            return await self.inner.list(prefix)
        finally:
            self.finished["list"] += 1

    async def delete(self, key: str) -> None:
        await self._gate("delete")
        try:
            await self.inner.delete(key)
        finally:
            self.finished["delete"] += 1

    async def close(self) -> None:
        self.release_all()
        await self.inner.close()


Serve = Callable[..., Awaitable[Api]]


class DoorTestServer(TestServer):
    """aiohttp's test server with the gateway's front door (gateway/door.py), as
    ``evq serve`` runs it."""

    async def _make_runner(self, **kwargs: Any) -> DoorRunner:
        return DoorRunner(self.app, **kwargs)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """Where the test's queues live (a second server on it sees the first one's queues)."""
    return tmp_path / "data"


@pytest.fixture
def serve(aiohttp_client: Any, data_dir: Path) -> Iterator[Serve]:
    """Start a gateway: ``await serve(AppOptions(...), store=..., ready=True)``.

    Calls a failed test left held in a :class:`GatedStore` are let go before the servers
    stop, so that closing the queues (which finishes their writes) cannot hang.
    """
    gated: list[GatedStore] = []

    async def start(
        options: AppOptions | None = None,
        *,
        store: ObjectStore | None = None,
        ready: bool = True,
        count: int = 2,
    ) -> Api:
        if isinstance(store, GatedStore):
            gated.append(store)
        directory = LocalDirectory(store or LocalDirStore(data_dir), count=count)
        # aiohttp's TestServer cancels the handler of a client that hangs up, as
        # gateway/door.py asks of its runner (handler_cancellation=True).
        client = await aiohttp_client(DoorTestServer(make_app(directory, options or AppOptions())))
        api = Api(client)
        apis.append(api)
        if ready:
            await api.wait_ready()
        return api

    apis: list[Api] = []
    yield start
    for store in gated:
        store.release_all()
    for api in apis:
        api.raw.close()


@pytest.fixture
async def api(serve: Serve) -> Api:
    """A ready gateway with the default options."""
    return await serve()


# ---------------------------------------------------------------- the SQS face's modules


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqsServer]:
    """A gateway of its own for each SQS test module (a module with other options defines
    its own ``server``)."""
    with running(tmp_path_factory.mktemp("sqs")) as s:
        yield s


@pytest.fixture
def sqs(server: SqsServer) -> Iterator[Any]:
    """A boto3 SQS client of the module's server."""
    with client_of(server) as c:
        yield c
