"""Where a queue lives: the view of the shards that gateways and handlers share.

:class:`RayDirectory` talks to shard actors on Ray; :class:`LocalDirectory` hosts the same
:class:`~actors.shard.QueueShard` objects in the gateway's own process (tests, and
``evq serve --no-ray`` for debugging). Both give errors back as values or raise
:class:`QueueError` — never Ray's exceptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, cast

from actors.channel import ChannelClient
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.errors import InternalError, Moving, QueueError, Unavailable, WrongShard
from actors.handover import move_queue
from actors.history import Sample
from actors.keyspace import home_of
from actors.log.placement import MovingWait, Placement, follow_refusal, refused_to
from actors.log.store import ObjectStore
from actors.metrics import QueueMetrics
from actors.resize import Progress, resize, restart_shards
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard
from actors.status import ShardStatus

__all__ = ["ChannelDirectory", "Directory", "LocalDirectory", "RayDirectory"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Directory(Protocol):
    """The operations the gateway needs from wherever the queues live."""

    count: int

    def shard_of(self, queue: str) -> int:
        """The index of the shard that holds ``queue``."""
        ...

    def reroute(self, queue: str, refusal: WrongShard) -> bool:
        """Learn from a shard's refusal where ``queue`` is; True: resend the refused
        commands (to the shard it names, which the route may already be)."""
        ...

    async def run_batch(self, shard: int, items: list[tuple[str, object]]) -> list[Any]:
        """Run ``(queue, command)`` items on shard ``shard`` in one go; each result is a
        reply or a QueueError."""
        ...

    async def execute_many(self, queue: str, commands: list[object]) -> list[Any]:
        """Run commands on a queue; each result is a reply or a QueueError."""
        ...

    async def take(self, queue: str, command: cmd.Take, wait_s: float) -> Any:
        """A waiting take: the deliveries, or a QueueError."""
        ...

    async def create(
        self, name: str, settings: QueueSettings, given: list[str]
    ) -> tuple[bool, QueueSettings]:
        """Create a queue. Raises: QueueError."""
        ...

    async def watch_key(self, key: str, version: int) -> rp.KeyView:
        """A key's state once past ``version`` (one-shot; cancel to stop). Raises: QueueError."""
        ...

    async def metrics(self) -> list[QueueMetrics]:
        """Every queue's figures (shards that cannot answer are left out)."""
        ...

    async def history(self, queue: str) -> list[Sample]:
        """A queue's counts a minute at a time over the last hour. Raises: QueueError."""
        ...

    async def delete(self, name: str) -> None:
        """Delete a queue. Raises: QueueError."""
        ...

    async def names(self) -> list[str]:
        """Every queue, sorted."""
        ...

    async def names_by_shard(self) -> list[list[str] | None]:
        """Each shard's queues, sorted (None: the shard could not answer)."""
        ...

    async def status(self, brief: bool = False) -> list[ShardStatus]:
        """Every shard's readiness (``brief``: without each queue's recovery report, for
        probes and scrapes)."""
        ...

    async def start(self) -> None:
        """Begin recovering the shards (readiness follows)."""
        ...

    async def close(self) -> None:
        """Finish writes, snapshot, stop."""
        ...


class _Routes:
    """Where each queue is, as a gateway knows it: the placement map it was given (the hash
    over the shard count until then) and the queues shards' refusals (WrongShard) taught it
    are elsewhere. A refused command had no effect, so it is resent where the refusal says,
    up to ``MAX_HOPS`` times."""

    count: int

    def _init_routes(self, count: int) -> None:
        self.count = count
        self.placement = Placement(count=count)
        self.routes: dict[str, int] = {}  # queues learned to be elsewhere than the map says

    def shard_of(self, queue: str) -> int:
        shard = self.routes.get(queue)
        return self.placement.shard_of(queue) if shard is None else shard

    def _reach(self, shard: int) -> bool:
        """Whether this directory can send to shard ``shard`` (one a resize started may be
        new to it: reached from now on where it can be)."""
        return 0 <= shard < self.count

    def reroute(self, queue: str, refusal: WrongShard) -> bool:
        shard = refusal.fields.get("shard")
        if not isinstance(shard, int) or not self._reach(shard):
            return False
        if shard == self.shard_of(queue):
            return True  # learnt already (a newer map, or another refusal): resend there
        if shard == self.placement.shard_of(queue):
            self.routes.pop(queue, None)
        else:
            self.routes[queue] = shard
        return True

    def placed(self, placement: Placement) -> None:
        """Route by ``placement`` from now on (a newer map, perhaps of another count)."""
        if placement.generation >= self.placement.generation:
            self.placement = placement
            self.count = placement.count
            self.routes.clear()

    def learn(self, statuses: list[ShardStatus]) -> None:
        """Follow a resize another process ran, from what the shards say of the map they
        serve by: its count (the queues it pins are learned from refusals)."""
        newest = max(statuses, key=lambda s: s.generation, default=None)
        if newest is None or newest.count < 1 or newest.generation <= self.placement.generation:
            return
        self.placed(Placement(generation=newest.generation, count=newest.count))
        self._fit(max(newest.span, newest.count))

    def _fit(self, span: int) -> None:
        """Reach shards 0 … ``span``-1 (no more: the others were stopped by a shrink)."""

    def _stopped(self, shard: int, items: list[tuple[str, object]]) -> list[Any]:
        """Items batched for a shard a shrink stopped since: refused (no effect), each
        naming the shard its queue is routed to now, where they are resent."""
        return [
            WrongShard(
                f"shard {shard} was stopped by a resize",
                queue=queue,
                shard=self.shard_of(queue),
                generation=self.placement.generation,
            )
            for queue, _ in items
        ]

    async def _routed(self, queue: str, call: Callable[[int], Awaitable[T]]) -> T:
        """``call(shard)`` on ``queue``'s shard, resent after refusals (raised, returned, or
        a list of them): where a WrongShard says, or, while the queue is moving, in a
        moment (up to ``MOVING_WAIT_S``); after ``MAX_HOPS`` refusals in a row, each resend
        waits a moment too (shards that disagree until the newest map reaches them all)."""
        hops = 0
        wait = MovingWait()
        while True:
            try:
                result: Any = await call(self.shard_of(queue))
            except WrongShard as exc:
                hops += 1
                if not await self._follow(queue, exc, hops, wait):
                    raise
                continue
            except Moving as exc:
                result = exc
            moving = isinstance(result, Moving) or (
                isinstance(result, list)
                and bool(result)
                and all(isinstance(r, Moving) for r in result)
            )
            if moving:
                if await wait.again():
                    continue
                if isinstance(result, Moving):
                    raise result
                return result
            refusal = result if isinstance(result, WrongShard) else None
            if isinstance(result, list) and refused_to(result) is not None:
                refusal = result[0]
            if refusal is None:
                return result
            hops += 1
            if not await self._follow(queue, refusal, hops, wait):
                return result

    async def _follow(self, queue: str, refusal: WrongShard, hops: int, wait: MovingWait) -> bool:
        """Whether to resend after ``refusal`` (learning from it where the queue is)."""
        return await follow_refusal(self.reroute(queue, refusal), hops, wait)


class LocalDirectory(_Routes):
    """Shards in this process, over one store."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        count: int = 1,
        log_settings: LogSettings | None = None,
        **shard_options: Any,
    ) -> None:
        self._init_routes(count)
        self.store = store
        self.log_settings = log_settings
        self.shard_options = shard_options
        self.shards = [self._new_shard(i) for i in range(count)]
        self._started: asyncio.Future[Any] | None = None

    def _new_shard(self, index: int) -> QueueShard:
        return QueueShard(
            index,
            self.count,
            self.store,
            log_settings=self.log_settings,
            forward=self._forward,
            **self.shard_options,
        )

    def _reach(self, shard: int) -> bool:
        return 0 <= shard < len(self.shards)

    async def run_batch(self, shard: int, items: list[tuple[str, object]]) -> list[Any]:
        if shard >= len(self.shards):
            return self._stopped(shard, items)
        return await self.shards[shard].run_batch(items)

    def start_batch(
        self, shard: int, items: list[tuple[str, object]], then: Callable[[Any], None]
    ) -> bool:
        """:meth:`run_batch` without a task: decided now, ``then(results)`` once durable;
        False when the shard must await something first (then use :meth:`run_batch`)."""
        if shard >= len(self.shards):
            return False
        call = self.shards[shard].begin(items)
        if call is None:
            return False
        call.on_done(then)
        return True

    async def _forward(self, target: str, commands: list[object]) -> list[Any]:
        return await self.execute_many(target, commands)

    async def execute_many(self, queue: str, commands: list[object]) -> list[Any]:
        return await self._routed(queue, lambda i: self.shards[i].execute_many(queue, commands))

    async def take(self, queue: str, command: cmd.Take, wait_s: float) -> Any:
        async def take(i: int) -> Any:
            try:
                return await self.shards[i].take(queue, command, wait_s)
            except QueueError as exc:
                return exc

        return await self._routed(queue, take)

    async def history(self, queue: str) -> list[Sample]:
        return await self._routed(queue, lambda i: self.shards[i].history(queue))

    async def create(
        self, name: str, settings: QueueSettings, given: list[str]
    ) -> tuple[bool, QueueSettings]:
        return await self._routed(name, lambda i: self.shards[i].create(name, settings, given))

    async def watch_key(self, key: str, version: int) -> rp.KeyView:
        home = home_of(key)
        return await self._routed(home, lambda i: self.shards[i].watch_key(key, version))

    async def metrics(self) -> list[QueueMetrics]:
        return [m for s in self.shards for m in await s.metrics()]

    async def delete(self, name: str) -> None:
        await self._routed(name, lambda i: self.shards[i].delete(name))

    async def names(self) -> list[str]:
        names: list[str] = []
        for shard in self.shards:
            names.extend(await shard.names())
        return sorted(names)

    async def names_by_shard(self) -> list[list[str] | None]:
        return [await shard.names() for shard in self.shards]

    async def status(self, brief: bool = False) -> list[ShardStatus]:
        return [s.status(brief) for s in self.shards]

    async def move(self, name: str, target: int) -> tuple[Placement, float]:
        """Move queue ``name`` to shard ``target`` (:func:`actors.handover.move_queue`): the
        map it ends at, and how long the queue had no owner (s)."""
        placement, paused = await move_queue(self.store, _InProcess(self), self.count, name, target)
        self.placed(placement)
        return placement, paused

    async def resize(
        self,
        count: int,
        progress: Progress | None = None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Placement:
        """Make ``count`` the shard count (:func:`actors.resize.resize`): the map it ends at."""
        return await self._coordinated(
            lambda calls: resize(self.store, calls, count, progress=progress, cancelled=cancelled)
        )

    async def restart_shards(
        self, progress: Progress | None = None, cancelled: Callable[[], bool] = lambda: False
    ) -> Placement:
        """Restart every shard in turn, its queues served throughout
        (:func:`actors.resize.restart_shards`): the map it ends at."""
        return await self._coordinated(
            lambda calls: restart_shards(self.store, calls, progress=progress, cancelled=cancelled)
        )

    async def _coordinated(self, job: Callable[[_InProcess], Awaitable[Placement]]) -> Placement:
        """``job`` on this directory's shards; routes by the last map it gave them, also when
        it stopped midway."""
        calls = _InProcess(self)
        try:
            return await job(calls)
        finally:
            if calls.last is not None:
                self.placed(calls.last)

    async def start(self) -> None:
        if self._started is None:
            self._started = asyncio.ensure_future(asyncio.gather(*(s.start() for s in self.shards)))

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.shards))
        await self.store.close()


class _InProcess:
    """The coordinator's calls on a LocalDirectory's shards."""

    def __init__(self, directory: LocalDirectory) -> None:
        self.directory = directory
        self.shards = directory.shards
        self.last: Placement | None = None  # the newest map given to the shards

    async def run(self, span: int) -> None:
        directory = self.directory
        while len(self.shards) < span:
            shard = directory._new_shard(len(self.shards))
            self.shards.append(shard)
            await shard.start()

    async def held(self, shard: int) -> list[tuple[str, bool]]:
        return self.shards[shard].held()

    async def arrivals(self, shard: int) -> list[str]:
        return self.shards[shard].arrivals()

    async def stop(self, count: int) -> None:
        while len(self.shards) > count:
            await self.shards.pop().close()

    async def restart(self, shard: int) -> None:
        await self.shards[shard].close()
        self.shards[shard] = fresh = self.directory._new_shard(shard)
        await fresh.start()

    async def hand_over(self, shard: int, name: str, to: int, generation: int) -> str:
        return await self.shards[shard].hand_over(name, to, generation)

    async def take_back(self, shard: int, name: str, generation: int | None = None) -> None:
        await self.shards[shard].take_back(name, generation)

    async def placed(self, placement: Placement) -> dict[str, int]:
        strays: dict[str, int] = {}
        for shard in self.shards:
            strays.update(dict.fromkeys(shard.placed(placement), shard.index))
        self.last = placement
        self.directory.placed(placement)
        return strays

    async def fetch(self, shard: int, name: str, key: str) -> None:
        await self.shards[shard].fetch(name, key)

    async def take_over(self, shard: int, name: str, key: str | None = None) -> bool:
        return await self.shards[shard].take_over(name, key)


class ChannelDirectory(_Routes):
    """Shards reached over their data channels (:mod:`actors.channel`); where a shard
    listens is asked of ``address(index)`` (again after every broken connection)."""

    def __init__(
        self, count: int, secret: str, address: Callable[[int], Awaitable[tuple[str, int]]]
    ) -> None:
        self._init_routes(count)
        self.secret = secret
        self._address = address
        self.channels = [ChannelClient(functools.partial(address, i), secret) for i in range(count)]
        self._gone: list[ChannelClient] = []  # of shards a shrink stopped: closed at the end

    def _reach(self, shard: int) -> bool:
        if shard < 0:
            return False
        self._fit(max(shard + 1, len(self.channels)))
        return True

    def _fit(self, span: int) -> None:
        while len(self.channels) < span:
            index = len(self.channels)
            self.channels.append(
                ChannelClient(functools.partial(self._address, index), self.secret)
            )
        while len(self.channels) > span:
            self._gone.append(self.channels.pop())

    async def run_batch(self, shard: int, items: list[tuple[str, object]]) -> list[Any]:
        if shard >= len(self.channels):
            return self._stopped(shard, items)
        return await self.channels[shard].run_batch(items)

    def start_batch(
        self, shard: int, items: list[tuple[str, object]], then: Callable[[Any], None]
    ) -> bool:
        """:meth:`run_batch` without a task (:meth:`ChannelClient.start_batch`)."""
        if shard >= len(self.channels):
            return False
        return self.channels[shard].start_batch(items, then)

    async def execute_many(self, queue: str, commands: list[object]) -> list[Any]:
        return await self._routed(queue, lambda i: self.channels[i].execute_many(queue, commands))

    async def take(self, queue: str, command: cmd.Take, wait_s: float) -> Any:
        return await self._routed(queue, lambda i: self.channels[i].take(queue, command, wait_s))

    async def history(self, queue: str) -> list[Sample]:
        return await self._routed(queue, lambda i: self.channels[i].history(queue))

    async def watch_key(self, key: str, version: int) -> rp.KeyView:
        home = home_of(key)
        return await self._routed(home, lambda i: self.channels[i].watch_key(key, version))

    async def metrics(self) -> list[QueueMetrics]:
        results = await asyncio.gather(
            *(c.metrics() for c in self.channels), return_exceptions=True
        )
        out: list[QueueMetrics] = []
        for result in results:
            if isinstance(result, list):
                out.extend(result)
            elif not isinstance(result, QueueError):
                raise result
        return out

    async def create(
        self, name: str, settings: QueueSettings, given: list[str]
    ) -> tuple[bool, QueueSettings]:
        return await self._routed(name, lambda i: self.channels[i].create(name, settings, given))

    async def delete(self, name: str) -> None:
        await self._routed(name, lambda i: self.channels[i].delete(name))

    async def names(self) -> list[str]:
        lists = await asyncio.gather(*(c.names() for c in self.channels))
        return sorted(n for names in lists for n in names)

    async def names_by_shard(self) -> list[list[str] | None]:
        lists = await asyncio.gather(*(c.names() for c in self.channels), return_exceptions=True)
        out: list[list[str] | None] = []
        for names in lists:
            if isinstance(names, BaseException) and not isinstance(names, QueueError):
                raise names
            out.append(None if isinstance(names, BaseException) else sorted(names))
        return out

    async def status(self, brief: bool = False) -> list[ShardStatus]:
        calls = (c.status(brief) for c in self.channels)
        results = await asyncio.gather(*calls, return_exceptions=True)
        statuses = []
        for index, result in enumerate(results):
            if isinstance(result, QueueError):
                result = ShardStatus(index, False, 0, 0, [], {"*": str(result)})
            elif isinstance(result, BaseException):
                raise result
            statuses.append(result)
        self.learn(statuses)
        return statuses[: len(self.channels)]

    async def start(self) -> None:
        """Nothing to start: the shards belong to the process that spawned them."""

    async def close(self) -> None:
        for channel in self.channels + self._gone:
            await channel.close()


class RayDirectory(ChannelDirectory):
    """Shard actors on Ray (handles from :mod:`actors.spawn`): Ray places, restarts and
    locates them; every call goes over their data channels."""

    def __init__(
        self,
        handles: list[Any],
        secret: str,
        *,
        owns_shards: bool = True,
        spawner: Spawner | None = None,
        count: int | None = None,
    ) -> None:
        self.handles = handles
        self.secret = secret
        # False: the shards belong to the Ray cluster (detached) and outlive this gateway.
        self.owns_shards = owns_shards
        self.spawner = spawner  # starts more shards (a resize); None: this gateway cannot
        super().__init__(len(handles) if count is None else count, secret, self.address)
        self._fit(len(handles))

    def handle(self, index: int) -> Any:
        """Shard ``index``'s actor (one a resize started since is found by its name)."""
        while len(self.handles) <= index:
            import ray

            from actors.spawn import NAMESPACE, shard_name

            try:
                self.handles.append(
                    ray.get_actor(shard_name(len(self.handles)), namespace=NAMESPACE)
                )
            except ValueError:
                raise Unavailable(f"shard {index} does not run in this Ray cluster") from None
        return self.handles[index]

    async def address(self, index: int) -> tuple[str, int]:
        """Where shard ``index`` listens now (it moves when Ray restarts it)."""
        return await self._call(self.handle(index).address.remote())

    async def _call(self, ref: Any) -> Any:
        """Await a Ray call; a dead or restarting shard becomes Unavailable."""
        import ray.exceptions

        try:
            return await ref
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise Unavailable(f"the queue's shard is restarting: {type(exc).__name__}") from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(getattr(exc, "cause", None), QueueError) else None
            if cause is not None:
                raise cause from None
            log.error("shard call failed: %s", exc)
            raise InternalError(f"shard call failed: {type(exc).__name__}") from None

    async def start(self) -> None:
        for h in self.handles:
            h.start.remote()  # recovery runs in the shards; status() reports its progress

    async def move(self, name: str, target: int) -> tuple[Placement, float]:
        """Move queue ``name`` to shard ``target``, coordinated by the shard that holds the
        map's writes here, shard 0 (:meth:`ShardActor.move_queue`): the map it ends at, and
        how long the queue had no owner (s)."""
        placement, paused = await self._call(self.handles[0].move_queue.remote(name, target))
        self.placed(placement)
        return placement, paused

    async def resize(
        self,
        count: int,
        progress: Progress | None = None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Placement:
        """Make ``count`` the shard count, coordinated from this gateway, which starts the
        new shards (:func:`actors.resize.resize`): the map it ends at.

        Raises:
            Unavailable: this gateway cannot start shards.
        """
        return await self._coordinated(
            lambda store, calls: resize(store, calls, count, progress=progress, cancelled=cancelled)
        )

    async def restart_shards(
        self, progress: Progress | None = None, cancelled: Callable[[], bool] = lambda: False
    ) -> Placement:
        """Restart every shard actor in turn (a new process each: the code installed now),
        its queues served throughout (:func:`actors.resize.restart_shards`).

        Raises:
            Unavailable: this gateway cannot start shards.
        """
        return await self._coordinated(
            lambda store, calls: restart_shards(
                store, calls, progress=progress, cancelled=cancelled
            )
        )

    async def _coordinated(
        self, job: Callable[[ObjectStore, _RayCalls], Awaitable[Placement]]
    ) -> Placement:
        """``job`` coordinated from this gateway (the store opened here, shards started
        through the spawner); routes by the last map it gave the shards, also when it
        stopped midway.

        Raises:
            Unavailable: this gateway cannot start shards.
        """
        if self.spawner is None:
            raise Unavailable("this gateway cannot start shards: ask a gateway that can")
        calls = _RayCalls(self, self.spawner)
        store = self.spawner.open_store()
        try:
            return await job(store, calls)
        finally:
            if calls.last is not None:
                self.placed(calls.last)
                self._fit(calls.last.span)
            await store.close()

    async def close(self) -> None:
        """Close the shards when this gateway owns them: finish writes, snapshot (graceful
        shutdown of the server); else only let go of them."""
        await super().close()  # our channels first: the shards closing is not a failure
        if not self.owns_shards:
            return
        await asyncio.gather(
            *(self._call(h.close.remote()) for h in self.handles), return_exceptions=True
        )


class Spawner(Protocol):
    """What a gateway that can start shards holds (:class:`actors.spawn.ShardSpawner`)."""

    def spawn(self, span: int) -> list[Any]:
        """The handles of shards 0 … ``span``-1, starting the missing ones."""
        ...

    def open_store(self) -> ObjectStore:
        """The shards' store, opened here."""
        ...


RESTART_POLLS = 200  # 10 s for Ray to free a stopped shard's name


class _RayCalls:
    """A resize's calls on shard actors, from a gateway."""

    def __init__(self, directory: RayDirectory, spawner: Spawner) -> None:
        self.directory = directory
        self.spawner = spawner
        self.last: Placement | None = None

    def _shard(self, index: int) -> Any:
        return self.directory.handle(index)

    async def _call(self, ref: Any) -> Any:
        return await self.directory._call(ref)

    async def run(self, span: int) -> None:
        handles = self.spawner.spawn(span)
        for index, handle in enumerate(handles):
            if index >= len(self.directory.handles):
                self.directory.handles.append(handle)
        await asyncio.gather(*(self._call(h.start.remote()) for h in handles))
        self.directory._fit(max(span, len(self.directory.channels)))

    async def held(self, shard: int) -> list[tuple[str, bool]]:
        held = await self._call(self._shard(shard).held.remote())
        return [(str(name), bool(moving)) for name, moving in held]

    async def arrivals(self, shard: int) -> list[str]:
        return [str(n) for n in await self._call(self._shard(shard).arrivals.remote())]

    async def stop(self, count: int) -> None:
        import ray

        directory = self.directory
        directory._fit(count)
        while len(directory.handles) > count:
            handle = directory.handles.pop()
            with contextlib.suppress(QueueError):
                await self._call(handle.close.remote())
            ray.kill(handle, no_restart=True)

    async def restart(self, shard: int) -> None:
        import ray

        from actors.spawn import NAMESPACE, shard_name

        old = self._shard(shard)
        with contextlib.suppress(QueueError):
            await self._call(old.close.remote())
        ray.kill(old, no_restart=True)
        for _ in range(RESTART_POLLS):  # the name is free once Ray knows the actor is dead
            try:
                ray.get_actor(shard_name(shard), namespace=NAMESPACE)
            except ValueError:
                break
            await asyncio.sleep(0.05)
        fresh = self.spawner.spawn(shard + 1)[shard]
        self.directory.handles[shard] = fresh
        await self._call(fresh.start.remote())

    async def hand_over(self, shard: int, name: str, to: int, generation: int) -> str:
        return cast(
            str, await self._call(self._shard(shard).hand_over.remote(name, to, generation))
        )

    async def take_back(self, shard: int, name: str, generation: int | None = None) -> None:
        await self._call(self._shard(shard).take_back.remote(name, generation))

    async def placed(self, placement: Placement) -> dict[str, int]:
        span = max(placement.span, len(self.directory.handles))
        lists = await asyncio.gather(
            *(self._call(self._shard(i).placed.remote(placement)) for i in range(span))
        )
        self.last = placement
        self.directory.placed(placement)
        return {name: index for index, names in enumerate(lists) for name in names}

    async def fetch(self, shard: int, name: str, key: str) -> None:
        await self._call(self._shard(shard).fetch.remote(name, key))

    async def take_over(self, shard: int, name: str, key: str | None = None) -> bool:
        return cast(bool, await self._call(self._shard(shard).take_over.remote(name, key)))
