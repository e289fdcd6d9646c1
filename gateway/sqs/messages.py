"""Message actions: SendMessage(Batch) and ReceiveMessage — translations onto Put and Take —
and what every batch action shares (entry checks, failed entries)."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from typing import Any

from actors.core import commands as cmd
from actors.core import replies as rp
from actors.errors import QueueError, QueueNotFound
from actors.settings import QueueSettings
from gateway.sqs import message_attrs as ma
from gateway.sqs.context import Context
from gateway.sqs.errors import SqsError, from_queue_error, invalid, missing
from gateway.sqs.md5 import md5_of_attributes, md5_of_body
from gateway.sqs.queue_attrs import ATTR, SQS_MAX_MESSAGE_BYTES, wait_seconds_of
from gateway.sqs.receipts import encode_receipt
from gateway.sqs.wire import Params

__all__ = ["ACTIONS"]

MAX_ENTRIES = 10
MAX_WAIT_S = 20
MAX_VISIBILITY_S = 43_200
_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
_GROUP_OR_DEDUP = re.compile(r"[!-~]{1,128}")


# ------------------------------------------------------------------ batches


def batch_entries(ctx: Context, entry_name: str) -> list[tuple[str, Params]]:
    """A batch's entries with their ids, checked as SQS checks them.

    Raises:
        SqsError: EmptyBatchRequest, TooManyEntriesInBatchRequest, InvalidBatchEntryId,
            BatchEntryIdsNotDistinct, MissingParameter.
    """
    entries = ctx.params.sequence("Entries")
    if not entries:
        raise SqsError(
            "EmptyBatchRequest", f"There should be at least one {entry_name} in the request."
        )
    if len(entries) > MAX_ENTRIES:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_ENTRIES}. "
            f"You have sent {len(entries)}.",
        )
    out: list[tuple[str, Params]] = []
    seen: set[str] = set()
    for i, raw in enumerate(entries, start=1):
        entry = ctx.params.sub(raw)
        entry_id = entry.string("Id")
        if entry_id is None:
            raise missing(f"{entry_name}.{i}.Id")
        if not _ENTRY_ID.fullmatch(entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
        out.append((entry_id, entry))
    return out


def failed(entry_id: str, error: SqsError) -> dict[str, Any]:
    """One BatchResultErrorEntry."""
    return {
        "Id": entry_id,
        "SenderFault": error.sender,
        "Code": error.query_code,
        "Message": error.message,
    }


# ------------------------------------------------------------------ send


class Outgoing:
    """One message of a send, checked and translated, with what the reply says of it."""

    __slots__ = ("md5_attributes", "md5_body", "md5_system", "message")

    def __init__(self, p: Params, s: QueueSettings, *, in_batch: bool = False) -> None:
        body = p.string("MessageBody")
        if not body:
            raise missing("MessageBody")
        ma.check_text(body, "the message body")
        attributes = ma.parse_attributes(p.mapping("MessageAttributes"))
        system = ma.parse_system_attributes(p.mapping("MessageSystemAttributes"))
        limit = s.max_message_bytes
        if ma.size_of(body, attributes) > limit:
            # SQS's words, which differ in a batch entry
            what = "cannot be validated" if in_batch else "are invalid"
            raise invalid(
                f"One or more parameters {what}. Reason: Message must be shorter than "
                f"{limit} bytes."
            )
        ext = ma.Extensions(attributes)
        delay_ms = _delay(p, s, ext)
        group = _group_or_dedup(p, "MessageGroupId")
        hidden: dict[str, Any] = {}
        key = _dedup_key(p, s, ext, group, body, hidden)
        if "AWSTraceHeader" in system:
            hidden[ma.TRACE] = system["AWSTraceHeader"][1]
        stored = {**ma.stored(attributes), **hidden}
        self.message = cmd.NewMessage(
            body=body.encode("utf-8", "surrogatepass"),
            id=secrets.token_hex(16) if s.id_mode == "client" else None,
            delay_ms=delay_ms,
            activate_at_ms=ext.activate_at_ms,
            idempotency_key=key,
            group=group,
            attributes=stored or None,
        )
        self.md5_body = md5_of_body(body)
        self.md5_attributes = md5_of_attributes(attributes)
        self.md5_system = md5_of_attributes(system)

    def result(self, put: rp.PutResult, fifo: bool) -> dict[str, Any]:
        """What SendMessage (or a batch entry) answers."""
        doc: dict[str, Any] = {"MessageId": put.id, "MD5OfMessageBody": self.md5_body}
        if self.md5_attributes:
            doc["MD5OfMessageAttributes"] = self.md5_attributes
        if self.md5_system:
            doc["MD5OfMessageSystemAttributes"] = self.md5_system
        if fifo:
            doc["SequenceNumber"] = put.id
        return doc


def _delay(p: Params, s: QueueSettings, ext: ma.Extensions) -> int | None:
    delay = p.number("DelaySeconds", 0, 900, reason="DelaySeconds must be >= 0 and <= 900.")
    if delay is None or (delay == 0 and s.fifo):  # FIFO: 0 is allowed, the queue's applies
        return ext.delay_ms
    if s.fifo:
        raise invalid(
            f"Value {delay} for parameter DelaySeconds is invalid. Reason: The request include "
            "parameter that is not valid for this queue type."
        )
    if ext.delay_ms is not None or ext.activate_at_ms is not None:
        raise invalid(f"Give either DelaySeconds or {ma.EXT_DELAY} / {ma.EXT_ACTIVATE}, not both.")
    return delay * 1000


def _group_or_dedup(p: Params, name: str) -> str | None:
    value = p.string(name)
    if value is not None and not _GROUP_OR_DEDUP.fullmatch(value):
        raise invalid(
            f"Value {value[:200]} for parameter {name} is invalid. Reason: {name} can only "
            "include alphanumeric and punctuation characters. 1 to 128 in length."
        )
    return value


def _dedup_key(
    p: Params,
    s: QueueSettings,
    ext: ma.Extensions,
    group: str | None,
    body: str,
    hidden: dict[str, Any],
) -> str | None:
    """The engine's idempotency key for a message (FIFO deduplication, or the extension)."""
    dedup = _group_or_dedup(p, "MessageDeduplicationId")
    if not s.fifo:
        if dedup is not None:
            raise invalid(
                f"Value {dedup} for parameter MessageDeduplicationId is invalid. Reason: The "
                "request include parameter that is not valid for this queue type."
            )
        return ext.idempotency_key
    if group is None:
        raise missing("MessageGroupId")
    if ext.idempotency_key is not None:
        if dedup is not None:
            raise invalid(f"Give either MessageDeduplicationId or {ma.EXT_KEY}, not both.")
        dedup = ext.idempotency_key
    if dedup is None:
        if not s.content_based_dedup:
            raise _no_dedup_id()
        dedup = hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()
    hidden[ma.DEDUP_ID] = dedup
    if (s.meta or {}).get(ATTR + "DeduplicationScope") == "messageGroup":
        return f"sqs:{group}:{dedup}"
    return f"sqs:{dedup}"


async def send_message(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    s = await ctx.settings(name)
    out = Outgoing(ctx.params, s)
    [put] = await ctx.run(name, cmd.Put([out.message]))
    return out.result(put, s.fifo)


async def send_message_batch(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    entries = batch_entries(ctx, "SendMessageBatchRequestEntry")
    s = await ctx.settings(name)
    _check_batch_size(entries, s)
    if s.fifo:
        _check_fifo_entries(entries, s)
    failures: list[dict[str, Any]] = []
    ready: list[tuple[str, Outgoing]] = []
    for entry_id, entry in entries:
        try:
            ready.append((entry_id, Outgoing(entry, s, in_batch=True)))
        except SqsError as exc:
            failures.append(failed(entry_id, exc))
    successes: list[dict[str, Any]] = []
    if ready:
        results = await _put_all(ctx, name, [out.message for _, out in ready])
        for (entry_id, out), result in zip(ready, results, strict=True):
            if isinstance(result, SqsError):
                failures.append(failed(entry_id, result))
            else:
                successes.append({"Id": entry_id, **out.result(result, s.fifo)})
    return {"Successful": successes, "Failed": failures}


def _check_batch_size(entries: list[tuple[str, Params]], s: QueueSettings) -> None:
    """SQS sums the whole batch as sent, before it looks at any entry.

    Raises:
        SqsError: BatchRequestTooLong.
    """
    total = sum(
        ma.request_size(e.values.get("MessageBody"), e.values.get("MessageAttributes"))
        for _, e in entries
    )
    limit = max(SQS_MAX_MESSAGE_BYTES, s.max_message_bytes)
    if total > limit:
        raise SqsError(
            "BatchRequestTooLong",
            f"Batch requests cannot be longer than {limit} bytes. You have sent {total} bytes.",
        )


def _check_fifo_entries(entries: list[tuple[str, Params]], s: QueueSettings) -> None:
    """On a FIFO queue, SQS fails the whole batch when an entry lacks its group, or its
    deduplication id (without content-based deduplication); nothing of it is sent. A batch
    with no group at all lacks a parameter, as a single send does (MissingParameter); one in
    which only some entries have a group is InvalidParameterValue (AWS's recorded answer).

    Raises:
        SqsError: MissingParameter, InvalidParameterValue.
    """
    grouped = ["MessageGroupId" in entry for _, entry in entries]
    if not any(grouped):
        raise missing("MessageGroupId")
    if not all(grouped):
        raise invalid("The request must contain the parameter MessageGroupId.")
    if s.content_based_dedup:
        return
    for _, entry in entries:
        attributes = entry.values.get("MessageAttributes")
        keyed = isinstance(attributes, dict) and ma.EXT_KEY in attributes
        if "MessageDeduplicationId" not in entry and not keyed:
            raise _no_dedup_id()


def _no_dedup_id() -> SqsError:
    return invalid(
        "The queue should either have ContentBasedDeduplication enabled or "
        "MessageDeduplicationId provided explicitly"
    )


async def _put_all(
    ctx: Context, name: str, messages: list[cmd.NewMessage]
) -> list[rp.PutResult | SqsError]:
    """Put messages in one command; if the engine refuses the whole put, put them one by one
    so that only the entries at fault fail."""
    try:
        return list(await ctx.run(name, cmd.Put(messages)))
    except QueueNotFound:
        raise
    except QueueError:
        if len(messages) == 1:
            raise
    results: list[rp.PutResult | SqsError] = []
    for message in messages:
        try:
            [put] = await ctx.run(name, cmd.Put([message]))
            results.append(put)
        except QueueNotFound:
            raise
        except QueueError as exc:
            results.append(from_queue_error(exc))
    return results


# ------------------------------------------------------------------ receive


async def receive_message(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    p = ctx.params
    limit = p.number("MaxNumberOfMessages", 1, MAX_ENTRIES) or 1
    visibility = p.number("VisibilityTimeout", 0, MAX_VISIBILITY_S)
    wait = p.number(
        "WaitTimeSeconds", 0, MAX_WAIT_S, reason=f"Must be >= 0 and <= {MAX_WAIT_S}, if provided."
    )
    system = ma.system_attribute_names(
        p.strings("AttributeNames") + p.strings("MessageSystemAttributeNames")
    )
    patterns = p.strings("MessageAttributeNames")
    if wait is None:
        wait = wait_seconds_of(await ctx.settings(name))
    # FIFO only, as SQS: a retry with the same id within 5 minutes gets the same messages
    # and receipt handles (actors/core/decide.py, _taken_again); standard queues ignore it.
    attempt = p.string("ReceiveRequestAttemptId") if name.endswith(".fifo") else None
    take = cmd.Take(limit, None if visibility is None else visibility * 1000, attempt)
    deliveries = await ctx.take(name, take, float(wait))
    render = _renderer(ctx, name, system, patterns)
    messages = [render(d) for d in deliveries]
    return {"Messages": messages} if messages else {}


def _renderer(
    ctx: Context, name: str, system: list[str], patterns: list[str]
) -> Callable[[rp.Delivery], dict[str, Any]]:
    fifo = name.endswith(".fifo")

    def render(d: rp.Delivery) -> dict[str, Any]:
        body = d.body.decode("utf-8", "replace")
        doc: dict[str, Any] = {
            "MessageId": d.id,
            "ReceiptHandle": encode_receipt(name, d.id, d.lease, ctx.receipt_key),
            "MD5OfBody": md5_of_body(body),
            "Body": body,
        }
        stored = d.attributes or {}
        values = {
            "SenderId": ctx.account,
            "SentTimestamp": str(stored.get(cmd.SENT_AT, d.enqueued_at_ms)),
            "ApproximateReceiveCount": str(d.receive_count),
            "ApproximateFirstReceiveTimestamp": str(d.first_taken_ms),
            "SequenceNumber": d.id if fifo else None,
            "MessageDeduplicationId": stored.get(ma.DEDUP_ID),
            "MessageGroupId": d.group,
            "AWSTraceHeader": stored.get(ma.TRACE),
            "DeadLetterQueueSourceArn": _source_arn(ctx, stored),
        }
        shown = {k: str(values[k]) for k in system if values.get(k) is not None}
        if shown:
            doc["Attributes"] = shown
        attributes = ma.shown_attributes(stored, patterns)
        if attributes:
            doc["MD5OfMessageAttributes"] = md5_of_attributes(attributes)
            doc["MessageAttributes"] = ma.to_wire(attributes)
        return doc

    return render


def _source_arn(ctx: Context, stored: dict[str, Any]) -> str | None:
    source = stored.get(cmd.SOURCE_QUEUE)  # set on dead letters (actors/shard.py)
    return ctx.arn(source) if isinstance(source, str) else None


ACTIONS = {
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
}
