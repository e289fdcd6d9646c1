"""Bearer tokens on every route: missing, wrong and under-privileged tokens are refused with
401/403; enough privilege passes; rate limits answer 429 with Retry-After; WebSocket
watches check each key; open routes stay open. (The SQS API's SigV4 checks are tested in
test_sqs_auth.py.)"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import aiohttp
import pytest

from actors.errors import BadRequest
from gateway.app import AppOptions
from gateway.auth import _RULES, Token, load_tokens
from gateway.server import is_loopback
from tests.unit.gateway.conftest import Api, Serve

ADMIN = Token(name="admin", token="admin-token-0123456789", queues={"*": "admin"})
WRITER = Token(name="writer", token="writer-token-0123456789", queues={"orders*": "write"})
READER = Token(name="reader", token="reader-token-0123456789", queues={"*": "read"})
ORDERS_ADMIN = Token(
    name="orders-admin", token="orders-admin-0123456789", queues={"orders*": "admin"}
)
LEVEL_TOKEN = {"read": READER, "write": WRITER, "admin": ADMIN}
BELOW = {"write": READER, "admin": WRITER}  # a token one level short on "orders"


def auth(token: Token | str | None) -> dict[str, str]:
    if token is None:
        return {}
    secret = token.token if isinstance(token, Token) else token
    return {"Authorization": f"Bearer {secret}"}


async def call(api: Api, method: str, path: str, token: Any, doc: Any = None) -> int:
    data = json.dumps(doc).encode() if doc is not None else None
    headers = {**auth(token), "Content-Type": "application/json"}
    async with api.client.request(method, path, data=data, headers=headers) as resp:
        await resp.read()
        return resp.status


@pytest.fixture
async def secured(serve: Serve) -> Api:
    api = await serve(AppOptions(tokens=[ADMIN, WRITER, READER, ORDERS_ADMIN]), ready=False)
    await api.client.get("/readyz")
    return api


def _concrete(route: str) -> str:
    path = route.replace("{name}", "orders").replace("{id}", "1").replace("{key}", "orders-key")
    if route.startswith("/v1/watch/"):
        path += "?timeout=0.1"  # a long poll that passes waits for a change: not long here
    return path


ROUTES = sorted(k for k in _RULES if k[1] != "/v1/ws")


@pytest.mark.parametrize(("method", "route"), ROUTES, ids=[f"{m} {r}" for m, r in ROUTES])
async def test_missing_and_wrong_tokens_are_401_on_every_route(
    secured: Api, method: str, route: str
) -> None:
    path = _concrete(route)
    async with secured.client.request(method, path) as resp:
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await resp.json())["error"]["code"] == "Unauthorized"
    assert await call(secured, method, path, "not-a-token-at-all-000") == 401
    async with secured.client.request(method, path, headers={"Authorization": "Basic eDp5"}) as r:
        assert r.status == 401


@pytest.mark.parametrize(("method", "route"), ROUTES, ids=[f"{m} {r}" for m, r in ROUTES])
async def test_under_privileged_tokens_are_403_and_enough_passes(
    secured: Api, method: str, route: str
) -> None:
    perm, target = _RULES[(method, route)]
    path = _concrete(route)
    if target in ("queue", "key") and perm in BELOW:
        assert await call(secured, method, path, BELOW[perm]) == 403
    if target in ("queue", "key"):
        nobody = Token(name="x", token="x" * 20, queues={"other-*": "admin"})
        assert nobody.level("orders") == 0
    if target == "cluster":  # the whole server's: admin of some queues is not enough
        assert await call(secured, method, path, WRITER, doc={}) == 403
        assert await call(secured, method, path, ORDERS_ADMIN, doc={}) == 403
    status = await call(secured, method, path, LEVEL_TOKEN[perm], doc={})
    assert status not in (401, 403), (method, path, status)


async def test_every_native_route_has_a_rule_head_as_get(secured: Api) -> None:
    """A /v1 route without a rule would let any valid token through, whatever it may do."""
    routes = {
        (route.method, route.resource.canonical)
        for route in secured.app.router.routes()
        if route.resource is not None and route.resource.canonical.startswith("/v1/")
    }
    assert ("HEAD", "/v1/queues/{name}/messages") in routes
    unruled = {(m, r) for m, r in routes if ("GET" if m == "HEAD" else m, r) not in _RULES}
    assert unruled == set()


async def test_a_token_reaches_only_its_queues(secured: Api) -> None:
    assert await call(secured, "PUT", "/v1/queues/orders-eu", ADMIN, {}) == 201
    assert await call(secured, "PUT", "/v1/queues/billing", ADMIN, {}) == 201
    body = {"messages": [{"body": "x"}]}
    assert await call(secured, "POST", "/v1/queues/orders-eu/messages", WRITER, body) == 200
    assert await call(secured, "POST", "/v1/queues/billing/messages", WRITER, body) == 403
    assert await call(secured, "PUT", "/v1/queues/orders-new", WRITER, {}) == 403
    assert await call(secured, "POST", "/v1/queues/orders-eu/messages", READER, body) == 403
    async with secured.client.get("/v1/queues", headers=auth(WRITER)) as resp:
        assert (await resp.json())["queues"] == ["orders-eu"]
    async with secured.client.get("/v1/queues", headers=auth(READER)) as resp:
        assert (await resp.json())["queues"] == ["billing", "orders-eu"]


async def test_open_routes_stay_open(secured: Api) -> None:
    for path in ("/healthz", "/readyz"):
        async with secured.client.get(path) as resp:
            assert resp.status in (200, 503)


async def test_rate_limit_per_token_answers_429_with_retry_after(serve: Serve) -> None:
    slow = Token(
        name="slow", token="slow-token-0123456789", queues={"*": "read"}, rate=0.01, burst=2
    )
    api = await serve(AppOptions(tokens=[slow, ADMIN]))
    statuses = [await call(api, "GET", "/v1/queues", slow) for _ in range(3)]
    assert statuses == [200, 200, 429]
    async with api.client.get("/v1/queues", headers=auth(slow)) as resp:
        assert resp.status == 429
        assert int(resp.headers["Retry-After"]) >= 50
        assert (await resp.json())["error"]["code"] == "Overloaded"
    assert await call(api, "GET", "/v1/queues", ADMIN) == 200  # other tokens unaffected


async def test_websocket_needs_a_token_and_checks_each_key(secured: Api) -> None:
    async with secured.client.get("/v1/ws") as resp:
        assert resp.status == 401
    ws = await secured.client.ws_connect(f"/v1/ws?token={WRITER.token}")
    await ws.send_json({"op": "watch", "key": "queue:billing"})
    msg = json.loads((await ws.receive(timeout=5)).data)
    assert (msg["op"], msg["code"]) == ("error", "Forbidden")
    await ws.send_json({"op": "watch", "key": "queue:orders"})
    msg = json.loads((await ws.receive(timeout=5)).data)
    assert (msg["op"], msg["key"]) == ("event", "queue:orders")
    await ws.close()
    session = aiohttp.ClientSession(headers=auth(READER))
    try:
        ws = await session.ws_connect(secured.client.make_url("/v1/ws"))
        await ws.send_json({"op": "watch", "key": "sys:shutdown"})
        await ws.send_json({"op": "ping", "id": 1})
        assert json.loads((await ws.receive(timeout=5)).data) == {"op": "pong", "id": 1}
        await ws.close()
    finally:
        await session.close()


def test_token_documents_are_validated() -> None:
    good = '[[token]]\nname = "a"\ntoken = "aaaaaaaaaaaaaaaaaaaa"\n[token.queues]\n"*" = "read"\n'
    assert load_tokens(good, toml=True)[0].level("anything") == 1
    for bad in (
        '[[token]]\nname = "a"\ntoken = "short"\n',
        '[[token]]\nname = "a"\ntoken = "aaaaaaaaaaaaaaaaaaaa"\n[token.queues]\n"*" = "root"\n',
        good + good,
        "[[token]\n",
    ):
        with pytest.raises(BadRequest):
            load_tokens(bad, toml=True)
    assert load_tokens('{"token": [{"name": "j", "token": "jjjjjjjjjjjjjjjjjjjj"}]}', toml=False)


def test_without_tokens_the_server_refuses_to_listen_beyond_loopback(tmp_path: Any) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "evq",
            "serve",
            "--no-ray",
            "--host",
            "0.0.0.0",
            "--data",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "no tokens configured" in done.stderr
    assert "127.0.0.1" in done.stderr


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("::", False),
        ("gateway.example", False),
    ],
)
def test_only_loopback_addresses_may_serve_without_tokens(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# ---------------------------------------------------------------- secrets at rest, in logs


HASHED_SECRET = "hashed-caller-token-0123456789"
HASHED = Token(
    name="hashed",
    token_sha256=hashlib.sha256(HASHED_SECRET.encode()).hexdigest(),
    queues={"*": "write"},
)


async def test_a_token_given_by_its_hash_authenticates_on_every_face(serve: Serve) -> None:
    api = await serve(AppOptions(tokens=[ADMIN, HASHED]))
    assert await call(api, "PUT", "/v1/queues/hq", ADMIN, {}) in (200, 201)
    put = {"messages": [{"body": "x"}]}
    assert await call(api, "POST", "/v1/queues/hq/messages", HASHED_SECRET, put) == 200
    # the hash itself is not a token
    assert await call(api, "POST", "/v1/queues/hq/messages", HASHED.token_sha256, put) == 401
    assert await call(api, "PUT", "/v1/queues/other", HASHED_SECRET, {}) == 403  # write only
    async with api.client.get(
        "/v1/watch/queue:hq?timeout=0.1", headers=auth(HASHED_SECRET)
    ) as resp:
        assert resp.status in (200, 204)


def test_hashed_token_documents_are_validated() -> None:
    digest = hashlib.sha256(b"a-long-enough-token-123").hexdigest()
    [token] = load_tokens(f'[[token]]\nname = "h"\ntoken_sha256 = "{digest}"\n', toml=True)
    assert token.digest() == bytes.fromhex(digest)
    for bad in (
        '[[token]]\nname = "h"\ntoken_sha256 = "abc"\n',
        f'[[token]]\nname = "h"\ntoken_sha256 = "{"g" * 64}"\n',
        f'[[token]]\nname = "h"\ntoken = "a-long-enough-token-123"\ntoken_sha256 = "{digest}"\n',
        # the same caller twice: once as the token, once as its hash
        f'[[token]]\nname = "a"\ntoken = "a-long-enough-token-123"\n'
        f'[[token]]\nname = "b"\ntoken_sha256 = "{digest}"\n',
    ):
        with pytest.raises(BadRequest):
            load_tokens(bad, toml=True)


async def test_no_token_is_echoed_in_an_answer_or_the_log(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    api = await serve(AppOptions(tokens=[ADMIN, WRITER, HASHED]))
    wrong = "wrong-token-that-must-not-be-echoed-42"
    answers = []
    for method, path, token in (
        ("GET", "/v1/queues", wrong),
        ("PUT", "/v1/queues/orders", WRITER),  # 403
        ("POST", "/v1/queues/orders/messages", wrong),  # the fast path's 401
        ("GET", "/v1/watch/orders-key?timeout=0.1", wrong),
        ("GET", "/metrics", wrong),
    ):
        async with api.client.request(method, path, headers=auth(token), data=b"{}") as resp:
            answers.append(await resp.text() + str(dict(resp.headers)))
    async with api.client.get(f"/v1/ws?token={wrong}") as resp:
        answers.append(await resp.text())
    # (aiohttp's access log, which the test server keeps and evq serve turns off, would show
    # a WebSocket's query string)
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name != "aiohttp.access")
    seen = "\n".join(answers) + logged
    for secret in (wrong, ADMIN.token, WRITER.token, HASHED_SECRET, HASHED.token_sha256):
        assert secret is not None
        assert secret not in seen
