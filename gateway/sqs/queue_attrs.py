"""Queue attributes ⇄ queue settings. Pure.

SQS attributes that the engine implements map onto :class:`~actors.settings.QueueSettings`
fields (``VisibilityTimeout`` → ``visibility_timeout_ms``, ``RedrivePolicy`` →
``dead_letter_queue`` + ``max_receives``, …), with SQS's ranges. Those it does not
interpret (``ReceiveMessageWaitTimeSeconds``, which the gateway applies, ``Policy``, the KMS
ones, …), the tags and the creation time live in ``QueueSettings.meta`` under ``sqs.``
keys (tags: tags.py; URLs and ARNs: addresses.py). ``evq.*`` attributes are evq's
extensions past SQS's limits (README.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from actors.core.replies import Description
from actors.settings import (
    MAX_IDEMPOTENCY_WINDOW_MS,
    MAX_MESSAGE_BYTES_LIMIT,
    MAX_RETENTION_MS,
    QueueSettings,
)
from gateway.sqs.addresses import arn, name_of_arn
from gateway.sqs.errors import SqsError, invalid, invalid_attribute_name

__all__ = [
    "Changes",
    "attributes_view",
    "changes_for",
    "differing",
    "new_settings",
    "patched_meta",
    "wait_seconds_of",
]

SQS_MAX_MESSAGE_BYTES = 1_048_576
SQS_DEDUP_WINDOW_MS = 300_000
MAX_TAGS = 50

CREATED, MODIFIED, TAG, ATTR = "sqs.created", "sqs.modified", "sqs.tag:", "sqs.attr:"
PURGED = "sqs.purged"  # when the last PurgeQueue started, in ms (not a queue attribute)
PURGE_INTERVAL_MS = 60_000  # SQS: one purge per queue in 60 s

# name → (settings field, low, high, unit in ms or bytes)
_ENGINE: dict[str, tuple[str, int, int, int]] = {
    "DelaySeconds": ("delay_ms", 0, 900, 1000),
    "MaximumMessageSize": ("max_message_bytes", 1024, SQS_MAX_MESSAGE_BYTES, 1),
    "MessageRetentionPeriod": ("retention_ms", 60, 1_209_600, 1000),
    "VisibilityTimeout": ("visibility_timeout_ms", 0, 43_200, 1000),
    "evq.DelaySeconds": ("delay_ms", 0, MAX_RETENTION_MS // 1000, 1000),
    "evq.MaximumMessageSize": ("max_message_bytes", 1024, MAX_MESSAGE_BYTES_LIMIT, 1),
    "evq.MessageRetentionPeriod": ("retention_ms", 60, MAX_RETENTION_MS // 1000, 1000),
    "evq.DeduplicationWindowSeconds": (
        "idempotency_window_ms",
        0,
        MAX_IDEMPOTENCY_WINDOW_MS // 1000,
        1000,
    ),
}
_FIFO_ONLY = {"ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"}
_REMOVABLE = {"Policy", "RedriveAllowPolicy", "KmsMasterKeyId"}  # "" removes them
# SQS's words for queue names it refuses.
STANDARD_NAME_RULE = (
    "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
)
FIFO_NAME_RULE = (
    "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
    "underscores, must end with .fifo suffix and be 1 to 80 in length."
)
_READ_ONLY = {
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
}
# What GetQueueAttributes "All" shows, in this order (FIFO ones only on FIFO queues).
_ALL = [
    "QueueArn",
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "VisibilityTimeout",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "DelaySeconds",
    "ReceiveMessageWaitTimeSeconds",
    "RedrivePolicy",
    "RedriveAllowPolicy",
    "Policy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "SqsManagedSseEnabled",
    "FifoQueue",
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
]
_EXTENSIONS = [name for name in _ENGINE if name.startswith("evq.")]


def bad_value(name: str, reason: str) -> SqsError:
    """InvalidAttributeValue."""
    return SqsError(
        "InvalidAttributeValue", f"Invalid value for the parameter {name}. Reason: {reason}"
    )


# ------------------------------------------------------------------ attributes → settings


class Changes:
    """What some queue attributes change: settings fields, meta entries (None = remove),
    and the dead-letter queue they name (the caller checks it exists)."""

    __slots__ = ("account", "dead_letter_queue", "fields", "meta", "sources")

    def __init__(self, account: str) -> None:
        self.account = account  # the account of the ARNs they may name
        self.fields: dict[str, Any] = {}
        self.meta: dict[str, str | None] = {}
        self.dead_letter_queue: str | None = None
        self.sources: dict[str, list[str]] = {}  # attribute → the fields it sets

    def set_fields(self, attribute: str, **fields: Any) -> None:
        """Settings fields that ``attribute`` sets."""
        self.fields.update(fields)
        self.sources.setdefault(attribute, []).extend(fields)


def changes_for(
    attributes: Mapping[str, str], *, fifo: bool, creating: bool, account: str
) -> Changes:
    """The changes ``attributes`` ask of a queue (``account``: the server's, which ARNs
    in them must name).

    Raises:
        SqsError: InvalidAttributeName (unknown, read-only, or FIFO-only on a standard
            queue), InvalidAttributeValue, InvalidParameterValue.
    """
    changes = Changes(account)
    for name, value in attributes.items():
        if not isinstance(value, str):
            raise bad_value(name, "must be a string")
        _change(changes, name, value, fifo=fifo, creating=creating)
    return changes


def _change(changes: Changes, name: str, value: str, *, fifo: bool, creating: bool) -> None:
    if name in _ENGINE:
        field, low, high, unit = _ENGINE[name]
        changes.set_fields(name, **{field: _int(name, value, low, high) * unit})
    elif name == "FifoQueue":
        _fifo_queue(value, fifo=fifo, creating=creating)
    elif name in _FIFO_ONLY and not fifo:
        if name == "ContentBasedDeduplication":
            raise invalid_attribute_name(name)
        raise SqsError(
            "InvalidAttributeName",
            f"You can specify the {name} only when FifoQueue is set to true.",
        )
    elif name in _STORED:
        removed = not value and name in _REMOVABLE  # SQS: "" removes these
        changes.meta[ATTR + name] = None if removed else _STORED[name](name, value)
    elif name == "RedrivePolicy":
        _redrive(changes, value)
    elif name == "ContentBasedDeduplication":
        changes.set_fields(name, content_based_dedup=_bool(name, value))
    else:
        raise invalid_attribute_name(name)


def _fifo_queue(value: str, *, fifo: bool, creating: bool) -> None:
    """``FifoQueue`` names the type a queue has: only ``true``, only on FIFO queues (and
    on creation, where ``true`` needs a FIFO queue's name)."""
    true = value.lower() == "true"
    if not fifo:
        if creating and true:
            raise invalid(FIFO_NAME_RULE)
        raise invalid_attribute_name("FifoQueue")
    if not true:
        raise bad_value("FifoQueue", "Modifying queue type is not supported.")


def differing(changes: Changes, actual: QueueSettings) -> list[str]:
    """The attributes of ``changes`` whose values ``actual`` (an existing queue) does not
    have, in the order they were given."""
    names = [
        attribute
        for attribute, fields in changes.sources.items()
        if any(getattr(actual, f) != changes.fields[f] for f in fields)
    ]
    meta = actual.meta or {}
    names += [k.removeprefix(ATTR) for k, v in changes.meta.items() if meta.get(k) != v]
    return names


def _int(name: str, value: str, low: int, high: int) -> int:
    text = value.strip()
    if not text.lstrip("+-").isdigit() or len(text) > 20 or not low <= int(text) <= high:
        raise bad_value(name, f"must be an integer between {low} and {high}")
    return int(text)


def _bool(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise bad_value(name, "must be true or false")
    return value.lower() == "true"


def _redrive(changes: Changes, value: str) -> None:
    if not value:  # SQS: an empty policy removes the dead-letter queue
        changes.set_fields("RedrivePolicy", dead_letter_queue=None, max_receives=None)
        return
    policy = _json_object("RedrivePolicy", value)
    target = name_of_arn(policy.get("deadLetterTargetArn"), changes.account)
    count = policy.get("maxReceiveCount")
    if isinstance(count, str):
        count = _int("RedrivePolicy", count, 1, 1000)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
        raise bad_value("RedrivePolicy", "maxReceiveCount must be an integer between 1 and 1000")
    changes.set_fields("RedrivePolicy", dead_letter_queue=target, max_receives=count)
    changes.dead_letter_queue = target


def _json_object(name: str, value: str) -> dict[str, Any]:
    try:
        doc = json.loads(value)
    except ValueError:
        raise bad_value(name, "must be a JSON object") from None
    if not isinstance(doc, dict):
        raise bad_value(name, "must be a JSON object")
    return doc


def _stored_json(name: str, value: str) -> str:
    _json_object(name, value)
    return value


def _stored_redrive_allow(name: str, value: str) -> str:
    permission = _json_object(name, value).get("redrivePermission")
    if permission not in ("allowAll", "denyAll", "byQueue"):
        raise bad_value(name, "redrivePermission must be allowAll, denyAll or byQueue")
    return value


def _choice(*options: str) -> Callable[[str, str], str]:
    def check(name: str, value: str) -> str:
        if value not in options:
            raise bad_value(name, f"must be one of {', '.join(options)}")
        return value

    return check


def _ranged(low: int, high: int) -> Callable[[str, str], str]:
    return lambda name, value: str(_int(name, value, low, high))


def _text(name: str, value: str) -> str:
    if len(value) > 2048:
        raise bad_value(name, "is too long")
    return value


_STORED: dict[str, Callable[[str, str], str]] = {
    "ReceiveMessageWaitTimeSeconds": _ranged(0, 20),
    "Policy": _stored_json,
    "RedriveAllowPolicy": _stored_redrive_allow,
    "KmsMasterKeyId": _text,
    "KmsDataKeyReusePeriodSeconds": _ranged(60, 86_400),
    "SqsManagedSseEnabled": lambda name, value: str(_bool(name, value)).lower(),
    "DeduplicationScope": _choice("queue", "messageGroup"),
    "FifoThroughputLimit": _choice("perQueue", "perMessageGroupId"),
}


def new_settings(name: str, changes: Changes, tags: Mapping[str, str], now_s: int) -> QueueSettings:
    """Settings of a queue created through SQS: SQS's defaults, then ``changes`` and the
    ``tags`` (checked)."""
    meta = {CREATED: str(now_s), MODIFIED: str(now_s)}
    meta.update({k: v for k, v in changes.meta.items() if v is not None})
    meta.update({TAG + k: v for k, v in tags.items()})
    fields: dict[str, Any] = {
        "fifo": name.endswith(".fifo"),
        "max_message_bytes": SQS_MAX_MESSAGE_BYTES,
        "idempotency_window_ms": SQS_DEDUP_WINDOW_MS,
        **changes.fields,
        "meta": meta,
    }
    return QueueSettings(**fields)


def patched_meta(
    current: Mapping[str, str] | None, updates: Mapping[str, str | None], now_s: int
) -> dict[str, str]:
    """``current`` meta with ``updates`` applied (None removes) and the modification time."""
    meta = dict(current or {})
    for key, value in updates.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    meta[MODIFIED] = str(now_s)
    return meta


def wait_seconds_of(settings: QueueSettings) -> int:
    """The queue's default long-poll wait (ReceiveMessageWaitTimeSeconds)."""
    return int((settings.meta or {}).get(ATTR + "ReceiveMessageWaitTimeSeconds", "0"))


# ------------------------------------------------------------------ settings → attributes


def attributes_view(
    desc: Description, wanted: list[str], region: str, account: str
) -> dict[str, str]:
    """The attributes GetQueueAttributes shows for ``wanted`` names ("All": every one),
    ARNs in ``region`` and ``account``.

    Raises:
        SqsError: InvalidAttributeName for a name SQS (and evq) does not have.
    """
    s = desc.settings
    names: list[str] = []
    for name in wanted:
        if name == "All":
            names.extend(_ALL)
        elif name in _ALL or name in _EXTENSIONS:
            names.append(name)
        else:
            raise invalid_attribute_name(name)
    view: dict[str, str] = {}
    for name in dict.fromkeys(names):
        value = _attribute(desc, name, region, account)
        if value is not None and (s.fifo or name not in _FIFO_ONLY | {"FifoQueue"}):
            view[name] = value
    return view


def _attribute(desc: Description, name: str, region: str, account: str) -> str | None:
    s, stats, meta = desc.settings, desc.stats, desc.settings.meta or {}
    if name in _ENGINE:
        field, _, _, unit = _ENGINE[name]
        return str(getattr(s, field) // unit)
    simple: dict[str, Any] = {
        "QueueArn": arn(region, desc.name, account),
        "ApproximateNumberOfMessages": stats.ready,
        "ApproximateNumberOfMessagesNotVisible": stats.reserved,
        "ApproximateNumberOfMessagesDelayed": stats.delayed,
        "CreatedTimestamp": meta.get(CREATED),
        "LastModifiedTimestamp": meta.get(MODIFIED),
        "FifoQueue": "true" if s.fifo else None,
        "ContentBasedDeduplication": str(s.content_based_dedup).lower(),
    }
    if name in simple:
        value = simple[name]
        return None if value is None else str(value)
    if name == "RedrivePolicy":
        if s.dead_letter_queue is None:
            return None
        target = arn(region, s.dead_letter_queue, account)
        return json.dumps({"deadLetterTargetArn": target, "maxReceiveCount": s.max_receives})
    defaults = {
        "ReceiveMessageWaitTimeSeconds": "0",
        "SqsManagedSseEnabled": "false",
        "DeduplicationScope": "queue",
        "FifoThroughputLimit": "perQueue",
    }
    return meta.get(ATTR + name, defaults.get(name))
