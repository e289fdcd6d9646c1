"""Queue actions: CreateQueue, GetQueueUrl, ListQueues, DeleteQueue, Get/SetQueueAttributes,
PurgeQueue, TagQueue, UntagQueue, ListQueueTags, ListDeadLetterSourceQueues."""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

from actors.core import commands as cmd
from actors.core.replies import Description
from actors.errors import QueueError, QueueNotFound
from actors.settings import validate_queue_name
from gateway import native
from gateway.sqs import queue_attrs as qa
from gateway.sqs.context import Context
from gateway.sqs.errors import SqsError, invalid, missing, no_queue

__all__ = ["ACTIONS"]


def _queue_name(name: str) -> str:
    if name.startswith(qa.RESERVED_PREFIX):
        raise invalid(f"Queue names starting with {qa.RESERVED_PREFIX} are the server's own.")
    try:
        return validate_queue_name(name)
    except QueueError:
        raise invalid(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in "
            "length (plus .fifo for FIFO queues)."
        ) from None


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
    name = _queue_name(p.required("QueueName"))
    attributes = p.string_map("Attributes")
    fifo = name.endswith(".fifo")
    if fifo and attributes.get("FifoQueue", "").lower() != "true":
        raise invalid("A queue whose name ends in .fifo needs the attribute FifoQueue=true.")
    changes = qa.changes_for(attributes, fifo=fifo, creating=True)
    if changes.dead_letter_queue is not None:
        await _check_dead_letter_target(ctx, changes.dead_letter_queue, fifo)
    tags = p.string_map("tags") or p.string_map("Tags")  # JSON: "tags"; query: Tag.N.Key
    settings, given = qa.new_settings(name, changes, tags, ctx.now_ms() // 1000)
    created, actual = await native_directory(ctx).create(name, settings, given)
    if not created:
        meta = actual.meta or {}
        differ = [k for k, v in changes.meta.items() if meta.get(k) != v]
        if differ:
            raise SqsError(
                "QueueNameExists",
                f"A queue named {name} already exists with other attributes: "
                + ", ".join(k.removeprefix(qa.ATTR) for k in differ),
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
    if (owner is not None and owner != qa.ACCOUNT) or name.startswith(qa.RESERVED_PREFIX):
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
    names = await native_directory(ctx).names()
    return sorted(n for n in names if not n.startswith(qa.RESERVED_PREFIX))


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
    view = qa.attributes_view(desc, wanted, ctx.region)
    return {"Attributes": view} if view else {}


async def set_queue_attributes(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    attributes = ctx.params.string_map("Attributes")
    if "Attributes" not in ctx.params:
        raise missing("Attributes")
    desc = await ctx.describe(name)
    changes = qa.changes_for(attributes, fifo=desc.settings.fifo, creating=False)
    if changes.dead_letter_queue is not None:
        await _check_dead_letter_target(ctx, changes.dead_letter_queue, desc.settings.fifo)
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


async def _patch_tags(ctx: Context, desc: Description, updates: dict[str, str | None]) -> None:
    meta = qa.patched_meta(desc.settings.meta, updates, ctx.now_ms() // 1000)
    if len([k for k in meta if k.startswith(qa.TAG)]) > qa.MAX_TAGS:
        raise invalid(f"Too many tags: a queue has at most {qa.MAX_TAGS}.")
    await ctx.run(desc.name, cmd.PatchSettings({"meta": meta}))
    ctx.forget(desc.name)


async def tag_queue(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    tags = qa.check_tags(ctx.params.string_map("Tags"))
    if not tags:
        raise missing("Tags")
    desc = await ctx.describe(name)
    await _patch_tags(ctx, desc, {qa.TAG + k: v for k, v in tags.items()})
    return {}


async def untag_queue(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    keys = ctx.params.strings("TagKeys")
    if not keys:
        raise missing("TagKeys")
    desc = await ctx.describe(name)
    await _patch_tags(ctx, desc, dict.fromkeys((qa.TAG + k for k in keys), None))
    return {}


async def list_queue_tags(ctx: Context) -> dict[str, Any]:
    tags = qa.tags_of((await ctx.describe(ctx.queue())).settings)
    return {"Tags": tags} if tags else {}


async def list_dead_letter_source_queues(ctx: Context) -> dict[str, Any]:
    target = ctx.queue()
    await ctx.run(target, cmd.Stats())  # the queue itself must exist

    async def points_here(name: str) -> bool:
        try:
            desc = await ctx.describe(name)
        except QueueError:
            return False  # deleted meanwhile
        return desc.settings.dead_letter_queue == target

    names = await _visible_names(ctx)
    found = await asyncio.gather(*map(points_here, names))
    sources = [n for n, ok in zip(names, found, strict=True) if ok]
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
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
}
