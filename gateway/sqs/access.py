"""Who may do what through the SQS face. Pure.

One permission model serves both APIs (``gateway/auth.py``): a caller holds ``read``,
``write`` or ``admin`` on queue-name globs, whether it signs SQS requests with its access key
or shows its bearer token to the native API. Each SQS action needs one level on one queue,
as its native counterpart does:

- ``read``: look (GetQueueUrl, GetQueueAttributes, ListQueueTags, ListDeadLetterSourceQueues,
  ListMessageMoveTasks; ListQueues lists only the queues the caller may read);
- ``write``: produce and consume (SendMessage, ReceiveMessage, DeleteMessage,
  ChangeMessageVisibility and their batches);
- ``admin``: change queues (CreateQueue, DeleteQueue, SetQueueAttributes, PurgeQueue, tags,
  permissions, and the move tasks of a dead-letter queue, which also need ``write`` on
  every queue they move messages to).
"""

from __future__ import annotations

from gateway.auth import LEVELS, Token
from gateway.sqs.errors import SqsError

__all__ = ["LIST", "NEW", "QUEUE", "RULES", "SOURCE", "TASK", "denied", "permits"]

# What an action's permission applies to.
QUEUE = "queue"  # the queue of QueueUrl (or of the queue URL the request was posted to)
NEW = "new"  # the queue named by QueueName
LIST = "list"  # nothing: any caller may ask; the answer holds what it may read
SOURCE = "source"  # the queue named by SourceArn
TASK = "task"  # the queue named inside TaskHandle

RULES: dict[str, tuple[str, str]] = {
    "CreateQueue": ("admin", NEW),
    "GetQueueUrl": ("read", NEW),
    "ListQueues": ("read", LIST),
    "DeleteQueue": ("admin", QUEUE),
    "GetQueueAttributes": ("read", QUEUE),
    "SetQueueAttributes": ("admin", QUEUE),
    "PurgeQueue": ("admin", QUEUE),
    "ListDeadLetterSourceQueues": ("read", QUEUE),
    "TagQueue": ("admin", QUEUE),
    "UntagQueue": ("admin", QUEUE),
    "ListQueueTags": ("read", QUEUE),
    "AddPermission": ("admin", QUEUE),
    "RemovePermission": ("admin", QUEUE),
    "SendMessage": ("write", QUEUE),
    "SendMessageBatch": ("write", QUEUE),
    "ReceiveMessage": ("write", QUEUE),
    "DeleteMessage": ("write", QUEUE),
    "DeleteMessageBatch": ("write", QUEUE),
    "ChangeMessageVisibility": ("write", QUEUE),
    "ChangeMessageVisibilityBatch": ("write", QUEUE),
    "StartMessageMoveTask": ("admin", SOURCE),
    "ListMessageMoveTasks": ("read", SOURCE),
    "CancelMessageMoveTask": ("admin", TASK),
}


def permits(caller: Token | None, level: str, queue: str) -> bool:
    """Whether ``caller`` holds ``level`` on ``queue`` (always, with no callers configured)."""
    return caller is None or caller.level(queue) >= LEVELS[level]


def denied(caller: Token, action: str, arn: str) -> SqsError:
    """AccessDenied, worded as AWS words it (the caller named by its evq name)."""
    return SqsError(
        "AccessDenied",
        f"User: {caller.name} is not authorized to perform: sqs:{action} on resource: {arn}",
        status=403,
    )
