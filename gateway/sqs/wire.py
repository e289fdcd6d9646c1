"""SQS requests on the wire → one action and its parameters. Pure: no I/O.

Both wire forms end up in the JSON protocol's shape, so the actions read one kind of
parameters:

- JSON 1.0: ``X-Amz-Target: AmazonSQS.<Action>`` and a JSON object as the body;
- query: a form (``Action=SendMessage&QueueUrl=…&MessageAttribute.1.Name=…``), whose
  flattened, numbered names are folded back into lists and maps here (``Attribute.N.Name`` /
  ``.Value`` → ``Attributes``, ``SendMessageBatchRequestEntry.N.*`` → ``Entries``, …).

:class:`Params` reads typed values out of either, with SQS's errors for missing or bad ones
(query values are all strings; JSON values have JSON types).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

import msgspec

from gateway.sqs.errors import SqsError, invalid, missing

__all__ = ["TARGET_PREFIX", "Call", "Params", "parse_json", "parse_query"]

TARGET_PREFIX = "AmazonSQS."
_ACTION = re.compile(r"[A-Za-z]{1,64}")

# Query names of flattened lists, and the JSON member they stand for.
_LISTS = {
    "AttributeName": "AttributeNames",
    "MessageSystemAttributeName": "MessageSystemAttributeNames",
    "MessageAttributeName": "MessageAttributeNames",
    "TagKey": "TagKeys",
    "AWSAccountId": "AWSAccountIds",
    "ActionName": "Actions",
    "SendMessageBatchRequestEntry": "Entries",
    "DeleteMessageBatchRequestEntry": "Entries",
    "ChangeMessageVisibilityBatchRequestEntry": "Entries",
}
# Query names of flattened maps: the JSON member, and the names of key and value.
_MAPS = {
    "Attribute": ("Attributes", "Name", "Value"),
    "Tag": ("Tags", "Key", "Value"),
    "MessageAttribute": ("MessageAttributes", "Name", "Value"),
    "MessageSystemAttribute": ("MessageSystemAttributes", "Name", "Value"),
}
_MAX_INDEX = 1000  # a query list longer than this is malformed, whatever the action


class Call(NamedTuple):
    """One request: which protocol, which action, its parameters (JSON-shaped)."""

    protocol: str  # "json" | "query"
    action: str
    params: dict[str, Any]


_json_decoder = msgspec.json.Decoder()


def parse_json(target: str, body: bytes) -> Call:
    """A JSON-protocol request.

    Raises:
        SqsError: UnknownOperationException for a target outside SQS; SerializationException
            when the body is not a JSON object.
    """
    action = target[len(TARGET_PREFIX) :] if target.startswith(TARGET_PREFIX) else ""
    if not _ACTION.fullmatch(action):
        raise SqsError("UnknownOperationException", f"Unknown operation {target[:100]!r}.")
    try:
        params = _json_decoder.decode(body) if body.strip() else {}
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # a string that is not UTF-8
        raise SqsError("SerializationException", f"The body is not valid JSON: {exc}") from None
    if not isinstance(params, dict):
        raise SqsError("SerializationException", "The body must be a JSON object.")
    return Call("json", action, params)


def parse_query(pairs: Iterable[tuple[str, str]]) -> Call:
    """A query-protocol request from its form fields (URL query and body together).

    Raises:
        SqsError: MissingAction, InvalidAction (a malformed name), MalformedQueryString.
    """
    flat: dict[str, str] = {}
    for key, value in pairs:
        flat.setdefault(key, value)
    action = flat.pop("Action", "")
    flat.pop("Version", None)
    if not action:
        raise SqsError("MissingAction", "The request must contain the parameter Action.")
    if not _ACTION.fullmatch(action):
        raise SqsError(
            "InvalidAction", f"The action {action[:100]} is not valid for this endpoint."
        )
    return Call("query", action, fold(flat))


def fold(flat: dict[str, str]) -> dict[str, Any]:
    """Flattened query names (``A.1.B``) as the nested JSON shape.

    Raises:
        SqsError: MalformedQueryString for an index that is not a positive number.
    """
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise _malformed(key)
            node = child
        if isinstance(node.get(parts[-1]), dict):
            raise _malformed(key)
        node[parts[-1]] = value
    return _shape(tree)


def _malformed(key: str) -> SqsError:
    return SqsError("MalformedQueryString", f"The parameter {key[:200]} is malformed.")


def _numbered(name: str, node: Any) -> list[Any]:
    """The values of ``name.1``, ``name.2``, … in order of their numbers (``name=`` with
    no value: none, as SDKs send an empty list)."""
    if node == "":
        return []
    if not isinstance(node, dict):
        raise _malformed(name)
    items: dict[int, Any] = {}
    for index, value in node.items():
        if not index.isdigit() or not 1 <= int(index) <= _MAX_INDEX:
            raise _malformed(f"{name}.{index}")
        if int(index) in items:  # "1" and "01": one number twice (a 500 once: loadtest/fuzz.py)
            raise _malformed(f"{name}.{index}")
        items[int(index)] = value
    return [items[i] for i in sorted(items)]


def _shape(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in node.items():
        if name in _LISTS:
            out[_LISTS[name]] = [
                _shape(v) if isinstance(v, dict) else v for v in _numbered(name, value)
            ]
        elif name in _MAPS:
            member, key_name, value_name = _MAPS[name]
            mapping: dict[str, Any] = {}
            for entry in _numbered(name, value):
                if not isinstance(entry, dict) or not isinstance(entry.get(key_name), str):
                    # no name, or a name with parts of its own (``X.1.Name.1=…``): a 500
                    # once (found by loadtest/fuzz.py, tests/data/fuzz/sqs_query/)
                    raise _malformed(name)
                mapping[entry[key_name]] = entry.get(value_name)
            out[member] = mapping
        elif isinstance(value, dict):
            out[name] = _shape(value)
        else:
            out[name] = value
    return out


# ------------------------------------------------------------------ typed parameters


class Params:
    """Typed access to one request's (or one batch entry's) parameters."""

    __slots__ = ("query", "values")

    def __init__(self, values: Any, *, query: bool) -> None:
        if not isinstance(values, dict):
            raise invalid("The parameters must be a structure.")
        self.values: dict[str, Any] = values
        self.query = query

    def __contains__(self, name: str) -> bool:
        return self.values.get(name) is not None

    def sub(self, value: Any) -> Params:
        """Parameters nested in these (a batch entry)."""
        return Params(value, query=self.query)

    def string(self, name: str, *, required: bool = False) -> str | None:
        """A string parameter. Raises: SqsError."""
        value = self.values.get(name)
        if value is None:
            if required:
                raise missing(name)
            return None
        if not isinstance(value, str):
            raise invalid(f"Value for parameter {name} must be a string.")
        return value

    def required(self, name: str) -> str:
        """A required string parameter. Raises: SqsError."""
        value = self.string(name, required=True)
        assert value is not None
        return value

    def number(
        self, name: str, low: int, high: int, *, required: bool = False, reason: str = ""
    ) -> int | None:
        """An integer parameter within ``low..high`` (``reason``: SQS's words when it is
        not; by default "Must be between {low} and {high}, if provided."). Raises: SqsError."""
        value = self.values.get(name)
        if value is None:
            if required:
                raise missing(name)
            return None
        return parse_int(value, name, low, high, reason)

    def boolean(self, name: str) -> bool | None:
        """A boolean parameter. Raises: SqsError."""
        value = self.values.get(name)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise invalid(f"Value {str(value)[:100]} for parameter {name} is invalid: not a boolean.")

    def sequence(self, name: str) -> list[Any]:
        """A list parameter (empty when absent; the query protocol sends an empty list as
        ``Name=``). Raises: SqsError."""
        value = self.values.get(name)
        if value is None or (self.query and value == ""):
            return []
        if not isinstance(value, list):
            raise invalid(f"Value for parameter {name} must be a list.")
        return value

    def strings(self, name: str) -> list[str]:
        """A list of strings. Raises: SqsError."""
        values = self.sequence(name)
        if not all(isinstance(v, str) for v in values):
            raise invalid(f"Values of parameter {name} must be strings.")
        return values

    def mapping(self, name: str) -> dict[str, Any]:
        """A map parameter (empty when absent). Raises: SqsError."""
        value = self.values.get(name)
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise invalid(f"Value for parameter {name} must be a map.")
        return value

    def string_map(self, name: str) -> dict[str, str]:
        """A map of strings to strings. Raises: SqsError."""
        value = self.mapping(name)
        if not all(isinstance(v, str) for v in value.values()):
            raise invalid(f"Values of parameter {name} must be strings.")
        return value


def parse_int(value: Any, name: str, low: int, high: int, reason: str = "") -> int:
    """An integer given as a JSON number or a decimal string, within ``low..high``.

    Raises:
        SqsError: InvalidParameterValue, with ``reason`` (default: SQS's usual one).
    """
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"[+-]?\d{1,19}", value.strip()):
        number = int(value)
    if number is None or not low <= number <= high:
        reason = reason or f"Must be between {low} and {high}, if provided."
        raise invalid(f"Value {str(value)[:100]} for parameter {name} is invalid. Reason: {reason}")
    return number


def decode_binary(value: Any, name: str) -> bytes:
    """A binary value: base64 text in both protocols.

    Raises:
        SqsError: InvalidParameterValue.
    """
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise invalid(f"Value for parameter {name} must be base64-encoded binary.")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"Value for parameter {name} is not valid base64.") from None
