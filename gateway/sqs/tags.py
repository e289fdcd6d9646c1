"""Queue tags: TagQueue, UntagQueue, ListQueueTags, and the checks CreateQueue shares.

A queue's tags live in its settings' ``meta`` under ``sqs.tag:`` keys, durable in its log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from actors.core import commands as cmd
from actors.core.replies import Description
from actors.settings import QueueSettings
from gateway.sqs.context import Context
from gateway.sqs.errors import SqsError, invalid, missing
from gateway.sqs.queue_attrs import MAX_TAGS, TAG, patched_meta

__all__ = ["ACTIONS", "check_tags", "tags_of"]


def _too_many(queue: str) -> SqsError:
    return invalid(f"Too many tags added for queue {queue}.")


def _check_lengths(keys: Iterable[Any]) -> None:
    if not all(isinstance(key, str) and 1 <= len(key) <= 128 for key in keys):
        raise invalid("Tag keys must be between 1 and 128 characters in length.")


def check_tags(tags: Mapping[str, Any], queue: str) -> dict[str, str]:
    """Tags for ``queue`` as SQS allows them: at most 50, keys of 1-128 characters not
    starting with ``aws:``, values of at most 256.

    Raises:
        SqsError: InvalidParameterValue.
    """
    if len(tags) > MAX_TAGS:
        raise _too_many(queue)
    _check_lengths(tags)
    for key in tags:
        if key.lower().startswith("aws:"):
            raise invalid(f"Tag key {key} is invalid: the prefix aws: is reserved for AWS use.")
    for value in tags.values():
        if not isinstance(value, str) or len(value) > 256:
            raise invalid("Tag values must be between 0 and 256 characters in length.")
    return dict(tags)


def tags_of(settings: QueueSettings) -> dict[str, str]:
    """A queue's tags."""
    meta = settings.meta or {}
    return {k[len(TAG) :]: v for k, v in meta.items() if k.startswith(TAG)}


async def _patch_tags(ctx: Context, desc: Description, updates: dict[str, str | None]) -> None:
    meta = patched_meta(desc.settings.meta, updates, ctx.now_ms() // 1000)
    if len([k for k in meta if k.startswith(TAG)]) > MAX_TAGS:
        raise _too_many(desc.name)
    await ctx.run(desc.name, cmd.PatchSettings({"meta": meta}))
    ctx.forget(desc.name)


async def tag_queue(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    tags = check_tags(ctx.params.string_map("Tags"), name)
    if not tags:
        raise missing("Tags")
    desc = await ctx.describe(name)
    await _patch_tags(ctx, desc, {TAG + k: v for k, v in tags.items()})
    return {}


async def untag_queue(ctx: Context) -> dict[str, Any]:
    name = ctx.queue()
    if "TagKeys" not in ctx.params:
        raise missing("TagKeys")
    keys = ctx.params.strings("TagKeys")
    _check_lengths(keys or [""])  # SQS: an empty list is as a key out of bounds
    desc = await ctx.describe(name)
    await _patch_tags(ctx, desc, dict.fromkeys((TAG + k for k in keys), None))
    return {}


async def list_queue_tags(ctx: Context) -> dict[str, Any]:
    tags = tags_of((await ctx.describe(ctx.queue())).settings)
    return {"Tags": tags} if tags else {}


ACTIONS = {
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
}
