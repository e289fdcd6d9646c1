"""The MD5 digests SQS returns with messages, computed exactly as SQS does. Pure.

``MD5OfMessageBody`` is the MD5 of the body's UTF-8 bytes. ``MD5OfMessageAttributes`` (and
``MD5OfMessageSystemAttributes``) digest a binary encoding of the attributes: in order of
name, each contributes its name, its data type and its value, every one of them as a 4-byte
big-endian length followed by the bytes, with a one-byte marker before the value: 1 for a
string value (String and Number types), 2 for a binary one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

__all__ = ["Attribute", "md5_of_attributes", "md5_of_body"]

# One message attribute: (data type, value) — str for String/Number types, bytes for Binary.
Attribute = tuple[str, str | bytes]

_STRING, _BINARY = b"\x01", b"\x02"


def md5_of_body(body: str) -> str:
    """Hex MD5 of the body as SQS reports it."""
    return hashlib.md5(body.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()


def md5_of_attributes(attributes: Mapping[str, Attribute]) -> str | None:
    """Hex MD5 of message (or system) attributes; None when there are none."""
    if not attributes:
        return None
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        data_type, value = attributes[name]
        _field(digest, name.encode("utf-8"))
        _field(digest, data_type.encode("utf-8"))
        if isinstance(value, bytes):
            digest.update(_BINARY)
            _field(digest, value)
        else:
            digest.update(_STRING)
            _field(digest, value.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _field(digest: hashlib._Hash, data: bytes) -> None:
    digest.update(len(data).to_bytes(4, "big"))
    digest.update(data)
