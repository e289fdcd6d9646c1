"""One error family for every layer of evq.

Every error is a :class:`QueueError`. Its ``kind`` says how a caller should react (fix the
request, retry, re-resolve the actor, alert); its ``code`` is the stable name the native API
shows (API.md, "Errors"). ``gateway/errors.py`` is the only place that turns kinds into HTTP
statuses. Messages are for humans and are not part of the API.

Errors cross Ray process boundaries, so constructors keep the shape ``(message, **fields)``
and pickling preserves the fields.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

__all__ = [
    "BadRequest",
    "Conflict",
    "DataError",
    "ErrorKind",
    "Fenced",
    "Forbidden",
    "InternalError",
    "MessageNotFound",
    "Moving",
    "NotReady",
    "Overloaded",
    "QueueError",
    "QueueExists",
    "QueueNotFound",
    "StaleLease",
    "TaskNotFound",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "WrongShard",
]


class ErrorKind(enum.Enum):
    """How a caller should handle an error; closed on purpose."""

    INVALID = "invalid"  # the caller must fix the request
    UNAUTHORIZED = "unauthorized"  # no or bad credentials: authenticate, then retry
    FORBIDDEN = "forbidden"  # valid credentials without the right: do not retry
    TOO_LARGE = "too_large"  # a body or batch over a limit
    NOT_FOUND = "not_found"  # unknown queue, message or key
    CONFLICT = "conflict"  # stale lease, existing queue with other settings, id clash
    OVERLOADED = "overloaded"  # back off and retry later
    UNAVAILABLE = "unavailable"  # not ready or a failed write: retry
    FENCED = "fenced"  # this incarnation lost ownership of the queue
    DATA = "data"  # corrupt or unknown log data: alert
    INTERNAL = "internal"  # a bug


def _rebuild(cls: type[QueueError], message: str, fields: dict[str, Any]) -> QueueError:
    return cls(message, **fields)


class QueueError(Exception):
    """Root of every evq error."""

    kind: ClassVar[ErrorKind] = ErrorKind.INTERNAL
    code: ClassVar[str] = "InternalError"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.fields))

    def __eq__(self, other: object) -> bool:
        return (
            type(self) is type(other)
            and isinstance(other, QueueError)
            and (self.message, self.fields) == (other.message, other.fields)
        )

    def __hash__(self) -> int:
        return hash((type(self), self.message))


class BadRequest(QueueError):
    """Malformed or out-of-range input."""

    kind = ErrorKind.INVALID
    code = "BadRequest"


class Unauthorized(QueueError):
    """The request carries no credentials, or credentials the server does not accept."""

    kind = ErrorKind.UNAUTHORIZED
    code = "Unauthorized"


class Forbidden(QueueError):
    """The credentials are valid but do not allow this request."""

    kind = ErrorKind.FORBIDDEN
    code = "Forbidden"


class TooLarge(QueueError):
    """A message, batch or request over its size limit."""

    kind = ErrorKind.TOO_LARGE
    code = "TooLarge"


class QueueNotFound(QueueError):
    """No queue by that name."""

    kind = ErrorKind.NOT_FOUND
    code = "QueueNotFound"


class MessageNotFound(QueueError):
    """No message by that id in the queue."""

    kind = ErrorKind.NOT_FOUND
    code = "MessageNotFound"


class TaskNotFound(QueueError):
    """No move task by that id on the queue."""

    kind = ErrorKind.NOT_FOUND
    code = "TaskNotFound"


class QueueExists(QueueError):
    """The queue exists with other settings."""

    kind = ErrorKind.CONFLICT
    code = "QueueExists"


class Conflict(QueueError):
    """The request clashes with the current state (an id reused with another body, a lease
    missing on a reserved message)."""

    kind = ErrorKind.CONFLICT
    code = "Conflict"


class StaleLease(QueueError):
    """The lease is not the message's current lease (expired, replaced or foreign)."""

    kind = ErrorKind.CONFLICT
    code = "StaleLease"


class Overloaded(QueueError):
    """Too much work in flight; retry after a pause."""

    kind = ErrorKind.OVERLOADED
    code = "Overloaded"


class NotReady(QueueError):
    """The server is still recovering or shutting down."""

    kind = ErrorKind.UNAVAILABLE
    code = "NotReady"


class Unavailable(QueueError):
    """A write failed or a component is unreachable; the outcome of the command is unknown."""

    kind = ErrorKind.UNAVAILABLE
    code = "Unavailable"


class Moving(QueueError):
    """The queue is being handed to another shard (a resize or a rolling restart): retry in
    a moment, when its new shard serves it."""

    kind = ErrorKind.UNAVAILABLE
    code = "Moving"


class WrongShard(QueueError):
    """This shard does not hold the queue (the placement map names another, ``shard``, at
    ``generation``); refused before any effect, so the caller resends it there."""

    kind = ErrorKind.UNAVAILABLE
    code = "WrongShard"


class Fenced(QueueError):
    """A newer incarnation owns this queue's log; this one must stop serving it."""

    kind = ErrorKind.FENCED
    code = "Fenced"


class DataError(QueueError):
    """Log or snapshot data that is damaged or of an unknown format version."""

    kind = ErrorKind.DATA
    code = "DataError"


class InternalError(QueueError):
    """A bug: an invariant did not hold."""

    kind = ErrorKind.INTERNAL
    code = "InternalError"
