"""The shards on Ray: spawning their processes, finding them, and their handles.

The handler runtime (:mod:`evq.handlers.cluster`) makes Ray actors of its own: a handler's
runtime and its workers.

Each shard is an async Ray actor named ``evq-shard-<i>`` in the ``evq`` namespace, so every
gateway process of the cluster finds the same shards. In a cluster a gateway joined, the
shards are detached: they belong to the cluster, not to the gateway that created them, and
``evq shards stop`` ends them. Ray restarts a shard whose process died
(``max_restarts=-1``); the new incarnation recovers its queues from the store on its first
call. Calls are not retried by Ray: a call that died with its actor may have taken
effect, and only the client can decide whether repeating it is safe (its puts carry
idempotency keys).

The cluster secret does not travel through Ray in a cluster (Ray's own traffic between
nodes is not encrypted unless Ray's TLS is set up): a shard reads it from its node's
environment (``EVQ_CLUSTER_SECRET``, or a file named by ``EVQ_CLUSTER_SECRET_FILE``), as it
reads its store's credentials, and the gateway that spawned it checks that they share it by a
fingerprint. Only the embedded server, whose Ray runs on this machine alone, hands its shards
the secret in their spec.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
from typing import Any, cast

import msgspec
import ray
import ray.exceptions

from actors import handshake
from actors.channel import IN_FLIGHT_PER_CONNECTION, ChannelServer
from actors.core import commands as cmd
from actors.errors import QueueError, Unavailable
from actors.handover import move_queue
from actors.log.placement import MAX_HOPS, Placement, refused_to
from actors.log.stores import open_store
from actors.logsetup import LogConfig, configure
from actors.settings import LogSettings, QueueSettings
from actors.shard import (
    SHARD_COLLECTOR_THRESHOLDS,
    QueueShard,
    tune_allocator,
    tune_collector,
)
from actors.status import ShardStatus

__all__ = [
    "NAMESPACE",
    "ShardActor",
    "ShardSpawner",
    "ShardSpec",
    "node_secret",
    "running_shards",
    "spawn_shards",
]

log = logging.getLogger(__name__)

NAMESPACE = "evq"


def shard_name(index: int) -> str:
    """The Ray actor name of shard ``index``."""
    return f"evq-shard-{index}"


def node_secret() -> str | None:
    """The cluster secret as this process's environment holds it (its node's: a Ray worker
    inherits its raylet's): ``EVQ_CLUSTER_SECRET``, or the file ``EVQ_CLUSTER_SECRET_FILE``
    names. None when neither is set, or the secret is too short to be one."""
    value = os.environ.get("EVQ_CLUSTER_SECRET", "").strip()
    path = os.environ.get("EVQ_CLUSTER_SECRET_FILE")
    if not value and path:
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read().strip()
        except OSError as exc:
            log.error("the cluster secret's file %s does not read: %s", path, exc.strerror)
            return None
    return value if len(value) >= handshake.MIN_SECRET_CHARS else None


class ShardSpec(msgspec.Struct, frozen=True):
    """What every shard process needs: its store, and the secret gateways present (or
    None: each shard reads its node's, :func:`node_secret`)."""

    count: int
    store: str
    secret: str | None
    store_options: dict[str, Any] = msgspec.field(default_factory=dict)
    log_settings: LogSettings = msgspec.field(default_factory=LogSettings)
    memory_budget_bytes: int | None = None  # puts refused past it (QueueShard)
    log: LogConfig = msgspec.field(default_factory=LogConfig)  # the gateway's --log-*
    # The data channel's frames go unsealed when both ends are on loopback (the embedded
    # server: one machine); otherwise, and always in a cluster, they are encrypted.
    plain_on_loopback: bool = False


class ShardActor:
    """The process around one :class:`QueueShard`; wrapped by ``ray.remote`` in
    :func:`spawn_shards`."""

    def __init__(self, index: int, spec: ShardSpec) -> None:
        configure(spec.log, shard=index)  # every record names this shard
        self.index = index
        self.spec = spec
        tune_allocator()
        store = open_store(spec.store, **spec.store_options)
        self.shard = QueueShard(
            index,
            spec.count,
            store,
            log_settings=spec.log_settings,
            forward=self._forward,
            memory_budget_bytes=spec.memory_budget_bytes,
            wait_for_log=True,  # Ray may start it while its last incarnation still runs
        )
        self._started: asyncio.Task[ShardStatus] | None = None
        self._handles: dict[int, Any] = {}
        secret = spec.secret if spec.secret is not None else node_secret()
        # A shard whose node has no secret serves no channel (one made up here refuses
        # every connection) and says why to the gateways that check it.
        self._no_secret = secret is None
        self._secret = secret if secret is not None else secrets.token_hex(32)
        self._channel = ChannelServer(
            self.shard, self._secret, encrypt=None if spec.plain_on_loopback else True
        )
        # the puts each gateway can have on their way in, which the shard cannot refuse
        self.shard.memory.in_flight = lambda: IN_FLIGHT_PER_CONNECTION * self._channel.connections
        self._address: asyncio.Future[tuple[str, int]] | None = None
        tune_collector(SHARD_COLLECTOR_THRESHOLDS)

    def _ensure_started(self) -> None:
        # Async actors run __init__ outside the event loop: start recovery on the first call.
        if self._started is None:
            self._started = asyncio.get_running_loop().create_task(self.shard.start())

    async def start(self) -> ShardStatus:
        """Recover this shard's queues (once) and report."""
        self._ensure_started()
        assert self._started is not None
        return await asyncio.shield(self._started)

    async def address(self) -> tuple[str, int]:
        """Where this shard's data channel listens (started on first ask)."""
        self._ensure_started()
        if self._address is None:
            host = ray.util.get_node_ip_address()
            self._address = asyncio.ensure_future(self._channel.start(host))
            address = await asyncio.shield(self._address)
            log.info("shard %d: data channel on %s:%d", self.index, *address)
        return await asyncio.shield(self._address)

    async def channel_access(self) -> tuple[int, str | None]:
        """The shard count and the data channels' secret, for in-cluster clients that take
        straight from the shards (handler runtimes, ``evq.handlers``): the secret only when
        the spec carried it (the embedded server, one machine); in a cluster, None, and the
        client reads its node's (:func:`node_secret`), so that the answer, which crosses
        Ray's network, does not carry it."""
        return self.shard.count, self.spec.secret

    async def check(self, count: int, store: str, fingerprint: str) -> str | None:
        """Why a gateway with this shard count, store and cluster secret (its
        :func:`actors.handshake.fingerprint`, not the secret) may not use this shard (None:
        it may)."""
        if self._no_secret:
            return (
                f"shard {self.index} has no cluster secret: its Ray node needs "
                "EVQ_CLUSTER_SECRET (or EVQ_CLUSTER_SECRET_FILE) in its environment, the "
                "gateways' own (in a cluster the secret is not sent through Ray)"
            )
        mine = handshake.fingerprint(self._secret)
        if not hmac.compare_digest(fingerprint.encode(), mine.encode()):
            return (
                f"shard {self.index} of this Ray cluster holds another cluster secret: every "
                "gateway of a cluster needs the same EVQ_CLUSTER_SECRET (or cluster_secret_file)"
            )
        if count != self.shard.count:  # the count it was spawned with, or a resize's since
            return (
                f"the shards of this Ray cluster are {self.shard.count}, not {count}: start "
                "the gateway without --shards, or change the count with `evq shards resize`"
            )
        if store != self.spec.store:
            return f"shard {self.index} of this Ray cluster serves another store: {self.spec.store}"
        return None

    async def status(self, brief: bool = False) -> ShardStatus:
        """Readiness without waiting for it (``brief``: as :meth:`QueueShard.status`)."""
        self._ensure_started()
        return self.shard.status(brief)

    async def execute_many(self, name: str, commands: list[object]) -> list[Any]:
        """See :meth:`QueueShard.execute_many`."""
        self._ensure_started()
        return await self.shard.execute_many(name, commands)

    async def take(self, name: str, command: cmd.Take, wait_s: float) -> Any:
        """See :meth:`QueueShard.take`; errors are returned, not raised."""
        self._ensure_started()
        try:
            return await self.shard.take(name, command, wait_s)
        except QueueError as exc:
            return exc

    async def create(self, name: str, settings: QueueSettings, given: list[str]) -> Any:
        """See :meth:`QueueShard.create`; errors are returned, not raised."""
        self._ensure_started()
        try:
            return await self.shard.create(name, settings, given)
        except QueueError as exc:
            return exc

    async def delete(self, name: str) -> QueueError | None:
        """See :meth:`QueueShard.delete`; errors are returned, not raised."""
        self._ensure_started()
        try:
            await self.shard.delete(name)
        except QueueError as exc:
            return exc
        return None

    async def names(self) -> list[str]:
        """The queues this shard serves."""
        self._ensure_started()
        return await self.shard.names()

    async def close(self) -> None:
        """Finish writes and snapshot every queue (graceful shutdown)."""
        await self._channel.close()
        await self.shard.close()

    # ---------------------------------------------------------------- handover

    async def hand_over(self, name: str, to: int, generation: int) -> str:
        """See :meth:`QueueShard.hand_over` (raises)."""
        await self.start()
        return await self.shard.hand_over(name, to, generation)

    async def take_back(self, name: str, generation: int | None = None) -> None:
        """See :meth:`QueueShard.take_back` (raises)."""
        await self.start()
        await self.shard.take_back(name, generation)

    async def placed(self, placement: Placement) -> list[str]:
        """See :meth:`QueueShard.placed`."""
        await self.start()
        return self.shard.placed(placement)

    async def held(self) -> list[tuple[str, bool]]:
        """See :meth:`QueueShard.held`."""
        await self.start()
        return self.shard.held()

    async def arrivals(self) -> list[str]:
        """See :meth:`QueueShard.arrivals`."""
        await self.start()
        return self.shard.arrivals()

    async def fetch(self, name: str, key: str) -> None:
        """See :meth:`QueueShard.fetch`."""
        await self.start()
        await self.shard.fetch(name, key)

    async def take_over(self, name: str, key: str | None = None) -> bool:
        """See :meth:`QueueShard.take_over` (raises)."""
        await self.start()
        return await self.shard.take_over(name, key)

    async def move_queue(self, name: str, target: int) -> tuple[Placement, float]:
        """Coordinate the move of queue ``name`` to shard ``target`` from this shard, which
        reaches the others over Ray (:func:`actors.handover.move_queue`, raises)."""
        await self.start()
        return await move_queue(self.shard.store, _ActorCalls(self), self.shard.count, name, target)

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handles[index] = ray.get_actor(shard_name(index), namespace=NAMESPACE)
        return handle

    async def pid(self) -> int:
        """The process id (tests kill it to prove restarts)."""
        import os

        return os.getpid()

    async def _remote(self, index: int, method: str, *args: Any) -> Any:
        """``method(*args)`` of shard ``index``, over Ray.

        Raises:
            Unavailable: that incarnation is gone (killed by a resize, restarting): its
                handle is forgotten, so the next call asks Ray for the shard by name instead
                of calling the dead one for ever (dead letters waited on one for the rest of
                a campaign: RESULTS.md); and a QueueError is what the callers (the dead
                letters' route, a handover's take-backs) know to retry or step over.
        """
        try:
            return await getattr(self._handle(index), method).remote(*args)
        except (
            ray.exceptions.RayActorError,
            ray.exceptions.ActorUnavailableError,
            ValueError,  # ray.get_actor: no such shard now
        ) as exc:
            self._handles.pop(index, None)
            raise Unavailable(f"shard {index} is restarting: {type(exc).__name__}") from None

    async def _forward(self, target: str, commands: list[object]) -> list[Any]:
        index = self.shard.placement.shard_of(target)
        for _ in range(MAX_HOPS):
            results = await self._remote(index, "execute_many", target, commands)
            moved = refused_to(results)
            if moved is None or moved == index:
                break
            index = moved  # the map moved it: the shard that refused names its holder
        return cast(list[Any], results)


class _ActorCalls:
    """A coordinator's calls (actors.handover.ShardCalls) from one shard actor: on itself
    directly, on the others over Ray (a dead one's answer: Unavailable)."""

    def __init__(self, actor: ShardActor) -> None:
        self.actor = actor

    async def hand_over(self, shard: int, name: str, to: int, generation: int) -> str:
        if shard == self.actor.index:
            return await self.actor.shard.hand_over(name, to, generation)
        return cast(str, await self.actor._remote(shard, "hand_over", name, to, generation))

    async def take_back(self, shard: int, name: str, generation: int | None = None) -> None:
        if shard == self.actor.index:
            await self.actor.shard.take_back(name, generation)
        else:
            await self.actor._remote(shard, "take_back", name, generation)

    async def placed(self, placement: Placement) -> dict[str, int]:
        strays: dict[str, int] = {}
        for shard in range(max(placement.span, self.actor.shard.placement.span)):
            if shard == self.actor.index:
                names = self.actor.shard.placed(placement)
            else:
                names = await self.actor._remote(shard, "placed", placement)
            strays.update(dict.fromkeys(names, shard))
        return strays

    async def fetch(self, shard: int, name: str, key: str) -> None:
        if shard == self.actor.index:
            await self.actor.shard.fetch(name, key)
        else:
            await self.actor._remote(shard, "fetch", name, key)

    async def take_over(self, shard: int, name: str, key: str | None = None) -> bool:
        if shard == self.actor.index:
            return await self.actor.shard.take_over(name, key)
        return cast(bool, await self.actor._remote(shard, "take_over", name, key))


class ShardSpawner:
    """Starts shards like the ones a gateway started (a resize grows them)."""

    def __init__(
        self, spec: ShardSpec, *, spread: bool, resource: str | None, detached: bool
    ) -> None:
        self.spec = spec
        self.options = {"spread": spread, "resource": resource, "detached": detached}

    def spawn(self, span: int) -> list[Any]:
        """Handles of shards 0 … ``span``-1, found or started (:func:`spawn_shards`). A new
        one is given the count the gateway started with: it opens its log with the store's
        (the placement map's once a resize wrote one)."""
        return spawn_shards(self.spec, span=span, **self.options)  # type: ignore[arg-type]

    def open_store(self) -> Any:
        """The shards' store, opened in this process."""
        return open_store(self.spec.store, **self.spec.store_options)


def spawn_shards(
    spec: ShardSpec,
    *,
    spread: bool = False,
    resource: str | None = None,
    detached: bool = False,
    span: int | None = None,
) -> list[Any]:
    """Create (or find) the ``spec.count`` shard actors (``span``: that many, for a store a
    resize gave more shards); return their handles in order.

    ``detached``: the shards belong to the Ray cluster, not to this process; they keep
    running when it exits, however it exits (``evq shards stop`` stops them). Named actors
    make creation race-free: two gateways starting together get the same shards, and the
    second one's ``spec`` is not used (:meth:`ShardActor.check` says whether it matches).

    ``spread`` places them on as many nodes as possible (Ray's SPREAD strategy) instead of
    packing them on the driver's node; ``resource`` makes each shard need one unit of that
    custom resource, so that only the nodes offering it host shards (and how many). A shard
    whose node dies is restarted on another node that qualifies.
    """
    remote = ray.remote(ShardActor)
    placement_options: dict[str, Any] = {}
    if spread:
        placement_options["scheduling_strategy"] = "SPREAD"
    if resource:
        placement_options["resources"] = {resource: 1}
    handles = []
    for index in range(spec.count if span is None else span):
        handle = remote.options(
            name=shard_name(index),
            namespace=NAMESPACE,
            get_if_exists=True,
            max_restarts=-1,
            max_task_retries=0,
            max_concurrency=10_000,
            num_cpus=0,
            lifetime="detached" if detached else None,
            **placement_options,
        ).remote(index, spec)
        handles.append(handle)
    return handles


def running_shards() -> dict[int, Any]:
    """The shard actors alive in this Ray cluster's ``evq`` namespace: index -> handle."""
    prefix = shard_name(0).removesuffix("0")
    found = {}
    for name in ray.util.list_named_actors():
        index = name.removeprefix(prefix)
        if index != name and index.isdigit():
            with contextlib.suppress(ValueError):  # ended since it was listed
                found[int(index)] = ray.get_actor(name, namespace=NAMESPACE)
    return dict(sorted(found.items()))
