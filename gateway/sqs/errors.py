"""SQS errors: the codes SQS clients know, and how evq's own errors map onto them. Pure.

An :class:`SqsError` carries the two names SQS gives every error: the JSON protocol's type
(``QueueDoesNotExist``, what boto3 turns into ``client.exceptions.QueueDoesNotExist``) and
the query protocol's code (``AWS.SimpleQueueService.NonExistentQueue``, which the JSON
protocol repeats in the ``x-amzn-query-error`` header and boto3 shows as ``Error.Code``).
:func:`from_queue_error` is the one mapping from :class:`~actors.errors.QueueError` kinds.
"""

from __future__ import annotations

from actors.errors import ErrorKind, QueueError

__all__ = [
    "SqsError",
    "from_queue_error",
    "invalid",
    "invalid_attribute_name",
    "missing",
    "no_queue",
    "receipt_invalid",
]

# JSON type → query code, where they differ (SQS's own pairs).
QUERY_CODES = {
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


class SqsError(Exception):
    """An error as SQS reports it: JSON type, query code, HTTP status, who is at fault."""

    def __init__(self, code: str, message: str, *, status: int = 400, sender: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.sender = sender

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
    return SqsError("InvalidParameterValue", message)


def missing(name: str) -> SqsError:
    """MissingParameter: a required parameter is absent."""
    return SqsError("MissingParameter", f"The request must contain the parameter {name}.")


def no_queue() -> SqsError:
    """QueueDoesNotExist."""
    return SqsError("QueueDoesNotExist", "The specified queue does not exist.")


def invalid_attribute_name(name: str) -> SqsError:
    """InvalidAttributeName: a queue attribute SQS does not have (or that is read-only)."""
    return SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")


def receipt_invalid(handle: str, reason: str = "") -> SqsError:
    """ReceiptHandleIsInvalid."""
    shown = handle if len(handle) <= 200 else handle[:200] + "…"
    tail = f" Reason: {reason}" if reason else ""
    return SqsError(
        "ReceiptHandleIsInvalid", f'The input receipt handle "{shown}" is not a valid one.{tail}'
    )


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
