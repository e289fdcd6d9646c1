"""A shard: many queues in one process, each an independent :class:`QueueActor`.

A Ray actor is a whole process (~50 MiB here), so queues share a few shard processes; a
queue lives on shard ``placement(name, count)``. A shard is a plain asyncio class: Ray wraps
it only where it is spawned (:mod:`actors.spawn`), and the tests use it directly.

On start a shard opens every queue of the store that hashes to it, so a restarted shard
process (or its replacement on another node) serves its queues again from their logs.
Deleting a queue writes a tombstone first, so a crash half-way through the deletion is
finished by the next start instead of leaving a damaged log behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from actors.clock import Clock, SystemClock
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.core.ids import IdSource
from actors.core.state import Message
from actors.errors import NotReady, Overloaded, QueueError, QueueExists, QueueNotFound
from actors.ids import RandomIds
from actors.keyspace import ShardKeys, is_partition, partition_of
from actors.log import keys
from actors.log.replay import RecoveryReport
from actors.log.store import KeyNotFound, ObjectStore
from actors.metrics import QueueMetrics
from actors.queue_actor import QueueActor
from actors.settings import LogSettings, QueueSettings, validate_queue_name

__all__ = ["QueueShard", "ShardStatus", "placement"]

log = logging.getLogger(__name__)

# Puts a batch of dead letters into a queue that may live on another shard.
Forward = Callable[[str, list[object]], Awaitable[list[Any]]]


def placement(name: str, count: int) -> int:
    """The shard that owns queue ``name`` among ``count`` shards (stable across processes)."""
    return zlib.crc32(name.encode()) % count


def _tombstone(name: str) -> str:
    return f"{keys.queue_prefix(name)}DELETED"


class ShardStatus(msgspec.Struct):
    """Whether a shard has recovered its queues, and what recovery found."""

    index: int
    ready: bool
    queues: int
    recovering: int
    reports: list[RecoveryReport]
    failed: dict[str, str]


class QueueShard:
    """Hosts the queues that hash to ``index`` out of ``count``."""

    def __init__(
        self,
        index: int,
        count: int,
        store: ObjectStore,
        *,
        log_settings: LogSettings | None = None,
        clock: Clock | None = None,
        ids: IdSource | None = None,
        forward: Forward | None = None,
        memory_budget_bytes: int | None = None,
    ) -> None:
        self.index = index
        # Past this resident size, puts are refused (Overloaded) until takes and acks free
        # memory: a full shard answers 429 instead of dying of out-of-memory.
        self.memory = MemoryBudget(memory_budget_bytes)
        self.count = count
        self.store = store
        self.log_settings = log_settings or LogSettings()
        self.clock = clock or SystemClock()
        self.ids = ids or RandomIds()
        self.forward = forward  # set by the spawner: routes dead letters to other shards
        self.queues: dict[str, QueueActor] = {}
        self.listeners: list[Callable[[QueueActor], None]] = []
        self._opening: dict[str, asyncio.Future[QueueActor]] = {}
        self._ready = False
        self._recovering = 0
        self._reports: list[RecoveryReport] = []
        self._failed: dict[str, str] = {}
        self._closed = False
        self._created_here: frozenset[str] = frozenset()
        self.keys = ShardKeys(self.clock, self._get_app_key, self._get_stats)
        self.listeners.append(self._queue_changed)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> ShardStatus:
        """Open every queue of the store that belongs here; return the status."""
        names = await self._stored_names()
        mine = [n for n in names if placement(n, self.count) == self.index]
        self._recovering = len(mine)
        log.info("shard %d/%d: recovering %d queue(s)", self.index, self.count, len(mine))
        for name in mine:
            try:
                await self._open(name)
            except QueueNotFound:
                pass  # a queue whose deletion was finished, or nothing valid survived
            except QueueError as exc:
                self._failed[name] = str(exc)
                log.error("shard %d: queue %s did not recover: %s", self.index, name, exc)
            finally:
                self._recovering -= 1
        self._ready = True
        return self.status()

    def status(self) -> ShardStatus:
        """Readiness and recovery reports."""
        return ShardStatus(
            self.index,
            self._ready,
            len(self.queues),
            self._recovering,
            self._reports,
            self._failed,
        )

    async def close(self) -> None:
        """Close every queue: finish writes, snapshot, stop timers."""
        self._closed = True
        self.keys.close()
        await asyncio.gather(*(q.close() for q in self.queues.values()))

    async def _stored_names(self) -> list[str]:
        seen = set()
        for key in await self.store.list(keys.ROOT):
            name = key[len(keys.ROOT) :].split("/", 1)[0]
            seen.add(name)
        return sorted(seen)

    # ---------------------------------------------------------------- queues

    async def create(
        self, name: str, settings: QueueSettings, given: list[str]
    ) -> tuple[bool, QueueSettings]:
        """Create ``name`` (True), or find it with matching settings (False).

        Only the settings named in ``given`` must match an existing queue's.

        Raises:
            QueueExists: it exists and a given setting differs.
            BadRequest: invalid name or settings.
        """
        validate_queue_name(name)
        settings.validate(name)
        self._check_open()
        queue = self.queues.get(name)
        created = False
        if queue is None:
            queue = await self._open(name, cmd.Create(name, settings), lenient=True)
            # Exactly one of several concurrent creators sees the flag.
            created, self._created_here = name in self._created_here, self._created_here - {name}
        existing = queue.state.settings
        if not created:
            differ = [f for f in given if getattr(existing, f) != getattr(settings, f)]
            if differ:
                raise QueueExists(f"queue {name} exists with other {', '.join(differ)}", queue=name)
        return created, existing

    async def delete(self, name: str) -> None:
        """Delete the queue and its whole log.

        Raises:
            QueueNotFound: no such queue.
        """
        queue = await self.get(name)
        await queue.close(snapshot=False)
        self.queues.pop(name, None)
        await self.store.put(_tombstone(name), b"")
        await self._erase(name)
        self.keys.queue_gone(name)

    async def _erase(self, name: str) -> None:
        """Remove every object of the queue, the tombstone last."""
        tomb = _tombstone(name)
        for key in await self.store.list(keys.queue_prefix(name)):
            if key != tomb:
                await self.store.delete(key)
        await self.store.delete(tomb)

    async def names(self) -> list[str]:
        """The queues this shard serves (not the server's own key partitions)."""
        return sorted(n for n in self.queues if not is_partition(n))

    async def get(self, name: str) -> QueueActor:
        """The queue actor for ``name``, opened from the store if needed.

        Raises:
            QueueNotFound: no such queue.
        """
        queue = self.queues.get(name)
        if queue is not None:
            return queue
        self._check_open()
        if not self._ready:
            raise NotReady(f"shard {self.index} is still recovering", queue=name)
        validate_queue_name(name, internal=True)
        if is_partition(name):  # key partitions come into being when first used
            return await self._open(name, cmd.Create(name, QueueSettings()), lenient=True)
        return await self._open(name)

    async def _open(
        self, name: str, create: cmd.Create | None = None, lenient: bool = False
    ) -> QueueActor:
        """Open a queue once, however many callers ask at the same time."""
        pending = self._opening.get(name)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[QueueActor] = asyncio.get_running_loop().create_future()
        self._opening[name] = fut
        try:
            queue = await self._open_now(name, create, lenient)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()
            raise
        else:
            fut.set_result(queue)
            return queue
        finally:
            del self._opening[name]

    async def _open_now(self, name: str, create: cmd.Create | None, lenient: bool) -> QueueActor:
        existing = self.queues.get(name)
        if existing is not None:
            return existing
        if await self._tombstoned(name):
            await self._erase(name)  # finish a deletion a crash interrupted
        queue = QueueActor(
            name,
            self.store,
            clock=self.clock,
            ids=self.ids,
            log_settings=self.log_settings,
            dead_letter_router=self._route_dead_letters,
        )
        if create is not None and lenient:
            # Creation must not fail on "other settings" here: create() compares only the
            # settings the client gave.
            report = await queue.open_or_create(create)
            if report.last_seq == 0:  # nothing was there: this call created it
                self._created_here = self._created_here | {name}
        else:
            await queue.open(create)
        queue.listeners.extend(self.listeners)
        self.queues[name] = queue
        if queue.report is not None:
            self._reports.append(queue.report)
            del self._reports[:-1000]
        return queue

    async def _tombstoned(self, name: str) -> bool:
        try:
            await self.store.get(_tombstone(name))
        except KeyNotFound:
            return False
        return True

    def _check_open(self) -> None:
        if self._closed:
            raise NotReady(f"shard {self.index} is shutting down")

    # ---------------------------------------------------------------- commands

    async def execute_many(self, name: str, commands: list[object]) -> list[Any]:
        """Run commands on queue ``name`` in order; each result is a reply or a QueueError."""
        try:
            queue = await self.get(name)
        except QueueError as exc:
            return [exc] * len(commands)
        if self.memory.over() and any(type(c) is cmd.Put for c in commands):
            return await self._without_puts(queue, commands)
        results = await queue.execute_many(commands)
        if is_partition(name):
            for command, result in zip(commands, results, strict=True):
                if type(command) is cmd.SetKey and isinstance(result, rp.KeyView):
                    self.keys.key_set(result)
        return results

    async def take(self, name: str, command: cmd.Take, wait_s: float) -> list[Any]:
        """A take that waits up to ``wait_s`` for messages.

        Raises:
            QueueError: as QueueActor.take.
        """
        queue = await self.get(name)
        return await queue.take(command, wait_s)

    async def _without_puts(self, queue: QueueActor, commands: list[object]) -> list[Any]:
        """Over the memory budget: refuse the puts, run the rest."""
        refused = Overloaded(
            f"shard {self.index} is over its memory budget; take and ack messages, or retry later",
            queue=queue.name,
        )
        others = [c for c in commands if type(c) is not cmd.Put]
        done = iter(await queue.execute_many(others) if others else [])
        return [refused if type(c) is cmd.Put else next(done) for c in commands]

    async def metrics(self) -> list[QueueMetrics]:
        """Every queue's figures now (not the key partitions)."""
        return [q.metrics() for n, q in sorted(self.queues.items()) if not is_partition(n)]

    # ---------------------------------------------------------------- watch keys

    async def watch_key(self, key: str, version: int) -> rp.KeyView:
        """The key's state once its version is past ``version`` (see actors.keyspace).

        Raises:
            BadRequest: an invalid key.
        """
        return await self.keys.watch(key, version)

    def _queue_changed(self, queue: QueueActor) -> None:
        if not is_partition(queue.name):
            self.keys.queue_changed(queue.name)

    async def _get_app_key(self, key: str) -> rp.KeyView:
        [result] = await self.execute_many(partition_of(key), [cmd.GetKey(key)])
        if isinstance(result, QueueError):
            raise result
        return result  # type: ignore[no-any-return]

    async def _get_stats(self, name: str) -> rp.StatsView | None:
        try:
            queue = await self.get(name)
        except QueueNotFound:
            return None
        return await queue.execute(cmd.Stats())  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- dead letters

    async def _route_dead_letters(self, source: str, target: str, letters: list[Message]) -> None:
        """Put dead letters into ``target``, idempotently (a retry finds them there)."""
        put = cmd.Put([_redelivery(source, m) for m in letters], redelivery=True)
        if placement(target, self.count) == self.index or self.forward is None:
            [result] = await self.execute_many(target, [put])
        else:
            [result] = await self.forward(target, [put])
        if isinstance(result, QueueError):
            raise result


class MemoryBudget:
    """This process's resident memory against a budget, read at most every 200 ms."""

    def __init__(self, budget_bytes: int | None) -> None:
        self.budget = budget_bytes
        self._checked = 0.0
        self._over = False

    def over(self) -> bool:
        if self.budget is None:
            return False
        now = time.perf_counter()  # a rate limit on /proc reads, not state time
        if now - self._checked >= 0.2:
            self._checked = now
            self._over = resident_bytes() > self.budget
        return self._over


def resident_bytes() -> int:
    """This process's resident set size."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _redelivery(source: str, m: Message) -> cmd.NewMessage:
    """The dead-letter copy of ``m``: same body, attributes and group, plus where it came
    from (``evq.source_queue``, ``evq.source_id``); an idempotency key so that routing twice
    puts it once. A client-id dead-letter queue keeps the id; a server-id one assigns its own
    (ids of different queues may collide)."""
    return cmd.NewMessage(
        body=m.body,
        id=str(m.id),
        idempotency_key=f"dlq:{source}:{m.seq}",
        group=m.group,
        attributes={**(m.attributes or {}), "evq.source_queue": source, "evq.source_id": str(m.id)},
    )
