"""Queue actions: CreateQueue, GetQueueUrl, ListQueues, DeleteQueue, Get/SetQueueAttributes,
PurgeQueue, ListDeadLetterSourceQueues (tags: tags.py; permissions: permissions.py)."""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

from actors.core import commands as cmd
from actors.errors import QueueError, QueueNotFound
from actors.settings import validate_queue_name
from gateway import native
from gateway.sqs import queue_attrs as qa
from gateway.sqs.addresses import RESERVED_PREFIX
from gateway.sqs.context import Context
from gateway.sqs.errors import SqsError, invalid, missing, no_queue
from gateway.sqs.tags import check_tags

__all__ = ["ACTIONS", "dead_letter_sources"]


def _queue_name(name: str, attributes: dict[str, str]) -> str:
    """A name for a new queue, as SQS allows them (``.fifo`` names FIFO queues only).

    Raises:
        SqsError: InvalidParameterValue.
    """
    fifo = name.endswith(".fifo") and attributes.get("FifoQueue", "").lower() == "true"
    if name.startswith(RESERVED_PREFIX):
        raise invalid(f"Queue names starting with {RESERVED_PREFIX} are the server's own.")
    if name.endswith(".fifo") and not fifo:  # a standard queue's name has no period
        raise invalid(qa.STANDARD_NAME_RULE)
    try:
        return validate_queue_name(name)
    except QueueError:
        raise invalid(qa.FIFO_NAME_RULE if fifo else qa.STANDARD_NAME_RULE) from None


async def _check_dead_letter_target(ctx: Context, target: str, fifo: bool) -> None:
    """A RedrivePolicy must name an existing queue of the same type.

    Raises:
        SqsError: InvalidParameterValue.
    """
    try:
        desc = await ctx.describe(target)
    except QueueNotFound:
        raise invalid(
            f"Value for parameter RedrivePolicy is invalid. Reason: Dead letter target "
            f"{target} does not exist."
        ) from None
    if desc.settings.fifo != fifo:
        raise invalid(
            "Value for parameter RedrivePolicy is invalid. Reason: Dead-letter queue must be "
            "same type of queue as the source."
        )


async def create_queue(ctx: Context) -> dict[str, Any]:
    p = ctx.params
    attributes = p.string_map("Attributes")
    name = _queue_name(p.required("QueueName"), attributes)
    fifo = name.endswith(".fifo")
    changes = qa.changes_for(attributes, fifo=fifo, creating=True, account=ctx.account)
    if changes.dead_letter_queue is not None:
        await _check_dead_letter_target(ctx, changes.dead_letter_queue, fifo)
    tags = p.string_map("tags") or p.string_map("Tags")  # JSON: "tags"; query: Tag.N.Key
    settings = qa.new_settings(name, changes, check_tags(tags, name), ctx.now_ms() // 1000)
    # An existing queue answers when the attributes given match its own (checked here,
    # where SQS's names for them are known, rather than by the shard).
    created, actual = await native_directory(ctx).create(name, settings, [])
    differ = [] if created else qa.differing(changes, actual)
    if differ:
        raise SqsError(
            "QueueNameExists",
            "A queue already exists with the same name and a different value for attribute "
            + differ[0],
        )
    ctx.forget(name)
    return {"QueueUrl": ctx.url(name)}


def native_directory(ctx: Context) -> Any:
    """The gateway's directory of queues."""
    return ctx.app[native.DIRECTORY]


async def get_queue_url(ctx: Context) -> dict[str, Any]:
    p = ctx.params
    name = p.required("QueueName")
    owner = p.string("QueueOwnerAWSAccountId")
    if (owner is not None and owner != ctx.account) or name.startswith(RESERVED_PREFIX):
        raise no_queue()
    try:
        validate_queue_name(name)
    except QueueError:
        raise no_queue() from None
    await ctx.run(name, cmd.Stats())
    return {"QueueUrl": ctx.url(name)}


def _page(names: list[str], ctx: Context) -> tuple[list[str], str | None]:
    """One page of ``names`` by MaxResults / NextToken (a token names the last one shown).

    Raises:
        SqsError: InvalidParameterValue.
    """
    p = ctx.params
    limit = p.number("MaxResults", 1, 1000)
    token = p.string("NextToken")
    if token is not None:
        try:
            after = base64.urlsafe_b64decode(token.encode()).decode()
        except (binascii.Error, ValueError):
            raise invalid("Invalid NextToken value.") from None
        names = [n for n in names if n > after]
    if limit is None:
        return names[:1000], None
    page = names[:limit]
    more = len(names) > limit
    next_token = base64.urlsafe_b64encode(page[-1].encode()).decode() if more else None
    return page, next_token


async def _visible_names(ctx: Context) -> list[str]:
    """The SQS queues the caller may read, sorted."""
    names = await native_directory(ctx).names()
    return sorted(n for n in names if not n.startswith(RESERVED_PREFIX) and ctx.may("read", n))


async def list_queues(ctx: Context) -> dict[str, Any]:
    prefix = ctx.params.string("QueueNamePrefix") or ""
    names = [n for n in await _visible_names(ctx) if n.startswith(prefix)]
    page, token = _page(names, ctx)
    result: dict[str, Any] = {}
    if page:
        result["QueueUrls"] = [ctx.url(n) for n in page]
    if token:
        result["NextToken"] = token
    return result


async def delete_queue(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    await native_directory(ctx).delete(name)
    ctx.forget(name)
    return {}


async def get_queue_attributes(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    wanted = ctx.params.strings("AttributeNames")
    desc = await ctx.describe(name)
    view = qa.attributes_view(desc, wanted, ctx.region, ctx.account)
    return {"Attributes": view} if view else {}


async def set_queue_attributes(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    attributes = ctx.params.string_map("Attributes")
    if "Attributes" not in ctx.params:
        raise missing("Attributes")
    desc = await ctx.describe(name)
    fifo = desc.settings.fifo
    changes = qa.changes_for(attributes, fifo=fifo, creating=False, account=ctx.account)
    if changes.dead_letter_queue is not None:
        await _check_dead_letter_target(ctx, changes.dead_letter_queue, fifo)
    fields = dict(changes.fields)
    fields["meta"] = qa.patched_meta(desc.settings.meta, changes.meta, ctx.now_ms() // 1000)
    await ctx.run(name, cmd.PatchSettings(fields))
    ctx.forget(name)
    return {}


async def purge_queue(ctx: Context) -> dict[str, Any]:
    """Delete every message; a second purge of the queue within 60 s is refused, as SQS
    does. The time is kept in the queue's settings (durable, and the same for every
    gateway); two purges racing through two gateways may both pass."""
    name = ctx.queue()
    desc = await ctx.describe(name)
    now = ctx.now_ms()
    meta = dict(desc.settings.meta or {})
    last = meta.get(qa.PURGED)
    if last is not None and last.isdigit() and now - int(last) < qa.PURGE_INTERVAL_MS:
        raise SqsError(
            "PurgeQueueInProgress",
            f"Only one PurgeQueue operation on {name} is allowed every 60 seconds.",
            status=403,
        )
    meta[qa.PURGED] = str(now)
    await ctx.run(name, cmd.PatchSettings({"meta": meta}))
    ctx.forget(name)
    await ctx.run(name, cmd.Purge())
    return {}


async def dead_letter_sources(ctx: Context, target: str) -> list[str]:
    """The queues whose dead letters go to ``target``, by name."""

    async def points_here(name: str) -> bool:
        try:
            desc = await ctx.describe(name)
        except QueueError:
            return False  # deleted meanwhile
        return desc.settings.dead_letter_queue == target

    names = await _visible_names(ctx)
    found = await asyncio.gather(*map(points_here, names))
    return [n for n, ok in zip(names, found, strict=True) if ok]


async def list_dead_letter_source_queues(ctx: Context) -> dict[str, Any]:
    target = ctx.queue()
    await ctx.run(target, cmd.Stats())  # the queue itself must exist
    sources = await dead_letter_sources(ctx, target)
    page, token = _page(sources, ctx)
    result: dict[str, Any] = {"queueUrls": [ctx.url(n) for n in page]}
    if token:
        result["NextToken"] = token
    return result


ACTIONS = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "PurgeQueue": purge_queue,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
}
