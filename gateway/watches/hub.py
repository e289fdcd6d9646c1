"""The asyncio side of watches in one gateway process.

Local watchers (WebSocket connections, long polls) arm keys in a :class:`WatchTable`. For
every key with local interest the hub keeps exactly **one** upstream one-shot watch toward
the shard that owns the key, whatever the number of local watchers: when it answers, the
new state is published locally (one encoding, one pass over the armed watchers of that key)
and the upstream watch is armed again with the newest version. A burst of changes upstream
therefore reaches this process as at most one state per round trip, and each watcher gets
at most one notification per arm.

``sys:*`` keys are this process's own (e.g. ``sys:shutdown``); they never go upstream.

Waiting costs a future per long poll and nothing per WebSocket watcher beyond its table
entries: there is no task per waiter. Upstream watches linger ``LINGER_S`` after the last
local interest in a key goes, so watchers that re-arm right after a notification do not make
the hub drop and re-create its upstream watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from actors.clock import Clock, SystemClock
from actors.core import replies as rp
from actors.core.keys import SYS_PREFIX
from actors.errors import BadRequest, QueueError
from watch.core import KeyState, WatchTable

__all__ = ["Hub", "Sink"]

log = logging.getLogger(__name__)

LINGER_S = 30.0

Upstream = Callable[[str, int], Awaitable[rp.KeyView]]


class Sink(Protocol):
    """A watcher that is told, not awaited (a WebSocket connection)."""

    def deliver(self, state: KeyState) -> None: ...


Watcher = Any  # an asyncio.Future[KeyState] (long poll) or a Sink


class Hub:
    """Watches of one gateway process."""

    def __init__(self, upstream: Upstream, clock: Clock | None = None) -> None:
        self._upstream = upstream
        self.clock = clock or SystemClock()
        self.table: WatchTable[Watcher] = WatchTable()
        self._interest: dict[str, int] = {}  # key -> local watchers watching it
        self._follow: dict[str, asyncio.Task[None]] = {}
        self._linger: dict[str, asyncio.TimerHandle] = {}
        self._last_sys_version = 0
        self._polls: set[asyncio.Future[Any]] = set()
        self.upstream_calls = 0  # answers received from upstream (for tests and metrics)
        self.closed = False

    # ---------------------------------------------------------------- watchers

    def arm(self, watcher: Watcher, key: str, version: int | None = None) -> KeyState | None:
        """Arm ``key`` for ``watcher``: the state to deliver now if the watcher is behind,
        else None (it is told later, once)."""
        if self.table.delivered(watcher, key) is None:
            self._interest[key] = self._interest.get(key, 0) + 1
            self._keep(key)
        return self.table.arm(watcher, key, version)

    def unwatch(self, watcher: Watcher, key: str) -> None:
        if self.table.unwatch(watcher, key):
            self._lose(key)

    def drop(self, watcher: Watcher) -> None:
        """Forget a watcher entirely (disconnect, long poll answered or timed out)."""
        for key in self.table.watched_keys(watcher):
            self._lose(key)
        self.table.drop(watcher)

    async def wait(self, key: str, version: int, wait_s: float) -> KeyState | None:
        """A long poll: the key's state once past ``version``, or None after ``wait_s``."""
        fut: asyncio.Future[KeyState | None] = asyncio.get_running_loop().create_future()
        try:
            now = self.arm(fut, key, version)
            if now is not None:
                return now
            if self.closed:
                return None
            self._polls.add(fut)
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(fut, wait_s)
            return None
        finally:
            self._polls.discard(fut)
            self.drop(fut)

    # ---------------------------------------------------------------- publishing

    def publish(self, key: str, version: int, value: Any) -> int:
        """A key's new state: notify every watcher armed on it. Returns how many."""
        state, fired = self.table.publish(key, version, value)
        for w in fired:
            if isinstance(w, asyncio.Future):
                if not w.done():
                    w.set_result(state)
            else:
                w.deliver(state)
        return len(fired)

    def publish_sys(self, key: str, value: Any) -> int:
        """Set one of this process's ``sys:`` keys."""
        if not key.startswith(SYS_PREFIX):
            raise BadRequest("only sys: keys are published by the gateway", key=key)
        version = max(self.table.version(key) + 1, self.clock.now_ms() * 1000)
        return self.publish(key, version, value)

    def state(self, key: str) -> KeyState | None:
        return self.table.state(key)

    # ---------------------------------------------------------------- upstream

    def _keep(self, key: str) -> None:
        """Someone here watches ``key``: make sure one upstream watch follows it."""
        handle = self._linger.pop(key, None)
        if handle is not None:
            handle.cancel()
        if key.startswith(SYS_PREFIX) or key in self._follow or self.closed:
            return
        self._follow[key] = asyncio.ensure_future(self._follow_key(key))

    def _lose(self, key: str) -> None:
        n = self._interest.get(key, 0) - 1
        if n > 0:
            self._interest[key] = n
            return
        self._interest.pop(key, None)
        if key in self._follow and key not in self._linger:
            loop = asyncio.get_running_loop()
            self._linger[key] = loop.call_later(LINGER_S, self._stop_following, key)

    def _stop_following(self, key: str) -> None:
        self._linger.pop(key, None)
        if self._interest.get(key):
            return
        task = self._follow.pop(key, None)
        if task is not None:
            task.cancel()
        self.table.forget(key)

    async def _follow_key(self, key: str) -> None:
        """One upstream one-shot watch after another, for as long as ``key`` is wanted."""
        delay = 0.05
        try:
            while not self.closed:
                state = self.table.state(key)
                since = -1 if state is None else state.version  # -1: tell me what it is now
                try:
                    view = await self._upstream(key, since)
                except QueueError as exc:
                    if isinstance(exc, BadRequest):
                        log.warning("watch of %r refused upstream: %s", key, exc)
                        return
                    await asyncio.sleep(delay)  # the shard is restarting: try again
                    delay = min(delay * 2, 2.0)
                    continue
                delay = 0.05
                self.upstream_calls += 1
                self.publish(view.key, view.version, view.value)
        finally:
            if self._follow.get(key) is asyncio.current_task():
                del self._follow[key]

    def interest(self) -> dict[str, int]:
        """Local watchers per key (for tests and metrics)."""
        return dict(self._interest)

    def following(self) -> list[str]:
        """Keys with an upstream watch (for tests and metrics)."""
        return sorted(self._follow)

    async def close(self) -> None:
        """Stop following upstream; answer pending long polls with "nothing yet"."""
        self.closed = True
        for fut in self._polls:
            if not fut.done():
                fut.set_result(None)
        for handle in self._linger.values():
            handle.cancel()
        self._linger.clear()
        tasks = list(self._follow.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
