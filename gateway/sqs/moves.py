"""Message move tasks: StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask.

A move task redrives a dead-letter queue: its messages go back to the queues they were
dead-lettered from, or to ``DestinationArn``, at most ``MaxNumberOfMessagesPerSecond``. The
task runs in the shard of the dead-letter queue and is durable in its log
(``actors/moves.py``), so it survives the gateway that started it, and a restarted shard
runs it on. Errors are worded as AWS words them (its recorded answers).

A ``TaskHandle`` is the URL-safe base64 of ``{"taskId": …, "sourceArn": …}``: cancelling
needs nothing but the handle, whichever gateway issued it.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from typing import Any

from actors.core import commands as cmd
from actors.core import replies as rp
from actors.core.decide import MAX_MOVE_RATE
from actors.errors import Conflict, QueueNotFound, TaskNotFound
from gateway.sqs.addresses import name_of_arn
from gateway.sqs.context import Context
from gateway.sqs.errors import SqsError, invalid
from gateway.sqs.queues import dead_letter_sources

__all__ = ["ACTIONS", "decode_handle", "encode_handle"]

MAX_LISTED = 10
# What a failed task's FailureReason says, by the engine's error code.
_FAILURES = {"QueueNotFound": "AWS.SimpleQueueService.NonExistentQueue"}


def _not_found(parameter: str) -> SqsError:
    return SqsError(
        "ResourceNotFoundException",
        f"The resource that you specified for the {parameter} parameter doesn't exist.",
        status=404,
    )


def encode_handle(task: str, source_arn: str) -> str:
    """The TaskHandle of a task."""
    raw = json.dumps({"taskId": task, "sourceArn": source_arn}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_handle(handle: str) -> tuple[str, str]:
    """The task id and source ARN of a TaskHandle.

    Raises:
        SqsError: InvalidParameterValue, for anything that is not a handle.
    """
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
        doc = json.loads(raw)
        task, source = doc["taskId"], doc["sourceArn"]
    except (binascii.Error, ValueError, TypeError, KeyError):
        raise invalid("Value for parameter TaskHandle is invalid.") from None
    if not isinstance(task, str) or not isinstance(source, str) or not task:
        raise invalid("Value for parameter TaskHandle is invalid.")
    return task, source


async def _existing(ctx: Context, arn: str, parameter: str) -> str:
    """The queue an ARN names, which must exist.

    Raises:
        SqsError: InvalidParameterValue (not a queue ARN), ResourceNotFoundException.
    """
    name = name_of_arn(arn, ctx.account, parameter)
    try:
        await ctx.run(name, cmd.Stats())
    except QueueNotFound:
        raise _not_found(parameter) from None
    return name


async def start_message_move_task(ctx: Context) -> dict[str, Any]:
    source_arn = ctx.params.required("SourceArn")
    source = await _existing(ctx, source_arn, "SourceArn")
    destination_arn = ctx.params.string("DestinationArn")
    destination = None
    if destination_arn is not None:
        destination = await _existing(ctx, destination_arn, "DestinationArn")
    rate = ctx.params.number("MaxNumberOfMessagesPerSecond", 1, MAX_MOVE_RATE)
    sources = await dead_letter_sources(ctx, source)
    if not sources:
        raise invalid("Source queue must be configured as a Dead Letter Queue.")
    for target in [destination] if destination is not None else sources:
        ctx.require("write", target)  # where the messages will go
    task = secrets.token_hex(16)
    try:
        await ctx.run(source, cmd.StartMove(task, destination, rate))
    except Conflict:
        raise invalid(
            "There is already a task running. Only one active task is allowed for a source "
            "queue arn at a given time."
        ) from None
    return {"TaskHandle": encode_handle(task, source_arn)}


def _entry(task: rp.MoveTask, source_arn: str, ctx: Context) -> dict[str, Any]:
    """One ListMessageMoveTasksResultEntry, with the fields SQS shows for its status."""
    entry: dict[str, Any] = {
        "Status": task.status,
        "SourceArn": source_arn,
        "ApproximateNumberOfMessagesMoved": task.moved,
        "ApproximateNumberOfMessagesToMove": task.to_move,
        "StartedTimestamp": task.started_at_ms,
    }
    if task.status == rp.RUNNING:
        entry["TaskHandle"] = encode_handle(task.task, source_arn)
    if task.destination is not None:
        entry["DestinationArn"] = ctx.arn(task.destination)
    if task.rate is not None:
        entry["MaxNumberOfMessagesPerSecond"] = task.rate
    if task.status == rp.FAILED:
        entry["FailureReason"] = _FAILURES.get(task.reason or "", task.reason or "")
    return entry


async def list_message_move_tasks(ctx: Context) -> dict[str, Any]:
    source_arn = ctx.params.required("SourceArn")
    limit = ctx.params.number("MaxResults", 1, MAX_LISTED) or 1
    source = await _existing(ctx, source_arn, "SourceArn")
    tasks: list[rp.MoveTask] = await ctx.run(source, cmd.ListMoves())
    return {"Results": [_entry(t, source_arn, ctx) for t in tasks[:limit]]}


async def cancel_message_move_task(ctx: Context) -> dict[str, Any]:
    task, source_arn = decode_handle(ctx.params.required("TaskHandle"))
    try:
        source = name_of_arn(source_arn, ctx.account, "TaskHandle")
    except SqsError:
        raise _not_found("SourceArn") from None
    try:
        moved = await ctx.run(source, cmd.CancelMove(task))
    except QueueNotFound:
        raise _not_found("SourceArn") from None
    except TaskNotFound:
        raise SqsError("ResourceNotFoundException", "Task does not exist.", status=404) from None
    except Conflict:
        raise invalid("Only a running task can be cancelled.") from None
    return {"ApproximateNumberOfMessagesMoved": moved}


ACTIONS = {
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
    "CancelMessageMoveTask": cancel_message_move_task,
}
