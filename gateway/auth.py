"""Bearer tokens with per-queue permissions, and a leaky-bucket rate limit per token.

Tokens come from a TOML or JSON file (``--tokens-file``) or from ``EVQ_TOKENS`` (the same
document as JSON)::

    [[token]]
    name = "billing-producer"
    token = "…a long random string…"
    rate = 200          # requests per second (leaky bucket); omit for no limit
    burst = 400         # how many may arrive at once (default: twice the rate)
    [token.queues]      # queue-name globs → permission: read < write < admin
    "billing-*" = "write"
    "*" = "read"

``read``: look (describe, stats, peek, list, get and watch keys); ``write``: also produce and
consume (put, take, ack, release, touch, update, delete messages; set keys); ``admin``: also
create, change, purge and delete queues. Keys are matched by their own name, except
``queue:{name}`` keys, which follow the queue; ``sys:`` keys and ``/metrics``/``/v1/status``
need any valid token. ``/healthz``, ``/readyz`` and the dashboard page are open; the SQS API
has its own SigV4 keys.

Without tokens the server is open and must listen on loopback only (see gateway/server.py).

Rate limits are per gateway process: each one (``--workers``, and every gateway of a
cluster) keeps its own bucket per token, so a token's whole rate is ``rate`` times the
processes its requests reach. Set ``rate`` to a process's share. A limit that held across
gateways would need a count shared by all of them, consulted on every request: a hop to
another process that costs about what a put costs, on the requests the limit is there to
keep cheap, and a single point that every gateway waits on.
"""

from __future__ import annotations

import fnmatch
import hmac
import json
import math
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
from aiohttp import web

from actors.clock import Clock, SystemClock
from actors.errors import BadRequest
from actors.keyspace import QUEUE_PREFIX, SYS_PREFIX

__all__ = [
    "AUTH",
    "Auth",
    "Denial",
    "Token",
    "auth_middleware",
    "authorize",
    "load_tokens",
    "presented",
]

LEVELS = {"read": 1, "write": 2, "admin": 3}


class Token(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    token: str
    queues: dict[str, str] = {}  # glob → read | write | admin
    rate: float | None = None
    burst: float | None = None

    def level(self, resource: str) -> int:
        """The highest permission this token has on ``resource``."""
        best = 0
        for pattern, perm in self.queues.items():
            if fnmatch.fnmatchcase(resource, pattern):
                best = max(best, LEVELS[perm])
        return best


class _TokenFile(msgspec.Struct):
    token: list[Token] = []


def load_tokens(text: str, *, toml: bool) -> list[Token]:
    """Parse a token document (TOML or JSON).

    Raises:
        BadRequest: malformed, a duplicate token, or an unknown permission.
    """
    try:
        raw = tomllib.loads(text) if toml else json.loads(text)
        doc = msgspec.convert(raw, _TokenFile)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, msgspec.ValidationError) as exc:
        raise BadRequest(f"invalid token document: {exc}") from None
    seen: set[str] = set()
    for t in doc.token:
        if len(t.token) < 16:
            raise BadRequest(f"token {t.name!r}: tokens must be at least 16 characters")
        if t.token in seen:
            raise BadRequest(f"token {t.name!r} is listed twice")
        seen.add(t.token)
        bad = sorted(set(t.queues.values()) - set(LEVELS))
        if bad:
            raise BadRequest(f"token {t.name!r}: unknown permission {bad[0]!r}")
        if t.rate is not None and t.rate <= 0:
            raise BadRequest(f"token {t.name!r}: rate must be positive")
    return doc.token


def read_tokens(path: str | None, env_json: str | None) -> list[Token]:
    """Tokens from a file (TOML or JSON by extension) and/or the environment's JSON."""
    tokens: list[Token] = []
    if path:
        tokens += load_tokens(Path(path).read_text(), toml=not path.endswith(".json"))
    if env_json:
        tokens += load_tokens(env_json, toml=False)
    return tokens


class _Bucket:
    __slots__ = ("level", "stamp")

    def __init__(self, now: float) -> None:
        self.level = 0.0
        self.stamp = now


class Auth:
    """The configured tokens; checks a request's token, permission and rate."""

    def __init__(self, tokens: list[Token], clock: Clock | None = None) -> None:
        self.tokens = {t.token.encode(): t for t in tokens}
        self.clock = clock or SystemClock()
        self._buckets: dict[str, _Bucket] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def identify(self, presented: str | None) -> Token | None:
        """The token presented, if it is one of ours (constant-time comparison)."""
        if not presented:
            return None
        given = presented.encode()
        found = None
        for secret, token in self.tokens.items():
            if hmac.compare_digest(secret, given):
                found = token
        return found

    def admit(self, token: Token) -> float | None:
        """Leaky bucket: None if the request may go on, else seconds to wait."""
        if token.rate is None:
            return None
        now = self.clock.now_ms() / 1000
        bucket = self._buckets.get(token.name)
        if bucket is None:
            bucket = self._buckets[token.name] = _Bucket(now)
        bucket.level = max(0.0, bucket.level - (now - bucket.stamp) * token.rate)
        bucket.stamp = now
        burst = token.burst if token.burst is not None else max(1.0, 2 * token.rate)
        if bucket.level + 1 > burst:
            return (bucket.level + 1 - burst) / token.rate
        bucket.level += 1
        return None


AUTH = web.AppKey("auth", Auth)
TOKEN = web.RequestKey("evq_token", Token)  # the caller's Token (auth on)

# (method, canonical route) → (permission, what it applies to: "queue", "key", "any")
_RULES: dict[tuple[str, str], tuple[str, str]] = {
    ("GET", "/v1/queues"): ("read", "list"),
    ("PUT", "/v1/queues/{name}"): ("admin", "queue"),
    ("GET", "/v1/queues/{name}"): ("read", "queue"),
    ("PATCH", "/v1/queues/{name}"): ("admin", "queue"),
    ("DELETE", "/v1/queues/{name}"): ("admin", "queue"),
    ("POST", "/v1/queues/{name}/purge"): ("admin", "queue"),
    ("POST", "/v1/queues/{name}/messages"): ("write", "queue"),
    ("POST", "/v1/queues/{name}/take"): ("write", "queue"),
    ("POST", "/v1/queues/{name}/ack"): ("write", "queue"),
    ("POST", "/v1/queues/{name}/release"): ("write", "queue"),
    ("POST", "/v1/queues/{name}/touch"): ("write", "queue"),
    ("GET", "/v1/queues/{name}/messages/{id}"): ("read", "queue"),
    ("PATCH", "/v1/queues/{name}/messages/{id}"): ("write", "queue"),
    ("DELETE", "/v1/queues/{name}/messages/{id}"): ("write", "queue"),
    ("PUT", "/v1/keys/{key}"): ("write", "key"),
    ("GET", "/v1/keys/{key}"): ("read", "key"),
    ("GET", "/v1/watch/{key}"): ("read", "key"),
    ("GET", "/v1/ws"): ("read", "any"),  # each watched key is checked in gateway/watches.py
    ("GET", "/v1/status"): ("read", "any"),
    ("GET", "/metrics"): ("read", "any"),
}
_OPEN = {"/healthz", "/readyz", "/", "/favicon.ico"}
_OPEN_PREFIXES = ("/dashboard/",)


def key_resource(key: str) -> str:
    """What a key's permission is checked against: ``queue:{name}`` keys follow the queue."""
    return key[len(QUEUE_PREFIX) :] if key.startswith(QUEUE_PREFIX) else key


def may_read_key(token: Token | None, key: str) -> bool:
    """Whether ``token`` may watch ``key`` (always, when auth is off)."""
    if token is None or key.startswith(SYS_PREFIX):
        return True
    return token.level(key_resource(key)) >= LEVELS["read"]


def presented(authorization: str | None, ws_query_token: str | list[str] | None) -> str | None:
    """The token a request presents: ``Authorization: Bearer …``, or on ``/v1/ws`` the
    ``token`` query parameter (browsers cannot set headers on WebSockets)."""
    if authorization and authorization.startswith("Bearer "):
        return authorization[len("Bearer ") :].strip()
    if isinstance(ws_query_token, list):
        return ws_query_token[0] if ws_query_token else None
    return ws_query_token


def _presented(request: web.Request) -> str | None:
    ws_token = request.query.get("token") if request.path == "/v1/ws" else None
    return presented(request.headers.get("Authorization"), ws_token)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Denial(NamedTuple):
    """Why a request is refused: the status, code and message of the error reply, and how
    long to wait before retrying (429)."""

    status: int
    code: str
    message: str
    wait: float | None = None


def authorize(
    auth: Auth, method: str, canonical: str, path: str, presented: str | None, name: str
) -> Token | Denial | None:
    """The check of one request: None when none applies (auth off, open paths, the SQS API,
    unknown paths), the caller's Token when it may go on, or why not. ``canonical`` is the
    route (``/v1/queues/{name}``), ``name`` the queue or key it names (or "")."""
    if not auth.enabled or path in _OPEN or path.startswith(_OPEN_PREFIXES):
        return None
    rule = _RULES.get((method, canonical))
    if rule is None and not path.startswith(("/v1/", "/metrics")):
        return None  # the SQS API (SigV4) and unknown paths (404)
    token = auth.identify(presented)
    if token is None:
        return Denial(401, "Unauthorized", "a valid bearer token is required")
    wait = auth.admit(token)
    if wait is not None:
        return Denial(429, "Overloaded", "rate limit of this token exceeded", wait)
    if rule is not None:
        perm, target = rule
        if target in ("queue", "key"):
            resource = name if target == "queue" else key_resource(name)
            if token.level(resource) < LEVELS[perm]:
                return Denial(403, "Forbidden", f"this token may not {perm} {resource}")
    return token


def auth_middleware(error: Callable[..., web.Response]) -> Any:
    """The middleware; ``error(status, code, message, request, retry_after)`` makes replies."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        auth = request.app.get(AUTH)
        if auth is None:
            return await handler(request)
        resource = request.match_info.route.resource
        canonical = resource.canonical if resource is not None else request.path
        info = request.match_info
        name = info.get("name") or info.get("key") or ""
        verdict = authorize(
            auth, request.method, canonical, request.path, _presented(request), name
        )
        if isinstance(verdict, Denial):
            return error(verdict.status, verdict.code, verdict.message, request, verdict.wait)
        if verdict is not None:
            request[TOKEN] = verdict
        return await handler(request)

    return middleware


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
