"""Which gateways serve: the ``gateways`` of ``GET /v1/status``, drawn by the console's
cluster page (issue 36).

Each gateway that coordinates shards over Ray (``evq serve``'s first process, every gateway
of a cluster) publishes a record of itself in the shards' store, ``wal/gateways/<id>.json``,
every ``BEAT_S``: where it listens, its host and process, how many gateway processes share
its port, its watchers and open requests, when it started. The status lists the records
published within ``STALE_S`` (a gateway that stopped beating has stopped, or is cut off from
the store), and each gateway deletes records older than ``GONE_S`` once a minute, so the
prefix stays small. A gateway that stops says so by deleting its own record. A gateway
without a store (shards in its own process) lists itself alone. The worker processes of
``--workers`` ask the first process (:func:`gateway.tasks.forwarded`), so every process
answers the same list.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from actors.clock import Clock, SystemClock
from actors.errors import QueueError
from actors.log.store import KeyNotFound, ObjectStore

__all__ = ["ABOUT", "BEAT_S", "GONE_S", "PREFIX", "PRESENCE", "STALE_S", "Presence"]

log = logging.getLogger(__name__)

PREFIX = "wal/gateways/"
BEAT_S = 5.0
STALE_S = 3 * BEAT_S  # not published for this long: not listed
GONE_S = 3600.0  # not published for this long: deleted by the next gateway that sweeps
SWEEP_EVERY = 12  # beats between two sweeps (each reads every record)


class Presence:
    """This gateway's record, published to ``store`` (if any) while :meth:`run` runs."""

    def __init__(
        self,
        store: ObjectStore | None,
        about: Callable[[], dict[str, Any]],
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.about = about  # what the record says of this gateway now (listen, counts, …)
        self.clock = clock or SystemClock()
        self.id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.started_at = self._now()

    def _now(self) -> float:
        return self.clock.now_ms() / 1000

    def _key(self, gateway_id: str) -> str:
        return f"{PREFIX}{gateway_id}.json"

    def record(self) -> dict[str, Any]:
        """This gateway's record as it is now."""
        return {
            "id": self.id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": self.started_at,
            **self.about(),
            "seen_at": self._now(),
        }

    async def beat(self, sweep: bool = True) -> None:
        """Publish the record; with ``sweep``, delete the records of gateways gone for
        ``GONE_S``."""
        if self.store is None:
            return
        await self.store.put(self._key(self.id), json.dumps(self.record()).encode())
        if not sweep:
            return
        now = self._now()
        for key, doc in await self._records():
            if now - _seen(doc) > GONE_S:  # also what is not a record: nothing reads it
                with contextlib.suppress(KeyNotFound):
                    await self.store.delete(key)

    async def _records(self) -> list[tuple[str, dict[str, Any]]]:
        """(key, record) of each object under the prefix; one that does not decode to a
        record is an empty one (never seen: not listed, deleted as gone)."""
        assert self.store is not None
        found = []
        for key in await self.store.list(PREFIX):
            try:
                doc = json.loads(await self.store.get(key))
            except KeyNotFound:
                continue
            except ValueError:
                doc = None
            ok = isinstance(doc, dict) and isinstance(doc.get("id"), str)
            found.append((key, doc if ok else {}))
        return found

    async def gateways(self) -> list[dict[str, Any]]:
        """Every gateway published within ``STALE_S`` (this one always, as it is now), the
        oldest first, each with ``last_seen_s`` and whether it is ``self``."""
        now = self._now()
        mine = self.record()
        listed = {self.id: mine}
        if self.store is not None:
            for _, doc in await self._records():
                if doc and doc["id"] != self.id and now - _seen(doc) <= STALE_S:
                    listed[doc["id"]] = doc
        out = []
        for doc in listed.values():
            doc = dict(doc)
            doc["last_seen_s"] = round(max(0.0, now - doc.pop("seen_at", now)), 1)
            doc["self"] = doc["id"] == self.id
            out.append(doc)
        return sorted(out, key=lambda d: (d.get("started_at", 0), d["id"]))

    async def run(self) -> None:
        """Beat until cancelled (sweeping once every ``SWEEP_EVERY`` beats, the first
        included); a beat that fails is logged and tried again at the next."""
        for n in itertools.count():
            try:
                await self.beat(sweep=n % SWEEP_EVERY == 0)
            except Exception as exc:  # the store's, whatever it is: the loop must go on
                log.warning("gateway presence: could not publish (%r); trying again", exc)
            await asyncio.sleep(BEAT_S)

    async def leave(self) -> None:
        """Delete this gateway's record (it stops)."""
        if self.store is not None:
            with contextlib.suppress(KeyNotFound, QueueError, OSError):
                await self.store.delete(self._key(self.id))


def _seen(doc: dict[str, Any]) -> float:
    seen = doc.get("seen_at")
    return float(seen) if isinstance(seen, int | float) else 0.0


PRESENCE: web.AppKey[Presence] = web.AppKey("presence", Presence)
# What the server tells the app of itself for the record: {"listen", "processes"}.
ABOUT: web.AppKey[dict[str, Any]] = web.AppKey("presence_about", dict)
