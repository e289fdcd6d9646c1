"""Callers with per-queue permissions, and a leaky-bucket rate limit per caller.

Callers ("tokens") come from a TOML or JSON file (``--tokens-file``) or from ``EVQ_TOKENS``
(the same document as JSON)::

    [[token]]
    name = "billing-producer"
    token = "…a long random string…"     # a bearer token for the native API
    sqs_access_key = "AKIAEXAMPLE0001"   # and/or an AWS SigV4 key pair for the SQS API
    sqs_secret_key = "…a long random string…"
    rate = 200          # requests per second (leaky bucket); omit for no limit
    burst = 400         # how many may arrive at once (default: twice the rate)
    [token.queues]      # queue-name globs → permission: read < write < admin
    "billing-*" = "write"
    "*" = "read"

A caller has a bearer token, an SQS key pair, or both: one set of permissions and one rate
limit, whichever API it calls. The file may hold a token's SHA-256 instead of the token
(``token_sha256 = "…64 hex digits…"``, made with ``printf %s "$TOKEN" | sha256sum``): the
server then never has the token itself, only what it takes to recognise it (a bearer token
is a long random string, so its hash is as good as a password's slow one). An SQS secret key
cannot be stored so: SigV4 signs with the secret itself. The SQS actions map onto the same
three levels (``gateway/sqs/access.py``).

``read``: look (describe, stats, peek and browse messages, list, get and watch keys);
``write``: also produce and consume (put, take, ack, release, touch, update, delete
messages; set keys); ``admin``: also create, change, purge and delete queues. Keys are
matched by their own name, except ``queue:{name}`` keys, which follow the queue; ``sys:``
keys and ``/metrics``/``/v1/status`` need any valid token. ``/healthz``, ``/readyz`` and the
dashboard page are open; the SQS API is checked by the SQS face (``gateway/sqs/handler.py``)
with the callers' SigV4 keys.

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
import hashlib
import json
import math
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
from aiohttp import web

from actors.clock import Clock, SystemClock
from actors.core.keys import QUEUE_PREFIX, SYS_PREFIX
from actors.errors import BadRequest

__all__ = [
    "AUTH",
    "Auth",
    "Denial",
    "Token",
    "auth_middleware",
    "authorize",
    "check_tokens",
    "load_tokens",
    "presented",
    "sqs_key_callers",
]

LEVELS = {"read": 1, "write": 2, "admin": 3}


MIN_SECRET_CHARS = 16


class Token(msgspec.Struct, frozen=True, kw_only=True):
    """One caller: its credentials, permissions and rate limit."""

    name: str
    token: str | None = None  # bearer token (native API)
    token_sha256: str | None = None  # or its SHA-256, hex (the file then holds no token)
    queues: dict[str, str] = {}  # glob → read | write | admin
    rate: float | None = None
    burst: float | None = None
    sqs_access_key: str | None = None  # SigV4 key pair (SQS API)
    sqs_secret_key: str | None = None

    def digest(self) -> bytes | None:
        """The SHA-256 of the bearer token (None: no bearer token)."""
        if self.token is not None:
            return hashlib.sha256(self.token.encode()).digest()
        if self.token_sha256 is not None:
            return bytes.fromhex(self.token_sha256)
        return None

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
    check_tokens(doc.token)
    return doc.token


def check_tokens(tokens: list[Token]) -> None:
    """Each caller has credentials of its own and known permissions.

    Raises:
        BadRequest: a caller without credentials, a short secret, a credential listed twice,
            an unknown permission, or a rate that is not positive.
    """
    seen: set[bytes] = set()
    keys: set[str] = set()
    for t in tokens:
        if t.token is None and t.token_sha256 is None and t.sqs_access_key is None:
            raise BadRequest(f"token {t.name!r}: give a token, an SQS key pair, or both")
        if t.token is not None and t.token_sha256 is not None:
            raise BadRequest(f"token {t.name!r}: give token or token_sha256, not both")
        if t.token is not None and len(t.token) < MIN_SECRET_CHARS:
            raise BadRequest(f"token {t.name!r}: tokens must be at least 16 characters")
        if t.token_sha256 is not None and not _is_sha256(t.token_sha256):
            raise BadRequest(f"token {t.name!r}: token_sha256 is 64 hex digits (sha256sum)")
        digest = t.digest()
        if digest is not None:
            if digest in seen:
                raise BadRequest(f"token {t.name!r} is listed twice")
            seen.add(digest)
        _check_sqs_key(t, keys)
        bad = sorted(set(t.queues.values()) - set(LEVELS))
        if bad:
            raise BadRequest(f"token {t.name!r}: unknown permission {bad[0]!r}")
        if t.rate is not None and t.rate <= 0:
            raise BadRequest(f"token {t.name!r}: rate must be positive")


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)


def _check_sqs_key(t: Token, keys: set[str]) -> None:
    if (t.sqs_access_key is None) != (t.sqs_secret_key is None):
        raise BadRequest(f"token {t.name!r}: give sqs_access_key and sqs_secret_key together")
    if t.sqs_access_key is None or t.sqs_secret_key is None:
        return
    if not t.sqs_access_key.isalnum() or len(t.sqs_access_key) > 128:
        raise BadRequest(f"token {t.name!r}: sqs_access_key is 1-128 letters and digits")
    if len(t.sqs_secret_key) < MIN_SECRET_CHARS:
        raise BadRequest(f"token {t.name!r}: sqs_secret_key must be at least 16 characters")
    if t.sqs_access_key in keys:
        raise BadRequest(f"SQS access key of token {t.name!r} is listed twice")
    keys.add(t.sqs_access_key)


def sqs_key_callers(keys: dict[str, str]) -> list[Token]:
    """Callers for bare SQS keys (``EVQ_SQS_KEYS``: access key → secret): each may do
    anything on every queue, with no rate limit; the tokens file gives keys permissions."""
    return [
        Token(
            name=f"sqs-key-{key}", queues={"*": "admin"}, sqs_access_key=key, sqs_secret_key=secret
        )
        for key, secret in keys.items()
    ]


def read_tokens(path: str | None, env_json: str | None) -> list[Token]:
    """Tokens from a file (TOML or JSON by extension) and/or the environment's JSON."""
    tokens: list[Token] = []
    if path:
        tokens += load_tokens(Path(path).read_text(), toml=not path.endswith(".json"))
    if env_json:
        tokens += load_tokens(env_json, toml=False)
    check_tokens(tokens)  # the two together, too
    return tokens


class _Bucket:
    __slots__ = ("level", "stamp")

    def __init__(self, now: float) -> None:
        self.level = 0.0
        self.stamp = now


class Auth:
    """The configured callers; checks a request's credentials, permission and rate."""

    def __init__(self, tokens: list[Token], clock: Clock | None = None) -> None:
        self.callers = list(tokens)
        # SHA-256 of each bearer token → its caller: what is kept, whether the file held the
        # token or its hash
        self.tokens = {d: t for t in tokens if (d := t.digest()) is not None}
        self.sqs_callers = {t.sqs_access_key: t for t in tokens if t.sqs_access_key is not None}
        # access key → secret, as the SigV4 check takes them
        self.sqs_secrets = {k: t.sqs_secret_key or "" for k, t in self.sqs_callers.items()}
        self.clock = clock or SystemClock()
        self._buckets: dict[str, _Bucket] = {}

    @property
    def enabled(self) -> bool:
        """Whether callers are configured (the native API then needs a bearer token, even if
        no caller has one)."""
        return bool(self.callers)

    def identify(self, presented: str | None) -> Token | None:
        """The token presented, if it is one of ours. Looked up by its SHA-256: the time it
        takes says nothing about any token (finding a preimage is the only way to use it)."""
        if not presented:
            return None
        return self.tokens.get(hashlib.sha256(presented.encode()).digest())

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

# (method, canonical route) → (permission, what it applies to: "queue", "key", "any", or
# "cluster": every queue, i.e. the permission on the glob "*")
_RULES: dict[tuple[str, str], tuple[str, str]] = {
    ("GET", "/v1/queues"): ("read", "list"),
    ("PUT", "/v1/queues/{name}"): ("admin", "queue"),
    ("GET", "/v1/queues/{name}"): ("read", "queue"),
    ("GET", "/v1/queues/{name}/history"): ("read", "queue"),
    ("PATCH", "/v1/queues/{name}"): ("admin", "queue"),
    ("DELETE", "/v1/queues/{name}"): ("admin", "queue"),
    ("POST", "/v1/queues/{name}/purge"): ("admin", "queue"),
    ("POST", "/v1/queues/{name}/pause"): ("admin", "queue"),
    ("POST", "/v1/queues/{name}/resume"): ("admin", "queue"),
    ("POST", "/v1/queues/{name}/messages"): ("write", "queue"),
    ("POST", "/v1/queues/{name}/take"): ("write", "queue"),
    ("POST", "/v1/queues/{name}/ack"): ("write", "queue"),
    ("POST", "/v1/queues/{name}/release"): ("write", "queue"),
    ("POST", "/v1/queues/{name}/touch"): ("write", "queue"),
    ("GET", "/v1/queues/{name}/messages"): ("read", "queue"),
    ("GET", "/v1/queues/{name}/messages/{id}"): ("read", "queue"),
    ("PATCH", "/v1/queues/{name}/messages/{id}"): ("write", "queue"),
    ("DELETE", "/v1/queues/{name}/messages/{id}"): ("write", "queue"),
    ("PUT", "/v1/keys/{key}"): ("write", "key"),
    ("GET", "/v1/keys/{key}"): ("read", "key"),
    ("GET", "/v1/watch/{key}"): ("read", "key"),
    ("GET", "/v1/ws"): ("read", "any"),  # each watched key: gateway/watches/websocket.py
    ("GET", "/v1/status"): ("read", "any"),
    ("GET", "/metrics"): ("read", "any"),
    ("GET", "/v1/admin/shards"): ("read", "any"),
    ("POST", "/v1/admin/shards"): ("admin", "cluster"),
    ("POST", "/v1/admin/shards/restart"): ("admin", "cluster"),
    ("GET", "/v1/tasks"): ("read", "any"),
    ("GET", "/v1/tasks/{id}"): ("read", "any"),
    ("DELETE", "/v1/tasks/{id}"): ("admin", "cluster"),
    ("POST", "/v1/queues/{name}/redrive"): ("admin", "queue"),
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
    # aiohttp answers HEAD with a GET route's handler: the same rule applies
    rule = _RULES.get(("GET" if method == "HEAD" else method, canonical))
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
        if target in ("queue", "key", "cluster"):
            resource = {"queue": name, "key": key_resource(name), "cluster": "*"}[target]
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
