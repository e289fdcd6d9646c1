"""Message bodies, message attributes and system attributes, as SQS checks and shows them. Pure.

Stored form (the engine's ``attributes`` map, shared with the native API): a ``String``
attribute is its plain string, so the native API sees ``{"name": "value"}``; any other type
is ``{"DataType": …, "StringValue": …}`` or ``{"DataType": …, "BinaryValue": bytes}``. What
the SQS API keeps for itself (a FIFO message's deduplication id, the X-Ray trace header)
is stored under ``evq.sqs.`` names and never shown as a message attribute.

Three message attributes are evq extensions, read on send and not stored: ``evq.DelaySeconds``
(Number: a delay past SQS's 15 minutes), ``evq.ActivateAt`` (Number: a Unix time, may be
in the past to jump the line) and ``evq.IdempotencyKey`` (String: deduplication on any
queue, within the queue's window).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

from actors.core.commands import FAILURES, PROVENANCE
from gateway.sqs.errors import SqsError, invalid
from gateway.sqs.md5 import Attribute
from gateway.sqs.wire import decode_binary

__all__ = [
    "DEDUP_ID",
    "EXTENSIONS",
    "TRACE",
    "Extensions",
    "check_text",
    "parse_attributes",
    "parse_system_attributes",
    "request_size",
    "shown_attributes",
    "size_of",
    "stored",
    "system_attribute_names",
    "to_wire",
]

MAX_ATTRIBUTES = 10
HIDDEN = "evq.sqs."
DEDUP_ID = HIDDEN + "dedup_id"
TRACE = HIDDEN + "trace"
EXT_DELAY, EXT_ACTIVATE, EXT_KEY = "evq.DelaySeconds", "evq.ActivateAt", "evq.IdempotencyKey"
EXTENSIONS = (EXT_DELAY, EXT_ACTIVATE, EXT_KEY)
SYSTEM_NAMES = (
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "SequenceNumber",
    "MessageDeduplicationId",
    "MessageGroupId",
    "AWSTraceHeader",
    "DeadLetterQueueSourceArn",
)

_INVALID_CHARS = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_BASE_TYPES = ("String", "Number", "Binary")


def check_text(text: str, what: str) -> None:
    """Only the characters SQS allows in bodies and string values.

    Raises:
        SqsError: InvalidMessageContents.
    """
    if _INVALID_CHARS.search(text):
        raise SqsError(
            "InvalidMessageContents",
            f"Invalid characters found in {what}. Valid unicode characters are #x9 | #xA | "
            "#xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF",
        )


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise invalid(
            f"The message attribute name '{name[:300]}' is invalid. Attribute name can contain "
            "A-Z, a-z, 0-9, underscore (_), hyphen (-), and period (.) characters."
        )
    if name.startswith(".") or name.endswith(".") or ".." in name:
        raise invalid(
            f"The message attribute name '{name}' is invalid. Attribute name cannot start or "
            "end with a period (.), or have periods in succession (..)."
        )
    reserved = name.lower().startswith(("aws.", "amazon."))
    if reserved or (name.startswith("evq.") and name not in EXTENSIONS):
        raise invalid(
            f"The message attribute name '{name}' is invalid. Attribute names starting with "
            "'AWS.', 'Amazon.' or 'evq.' are reserved."
        )


def _check_value(name: str, data_type: str, raw: Mapping[str, Any]) -> str | bytes:
    if (
        not isinstance(data_type, str)
        or len(data_type) > 256
        or data_type.partition(".")[0] not in _BASE_TYPES
    ):
        raise invalid(
            f"The message attribute '{name}' has an invalid message attribute type, the set "
            "of supported type prefixes is Binary, Number, and String."
        )
    if data_type.startswith("Binary"):
        value = raw.get("BinaryValue")
        data = b"" if value is None else decode_binary(value, f"MessageAttribute {name}")
        if not data:
            raise _empty_value(name, data_type)
        return data
    text = raw.get("StringValue")
    if not isinstance(text, str) or not text:
        raise _empty_value(name, data_type)
    check_text(text, f"message attribute {name}")
    if data_type.startswith("Number"):
        digits = sum(c.isdigit() for c in text.partition("e")[0].partition("E")[0])
        if not _NUMBER.fullmatch(text) or digits > 38:
            raise invalid(
                f"Can't convert {text[:100]!r} of message attribute '{name}' to a number."
            )
    return text


def _empty_value(name: str, data_type: str) -> SqsError:
    return invalid(
        f"Message (user) attribute '{name}' must contain a non-empty value of type '{data_type}'."
    )


def parse_attributes(raw: Mapping[str, Any]) -> dict[str, Attribute]:
    """Message attributes of a send, checked: name → (data type, value).

    Raises:
        SqsError: InvalidParameterValue, InvalidMessageContents.
    """
    if len(raw) > MAX_ATTRIBUTES:
        raise invalid(
            f"Number of message attributes [{len(raw)}] exceeds the allowed maximum "
            f"[{MAX_ATTRIBUTES}]."
        )
    parsed: dict[str, Attribute] = {}
    for name, value in raw.items():
        _check_name(name)
        if not isinstance(value, Mapping):
            raise invalid(f"The message attribute '{name}' must be a structure.")
        data_type = value.get("DataType")
        if data_type is None:
            raise invalid(f"The message attribute '{name}' must contain a DataType.")
        parsed[name] = (data_type, _check_value(name, data_type, value))
    return parsed


def parse_system_attributes(raw: Mapping[str, Any]) -> dict[str, Attribute]:
    """Message system attributes of a send (only ``AWSTraceHeader`` exists).

    Raises:
        SqsError: InvalidParameterValue.
    """
    parsed: dict[str, Attribute] = {}
    for name, value in raw.items():
        if name != "AWSTraceHeader":
            raise invalid(f"Message system attribute name '{name[:100]}' is invalid.")
        if not isinstance(value, Mapping) or value.get("DataType") != "String":
            raise invalid("Message system attribute AWSTraceHeader must be of type String.")
        parsed[name] = ("String", _check_value(name, "String", value))
    return parsed


def request_size(body: object, attributes: object) -> int:
    """A message's size as SQS counts it, from its parameters as sent (before any check:
    what is malformed counts as far as it can be read)."""
    size = _text_size(body)
    if isinstance(attributes, Mapping):
        for name, value in attributes.items():
            size += _text_size(name)
            if isinstance(value, Mapping):
                size += _text_size(value.get("DataType")) + _text_size(value.get("StringValue"))
                size += _binary_size(value.get("BinaryValue"))
    return size


def _text_size(text: object) -> int:
    return len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else 0


def _binary_size(value: object) -> int:
    try:
        return len(decode_binary(value, "BinaryValue")) if value is not None else 0
    except SqsError:
        return _text_size(value)


def size_of(body: str, attributes: Mapping[str, Attribute]) -> int:
    """A message's size as SQS counts it: body, and names, types and values of attributes."""
    size = len(body.encode("utf-8", "surrogatepass"))
    for name, (data_type, value) in attributes.items():
        raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
        size += len(name.encode()) + len(data_type.encode()) + len(raw)
    return size


class Extensions:
    """The evq extension attributes of one send."""

    __slots__ = ("activate_at_ms", "delay_ms", "idempotency_key")

    def __init__(self, attributes: Mapping[str, Attribute]) -> None:
        self.delay_ms = self._seconds(attributes, EXT_DELAY, low=0)
        self.activate_at_ms = self._seconds(attributes, EXT_ACTIVATE, low=None)
        if self.delay_ms is not None and self.activate_at_ms is not None:
            raise invalid(f"Give either {EXT_DELAY} or {EXT_ACTIVATE}, not both.")
        key = attributes.get(EXT_KEY)
        if key is not None and (not key[0].startswith("String") or len(key[1]) > 256):
            raise invalid(f"{EXT_KEY} must be a String of at most 256 characters.")
        self.idempotency_key = None if key is None else str(key[1])

    @staticmethod
    def _seconds(attributes: Mapping[str, Attribute], name: str, low: int | None) -> int | None:
        entry = attributes.get(name)
        if entry is None:
            return None
        data_type, value = entry
        if not data_type.startswith("Number"):
            raise invalid(f"{name} must be of type Number.")
        seconds = float(value)
        if not abs(seconds) < 1e12 or (low is not None and seconds < low):
            raise invalid(f"{name} is out of range.")
        return round(seconds * 1000)


def stored(attributes: Mapping[str, Attribute]) -> dict[str, Any]:
    """Attributes in the engine's form, extensions left out."""
    out: dict[str, Any] = {}
    for name, (data_type, value) in attributes.items():
        if name in EXTENSIONS:
            continue
        if data_type == "String":
            out[name] = value
        elif isinstance(value, bytes):
            out[name] = {"DataType": data_type, "BinaryValue": value}
        else:
            out[name] = {"DataType": data_type, "StringValue": value}
    return out


def _from_stored(value: Any) -> Attribute:
    if isinstance(value, str):
        return ("String", value)
    if isinstance(value, Mapping) and isinstance(value.get("DataType"), str):
        binary = value.get("BinaryValue")
        if isinstance(binary, bytes):
            return (value["DataType"], binary)
        text = value.get("StringValue")
        if isinstance(text, str):
            return (value["DataType"], text)
    return ("String", str(value))


def _wanted(name: str, patterns: list[str]) -> bool:
    """Whether ``MessageAttributeNames`` ask for ``name``: ``All``, ``*`` and ``.*`` ask for
    every one, ``prefix.*`` for the names that start with ``prefix`` (as SQS answers:
    ``Hel.*`` gives ``Hello`` and ``Help.Me``), any other pattern for itself."""
    for pattern in patterns:
        if pattern in ("All", "*", ".*") or pattern == name:
            return True
        if pattern.endswith(".*") and name.startswith(pattern[:-2]):
            return True
    return False


def shown_attributes(
    stored_attrs: Mapping[str, Any] | None, patterns: list[str]
) -> dict[str, Attribute]:
    """The message attributes a receive shows for ``MessageAttributeNames`` patterns."""
    if not stored_attrs or not patterns:
        return {}
    return {
        name: _from_stored(value)
        for name, value in stored_attrs.items()
        if not name.startswith(HIDDEN)
        and name not in PROVENANCE
        and name != FAILURES
        and _wanted(name, patterns)
    }


def to_wire(attributes: Mapping[str, Attribute]) -> dict[str, dict[str, str]]:
    """Attributes in the JSON shape (binary values in base64)."""
    out = {}
    for name, (data_type, value) in attributes.items():
        if isinstance(value, bytes):
            out[name] = {"DataType": data_type, "BinaryValue": base64.b64encode(value).decode()}
        else:
            out[name] = {"DataType": data_type, "StringValue": value}
    return out


def system_attribute_names(names: list[str]) -> list[str]:
    """The system attributes a receive asks for ("All" is every one). Other names are
    ignored, as SQS does (clients ask for queue attributes here too)."""
    wanted: list[str] = []
    for name in names:
        if name == "All":
            wanted.extend(SYSTEM_NAMES)
        elif name in SYSTEM_NAMES:
            wanted.append(name)
    return list(dict.fromkeys(wanted))
