"""Results and errors → response bodies of either protocol. Pure.

Actions return JSON-shaped results (the JSON protocol's members); the JSON protocol sends
them as they are, the query protocol as SQS's XML: ``<{Action}Response>`` holding
``<{Action}Result>`` and ``<ResponseMetadata>``, lists and maps flattened into repeated
elements (``Messages`` → ``<Message>``…, ``Attributes`` → ``<Attribute><Name/><Value/>``…).
"""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape

import msgspec

from gateway.sqs.errors import SqsError

__all__ = [
    "JSON_TYPE",
    "XML_NS",
    "json_error",
    "json_result",
    "xml_error",
    "xml_result",
]

JSON_TYPE = "application/x-amz-json-1.0"
XML_NS = "http://queue.amazonaws.com/doc/2012-11-05/"
_TYPE_PREFIX = "com.amazonaws.sqs#"

_LIST_ITEMS = {
    "QueueUrls": "QueueUrl",
    "queueUrls": "QueueUrl",
    "Messages": "Message",
    "Failed": "BatchResultErrorEntry",
    "Results": "ListMessageMoveTasksResultEntry",
}
_BATCH_ENTRIES = {
    "SendMessageBatch": "SendMessageBatchResultEntry",
    "DeleteMessageBatch": "DeleteMessageBatchResultEntry",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibilityBatchResultEntry",
}
_MAP_ITEMS = {
    "Attributes": ("Attribute", "Name", "Value"),
    "Tags": ("Tag", "Key", "Value"),
    "MessageAttributes": ("MessageAttribute", "Name", "Value"),
}
# The actions whose responses have an output shape: AWS sends their ``<{Action}Result>``
# element even when it is empty, and the query protocol's parsers (botocore's among them)
# look it up without a default. The others (DeleteMessage, PurgeQueue, …) have none.
WITH_RESULT = frozenset(
    {
        "CancelMessageMoveTask",
        "ChangeMessageVisibilityBatch",
        "CreateQueue",
        "DeleteMessageBatch",
        "GetQueueAttributes",
        "GetQueueUrl",
        "ListDeadLetterSourceQueues",
        "ListMessageMoveTasks",
        "ListQueueTags",
        "ListQueues",
        "ReceiveMessage",
        "SendMessage",
        "SendMessageBatch",
        "StartMessageMoveTask",
    }
)
# XML 1.0 turns a raw CR into LF when parsing: send it as a character reference.
_ENTITIES = {"\r": "&#xD;", '"': "&quot;"}

_json = msgspec.json.Encoder()


def json_result(result: dict[str, Any]) -> bytes:
    """The JSON protocol's body for a result."""
    return _json.encode(result)


def json_error(error: SqsError) -> tuple[bytes, dict[str, str]]:
    """The JSON protocol's body and headers for an error."""
    body = _json.encode({"__type": _TYPE_PREFIX + error.code, "message": error.message})
    return body, {"x-amzn-query-error": f"{error.query_code};{error.fault}"}


def xml_result(action: str, result: dict[str, Any], request_id: str) -> bytes:
    """The query protocol's XML body for a result."""
    parts = [f'<?xml version="1.0"?><{action}Response xmlns="{XML_NS}">']
    if result or action in WITH_RESULT:
        parts.append(f"<{action}Result>")
        _members(parts, result, action)
        parts.append(f"</{action}Result>")
    parts.append(f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>")
    parts.append(f"</{action}Response>")
    return "".join(parts).encode("utf-8")


def xml_error(error: SqsError, request_id: str) -> bytes:
    """The query protocol's XML body for an error."""
    return (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{XML_NS}"><Error>'
        f"<Type>{error.fault}</Type><Code>{_text(error.query_code)}</Code>"
        f"<Message>{_text(error.query_message)}</Message><Detail/></Error>"
        f"<RequestId>{request_id}</RequestId></ErrorResponse>"
    ).encode()


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return escape(str(value), _ENTITIES)


def _members(parts: list[str], doc: dict[str, Any], action: str) -> None:
    for name, value in doc.items():
        if value is None:
            continue
        if name in _MAP_ITEMS and isinstance(value, dict):
            item, key_name, value_name = _MAP_ITEMS[name]
            for key, entry in value.items():
                parts.append(f"<{item}><{key_name}>{_text(key)}</{key_name}><{value_name}>")
                _value(parts, entry, action)
                parts.append(f"</{value_name}></{item}>")
        elif isinstance(value, list):
            entries = _BATCH_ENTRIES.get(action, name) if name == "Successful" else None
            item = entries or _LIST_ITEMS.get(name, name)
            for entry in value:
                parts.append(f"<{item}>")
                _value(parts, entry, action)
                parts.append(f"</{item}>")
        else:
            parts.append(f"<{name}>")
            _value(parts, value, action)
            parts.append(f"</{name}>")


def _value(parts: list[str], value: Any, action: str) -> None:
    if isinstance(value, dict):
        _members(parts, value, action)
    else:
        parts.append(_text(value))
