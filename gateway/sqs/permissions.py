"""AddPermission and RemovePermission: statements of the queue's ``Policy`` attribute.

As SQS does, AddPermission adds one statement per label to the queue's policy (making the
policy if there is none: version ``2008-10-17``, id ``{queue ARN}/SQSDefaultPolicy``), and
RemovePermission takes the label's statement out again (the policy with it, once empty).
The policy lives in the queue's settings (``meta``), durable as the other SQS-only
attributes, and shows as the ``Policy`` attribute. evq keeps it; it does not enforce it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from actors.core import commands as cmd
from actors.core.replies import Description
from gateway.sqs.context import Context
from gateway.sqs.errors import SqsError, invalid, missing
from gateway.sqs.queue_attrs import ATTR, patched_meta

__all__ = ["ACTIONS"]

POLICY = ATTR + "Policy"
MAX_ACTIONS = 7
# What a permission can grant (the batch actions come with theirs).
_GRANTABLE = frozenset(
    {
        "*",
        "ChangeMessageVisibility",
        "DeleteMessage",
        "GetQueueAttributes",
        "GetQueueUrl",
        "ListDeadLetterSourceQueues",
        "PurgeQueue",
        "ReceiveMessage",
        "SendMessage",
    }
)
# SQS actions only the queue's owner may call.
_OWNER_ONLY = frozenset(
    {
        "AddPermission",
        "CancelMessageMoveTask",
        "ChangeMessageVisibilityBatch",
        "CreateQueue",
        "DeleteMessageBatch",
        "DeleteQueue",
        "ListMessageMoveTasks",
        "ListQueueTags",
        "ListQueues",
        "RemovePermission",
        "SendMessageBatch",
        "SetQueueAttributes",
        "StartMessageMoveTask",
        "TagQueue",
        "UntagQueue",
    }
)
_LABEL = re.compile(r"[A-Za-z0-9_-]{1,80}")
_ACCOUNT_ID = re.compile(r"\d{12}")


def _label(ctx: Context) -> str:
    label = ctx.params.required("Label")
    if not _LABEL.fullmatch(label):
        raise invalid(
            f"Value {label[:200]} for parameter Label is invalid. Reason: Can only include "
            "alphanumeric characters, hyphens, or underscores. 1 to 80 in length."
        )
    return label


def _check_grant(accounts: list[str], actions: list[str]) -> None:
    """The accounts and actions of an AddPermission, checked in SQS's order.

    Raises:
        SqsError: MissingParameter, InvalidParameterValue, OverLimit.
    """
    if not actions:
        raise missing("Actions")
    if not accounts:
        raise invalid("Value [] for parameter PrincipalId is invalid. Reason: Unable to verify.")
    for account in accounts:
        if not _ACCOUNT_ID.fullmatch(account):
            raise invalid(
                f"Value {account[:200]} for parameter PrincipalId is invalid. "
                "Reason: Unable to verify."
            )
    if len(actions) > MAX_ACTIONS:
        raise SqsError(
            "OverLimit",
            f"{len(actions)} Actions were found, maximum allowed is {MAX_ACTIONS}.",
            status=403,
        )
    for action in actions:
        if action not in _GRANTABLE:
            reason = (
                "Only the queue owner is allowed to invoke this action."
                if action in _OWNER_ONLY
                else "Please refer to the appropriate WSDL for a list of valid actions."
            )
            raise invalid(
                f"Value SQS:{action[:200]} for parameter ActionName is invalid. Reason: {reason}"
            )


def _one_or_list(values: list[str]) -> str | list[str]:
    return values[0] if len(values) == 1 else values


def _statement(label: str, accounts: list[str], actions: list[str], arn: str) -> dict[str, Any]:
    """The statement SQS writes for a permission."""
    return {
        "Sid": label,
        "Effect": "Allow",
        "Principal": {"AWS": _one_or_list([f"arn:aws:iam::{a}:root" for a in accounts])},
        "Action": _one_or_list([f"SQS:{action}" for action in actions]),
        "Resource": arn,
    }


def _policy(desc: Description) -> tuple[dict[str, Any] | None, list[Any]]:
    """The queue's policy (None: it has none) and its statements."""
    text = (desc.settings.meta or {}).get(POLICY)
    if not text:
        return None, []
    policy = json.loads(text)  # stored only once checked to be a JSON object
    statements = policy.get("Statement", [])
    return policy, statements if isinstance(statements, list) else [statements]


def _has_label(statements: list[Any], label: str) -> bool:
    return any(isinstance(s, dict) and s.get("Sid") == label for s in statements)


async def _store(ctx: Context, desc: Description, policy: dict[str, Any] | None) -> None:
    text = None if policy is None else json.dumps(policy, separators=(",", ":"))
    meta = patched_meta(desc.settings.meta, {POLICY: text}, ctx.now_ms() // 1000)
    await ctx.run(desc.name, cmd.PatchSettings({"meta": meta}))
    ctx.forget(desc.name)


async def add_permission(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    label = _label(ctx)
    accounts = ctx.params.strings("AWSAccountIds")
    actions = ctx.params.strings("Actions")
    desc = await ctx.describe(name)
    _check_grant(accounts, actions)
    policy, statements = _policy(desc)
    if _has_label(statements, label):
        raise invalid(f"Value {label} for parameter Label is invalid. Reason: Already exists.")
    arn = ctx.arn(name)
    if policy is None:
        policy = {"Version": "2008-10-17", "Id": f"{arn}/SQSDefaultPolicy"}
    policy["Statement"] = [*statements, _statement(label, accounts, actions, arn)]
    await _store(ctx, desc, policy)
    return {}


async def remove_permission(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    label = ctx.params.required("Label")
    desc = await ctx.describe(name)
    policy, statements = _policy(desc)
    if policy is None:  # moto's words for this case; AWS's recorded ones are for the next
        raise invalid(
            f"Value {label} for parameter Label is invalid. "
            "Reason: can't find label on existing policy."
        )
    if not _has_label(statements, label):
        raise invalid(f"Value {label} for parameter Label is invalid. Reason: can't find label.")
    kept = [s for s in statements if not (isinstance(s, dict) and s.get("Sid") == label)]
    policy["Statement"] = kept
    await _store(ctx, desc, policy if kept else None)
    return {}


ACTIONS = {
    "AddPermission": add_permission,
    "RemovePermission": remove_permission,
}
