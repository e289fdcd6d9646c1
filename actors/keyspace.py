"""Watch keys on the shards: where a key lives, and one-shot upstream watches.

Two kinds of keys live on shards:

- ``queue:{name}`` — a queue's counts (the API's stats document), published by the queue on
  the shard that owns the queue. Changes are coalesced: a burst of commands becomes at most
  one publication per ``COALESCE_S`` while someone watches, and the final state always
  arrives. Nobody watching costs nothing but forgetting the cached state. Versions are
  hybrid-clock numbers (``max(last + 1, wall-clock µs)``), so they keep growing across
  restarts without being logged.
- application keys — durable: a key lives in one of ``PARTITIONS`` key-partition logs
  (reserved queues ``__evq-keys-NN``) as ``KeySet`` events, so its version survives restarts
  and keeps growing; the partition's shard publishes each durable set.

``sys:*`` keys never reach a shard: each gateway process publishes them itself.

:class:`ShardKeys` answers one-shot watches from gateways (one per key per gateway process):
"tell me when ``key`` is past version V". Futures, not tasks, wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from actors.clock import Clock
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.core.keys import QUEUE_PREFIX, SYS_PREFIX, validate_key
from actors.errors import BadRequest, QueueError
from watch.core import KeyState, WatchTable

__all__ = [
    "PARTITIONS",
    "ShardKeys",
    "home_of",
    "is_partition",
    "partition_of",
    "queue_value",
]

PARTITIONS = 16
PARTITION_PREFIX = "__evq-keys-"
COALESCE_S = 0.05


def partition_of(key: str) -> str:
    """The key-partition queue that holds application key ``key``."""
    return f"{PARTITION_PREFIX}{zlib.crc32(key.encode()) % PARTITIONS:02d}"


def is_partition(queue: str) -> bool:
    return queue.startswith(PARTITION_PREFIX)


def home_of(key: str) -> str:
    """The queue whose shard answers for ``key``.

    Raises:
        BadRequest: an invalid key, or a ``sys:`` key (those live in the gateways).
    """
    validate_key(key)
    if key.startswith(QUEUE_PREFIX):
        return key[len(QUEUE_PREFIX) :]
    if key.startswith(SYS_PREFIX):
        raise BadRequest("sys: keys are published by the server", key=key)
    return partition_of(key)


def queue_value(s: rp.StatsView) -> dict[str, Any]:
    """A queue's counts as the API shows them (also the value of its ``queue:`` key)."""
    return {
        "ready": s.ready,
        "delayed": s.delayed,
        "reserved": s.reserved,
        "total": s.total,
        "oldest_ready_age": None if s.oldest_ready_age_ms is None else s.oldest_ready_age_ms / 1000,
        "dead_lettered": s.dead_lettered,
        "dead_letter_pending": s.dead_letter_pending,
        "expired": s.expired,
        "acked": s.acked,
        "enqueued": s.enqueued,
        "purged": s.purged,
        "paused": s.paused,
    }


# How the shard answers "what is this key now": (version, value) for application keys,
# the queue's stats (or None: no such queue) for queue keys.
GetKey = Callable[[str], Awaitable[rp.KeyView]]
GetStats = Callable[[str], Awaitable[rp.StatsView | None]]


class ShardKeys:
    """The keys one shard answers for, and the gateways' one-shot watches on them."""

    def __init__(self, clock: Clock, get_key: GetKey, get_stats: GetStats) -> None:
        self.clock = clock
        self._get_key = get_key
        self._get_stats = get_stats
        self.table: WatchTable[asyncio.Future[KeyState]] = WatchTable()
        self._last_version = 0
        self._dirty: set[str] = set()
        self._flush: asyncio.TimerHandle | None = None
        self._loading: dict[str, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Queues whose ``queue:`` key the table holds a state of: a change of any other
        # queue costs one set lookup (every write calls queue_changed).
        self._known: set[str] = set()

    def next_version(self) -> int:
        """A queue-key version: greater than every earlier one, also across restarts."""
        self._last_version = max(self._last_version + 1, self.clock.now_ms() * 1000)
        return self._last_version

    # ---------------------------------------------------------------- watches

    async def watch(self, key: str, version: int) -> rp.KeyView:
        """The key's state as soon as its version is past ``version`` (cancel to give up).

        Raises:
            BadRequest: an invalid key.
        """
        home_of(key)
        if self.table.state(key) is None:
            await self._load(key)
        fut: asyncio.Future[KeyState] = asyncio.get_running_loop().create_future()
        now = self.table.arm(fut, key, version)
        if now is None:
            try:
                now = await fut
            finally:
                self.table.drop(fut)
        else:
            self.table.drop(fut)
        return rp.KeyView(key, now.version, now.value)

    async def get(self, key: str) -> rp.KeyView:
        """The key's state now."""
        home_of(key)
        if self.table.state(key) is None:
            await self._load(key)
        state = self.table.state(key)
        assert state is not None
        return rp.KeyView(key, state.version, state.value)

    async def _load(self, key: str) -> None:
        pending = self._loading.get(key)
        if pending is not None:
            await asyncio.shield(pending)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._loading[key] = fut
        try:
            if key.startswith(QUEUE_PREFIX):
                stats = await self._get_stats(key[len(QUEUE_PREFIX) :])
                value = None if stats is None else queue_value(stats)
                version = self.next_version()
            else:
                view = await self._get_key(key)
                version, value = view.version, view.value
            if self.table.state(key) is None:
                self._publish(key, version, value)
            fut.set_result(None)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()
            raise
        finally:
            del self._loading[key]

    def _publish(self, key: str, version: int, value: Any) -> None:
        if key.startswith(QUEUE_PREFIX):
            self._known.add(key[len(QUEUE_PREFIX) :])
        state, fired = self.table.publish(key, version, value)
        for fut in fired:
            if not fut.done():
                fut.set_result(state)

    # ---------------------------------------------------------------- changes

    def key_set(self, view: rp.KeyView) -> None:
        """An application key's new version is durable."""
        self._publish(view.key, view.version, view.value)

    def cares(self, queue: Any) -> bool:
        """Whether a change of ``queue`` (anything with a ``name``) matters to the watches:
        a state of its ``queue:`` key is held (to publish, or to forget)."""
        return queue.name in self._known

    def queue_changed(self, queue: Any) -> None:
        """``queue`` (anything with a ``name``) may have new counts (called on every durable
        change of a queue)."""
        name = queue.name
        if name not in self._known:
            return  # no state of its key is held: it is computed when someone asks
        key = QUEUE_PREFIX + name
        if not self.table.interested(key):
            self.table.forget(key)  # recomputed when someone asks
            self._known.discard(name)
            return
        self._dirty.add(name)
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(COALESCE_S, self._start_flush)

    def _start_flush(self) -> None:
        self._flush = None
        names, self._dirty = self._dirty, set()
        task = asyncio.ensure_future(self._publish_queues(names))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish_queues(self, names: set[str]) -> None:
        for name in names:
            with contextlib.suppress(QueueError):
                stats = await self._get_stats(name)
                self._publish(
                    QUEUE_PREFIX + name,
                    self.next_version(),
                    None if stats is None else queue_value(stats),
                )

    def moved(self, queue: str, refusal: QueueError) -> int:
        """Queue ``queue`` left this shard (handed over): the watches of the keys it answers
        for (its ``queue:`` key, or a key partition's keys) fail with ``refusal`` (the
        WrongShard naming its new shard: the gateway watches there), and their states are
        forgotten (stale if the queue comes back). Returns how many watches were told."""
        told = 0
        for key in [k for k in self.table.armed_keys() if home_of(k) == queue]:
            for fut in self.table.evict(key):
                if not fut.done():
                    fut.set_exception(refusal)
                    told += 1
        for key in [k for k in self.table.known_keys() if home_of(k) == queue]:
            self.table.evict(key)
        self._known.discard(queue)
        self._dirty.discard(queue)
        return told

    def queue_gone(self, name: str) -> None:
        """A queue was deleted: its key's value becomes None."""
        self._publish(QUEUE_PREFIX + name, self.next_version(), None)

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None


def set_key_command(key: str, value: Any) -> tuple[str, cmd.SetKey]:
    """The partition queue and the command that set an application key."""
    return partition_of(key), cmd.SetKey(key, value)
