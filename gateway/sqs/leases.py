"""Lease actions: DeleteMessage(Batch), ChangeMessageVisibility(Batch) — translations onto
Ack, Release (visibility 0) and Touch, with the lease taken from the receipt handle.

SQS accepts the receipt handle of an earlier receive on a standard queue: deleting with it
deletes the message, even if it was received again since, and changing the visibility with
it changes that of the message in flight. evq does the same with the engine's ``lenient``
commands, for handles it signed (receipts.py). On a FIFO queue, and for a handle that is not
signed, only the current lease holds, as in the native API: an old handle is refused as SQS
refuses an expired one on FIFO queues (``InvalidParameterValue``, "The receipt handle has
expired."). A handle evq never issued is ``ReceiptHandleIsInvalid``. The queue's existence
is checked before the handle, as SQS does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.core import commands as cmd
from actors.core import replies as rp
from actors.errors import QueueError
from actors.settings import QueueSettings
from gateway.sqs.context import Context
from gateway.sqs.errors import InvalidReceipt, SqsError, expired_receipt
from gateway.sqs.messages import MAX_VISIBILITY_S, batch_entries, failed
from gateway.sqs.receipts import Receipt, decode_receipt
from gateway.sqs.wire import Params

__all__ = ["ACTIONS"]

# SQS's reason when the message of a handle is gone, or not in flight under it.
_NOT_AVAILABLE = "Message does not exist or is not available for visibility timeout change."


def _lenient(s: QueueSettings, receipts: Sequence[Receipt]) -> bool:
    """Whether these handles act as SQS's do when a later receive took the message: all
    signed, on a standard queue."""
    return bool(receipts) and all(r.signed for r in receipts) and not s.fifo


def _receipt(ctx: Context, handle: str, name: str, *, single: bool = False) -> Receipt:
    """The receipt a handle stands for (``single``: for DeleteMessage or
    ChangeMessageVisibility, which word an invalid handle otherwise than batches).

    Raises:
        SqsError: ReceiptHandleIsInvalid.
    """
    try:
        return decode_receipt(handle, name, ctx.receipt_key)
    except InvalidReceipt as exc:
        raise exc.single() if single else exc from None


def _visibility(entry: Params) -> int:
    timeout = entry.number("VisibilityTimeout", 0, MAX_VISIBILITY_S, required=True)
    return timeout or 0


async def delete_message(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    handle = ctx.params.required("ReceiptHandle")
    s = await ctx.settings(name)  # as SQS: an unknown queue before a bad handle
    receipt = _receipt(ctx, handle, name, single=True)
    ack = cmd.Ack([cmd.LeaseRef(receipt.id, receipt.lease)], _lenient(s, [receipt]))
    [result] = await ctx.run(name, ack)
    if result.status == rp.STALE_LEASE:
        raise expired_receipt(handle)
    return {}  # deleted, or already gone: SQS deletes idempotently


async def delete_message_batch(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    entries = batch_entries(ctx, "DeleteMessageBatchRequestEntry")
    s = await ctx.settings(name)
    failures: list[dict[str, Any]] = []
    acks: list[tuple[str, str, Receipt]] = []
    for entry_id, entry in entries:
        try:
            handle = entry.required("ReceiptHandle")
            acks.append((entry_id, handle, _receipt(ctx, handle, name)))
        except SqsError as exc:
            failures.append(failed(entry_id, exc))
    successes = []
    if acks:
        receipts = [r for _, _, r in acks]
        items = [cmd.LeaseRef(r.id, r.lease) for r in receipts]
        results = await ctx.run(name, cmd.Ack(items, _lenient(s, receipts)))
        for (entry_id, handle, _), result in zip(acks, results, strict=True):
            if result.status == rp.STALE_LEASE:
                failures.append(failed(entry_id, expired_receipt(handle)))
            else:
                successes.append({"Id": entry_id})
    return {"Successful": successes, "Failed": failures}


async def _visibility_error(ctx: Context, name: str, handle: str, receipt: Receipt) -> SqsError:
    """Why a lease could not be changed: the message is gone or not in flight, or the
    handle is old."""
    try:
        view = await ctx.run(name, cmd.Peek(receipt.id))
    except QueueError:
        return expired_receipt(handle, _NOT_AVAILABLE)
    if view.state != "reserved":
        return SqsError("MessageNotInflight", "The specified message isn't in flight.")
    return expired_receipt(handle)


async def _change_visibility(
    ctx: Context, name: str, s: QueueSettings, changes: list[tuple[Receipt, int]]
) -> list[str]:
    """Extend leases (Touch) or end them (Release, for 0): the statuses in order."""
    lenient = _lenient(s, [r for r, _ in changes])
    releases = [
        (i, cmd.ReleaseItem(id=r.id, lease=r.lease)) for i, (r, vt) in enumerate(changes) if vt == 0
    ]
    touches = [
        (i, cmd.TouchItem(id=r.id, lease=r.lease, visibility_timeout_ms=vt * 1000))
        for i, (r, vt) in enumerate(changes)
        if vt > 0
    ]
    statuses = [""] * len(changes)
    commands: list[tuple[list[int], cmd.Release | cmd.Touch]] = []
    if releases:
        commands.append(([i for i, _ in releases], cmd.Release([r for _, r in releases], lenient)))
    if touches:
        commands.append(([i for i, _ in touches], cmd.Touch([t for _, t in touches], lenient)))
    for indexes, command in commands:
        results = await ctx.run(name, command)
        for i, result in zip(indexes, results, strict=True):
            statuses[i] = result.status
    return statuses


async def change_message_visibility(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    handle = ctx.params.required("ReceiptHandle")
    timeout = _visibility(ctx.params)
    s = await ctx.settings(name)  # as SQS: an unknown queue before a bad handle
    receipt = _receipt(ctx, handle, name, single=True)
    [status] = await _change_visibility(ctx, name, s, [(receipt, timeout)])
    if status != rp.OK:
        raise await _visibility_error(ctx, name, handle, receipt)
    return {}


async def change_message_visibility_batch(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    entries = batch_entries(ctx, "ChangeMessageVisibilityBatchRequestEntry")
    s = await ctx.settings(name)
    failures: list[dict[str, Any]] = []
    changes: list[tuple[str, str, Receipt, int]] = []
    for entry_id, entry in entries:
        try:
            handle = entry.required("ReceiptHandle")
            receipt = _receipt(ctx, handle, name)
            changes.append((entry_id, handle, receipt, _visibility(entry)))
        except SqsError as exc:
            failures.append(failed(entry_id, exc))
    successes = []
    statuses = await _change_visibility(ctx, name, s, [(r, vt) for _, _, r, vt in changes])
    for (entry_id, handle, receipt, _), status in zip(changes, statuses, strict=True):
        if status == rp.OK:
            successes.append({"Id": entry_id})
        else:
            failures.append(failed(entry_id, await _visibility_error(ctx, name, handle, receipt)))
    return {"Successful": successes, "Failed": failures}


ACTIONS = {
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
}
