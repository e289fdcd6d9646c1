"""Receipt handles: the queue, message id and lease of one receive, in one opaque string. Pure.

A handle is ``evq2.`` and the URL-safe base64 (unpadded) of a msgpack array
``[queue, id, lease, mac]``, where ``mac`` is an HMAC-SHA256 (16 bytes) of the other three
under a key derived from the cluster secret, so every gateway of a cluster checks the
handles any of them issued. A lease is a random token the shard drew, so a forged handle
only names a lease that is not current; the MAC proves more: that evq handed this lease out
for this message once. Only such a *signed* handle may act on a message that was received
again since (SQS accepts the handle of an earlier receive on standard queues), see
``gateway/sqs/leases.py``. A handle whose MAC does not check (another cluster's, or one
issued before a restart that drew a new secret) still works while its lease is current.

``evq1.`` handles (``[queue, id, lease]``, before the MAC) are still read, as unsigned.
Anything that does not decode to one of these shapes is ``ReceiptHandleIsInvalid``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

import msgspec

from gateway.sqs.errors import receipt_invalid

__all__ = ["Receipt", "decode_receipt", "encode_receipt", "receipt_key"]

_V1, _V2 = "evq1.", "evq2."
_MAX_HANDLE = 2048
_MAC_BYTES = 16


class Receipt(msgspec.Struct, frozen=True):
    """What a receipt handle stands for; ``signed``: its MAC checked."""

    queue: str
    id: str
    lease: str
    signed: bool = False


class _Fields(msgspec.Struct, array_like=True, frozen=True):
    queue: str
    id: str
    lease: str


class _Signed(msgspec.Struct, array_like=True, frozen=True):
    queue: str
    id: str
    lease: str
    mac: bytes


_encoder = msgspec.msgpack.Encoder()
_v1 = msgspec.msgpack.Decoder(_Fields)
_v2 = msgspec.msgpack.Decoder(_Signed)


def receipt_key(cluster_secret: str) -> bytes:
    """The key that signs receipt handles, derived from the cluster secret (never the secret
    itself, which also opens the shards)."""
    return hashlib.sha256(b"evq sqs receipt handles\0" + cluster_secret.encode()).digest()


def _mac(key: bytes, queue: str, message_id: str, lease: str) -> bytes:
    fields = _encoder.encode(_Fields(queue, message_id, lease))
    return hmac.new(key, fields, hashlib.sha256).digest()[:_MAC_BYTES]


def encode_receipt(queue: str, message_id: str, lease: str, key: bytes) -> str:
    """The receipt handle of one delivery, signed with ``key``."""
    raw = _encoder.encode(_Signed(queue, message_id, lease, _mac(key, queue, message_id, lease)))
    return _V2 + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_receipt(handle: object, queue: str | None = None, key: bytes = b"") -> Receipt:
    """The receipt a handle stands for; ``queue``, when given, must be the one it names.
    ``signed`` tells whether its MAC checks under ``key``.

    Raises:
        SqsError: ReceiptHandleIsInvalid.
    """
    if not isinstance(handle, str) or not handle:
        raise receipt_invalid(str(handle))
    version = handle[: len(_V2)]
    if version not in (_V1, _V2) or len(handle) > _MAX_HANDLE:
        raise receipt_invalid(handle)
    text = handle[len(_V2) :]
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
        fields = (_v2 if version == _V2 else _v1).decode(raw)
    except (binascii.Error, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise receipt_invalid(handle) from None
    if not (fields.queue and fields.id and fields.lease):
        raise receipt_invalid(handle)
    if queue is not None and fields.queue != queue:
        raise receipt_invalid(handle, "it belongs to another queue")
    signed = False
    if isinstance(fields, _Signed) and key:
        expected = _mac(key, fields.queue, fields.id, fields.lease)
        signed = hmac.compare_digest(expected, fields.mac)
    return Receipt(fields.queue, fields.id, fields.lease, signed)
