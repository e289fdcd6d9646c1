"""SQS errors: the codes SQS clients know, and how evq's own errors map onto them. Pure.

An :class:`SqsError` carries the two names SQS gives every error: the JSON protocol's type
(``QueueDoesNotExist``, what boto3 turns into ``client.exceptions.QueueDoesNotExist``) and
the query protocol's code (``AWS.SimpleQueueService.NonExistentQueue``, which the JSON
protocol repeats in the ``x-amzn-query-error`` header and boto3 shows as ``Error.Code``).
Both, and the message texts, are AWS's own as its recorded answers show them.
:func:`from_queue_error` is the one mapping from :class:`~actors.errors.QueueError` kinds.
"""

from __future__ import annotations

from actors.errors import ErrorKind, QueueError

__all__ = [
    "OTHER_QUEUE",
    "InvalidReceipt",
    "SqsError",
    "expired_receipt",
    "from_queue_error",
    "invalid",
    "invalid_attribute_name",
    "missing",
    "no_queue",
    "receipt_invalid",
]

# JSON type → query code, where they differ (SQS's own pairs). The JSON types are the
# service model's exception shapes, so that botocore finds ``client.exceptions.<shape>``;
# the two errors without a shape carry the names AWS sends for them.
QUERY_CODES = {
    "InvalidParameterValueException": "InvalidParameterValue",
    "MissingRequiredParameterException": "MissingParameter",
    "QueueDoesNotExist": "AWS.SimpleQueueService.NonExistentQueue",
    "QueueNameExists": "QueueAlreadyExists",
    "TooManyEntriesInBatchRequest": "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    "BatchEntryIdsNotDistinct": "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
    "EmptyBatchRequest": "AWS.SimpleQueueService.EmptyBatchRequest",
    "InvalidBatchEntryId": "AWS.SimpleQueueService.InvalidBatchEntryId",
    "BatchRequestTooLong": "AWS.SimpleQueueService.BatchRequestTooLong",
    "MessageNotInflight": "AWS.SimpleQueueService.MessageNotInflight",
    "PurgeQueueInProgress": "AWS.SimpleQueueService.PurgeQueueInProgress",
    "UnsupportedOperation": "AWS.SimpleQueueService.UnsupportedOperation",
    "QueueDeletedRecently": "AWS.SimpleQueueService.QueueDeletedRecently",
}
# The reason receipts.py gives for a handle another queue issued.
OTHER_QUEUE = "it belongs to another queue"


class SqsError(Exception):
    """An error as SQS reports it: JSON type, query code, HTTP status, who is at fault, and
    the message (``query_message``: the query protocol's, where SQS words it otherwise)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int = 400,
        sender: bool = True,
        query_message: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.sender = sender
        self.query_message = query_message or message
        self.retry_after = retry_after  # seconds a throttled caller should wait

    @property
    def query_code(self) -> str:
        """The code of the query protocol (and of the ``x-amzn-query-error`` header)."""
        return QUERY_CODES.get(self.code, self.code)

    @property
    def fault(self) -> str:
        """``Sender`` (the request is wrong) or ``Receiver`` (the server failed)."""
        return "Sender" if self.sender else "Receiver"

    def __repr__(self) -> str:
        return f"SqsError({self.code!r}, {self.message!r})"


def invalid(message: str) -> SqsError:
    """InvalidParameterValue: a parameter is out of range or malformed."""
    return SqsError("InvalidParameterValueException", message)


def missing(name: str) -> SqsError:
    """MissingParameter: a required parameter is absent."""
    return SqsError(
        "MissingRequiredParameterException", f"The request must contain the parameter {name}."
    )


def no_queue() -> SqsError:
    """QueueDoesNotExist."""
    return SqsError(
        "QueueDoesNotExist",
        "The specified queue does not exist.",
        query_message="The specified queue does not exist for this wsdl version.",
    )


def invalid_attribute_name(name: str) -> SqsError:
    """InvalidAttributeName: a queue attribute SQS does not have (or that is read-only)."""
    return SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")


class InvalidReceipt(SqsError):
    """ReceiptHandleIsInvalid: a handle evq never issued (or one of another queue).

    Its message is the one SQS gives in batch entries; :meth:`single` is the wording of
    DeleteMessage and ChangeMessageVisibility."""

    def __init__(self, message: str, *, other_queue: bool) -> None:
        super().__init__("ReceiptHandleIsInvalid", message)
        self.other_queue = other_queue

    def single(self) -> SqsError:
        """The error as a single-message action reports it."""
        if self.other_queue:
            return self
        return SqsError("ReceiptHandleIsInvalid", "The input receipt handle is invalid.")


def _shown(handle: str) -> str:
    return handle if len(handle) <= 200 else handle[:200] + "…"


def receipt_invalid(handle: str, reason: str = "") -> InvalidReceipt:
    """ReceiptHandleIsInvalid for ``handle`` (``reason``: :data:`OTHER_QUEUE` or empty)."""
    if reason == OTHER_QUEUE:
        return InvalidReceipt(
            f'The receipt handle "{_shown(handle)}" is not valid for this queue.', other_queue=True
        )
    return InvalidReceipt(
        f'The input receipt handle "{_shown(handle)}" is not a valid receipt handle.',
        other_queue=False,
    )


def expired_receipt(handle: str, reason: str = "The receipt handle has expired.") -> SqsError:
    """InvalidParameterValue for a handle evq issued whose lease no longer holds."""
    return invalid(f"Value {handle} for parameter ReceiptHandle is invalid. Reason: {reason}")


def from_queue_error(exc: QueueError) -> SqsError:
    """The SQS error for an engine or gateway error."""
    kind = exc.kind
    if kind is ErrorKind.NOT_FOUND and exc.code == "QueueNotFound":
        return no_queue()
    if kind in (ErrorKind.INVALID, ErrorKind.TOO_LARGE, ErrorKind.NOT_FOUND, ErrorKind.CONFLICT):
        if exc.code == "QueueExists":
            return SqsError(
                "QueueNameExists", f"A queue already exists with other attributes: {exc.message}"
            )
        return invalid(exc.message)
    if kind is ErrorKind.OVERLOADED:
        return SqsError("RequestThrottled", exc.message, status=400, sender=False)
    if kind in (ErrorKind.UNAUTHORIZED, ErrorKind.FORBIDDEN):
        return SqsError("AccessDenied", exc.message, status=403)
    if kind in (ErrorKind.UNAVAILABLE, ErrorKind.FENCED):
        return SqsError("ServiceUnavailable", exc.message, status=503, sender=False)
    return SqsError("InternalError", "internal error", status=500, sender=False)
