"""The client's pure half: request building, reply parsing, error mapping, retry policy.

No I/O here. ``evq.client`` sends the requests these functions build and hands back
what they parse, so all of it is tested without a socket. Shapes follow gateway/WIRE.md.

Every builder returns a :class:`Call`: method, path, payload, how to parse the answer and
whether the request may be sent again when its outcome is unknown (:class:`Resend`).
:func:`prepare` encodes a call once; the client resends those exact bytes on a retry, so a
retried put carries the same idempotency keys.
"""

from __future__ import annotations

import base64
import enum
import inspect
import math
import random
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

import msgspec

from actors import errors
from actors.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InternalError,
    Overloaded,
    QueueError,
    TooLarge,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "DEFAULT_URL",
    "JSON",
    "MSGPACK",
    "Body",
    "Call",
    "ItemResult",
    "KeyValue",
    "Message",
    "MessagePage",
    "NewMessage",
    "Prepared",
    "PutResult",
    "QueueConfig",
    "QueueInfo",
    "QueueStats",
    "Receipt",
    "Resend",
    "RetryPolicy",
    "TransportError",
    "ack",
    "as_messages",
    "body_fields",
    "browse",
    "create_queue",
    "decode_payload",
    "delete_message",
    "delete_queue",
    "error_from_reply",
    "get_key",
    "get_message",
    "get_queue",
    "handle_reply",
    "health",
    "list_queues",
    "message_doc",
    "message_from",
    "parse_retry_after",
    "pause",
    "prepare",
    "purge",
    "put",
    "random_key",
    "ready",
    "redrive",
    "release",
    "set_key",
    "take",
    "to_bytes",
    "touch",
    "update_message",
    "update_queue",
    "watch",
]

DEFAULT_URL = "http://127.0.0.1:8700"  # where clients look for a server by default

T = TypeVar("T")

JSON = "application/json"
MSGPACK = "application/msgpack"
USER_AGENT = "evq-client/0.1"

Body = bytes | bytearray | memoryview | str
"""A message body as callers give it; ``str`` travels as UTF-8."""

# ------------------------------------------------------------------ types


class NewMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message to put; only ``body`` is required (``delay`` xor ``activate_at``)."""

    body: Body
    id: str | None = None
    delay: float | None = None
    activate_at: float | None = None
    idempotency_key: str | None = None
    group: str | None = None
    attributes: dict[str, str] | None = None


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """A message as ``take`` (with a lease) or ``get_message`` (with a state) shows it."""

    id: str
    body: bytes = b""
    activate_at: float = 0.0
    enqueued_at: float = 0.0
    receive_count: int = 0
    lease: str | None = None
    lease_expires_at: float | None = None
    attributes: dict[str, Any] = msgspec.field(default_factory=dict)
    group: str | None = None
    state: str | None = None
    first_received_at: float | None = None
    # peek and browse: the last failures given with releases, ``{"at", "reason"}``, oldest first
    failures: list[dict[str, Any]] = msgspec.field(default_factory=list)

    @property
    def body_text(self) -> str:
        """The body decoded as UTF-8 (raises UnicodeDecodeError on binary bodies)."""
        return self.body.decode("utf-8")


class MessagePage(msgspec.Struct, frozen=True):
    """A page of a browse: messages (each with its ``state``, without a lease) and the
    cursor of the next page, for ``after`` (None: no message follows, for now)."""

    messages: list[Message]
    next: str | None = None


class PutResult(msgspec.Struct, frozen=True):
    """One message of a put: its id and ``created`` or ``duplicate``."""

    id: str
    status: str

    @property
    def created(self) -> bool:
        """Whether this put stored the message (False: an earlier put already had)."""
        return self.status == "created"


class ItemResult(msgspec.Struct, frozen=True):
    """One item of ack / release / touch: ``ok``, ``stale_lease`` or ``not_found``."""

    id: str
    status: str
    lease_expires_at: float | None = None

    @property
    def ok(self) -> bool:
        """Whether the command took effect on this message."""
        return self.status == "ok"


class QueueConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A queue's settings in API units (seconds)."""

    id_mode: str = "server"
    visibility_timeout: float = 30.0
    max_receives: int | None = None
    dead_letter_queue: str | None = None
    retention: float = 345_600.0
    max_message_bytes: int = 8 * 1024 * 1024
    fifo: bool = False
    delay: float = 0.0
    idempotency_window: float = 900.0
    content_based_dedup: bool = False
    max_messages: int | None = None
    take_rate: int | None = None  # messages a second, over the whole cluster
    put_rate: int | None = None
    max_in_flight: int | None = None
    fair: bool = False  # standard queues: messages handed out fairly across their groups


class QueueStats(msgspec.Struct, frozen=True, kw_only=True):
    """A queue's counters; ``oldest_ready_age`` is seconds or None."""

    ready: int = 0
    delayed: int = 0
    reserved: int = 0
    total: int = 0
    oldest_ready_age: float | None = None
    dead_lettered: int = 0
    dead_letter_pending: int = 0
    expired: int = 0
    acked: int = 0
    enqueued: int = 0
    purged: int = 0
    paused: bool = False


class QueueInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A queue: settings, stats (from GET/PATCH) and ``created`` (from create)."""

    name: str
    settings: QueueConfig = msgspec.field(default_factory=QueueConfig)
    stats: QueueStats | None = None
    created: bool | None = None


class KeyValue(msgspec.Struct, frozen=True):
    """A key's value at a version (0: never set)."""

    key: str
    version: int
    value: Any = None


class TransportError(Unavailable):
    """No complete reply (no connection, or it broke); ``fields["sent"]``: it may have arrived."""


# ------------------------------------------------------------------ retry policy


class Resend(enum.Enum):
    """When a call whose outcome is unknown (connection lost mid-way) may be sent again."""

    ALWAYS = "always"  # idempotent, or made so by idempotency keys
    IF_NOT_SENT = "if_not_sent"  # take, purge: only if the request surely never left


RETRY_STATUSES = frozenset({429, 503})


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Bounded retries with exponential backoff, equal jitter and Retry-After."""

    retries: int = 3
    backoff: float = 0.1
    max_backoff: float = 5.0
    max_retry_after: float = 60.0

    def pause(self, attempt: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (0-based), at least ``retry_after``."""
        ceiling = min(self.max_backoff, self.backoff * 2 ** min(attempt, 32))
        pause = ceiling / 2 + rng.uniform(0, ceiling / 2)
        return pause if retry_after is None else max(pause, retry_after)

    def next_pause(
        self, attempt: int, error: QueueError, resend: Resend, rng: random.Random
    ) -> float | None:
        """Seconds to wait before resending after ``error``, or None to raise it."""
        if attempt >= self.retries:
            return None
        if isinstance(error, TransportError):
            if resend is Resend.ALWAYS or not error.fields.get("sent", True):
                return self.pause(attempt, rng)
            return None
        if error.fields.get("status") not in RETRY_STATUSES:
            return None
        retry_after = error.fields.get("retry_after")
        if retry_after is not None and retry_after > self.max_retry_after:
            return None  # the server asks for a longer pause than we may take: let the caller
        return self.pause(attempt, rng, retry_after)


# ------------------------------------------------------------------ calls


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to read its answer; ``hold`` is how long the server may wait."""

    method: str
    path: str
    parse: Callable[[int, Any], T]
    payload: Any = None
    query: Mapping[str, str] | None = None
    resend: Resend = Resend.ALWAYS
    expect: frozenset[int] = frozenset({200, 201})
    hold: float = 0.0

    @property
    def target(self) -> str:
        """Path and query string."""
        return self.path + ("?" + urlencode(self.query) if self.query else "")

    @property
    def hot(self) -> bool:
        """A put, take, ack, release or touch: the server's front door serves these itself
        on connections that start with one (gateway/fast.py), so clients send them on
        connections of their own."""
        return self.method == "POST" and not self.query and _HOT.fullmatch(self.path) is not None


_HOT = re.compile(r"/v1/queues/[^/]+/(messages|take|ack|release|touch)")


@dataclass(frozen=True)
class Prepared:
    """A call encoded for the wire: resent byte for byte on a retry."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes | None
    hot: bool = False  # see Call.hot


_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()
_json_decoder = msgspec.json.Decoder()
_msgpack_decoder = msgspec.msgpack.Decoder()


def prepare(call: Call[Any], *, binary: bool = False, token: str | None = None) -> Prepared:
    """Encode ``call`` as JSON (or msgpack when ``binary``) with its headers."""
    ctype = MSGPACK if binary else JSON
    headers = {"Accept": ctype, "User-Agent": USER_AGENT}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = None
    if call.payload is not None:
        body = (_msgpack_encoder if binary else _json_encoder).encode(call.payload)
        headers["Content-Type"] = ctype
    return Prepared(call.method, call.target, headers, body, call.hot)


def decode_payload(data: bytes, content_type: str | None) -> Any:
    """Decode a reply body by its content type (JSON unless msgpack); None when empty."""
    if not data:
        return None
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    return (_msgpack_decoder if mime == MSGPACK else _json_decoder).decode(data)


def handle_reply(
    call: Call[T],
    status: int,
    data: bytes,
    content_type: str | None = None,
    retry_after: str | None = None,
) -> T:
    """The parsed answer to ``call``.

    Raises:
        QueueError: the class named by the reply's error code (status in ``fields``);
            InternalError when a success reply cannot be read.
    """
    if status in call.expect:
        try:
            return call.parse(status, decode_payload(data, content_type))
        except (msgspec.MsgspecError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise InternalError(
                f"unreadable reply to {call.method} {call.path}: {e}", status=status
            ) from e
    try:
        doc = decode_payload(data, content_type)
    except msgspec.MsgspecError:
        doc = data[:200].decode("utf-8", "replace")
    raise error_from_reply(status, doc, parse_retry_after(retry_after))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (an HTTP date is ignored: None)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _error_classes() -> dict[str, type[QueueError]]:
    found = (getattr(errors, name) for name in errors.__all__)
    return {
        cls.code: cls
        for cls in found
        if inspect.isclass(cls) and issubclass(cls, QueueError) and cls is not QueueError
    }


_BY_CODE = _error_classes()
_BY_STATUS: dict[int, type[QueueError]] = {
    401: Unauthorized,
    403: Forbidden,
    409: Conflict,
    413: TooLarge,
    429: Overloaded,
    503: Unavailable,
}


def _class_for(code: object, status: int) -> type[QueueError]:
    if isinstance(code, str) and code in _BY_CODE:
        return _BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return BadRequest if 400 <= status < 500 else InternalError


def error_from_reply(status: int, doc: Any, retry_after: float | None = None) -> QueueError:
    """The exception for an error reply: by ``error.code``, else by HTTP status."""
    code: object = None
    message = f"HTTP {status}"
    fields: dict[str, Any] = {}
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        message = str(error.get("message") or message)
        fields = {k: v for k, v in error.items() if isinstance(k, str) and k not in _ERROR_KEYS}
    elif isinstance(doc, str) and doc.strip():
        message = f"HTTP {status}: {doc.strip()}"
    cls = _class_for(code, status)
    if code is not None and code != cls.code:
        fields["code"] = code  # a code this client does not know
    fields["status"] = status
    if retry_after is not None:
        fields["retry_after"] = retry_after
    return cls(message, **fields)


_ERROR_KEYS = frozenset({"code", "message"})

# ------------------------------------------------------------------ bodies


def to_bytes(body: Body) -> bytes:
    """A body as bytes (``str`` as UTF-8)."""
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    raise TypeError(f"a body is bytes or str, not {type(body).__name__}")


# Bytes JSON writes as they are (it escapes control characters, '"' and '\\').
_UNESCAPED = bytes(b for b in range(0x20, 0x100) if b not in b'"\\')
_ESCAPES_CHECKED = 64 * 1024  # smaller bodies go as text whatever their escapes cost


def body_fields(body: Body, binary: bool) -> dict[str, Any]:
    """``{"body": …}``; in JSON, ``{"body_b64": …}`` for bytes that are not UTF-8, and for
    large text whose escapes would make it longer than base64 (4/3): a 64 MiB body of
    control characters would be 384 MiB of JSON, past the server's body limit."""
    raw = to_bytes(body)
    if binary:
        return {"body": raw}
    # an escape is at most 6 bytes: 5 more than the byte itself
    escapes = len(raw.translate(None, _UNESCAPED)) if len(raw) > _ESCAPES_CHECKED else 0
    if escapes * 15 <= len(raw):
        try:
            return {"body": raw.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {"body_b64": base64.b64encode(raw).decode("ascii")}


def _body_from(doc: Mapping[str, Any]) -> bytes:
    b64 = doc.get("body_b64")
    if b64 is not None:
        return base64.b64decode(b64, validate=True)
    body = doc.get("body")
    if body is None:
        return b""
    return to_bytes(body)


def message_from(doc: Any) -> Message:
    """A Message from its wire object (``body``/``body_b64``; null attributes → {})."""
    if not isinstance(doc, dict):
        raise TypeError("a message is an object")
    fields = {k: v for k, v in doc.items() if k != "body_b64"}
    fields["body"] = _body_from(doc)
    if fields.get("attributes") is None:
        fields.pop("attributes", None)
    return msgspec.convert(fields, Message)


def message_doc(message: Message, *, binary: bool = False) -> dict[str, Any]:
    """A Message as its wire object (the inverse of :func:`message_from`)."""
    doc = {k: v for k, v in msgspec.structs.asdict(message).items() if v is not None}
    del doc["body"]
    return {**doc, **body_fields(message.body, binary)}


# ------------------------------------------------------------------ builders


def _seg(value: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest("names, keys and ids are non-empty strings")
    return quote(value, safe=":")


def _queue(name: str) -> str:
    return "/v1/queues/" + _seg(name)


def _options(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _queue_info(_status: int, doc: Any) -> QueueInfo:
    return msgspec.convert(doc, QueueInfo)


def _nothing(_status: int, _doc: Any) -> None:
    return None


def _items(_status: int, doc: Any) -> list[ItemResult]:
    return msgspec.convert(doc["results"], list[ItemResult])


def _key_value(_status: int, doc: Any) -> KeyValue:
    return msgspec.convert(doc, KeyValue)


def create_queue(name: str, settings: Mapping[str, Any]) -> Call[QueueInfo]:
    """PUT /v1/queues/{name}: settings with None values left out (server defaults)."""
    return Call("PUT", _queue(name), _queue_info, _options(**settings))


def list_queues() -> Call[list[str]]:
    """GET /v1/queues."""
    return Call("GET", "/v1/queues", lambda _s, doc: msgspec.convert(doc["queues"], list[str]))


def get_queue(name: str) -> Call[QueueInfo]:
    """GET /v1/queues/{name}: settings and stats."""
    return Call("GET", _queue(name), _queue_info)


def queue_history(name: str) -> Call[list[dict[str, Any]]]:
    """GET /v1/queues/{name}/history: the counts a minute over the last hour, and now."""
    return Call("GET", _queue(name) + "/history", lambda _s, doc: list(doc["samples"]))


def update_queue(name: str, changes: Mapping[str, Any]) -> Call[QueueInfo]:
    """PATCH /v1/queues/{name}: exactly the given settings (None sends null)."""
    return Call("PATCH", _queue(name), _queue_info, dict(changes))


def delete_queue(name: str) -> Call[None]:
    """DELETE /v1/queues/{name}."""
    return Call("DELETE", _queue(name), _nothing, expect=frozenset({200, 204}))


def pause(name: str, paused: bool = True) -> Call[bool]:
    """POST /v1/queues/{name}/pause (or ``/resume``): whether the queue is paused now.
    Idempotent, so resent like a read."""
    verb = "/pause" if paused else "/resume"
    return Call("POST", _queue(name) + verb, lambda _s, doc: bool(doc["paused"]))


def purge(name: str) -> Call[int]:
    """POST /v1/queues/{name}/purge; resent only if surely not received."""
    return Call(
        "POST",
        _queue(name) + "/purge",
        lambda _s, doc: int(doc["purged"]),
        resend=Resend.IF_NOT_SENT,
    )


def random_key() -> str:
    """A fresh idempotency key (128 random bits)."""
    return "k-" + secrets.token_urlsafe(16)


def as_messages(
    messages: Body | NewMessage | Iterable[Body | NewMessage], defaults: Mapping[str, Any]
) -> list[NewMessage]:
    """Bodies and NewMessages as NewMessages; bare bodies take ``defaults``.

    Raises:
        BadRequest: no message, or an id / idempotency key in ``defaults`` for several.
    """
    if isinstance(messages, bytes | bytearray | memoryview | str | NewMessage):
        messages = [messages]
    items = list(messages)
    if not items:
        raise BadRequest("a put needs at least one message")
    if len(items) > 1 and (defaults.get("id") or defaults.get("idempotency_key")):
        raise BadRequest("id and idempotency_key name one message; use NewMessage for several")
    given = _options(**defaults)
    return [m if isinstance(m, NewMessage) else NewMessage(body=m, **given) for m in items]


def put(
    queue: str,
    messages: Sequence[NewMessage],
    *,
    binary: bool = False,
    auto_key: bool = True,
    new_key: Callable[[], str] = random_key,
) -> Call[list[PutResult]]:
    """POST …/messages; a message without an idempotency key gets one if ``auto_key``."""
    wire = []
    for m in messages:
        key = m.idempotency_key
        if key is None and auto_key:
            key = new_key()
        item = _options(
            id=m.id,
            delay=m.delay,
            activate_at=m.activate_at,
            idempotency_key=key,
            group=m.group,
            attributes=m.attributes,
        )
        wire.append({**body_fields(m.body, binary), **item})
    return Call(
        "POST",
        _queue(queue) + "/messages",
        lambda _s, doc: msgspec.convert(doc["results"], list[PutResult]),
        {"messages": wire},
    )


def take(
    queue: str, max: int = 1, wait: float | None = None, visibility_timeout: float | None = None
) -> Call[list[Message]]:
    """POST …/take; resent only if surely not received (a lost reply hides leased messages)."""
    payload = _options(max=max, wait=wait, visibility_timeout=visibility_timeout)
    return Call(
        "POST",
        _queue(queue) + "/take",
        lambda _s, doc: [message_from(m) for m in doc["messages"]],
        payload,
        resend=Resend.IF_NOT_SENT,
        hold=float(wait or 0),
    )


Receipt = Message | tuple[str, str]
"""What ack / release / touch accept: a taken Message, or an ``(id, lease)`` pair."""


def _receipt(item: Receipt) -> dict[str, str]:
    if isinstance(item, Message):
        if item.lease is None:
            raise BadRequest(f"message {item.id} has no lease (it was not taken)", id=item.id)
        return {"id": item.id, "lease": item.lease}
    mid, lease = item
    return {"id": mid, "lease": lease}


def _lease_call(queue: str, verb: str, items: Iterable[Receipt], **extra: Any) -> Call[Any]:
    more = _options(**extra)
    payload = {"items": [{**_receipt(i), **more} for i in items]}
    return Call("POST", f"{_queue(queue)}/{verb}", _items, payload)


def ack(queue: str, items: Iterable[Receipt]) -> Call[list[ItemResult]]:
    """POST …/ack."""
    return _lease_call(queue, "ack", items)


def release(
    queue: str,
    items: Iterable[Receipt],
    delay: float | None = None,
    activate_at: float | None = None,
    reason: str | None = None,
) -> Call[list[ItemResult]]:
    """POST …/release, each item with the same optional delay or activation time and
    reason."""
    return _lease_call(queue, "release", items, delay=delay, activate_at=activate_at, reason=reason)


def touch(
    queue: str, items: Iterable[Receipt], visibility_timeout: float | None = None
) -> Call[list[ItemResult]]:
    """POST …/touch, each item with the same optional new visibility timeout."""
    return _lease_call(queue, "touch", items, visibility_timeout=visibility_timeout)


def _message_path(queue: str, message_id: str) -> str:
    return f"{_queue(queue)}/messages/{_seg(message_id)}"


def get_message(queue: str, message_id: str) -> Call[Message]:
    """GET …/messages/{id}."""
    return Call("GET", _message_path(queue, message_id), lambda _s, doc: message_from(doc))


def browse(
    queue: str, state: str = "ready", limit: int = 100, after: str | None = None
) -> Call[MessagePage]:
    """GET …/messages?state=&limit=&after=: one page of a state's messages."""
    query = {"state": state, "limit": str(limit)}
    if after is not None:
        query["after"] = after
    return Call("GET", _queue(queue) + "/messages", _page, query=query)


def _page(_status: int, doc: Any) -> MessagePage:
    return MessagePage([message_from(m) for m in doc["messages"]], doc["next"])


def update_message(
    queue: str,
    message_id: str,
    *,
    body: Body | None = None,
    delay: float | None = None,
    activate_at: float | None = None,
    lease: str | None = None,
    binary: bool = False,
) -> Call[Message]:
    """PATCH …/messages/{id} with the given fields."""
    payload = _options(delay=delay, activate_at=activate_at, lease=lease)
    if body is not None:
        payload.update(body_fields(body, binary))
    return Call(
        "PATCH", _message_path(queue, message_id), lambda _s, doc: message_from(doc), payload
    )


def delete_message(
    queue: str, message_id: str, lease: str | None = None, force: bool = False
) -> Call[None]:
    """DELETE …/messages/{id}[?lease=…][?force=true]."""
    query = {"lease": lease} if lease is not None else {}
    if force:
        query["force"] = "true"
    return Call(
        "DELETE",
        _message_path(queue, message_id),
        _nothing,
        query=query or None,
        expect=frozenset({200, 204}),
    )


def set_key(key: str, value: Any) -> Call[int]:
    """PUT /v1/keys/{key}; answers the new version."""
    return Call(
        "PUT", "/v1/keys/" + _seg(key), lambda _s, doc: int(doc["version"]), {"value": value}
    )


def get_key(key: str) -> Call[KeyValue]:
    """GET /v1/keys/{key}."""
    return Call("GET", "/v1/keys/" + _seg(key), _key_value)


def watch(key: str, version: int = 0, wait: float = 30.0) -> Call[KeyValue | None]:
    """GET /v1/watch/{key}?timeout=wait: the state once past ``version``, None on 204."""
    query = {"version": str(int(version)), "timeout": _number(wait)}
    return Call(
        "GET",
        "/v1/watch/" + _seg(key),
        lambda status, doc: None if status == 204 else _key_value(status, doc),
        query=query,
        expect=frozenset({200, 204}),
        hold=float(wait),
    )


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def shards() -> Call[dict[str, Any]]:
    """GET /v1/admin/shards."""
    return Call("GET", "/v1/admin/shards", lambda _s, doc: dict(doc))


def resize_shards(count: int) -> Call[str]:
    """POST /v1/admin/shards: the resize task's id. Resent only if surely not received (a
    second resize while the first runs is refused 409)."""
    return Call(
        "POST",
        "/v1/admin/shards",
        lambda _s, doc: str(doc["task"]),
        {"count": count},
        resend=Resend.IF_NOT_SENT,
        expect=frozenset({202}),
    )


def restart_shards() -> Call[str]:
    """POST /v1/admin/shards/restart: the rolling restart's task id."""
    return Call(
        "POST",
        "/v1/admin/shards/restart",
        lambda _s, doc: str(doc["task"]),
        resend=Resend.IF_NOT_SENT,
        expect=frozenset({202}),
    )


def redrive(
    queue: str, to: str | None = None, rate: int | None = None, ids: Sequence[str] | None = None
) -> Call[str]:
    """POST /v1/queues/{name}/redrive: the redrive task's id. Resent only if surely not
    received (a second redrive of the queue while the first runs is refused 409)."""
    doc: dict[str, Any] = {}
    if to is not None:
        doc["to"] = to
    if rate is not None:
        doc["rate"] = rate
    if ids is not None:
        doc["ids"] = list(ids)
    return Call(
        "POST",
        _queue(queue) + "/redrive",
        lambda _s, doc: str(doc["task"]),
        doc,
        resend=Resend.IF_NOT_SENT,
        expect=frozenset({202}),
    )


def tasks() -> Call[list[dict[str, Any]]]:
    """GET /v1/tasks."""
    return Call("GET", "/v1/tasks", lambda _s, doc: [dict(t) for t in doc["tasks"]])


def task(task_id: str) -> Call[dict[str, Any]]:
    """GET /v1/tasks/{id}."""
    return Call("GET", f"/v1/tasks/{quote(task_id, safe='')}", lambda _s, doc: dict(doc))


def cancel_task(task_id: str) -> Call[dict[str, Any]]:
    """DELETE /v1/tasks/{id}."""
    return Call("DELETE", f"/v1/tasks/{quote(task_id, safe='')}", lambda _s, doc: dict(doc))


def health() -> Call[bool]:
    """GET /healthz."""
    return Call("GET", "/healthz", lambda _s, _doc: True)


def ready() -> Call[bool]:
    """GET /readyz: True when ready, False while recovering (503)."""
    return Call("GET", "/readyz", lambda status, _doc: status == 200, expect=frozenset({200, 503}))
