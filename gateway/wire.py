"""The native API's bodies ⇄ engine commands and replies (WIRE.md). Pure: no I/O.

Requests are decoded with msgspec into the structs below (unknown fields are an error), then
converted to commands with seconds turned into milliseconds and bodies into bytes. Replies
are turned into plain documents the handlers encode as JSON or msgpack.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import msgspec

from actors.core import commands as cmd
from actors.core import replies as rp
from actors.errors import BadRequest
from actors.keyspace import queue_value
from actors.settings import QueueSettings

__all__ = [
    "AckIn",
    "MessageIn",
    "MessagePatchIn",
    "PutIn",
    "QueueSettingsIn",
    "ReleaseIn",
    "TakeIn",
    "TouchIn",
    "decode",
    "delivery_doc",
    "description_doc",
    "settings_doc",
    "view_doc",
]

UNSET = msgspec.UNSET
MAX_WAIT_S = 300.0


class _In(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class MessageIn(_In):
    body: Any = None  # str (JSON, or msgpack str) or bytes (msgpack bin)
    body_b64: bytes | None = None  # base64 in JSON
    id: str | None = None
    delay: float | None = None
    activate_at: float | None = None
    idempotency_key: str | None = None
    group: str | None = None
    attributes: dict[str, str] | None = None


class PutIn(_In):
    messages: list[MessageIn]


class TakeIn(_In):
    max: int = 1
    wait: float = 0.0
    visibility_timeout: float | None = None


class LeaseIn(_In):
    id: str
    lease: str


class AckIn(_In):
    items: list[LeaseIn]


class ReleaseItemIn(_In):
    id: str
    lease: str
    delay: float | None = None
    activate_at: float | None = None
    reason: str | None = None


class ReleaseIn(_In):
    items: list[ReleaseItemIn]


class TouchItemIn(_In):
    id: str
    lease: str
    visibility_timeout: float | None = None


class TouchIn(_In):
    items: list[TouchItemIn]


class MessagePatchIn(_In):
    body: Any = None
    body_b64: bytes | None = None
    delay: float | None = None
    activate_at: float | None = None
    lease: str | None = None


class QueueSettingsIn(_In):
    id_mode: str | msgspec.UnsetType = UNSET
    visibility_timeout: float | msgspec.UnsetType = UNSET
    max_receives: int | msgspec.UnsetType | None = UNSET
    dead_letter_queue: str | msgspec.UnsetType | None = UNSET
    retention: float | msgspec.UnsetType = UNSET
    max_message_bytes: int | msgspec.UnsetType = UNSET
    fifo: bool | msgspec.UnsetType = UNSET
    delay: float | msgspec.UnsetType = UNSET
    idempotency_window: float | msgspec.UnsetType = UNSET
    content_based_dedup: bool | msgspec.UnsetType = UNSET
    max_messages: int | msgspec.UnsetType | None = UNSET
    take_rate: int | msgspec.UnsetType | None = UNSET
    put_rate: int | msgspec.UnsetType | None = UNSET
    max_in_flight: int | msgspec.UnsetType | None = UNSET
    fair: bool | msgspec.UnsetType = UNSET


class KeyIn(_In):
    value: Any


_json_decoders: dict[type, msgspec.json.Decoder[Any]] = {}
_msgpack_decoders: dict[type, msgspec.msgpack.Decoder[Any]] = {}


def decode(data: bytes, type_: type[Any], *, msgpack: bool = False) -> Any:
    """Decode a request body into ``type_``.

    Raises:
        BadRequest: malformed, wrong types, unknown fields.
    """
    decoder: msgspec.msgpack.Decoder[Any] | msgspec.json.Decoder[Any] | None
    if msgpack:
        decoder = _msgpack_decoders.get(type_)
        if decoder is None:
            decoder = _msgpack_decoders[type_] = msgspec.msgpack.Decoder(type_)
    else:
        decoder = _json_decoders.get(type_)
        if decoder is None:
            decoder = _json_decoders[type_] = msgspec.json.Decoder(type_)
    if not data:
        data = b"\x80" if msgpack else b"{}"
    try:
        return decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"invalid request body: {exc}") from None


# ------------------------------------------------------------------ units


def ms(seconds: float | None, what: str) -> int | None:
    """Seconds (from the API) as integer milliseconds.

    Raises:
        BadRequest: not a finite number, or one past any time in milliseconds.
    """
    if seconds is None:
        return None
    kind = type(seconds)
    if (kind is float or kind is int) and -1e15 < seconds < 1e15:  # finite (not NaN): most
        return round(seconds * 1000)
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
    ):
        raise BadRequest(f"{what} must be a number of seconds")
    millis = seconds * 1000
    if not math.isfinite(millis):  # finite seconds, too many to count in milliseconds
        raise BadRequest(f"{what} is out of range")
    return round(millis)


def secs(millis: int | None) -> float | None:
    """Milliseconds as seconds for the API."""
    return None if millis is None else millis / 1000


def body_bytes(body: Any, body_b64: bytes | None, *, required: bool = True) -> bytes | None:
    """A message body from ``body`` or ``body_b64``.

    Raises:
        BadRequest: both or (when required) neither given, or the wrong type.
    """
    if body is not None and body_b64 is not None:
        raise BadRequest("give either body or body_b64, not both")
    if body_b64 is not None:
        return body_b64
    if body is None:
        if required:
            raise BadRequest("a message needs a body (or body_b64)")
        return None
    if isinstance(body, str):
        return body.encode("utf-8", "surrogatepass")
    if isinstance(body, bytes):
        return body
    raise BadRequest("body must be a string (or bytes in msgpack)")


def _body_doc(doc: dict[str, Any], body: bytes, *, binary: bool) -> None:
    if binary:
        doc["body"] = body
        return
    try:
        doc["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        doc["body_b64"] = base64.b64encode(body).decode("ascii")


# ------------------------------------------------------------------ requests → commands


def put_command(req: PutIn) -> cmd.Put:
    """The Put command for a request.

    Raises:
        BadRequest: a message is malformed.
    """
    return cmd.Put([_new_message(m) for m in req.messages])


def _new_message(m: MessageIn) -> cmd.NewMessage:
    body, b64 = m.body, m.body_b64
    if (
        m.id is None
        and m.idempotency_key is None
        and m.group is None
        and m.attributes is None
        and m.activate_at is None
        and (b64 is None) != (body is None)
    ):  # a body (and perhaps a delay), most puts' every message: fewer conversions
        if b64 is not None:
            data = b64
        elif type(body) is str:
            data = body.encode("utf-8", "surrogatepass")
        else:
            data = body_bytes(body, None)  # type: ignore[assignment]  # bytes, or raises
        if m.delay is None:
            return cmd.NewMessage(body=data)
        return cmd.NewMessage(body=data, delay_ms=ms(m.delay, "delay"))
    return cmd.NewMessage(
        body=body_bytes(body, b64),  # type: ignore[arg-type]
        id=m.id,
        delay_ms=ms(m.delay, "delay"),
        activate_at_ms=ms(m.activate_at, "activate_at"),
        idempotency_key=m.idempotency_key,
        group=m.group,
        attributes=m.attributes,
    )


def take_command(req: TakeIn) -> tuple[cmd.Take, float]:
    """The Take command and how long to wait.

    Raises:
        BadRequest: wait out of 0..300, bad visibility timeout.
    """
    if isinstance(req.wait, bool) or not 0 <= req.wait <= MAX_WAIT_S:
        raise BadRequest(f"wait must be 0-{MAX_WAIT_S:g} seconds")
    return cmd.Take(req.max, ms(req.visibility_timeout, "visibility_timeout")), float(req.wait)


def ack_command(req: AckIn) -> cmd.Ack:
    """The Ack command."""
    return cmd.Ack([cmd.LeaseRef(i.id, i.lease) for i in req.items])


def release_command(req: ReleaseIn) -> cmd.Release:
    """The Release command. Raises: BadRequest."""
    return cmd.Release(
        [
            cmd.ReleaseItem(
                id=i.id,
                lease=i.lease,
                delay_ms=ms(i.delay, "delay"),
                activate_at_ms=ms(i.activate_at, "activate_at"),
                reason=i.reason,
            )
            for i in req.items
        ]
    )


def touch_command(req: TouchIn) -> cmd.Touch:
    """The Touch command. Raises: BadRequest."""
    return cmd.Touch(
        [
            cmd.TouchItem(
                id=i.id,
                lease=i.lease,
                visibility_timeout_ms=ms(i.visibility_timeout, "visibility_timeout"),
            )
            for i in req.items
        ]
    )


def update_command(mid: str, req: MessagePatchIn) -> cmd.Update:
    """The Update command for a message PATCH. Raises: BadRequest."""
    return cmd.Update(
        id=mid,
        lease=req.lease,
        body=body_bytes(req.body, req.body_b64, required=False),
        delay_ms=ms(req.delay, "delay"),
        activate_at_ms=ms(req.activate_at, "activate_at"),
    )


_SECONDS = {
    "visibility_timeout": "visibility_timeout_ms",
    "retention": "retention_ms",
    "delay": "delay_ms",
    "idempotency_window": "idempotency_window_ms",
}


def settings_changes(req: QueueSettingsIn) -> dict[str, Any]:
    """The settings a request names, in QueueSettings' terms (ms).

    Raises:
        BadRequest: a duration is not a number.
    """
    changes: dict[str, Any] = {}
    for field in req.__struct_fields__:
        value = getattr(req, field)
        if value is UNSET:
            continue
        if field in _SECONDS:
            changes[_SECONDS[field]] = ms(value, field)
        else:
            changes[field] = value
    return changes


def new_settings(name: str, req: QueueSettingsIn) -> tuple[QueueSettings, list[str]]:
    """Settings for a new queue and the names of those the request gave.

    Raises:
        BadRequest: a setting is invalid.
    """
    changes = settings_changes(req)
    changes.setdefault("fifo", name.endswith(".fifo"))
    base = msgspec.structs.asdict(QueueSettings())
    merged = {**base, **changes}
    try:
        settings = msgspec.convert(
            [merged[f] for f in QueueSettings.__struct_fields__], QueueSettings
        )
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid settings: {exc}") from None
    return settings.validate(name), [f for f in changes if f != "fifo" or req.fifo is not UNSET]


# ------------------------------------------------------------------ replies → documents


def settings_doc(s: QueueSettings) -> dict[str, Any]:
    """Settings as the API shows them (seconds)."""
    return {
        "id_mode": s.id_mode,
        "visibility_timeout": secs(s.visibility_timeout_ms),
        "max_receives": s.max_receives,
        "dead_letter_queue": s.dead_letter_queue,
        "retention": secs(s.retention_ms),
        "max_message_bytes": s.max_message_bytes,
        "fifo": s.fifo,
        "delay": secs(s.delay_ms),
        "idempotency_window": secs(s.idempotency_window_ms),
        "content_based_dedup": s.content_based_dedup,
        "max_messages": s.max_messages,
        "take_rate": s.take_rate,
        "put_rate": s.put_rate,
        "max_in_flight": s.max_in_flight,
        "fair": s.fair,
    }


def stats_doc(s: rp.StatsView) -> dict[str, Any]:
    """Queue stats as the API shows them (also the value of the queue's ``queue:`` key)."""
    return queue_value(s)


def description_doc(d: rp.Description) -> dict[str, Any]:
    """GET /v1/queues/{name}."""
    return {"name": d.name, "settings": settings_doc(d.settings), "stats": stats_doc(d.stats)}


def delivery_doc(d: rp.Delivery, *, binary: bool) -> dict[str, Any]:
    """One message handed out by take."""
    doc: dict[str, Any] = {"id": d.id}
    _body_doc(doc, d.body, binary=binary)
    doc.update(
        activate_at=secs(d.activate_at_ms),
        enqueued_at=secs(d.enqueued_at_ms),
        receive_count=d.receive_count,
        lease=d.lease,
        lease_expires_at=secs(d.lease_expires_at_ms),
        attributes=shown_attributes(d.attributes),
        first_received_at=secs(d.first_taken_ms),
    )
    if d.group is not None:
        doc["group"] = d.group
    return doc


def view_doc(v: rp.MessageView, *, binary: bool) -> dict[str, Any]:
    """GET / PATCH of one message."""
    doc: dict[str, Any] = {"id": v.id, "state": v.state}
    _body_doc(doc, v.body, binary=binary)
    doc.update(
        activate_at=secs(v.activate_at_ms),
        enqueued_at=secs(v.enqueued_at_ms),
        receive_count=v.receive_count,
        lease_expires_at=secs(v.lease_expires_at_ms),
        attributes=shown_attributes(v.attributes),
        group=v.group,
        failures=failures_doc(v.attributes),
    )
    return doc


def shown_attributes(attributes: dict[str, Any] | None) -> dict[str, Any]:
    """A message's attributes as clients see them: its failures are shown apart."""
    if not attributes:
        return {}
    if cmd.FAILURES not in attributes:
        return attributes
    return {k: v for k, v in attributes.items() if k != cmd.FAILURES}


def failures_doc(attributes: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A message's last failures (``ReleaseItem.reason``), oldest first."""
    kept = (attributes or {}).get(cmd.FAILURES)
    if not isinstance(kept, list):
        return []
    return [
        {"at": secs(f[0]), "reason": f[1]}
        for f in kept
        if isinstance(f, list) and len(f) == 2 and isinstance(f[0], int)
    ]


def item_doc(r: rp.ItemResult) -> dict[str, Any]:
    """One result of ack / release / touch."""
    doc: dict[str, Any] = {"id": r.id, "status": r.status}
    if r.lease_expires_at_ms is not None:
        doc["lease_expires_at"] = secs(r.lease_expires_at_ms)
    return doc
