"""Receipt handles: the queue, message id and lease of one receive, in one opaque string. Pure.

A handle is ``evq1.`` and the URL-safe base64 (unpadded) of a msgpack array
``[queue, id, lease]``. Nothing in it needs to be secret: a lease is a random token the
shard drew, so a forged handle only names a lease that is not current. Anything that does not
decode to exactly that shape is ``ReceiptHandleIsInvalid``.
"""

from __future__ import annotations

import base64
import binascii

import msgspec

from gateway.sqs.errors import receipt_invalid

__all__ = ["Receipt", "decode_receipt", "encode_receipt"]

_PREFIX = "evq1."
_MAX_HANDLE = 2048


class Receipt(msgspec.Struct, array_like=True, frozen=True):
    """What a receipt handle stands for."""

    queue: str
    id: str
    lease: str


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Receipt)


def encode_receipt(queue: str, message_id: str, lease: str) -> str:
    """The receipt handle of one delivery."""
    raw = _encoder.encode(Receipt(queue, message_id, lease))
    return _PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_receipt(handle: object, queue: str | None = None) -> Receipt:
    """The receipt a handle stands for; ``queue``, when given, must be the one it names.

    Raises:
        SqsError: ReceiptHandleIsInvalid.
    """
    if not isinstance(handle, str) or not handle:
        raise receipt_invalid(str(handle))
    if not handle.startswith(_PREFIX) or len(handle) > _MAX_HANDLE:
        raise receipt_invalid(handle)
    text = handle[len(_PREFIX) :]
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
        receipt = _decoder.decode(raw)
    except (binascii.Error, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise receipt_invalid(handle) from None
    if not (receipt.queue and receipt.id and receipt.lease):
        raise receipt_invalid(handle)
    if queue is not None and receipt.queue != queue:
        raise receipt_invalid(handle, "it belongs to another queue")
    return receipt
