"""Lease actions: DeleteMessage(Batch), ChangeMessageVisibility(Batch) — translations onto
Ack, Release (visibility 0) and Touch, with the lease taken from the receipt handle.

SQS accepts the receipt handle of an earlier receive on a standard queue: deleting with it
deletes the message, even if it was received again since, and changing the visibility with
it changes that of the message in flight. evq does the same with the engine's ``lenient``
commands, for handles it signed (receipts.py). On a FIFO queue, and for a handle that is not
signed, only the current lease holds, as in the native API: an old handle is
``ReceiptHandleIsInvalid``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.core import commands as cmd
from actors.core import replies as rp
from actors.errors import QueueError
from gateway.sqs.context import Context
from gateway.sqs.errors import SqsError, receipt_invalid
from gateway.sqs.messages import MAX_VISIBILITY_S, batch_entries, failed
from gateway.sqs.receipts import Receipt, decode_receipt

__all__ = ["ACTIONS"]


async def _lenient(ctx: Context, name: str, receipts: Sequence[Receipt]) -> bool:
    """Whether these handles act as SQS's do when a later receive took the message: all
    signed, on a standard queue."""
    if not receipts or not all(r.signed for r in receipts):
        return False
    return not (await ctx.settings(name)).fifo


def _receipt(ctx: Context, handle: str, name: str) -> Receipt:
    return decode_receipt(handle, name, ctx.receipt_key)


async def delete_message(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    handle = ctx.params.required("ReceiptHandle")
    receipt = _receipt(ctx, handle, name)
    lenient = await _lenient(ctx, name, [receipt])
    ack = cmd.Ack([cmd.LeaseRef(receipt.id, receipt.lease)], lenient)
    [result] = await ctx.run(name, ack)
    if result.status == rp.STALE_LEASE:
        raise receipt_invalid(handle, "The receipt handle has expired.")
    return {}  # deleted, or already gone: SQS deletes idempotently


async def delete_message_batch(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    failures: list[dict[str, Any]] = []
    acks: list[tuple[str, str, Receipt]] = []
    for entry_id, entry in batch_entries(ctx, "DeleteMessageBatchRequestEntry"):
        try:
            handle = entry.required("ReceiptHandle")
            acks.append((entry_id, handle, _receipt(ctx, handle, name)))
        except SqsError as exc:
            failures.append(failed(entry_id, exc))
    successes = []
    if acks:
        receipts = [r for _, _, r in acks]
        items = [cmd.LeaseRef(r.id, r.lease) for r in receipts]
        results = await ctx.run(name, cmd.Ack(items, await _lenient(ctx, name, receipts)))
        for (entry_id, handle, _), result in zip(acks, results, strict=True):
            if result.status == rp.STALE_LEASE:
                error = receipt_invalid(handle, "The receipt handle has expired.")
                failures.append(failed(entry_id, error))
            else:
                successes.append({"Id": entry_id})
    return {"Successful": successes, "Failed": failures}


async def _visibility_error(ctx: Context, name: str, handle: str, receipt: Receipt) -> SqsError:
    """Why a lease could not be changed: the message is not in flight, or the handle is old."""
    try:
        view = await ctx.run(name, cmd.Peek(receipt.id))
    except QueueError:
        return receipt_invalid(handle, "The message is gone.")
    if view.state != "reserved":
        return SqsError("MessageNotInflight", "The message referred to isn't in flight.")
    return receipt_invalid(handle, "The receipt handle has expired.")


async def _change_visibility(
    ctx: Context, name: str, changes: list[tuple[Receipt, int]]
) -> list[str]:
    """Extend leases (Touch) or end them (Release, for 0): the statuses in order."""
    lenient = await _lenient(ctx, name, [r for r, _ in changes])
    releases = [
        (i, cmd.ReleaseItem(id=r.id, lease=r.lease)) for i, (r, vt) in enumerate(changes) if vt == 0
    ]
    touches = [
        (i, cmd.TouchItem(id=r.id, lease=r.lease, visibility_timeout_ms=vt * 1000))
        for i, (r, vt) in enumerate(changes)
        if vt > 0
    ]
    statuses = [""] * len(changes)
    for indexed, make in ((releases, cmd.Release), (touches, cmd.Touch)):
        if indexed:
            command = make([item for _, item in indexed], lenient)  # type: ignore[arg-type]
            results = await ctx.run(name, command)
            for (i, _), result in zip(indexed, results, strict=True):
                statuses[i] = result.status
    return statuses


async def change_message_visibility(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    handle = ctx.params.required("ReceiptHandle")
    timeout = ctx.params.number("VisibilityTimeout", 0, MAX_VISIBILITY_S, required=True)
    receipt = _receipt(ctx, handle, name)
    [status] = await _change_visibility(ctx, name, [(receipt, timeout or 0)])
    if status != rp.OK:
        raise await _visibility_error(ctx, name, handle, receipt)
    return {}


async def change_message_visibility_batch(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    failures: list[dict[str, Any]] = []
    changes: list[tuple[str, str, Receipt, int]] = []
    for entry_id, entry in batch_entries(ctx, "ChangeMessageVisibilityBatchRequestEntry"):
        try:
            handle = entry.required("ReceiptHandle")
            receipt = _receipt(ctx, handle, name)
            timeout = entry.number("VisibilityTimeout", 0, MAX_VISIBILITY_S, required=True)
            changes.append((entry_id, handle, receipt, timeout or 0))
        except SqsError as exc:
            failures.append(failed(entry_id, exc))
    successes = []
    statuses = await _change_visibility(ctx, name, [(r, vt) for _, _, r, vt in changes])
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
