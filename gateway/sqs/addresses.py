"""Queue URLs and ARNs, and the account they name. Pure.

Every SQS queue of a server belongs to one account, ``sqs_account_id`` (default
``000000000000``): queue URLs are ``{endpoint}/{account}/{queue}`` and ARNs
``arn:aws:sqs:{region}:{account}:{queue}``.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from actors.errors import QueueError
from actors.settings import validate_queue_name
from gateway.sqs.errors import invalid, no_queue

__all__ = [
    "DEFAULT_ACCOUNT",
    "RESERVED_PREFIX",
    "arn",
    "check_account",
    "name_of_arn",
    "name_of_url",
]

DEFAULT_ACCOUNT = "000000000000"
RESERVED_PREFIX = "__evq"  # the server's own queues (watch-key partitions): not SQS queues
_ACCOUNT = re.compile(r"\d{12}")


def check_account(account: str) -> str:
    """An account id as AWS writes them: 12 digits.

    Raises:
        ValueError: anything else.
    """
    if not _ACCOUNT.fullmatch(account):
        raise ValueError(f"an SQS account id is 12 digits, not {account!r}")
    return account


def _sqs_name(name: str) -> str:
    """``name`` if it can name an SQS queue of this server.

    Raises:
        SqsError: QueueDoesNotExist.
    """
    if name.startswith(RESERVED_PREFIX):
        raise no_queue()
    try:
        return validate_queue_name(name)
    except QueueError:
        raise no_queue() from None


def name_of_url(url: str, account: str) -> str:
    """The queue a ``QueueUrl`` names: ``…/{account}/{name}`` on any host, or the bare
    name (SQS accepts it too).

    Raises:
        SqsError: QueueDoesNotExist for a URL that names no queue of ``account``.
    """
    if "/" not in url and ":" not in url:
        return _sqs_name(url)
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    if len(segments) != 2 or segments[0] != account:
        raise no_queue()
    return _sqs_name(segments[1])


def arn(region: str, name: str, account: str) -> str:
    """The ARN of a queue."""
    return f"arn:aws:sqs:{region}:{account}:{name}"


def name_of_arn(value: object, account: str, what: str = "deadLetterTargetArn") -> str:
    """The queue an SQS ARN of ``account`` names.

    Raises:
        SqsError: InvalidParameterValue.
    """
    parts = value.split(":") if isinstance(value, str) else []
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or parts[4] != account:
        raise invalid(f"Value {str(value)[:200]} for parameter {what} is invalid: not a queue ARN.")
    try:
        return validate_queue_name(parts[5])
    except QueueError:
        raise invalid(f"Value {value} for parameter {what} is invalid: bad queue name.") from None
