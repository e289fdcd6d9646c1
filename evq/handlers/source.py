"""Where a handler's messages come from: the queue, reached straight through the shards'
data channels (inside the cluster) or over the native HTTP API (a remote server).

Both sources offer the same few calls, in API units (seconds, ``(id, lease)`` pairs, item
statuses ``ok`` / ``stale_lease`` / ``not_found``); errors are raised as
:class:`~actors.errors.QueueError`. The depth of the queue comes from one-shot watches of
its ``queue:{name}`` key, each resubscribed with the version last seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from actors.core import commands as cmd
from actors.core import replies as rp
from actors.errors import MessageNotFound, QueueError, StaleLease, Unavailable
from evq.handlers.api import Job, Send

__all__ = ["DirectorySource", "HttpSource", "Limits", "Source", "Taken", "Watched"]

log = logging.getLogger(__name__)

Item = tuple[str, str]  # (message id, lease)


@dataclass(frozen=True, slots=True)
class Taken:
    """A reserved message and the lease that holds it."""

    message: Job
    lease: str


@dataclass(frozen=True, slots=True)
class Limits:
    """What the queue's settings say about deliveries."""

    visibility_timeout: float  # seconds a take reserves by default
    max_receives: int | None  # deliveries before the queue gives up on a message
    dead_letter_queue: str | None  # where it then goes (None: dropped)


@dataclass(frozen=True, slots=True)
class Watched:
    """A state of the queue's ``queue:`` key: its counts (None: no such queue)."""

    version: int
    counts: dict[str, Any] | None

    @property
    def ready(self) -> int:
        """Messages ready to be taken (0 when the queue does not exist or is paused: its
        takes get nothing, so the handler waits in its one long-poll take)."""
        counts = self.counts
        if not counts or counts.get("paused"):
            return 0
        return int(counts.get("ready", 0))


class Source(Protocol):
    """One queue, as the runtime uses it."""

    queue: str
    transport: str

    async def limits(self) -> Limits:
        """The queue's visibility timeout and dead-letter settings. Raises: QueueError."""
        ...

    async def take(self, max: int, wait: float, visibility_timeout: float) -> list[Taken]:
        """Reserve up to ``max`` ready messages, waiting up to ``wait`` s. Raises: QueueError."""
        ...

    async def ack(self, items: Sequence[Item]) -> list[str]:
        """Delete reserved messages; a status per item. Raises: QueueError."""
        ...

    async def release(
        self, items: Sequence[Item], delay: float, reason: str | None = None
    ) -> list[str]:
        """Give messages back, ready after ``delay`` s, failed for ``reason``. Raises:
        QueueError."""
        ...

    async def touch(self, items: Sequence[Item], visibility_timeout: float) -> list[str]:
        """Extend leases by ``visibility_timeout`` s from now. Raises: QueueError."""
        ...

    async def reschedule(self, item: Item, delay: float | None, at: float | None) -> str:
        """A new activation time instead of an ack. Raises: QueueError."""
        ...

    async def put(self, queue: str, puts: Sequence[tuple[str, Send]]) -> list[str]:
        """Put messages (with their idempotency keys) into ``queue``; ``created`` or
        ``duplicate`` per message. Raises: QueueError."""
        ...

    async def watch(self, version: int, wait: float) -> Watched | None:
        """The queue's counts once past ``version``; None after ``wait`` s. Raises: QueueError."""
        ...

    async def close(self) -> None:
        """Let go of connections."""
        ...


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def _message(queue: str, d: rp.Delivery) -> Job:
    return Job(
        id=d.id,
        body=d.body,
        attributes=d.attributes or {},
        receive_count=d.receive_count,
        queue=queue,
        enqueued_at=d.enqueued_at_ms / 1000,
        activate_at=d.activate_at_ms / 1000,
        group=d.group,
    )


def _new_message(key: str, p: Send) -> cmd.NewMessage:
    return cmd.NewMessage(
        body=p.body_bytes,
        id=p.id,
        delay_ms=_ms(p.delay),
        activate_at_ms=_ms(p.activate_at),
        idempotency_key=key,
        group=p.group,
        attributes=dict(p.attributes) if p.attributes else None,
    )


class DirectorySource:
    """The queue through a gateway-style directory: the shards' data channels (in-cluster:
    ``actors.directory.ChannelDirectory``) or in-process shards (tests).

    With ``connect``, the directory is made on first use and made again after the shards
    could not be reached (a restarted server has new shards and a new secret).
    """

    def __init__(
        self,
        queue: str,
        directory: Any = None,
        *,
        connect: Callable[[], Awaitable[Any]] | None = None,
        transport: str = "direct",
    ) -> None:
        if (directory is None) == (connect is None):
            raise ValueError("give a directory or a way to connect to one")
        self.queue = queue
        self.transport = transport
        self._directory = directory
        self._connect = connect
        self._key = f"queue:{queue}"

    async def _dir(self) -> Any:
        if self._directory is None:
            assert self._connect is not None
            self._directory = await self._connect()
        return self._directory

    async def _lost(self) -> None:
        """The shards could not be reached: connect afresh next time."""
        if self._connect is not None and self._directory is not None:
            directory, self._directory = self._directory, None
            with contextlib.suppress(Exception):
                await directory.close()

    async def _run(self, command: object, queue: str | None = None) -> Any:
        directory = await self._dir()
        try:
            [result] = await directory.execute_many(queue or self.queue, [command])
        except Unavailable:
            await self._lost()
            raise
        if isinstance(result, Unavailable):
            await self._lost()
        if isinstance(result, QueueError):
            raise result
        return result

    async def limits(self) -> Limits:
        settings = (await self._run(cmd.Describe())).settings
        return Limits(
            settings.visibility_timeout_ms / 1000,
            settings.max_receives,
            settings.dead_letter_queue,
        )

    async def take(self, max: int, wait: float, visibility_timeout: float) -> list[Taken]:
        directory = await self._dir()
        command = cmd.Take(max, _ms(visibility_timeout))
        try:
            result = await directory.take(self.queue, command, wait)
        except Unavailable:
            await self._lost()
            raise
        if isinstance(result, QueueError):
            raise result
        return [Taken(_message(self.queue, d), d.lease) for d in result]

    async def ack(self, items: Sequence[Item]) -> list[str]:
        results = await self._run(cmd.Ack([cmd.LeaseRef(i, lease) for i, lease in items]))
        return [r.status for r in results]

    async def release(
        self, items: Sequence[Item], delay: float, reason: str | None = None
    ) -> list[str]:
        delay_ms = _ms(delay)
        release = cmd.Release(
            [
                cmd.ReleaseItem(id=i, lease=lease, delay_ms=delay_ms, reason=reason)
                for i, lease in items
            ]
        )
        return [r.status for r in await self._run(release)]

    async def touch(self, items: Sequence[Item], visibility_timeout: float) -> list[str]:
        vt = _ms(visibility_timeout)
        touch = cmd.Touch(
            [cmd.TouchItem(id=i, lease=lease, visibility_timeout_ms=vt) for i, lease in items]
        )
        return [r.status for r in await self._run(touch)]

    async def reschedule(self, item: Item, delay: float | None, at: float | None) -> str:
        command = cmd.Reschedule(
            id=item[0], lease=item[1], delay_ms=_ms(delay), activate_at_ms=_ms(at)
        )
        return await _item_status(self._run(command))

    async def put(self, queue: str, puts: Sequence[tuple[str, Send]]) -> list[str]:
        command = cmd.Put([_new_message(key, p) for key, p in puts])
        results = await self._run(command, queue)
        return [r.status for r in results]

    async def watch(self, version: int, wait: float) -> Watched | None:
        directory = await self._dir()
        try:
            async with asyncio.timeout(wait):
                view = await directory.watch_key(self._key, version)
        except TimeoutError:
            return None
        except Unavailable:
            await self._lost()
            raise
        return Watched(view.version, view.value)

    async def close(self) -> None:
        await self._lost()


async def _item_status(call: Awaitable[Any]) -> str:
    """A per-message call's outcome as an item status."""
    try:
        await call
    except StaleLease:
        return "stale_lease"
    except MessageNotFound:
        return "not_found"
    return "ok"


class HttpSource:
    """The queue over the native HTTP API (``evq.client.AsyncClient``, msgpack bodies)."""

    transport = "http"

    def __init__(self, queue: str, server: str, *, token: str | None = None) -> None:
        from evq.client import AsyncClient  # aiohttp: only where HTTP is used

        self.queue = queue
        self.server = server
        self._client = AsyncClient(server, binary=True, token=token, timeout=30.0)
        self._key = f"queue:{queue}"

    async def limits(self) -> Limits:
        settings = (await self._client.get_queue(self.queue)).settings
        return Limits(
            float(settings.visibility_timeout),
            settings.max_receives,
            settings.dead_letter_queue,
        )

    async def take(self, max: int, wait: float, visibility_timeout: float) -> list[Taken]:
        taken = await self._client.take(
            self.queue, max, wait=wait or None, visibility_timeout=visibility_timeout
        )
        return [
            Taken(
                Job(
                    id=m.id,
                    body=m.body,
                    attributes=m.attributes,
                    receive_count=m.receive_count,
                    queue=self.queue,
                    enqueued_at=m.enqueued_at,
                    activate_at=m.activate_at,
                    group=m.group,
                ),
                m.lease or "",
            )
            for m in taken
        ]

    async def ack(self, items: Sequence[Item]) -> list[str]:
        return [r.status for r in await self._client.ack(self.queue, *items)]

    async def release(
        self, items: Sequence[Item], delay: float, reason: str | None = None
    ) -> list[str]:
        released = await self._client.release(self.queue, *items, delay=delay, reason=reason)
        return [r.status for r in released]

    async def touch(self, items: Sequence[Item], visibility_timeout: float) -> list[str]:
        results = await self._client.touch(
            self.queue, *items, visibility_timeout=visibility_timeout
        )
        return [r.status for r in results]

    async def reschedule(self, item: Item, delay: float | None, at: float | None) -> str:
        call = self._client.reschedule(
            self.queue, item[0], delay=delay, activate_at=at, lease=item[1]
        )
        return await _item_status(call)

    async def put(self, queue: str, puts: Sequence[tuple[str, Send]]) -> list[str]:
        from evq.client import NewMessage

        messages = [
            NewMessage(
                body=p.body_bytes,
                id=p.id,
                delay=p.delay,
                activate_at=p.activate_at,
                idempotency_key=key,
                group=p.group,
                attributes=dict(p.attributes) if p.attributes else None,
            )
            for key, p in puts
        ]
        return [r.status for r in await self._client.put(queue, messages)]

    async def watch(self, version: int, wait: float) -> Watched | None:
        state = await self._client.watch(self._key, version, wait=wait)
        return None if state is None else Watched(state.version, state.value)

    async def close(self) -> None:
        await self._client.close()
