"""The server's own events as watch keys (docs/API.md, "Watches and keys"):

- ``sys:placement``: the placement map's ``generation`` and shard ``count``;
- ``sys:shards``: each shard's ``state`` (starting, recovering, ready, failed, with the
  ``reason``: a full disk, a failed log, a shard that cannot be reached);
- ``sys:queues``: the number of queues, and the ``created`` and ``deleted`` names since
  the last version (up to ``NAMES_SHOWN`` of each; a watcher that needs all of them lists
  the queues).

Each gateway process publishes them itself, from what the shards say every
``SYS_POLL_S``, and only when they change: a dashboard watches them instead of polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from actors.errors import QueueError
from gateway import native
from gateway.shards import shard_state
from gateway.watches.watchers import HUB

__all__ = ["SysEvents", "install"]

log = logging.getLogger(__name__)

SYS_POLL_S = 1.0
NAMES_SHOWN = 100


class SysEvents:
    """What the last look found, and what to publish when the next one differs."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.placement: dict[str, int] | None = None
        self.shards: list[dict[str, Any]] | None = None
        self.changes: int | None = None
        self.names: set[str] | None = None

    async def look(self) -> None:
        """Ask the shards; publish what changed."""
        directory = self.app[native.DIRECTORY]
        hub = self.app[HUB]
        statuses = await directory.status(brief=True)
        generation = max((s.generation for s in statuses), default=0)
        placement = {"generation": generation, "count": directory.count}
        if placement != self.placement:
            self.placement = placement
            hub.publish_sys("sys:placement", placement)
        shards = []
        for status in statuses:
            state, reason = shard_state(status)
            doc: dict[str, Any] = {"index": status.index, "state": state}
            if reason is not None:
                doc["reason"] = reason
            shards.append(doc)
        if shards != self.shards:
            self.shards = shards
            hub.publish_sys("sys:shards", {"count": len(shards), "shards": shards})
        changes = sum(s.queue_changes for s in statuses)
        if changes != self.changes or self.names is None:
            names = set(await directory.names())
            before = self.names
            self.changes, self.names = changes, names
            if before is None:
                hub.publish_sys("sys:queues", {"count": len(names), "created": [], "deleted": []})
            elif names != before:
                hub.publish_sys(
                    "sys:queues",
                    {
                        "count": len(names),
                        "created": sorted(names - before)[:NAMES_SHOWN],
                        "deleted": sorted(before - names)[:NAMES_SHOWN],
                    },
                )

    async def run(self) -> None:
        """Look every ``SYS_POLL_S`` until cancelled."""
        while True:
            try:
                await self.look()
            except QueueError as exc:  # a shard that cannot answer: its state says so next
                log.debug("sys events: %s", exc)
            await asyncio.sleep(SYS_POLL_S)


def install(app: web.Application) -> None:
    """Publish the ``sys:`` events while ``app`` runs."""

    async def publishing(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.ensure_future(SysEvents(app).run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(publishing)
