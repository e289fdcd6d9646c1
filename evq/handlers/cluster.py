"""The handler runtime on Ray: one actor per handler, the user's function in a pool of
worker actors.

:func:`start` spawns a :class:`HandlerActor` (no CPU of its own, restarted by Ray if its
process dies) and returns a :class:`HandlerRun` to watch and stop it; :func:`run` does the
same and blocks until SIGTERM/SIGINT, then drains. Inside the actor a
:class:`~evq.handlers.runtime.HandlerRuntime` hands chunks of messages to
:class:`RayExecutor`: a pool of worker actors with the handler's resource options, each
running :func:`~evq.handlers.task.run_task` over one chunk at a time, grown as the
runtime asks and the cluster's free resources allow, shrunk when idle. Chunks go to a worker
over a socket of its own (:mod:`evq.handlers.link`): one starts in a worker that was idle
in ~0.5 ms, where a Ray actor call takes ~1.7 ms and a Ray task ~4 ms (loadtest/RESULTS.md),
so an idle handler starts on a put within a few milliseconds, and a busy one pays the hop
once per chunk, not per message.

Where the messages come from (``transport``):

- ``direct`` — the cluster hosts evq's shards (actors ``evq-shard-<i>`` in namespace
  ``evq``): the actor asks shard 0 for the shard count and the data-channel secret
  (``ShardActor.channel_access``) and takes straight from the shards over their data
  channels, as a gateway does; no HTTP hop.
- ``http`` — through the server's native API at ``server``.
- ``auto`` (default) — direct when the shards are there, HTTP otherwise.

This is the only module of the package that imports Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import signal
import threading
from collections.abc import Callable
from typing import Any

import ray
import ray.exceptions as rex

from actors.errors import Unavailable
from actors.localray import init_local
from actors.logsetup import LogConfig, configure, forward_ray_output
from actors.spawn import NAMESPACE, node_secret, shard_name
from evq.client_wire import DEFAULT_URL  # not evq.client: no aiohttp in workers
from evq.handlers.api import Handler, Job
from evq.handlers.executor import Running, TaskFailed, WorkerLost
from evq.handlers.link import WorkerPool, WorkerServer
from evq.handlers.plan import resource_limit
from evq.handlers.runtime import HandlerRuntime, HandlerStats
from evq.handlers.source import DirectorySource, HttpSource, Source
from evq.handlers.task import run_task

__all__ = [
    "HandlerActor",
    "HandlerRun",
    "HandlerStartError",
    "RayExecutor",
    "make_source",
    "run",
    "start",
]

log = logging.getLogger(__name__)

TRANSPORTS = ("auto", "direct", "http")
RESOURCES_TTL_S = 1.0  # how long a look at the cluster's free resources is reused
SETTLE_S = 0.5  # after a worker starts, until its resources surely show in a look


class HandlerStartError(RuntimeError):
    """The handler's actor could not start in the cluster."""


# ------------------------------------------------------------------ executor


class _Worker:
    """A process that runs one handler's function over chunks of messages (a Ray actor,
    wrapped in :class:`RayExecutor`; it holds the handler's resources while it lives). The
    chunks come over a socket of its own (:mod:`evq.handlers.link`)."""

    def __init__(self, handler: Handler, secret: str, log: LogConfig) -> None:
        configure(log, handler=handler.name, queue=handler.options.queue)
        self.server = WorkerServer(
            lambda messages: run_task(handler, messages), secret, ray.util.get_node_ip_address()
        )

    def address(self) -> tuple[str, int]:
        return self.server.address


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(exc).__name__


class RayExecutor:
    """Runs a handler's chunks in a pool of worker actors with its resource options
    (:class:`~evq.handlers.link.WorkerPool`): one chunk at a time per worker, a worker
    started when chunks wait and none is free, ``warm_workers`` idle ones kept, the others
    let go after ``idle_s`` idle."""

    def __init__(
        self, handler: Handler, *, idle_s: float = 60.0, log: LogConfig | None = None
    ) -> None:
        options = handler.options
        self._handler = handler
        self._log = log or LogConfig()
        self._secret = secrets.token_hex(16)  # what a connection to a worker begins with
        self._class = ray.remote(_Worker).options(
            max_restarts=0,  # a worker that died is replaced; its chunk's leases expire
            max_task_retries=0,
            **options.ray_options(),
        )
        self._need = {
            "CPU": options.num_cpus,
            "GPU": options.num_gpus,
            "memory": float(options.memory or 0),
            **dict(options.resources or {}),
        }
        self._spawned: dict[Any, float] = {}  # worker -> when it was started (loop time)
        self._seen: tuple[float, dict[str, float]] | None = None
        self._pool = WorkerPool(
            self._spawn,
            self._address,
            self._kill,
            self._secret,
            warm=options.warm_workers,
            idle_s=idle_s,
        )

    def submit(self, messages: list[Job]) -> Running:
        return self._pool.submit(messages)

    def _spawn(self) -> Any:
        worker = self._class.remote(self._handler, self._secret, self._log)
        self._spawned[worker] = asyncio.get_running_loop().time()
        return worker

    async def _address(self, worker: Any) -> tuple[str, int]:
        """Where a new worker listens, once it has started.

        Raises:
            TaskFailed: it did not start (e.g. the handler's module did not import there).
            WorkerLost: it died.
        """
        try:
            return tuple(await worker.address.remote())
        except rex.RayActorError as exc:
            if getattr(exc, "actor_init_failed", False):
                raise TaskFailed(_first_line(exc)) from None
            raise WorkerLost(f"{type(exc).__name__}: {_first_line(exc)}") from None
        except (rex.RuntimeEnvSetupError, rex.RayTaskError) as exc:
            raise TaskFailed(_first_line(exc)) from None

    def _kill(self, worker: Any) -> None:
        self._spawned.pop(worker, None)
        with contextlib.suppress(Exception):  # already gone
            ray.kill(worker, no_restart=True)

    async def limit(self, in_flight: Callable[[], int]) -> int | None:
        """Chunks the cluster can run at once: the workers alive (each holds its resources)
        plus as many more as fit in the free ones. A look at the cluster's resources is
        reused for a second. Workers started shortly before a look may not show in it yet,
        so they are not counted as held: their share is still in the free resources, and
        counting both would start workers that cannot be placed."""
        if not any(v > 0 for v in self._need.values()):
            return None
        loop = asyncio.get_running_loop()
        if self._seen is None or loop.time() - self._seen[0] > RESOURCES_TTL_S:
            available = await asyncio.to_thread(ray.available_resources)
            self._seen = (loop.time(), available)
        looked = self._seen[0]
        held = sum(1 for t in self._spawned.values() if t <= looked - SETTLE_S)
        return resource_limit(self._seen[1], self._need, held)

    async def close(self) -> None:
        """Let go of every worker (their chunks were settled or released before)."""
        await self._pool.close()


# ------------------------------------------------------------------ sources


async def _shard_access() -> tuple[int, str] | None:
    """The shard count and channel secret of the evq server in this cluster, if any. In a
    cluster the shards do not send the secret (it would cross Ray's network): this node's
    environment gives it, as it gives the shards theirs (:func:`actors.spawn.node_secret`)."""
    try:
        first = ray.get_actor(shard_name(0), namespace=NAMESPACE)
    except ValueError:
        return None
    try:
        count, secret = await first.channel_access.remote()
    except (rex.RayActorError, rex.ActorUnavailableError, AttributeError) as exc:
        log.warning("evq shards found but not reachable: %r", exc)
        return None
    if secret is None:
        secret = node_secret()
        if secret is None:
            log.warning(
                "evq shards found, but this Ray node has no cluster secret "
                "(EVQ_CLUSTER_SECRET or EVQ_CLUSTER_SECRET_FILE): not taking from them directly"
            )
            return None
    return int(count), str(secret)


async def _shard_address(index: int) -> tuple[str, int]:
    try:
        handle = ray.get_actor(shard_name(index), namespace=NAMESPACE)
        return await handle.address.remote()
    except (ValueError, rex.RayActorError, rex.ActorUnavailableError) as exc:
        raise Unavailable(f"shard {index} is not reachable: {type(exc).__name__}") from None


async def _channel_directory() -> Any:
    from actors.directory import ChannelDirectory

    access = await _shard_access()
    if access is None:
        raise Unavailable("the evq shards are not in this Ray cluster (any more)")
    count, secret = access
    return ChannelDirectory(count, secret, _shard_address)


async def make_source(
    queue: str, server: str, transport: str = "auto", token: str | None = None
) -> Source:
    """The queue's source for ``transport`` (see the module documentation).

    Raises:
        Unavailable: ``direct`` and no evq shards in this cluster.
        ValueError: an unknown transport.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
    if transport != "http":
        if await _shard_access() is not None:
            return DirectorySource(queue, connect=_channel_directory, transport="direct")
        if transport == "direct":
            raise Unavailable("no evq shards in this Ray cluster (namespace evq)")
    return HttpSource(queue, server, token=token)


# ------------------------------------------------------------------ the actor


class HandlerActor:
    """The process around one :class:`HandlerRuntime`; wrapped by ``ray.remote`` in
    :func:`start`. Ray restarts it when its process dies; the next :meth:`ensure_running`
    (the driver calls it every second) starts the runtime again."""

    def __init__(
        self,
        handler: Handler,
        server: str,
        transport: str = "auto",
        token: str | None = None,
        wrap_source: Callable[[Source], Source] | None = None,
        seed: int | None = None,
        log: LogConfig | None = None,
    ) -> None:
        self.log = log or LogConfig()
        configure(self.log, handler=handler.name, queue=handler.options.queue)
        self.handler = handler
        self.server = server
        self.transport = transport
        self.token = token
        self.wrap_source = wrap_source  # a fault-injection seam for tests
        self.seed = seed
        self._runtime: HandlerRuntime | None = None
        self._main: asyncio.Task[HandlerStats] | None = None

    async def ensure_running(self) -> HandlerStats:
        """Start the runtime (once); its stats.

        Raises:
            QueueError, ValueError: it could not start (e.g. ``direct`` without shards).
        """
        if self._main is None:
            self._main = asyncio.ensure_future(self._run())
        await asyncio.sleep(0)
        if self._main.done() and self._main.exception() is not None:
            raise self._main.exception()  # type: ignore[misc]
        return await self.stats()

    async def _run(self) -> HandlerStats:
        source = await make_source(
            self.handler.options.queue, self.server, self.transport, self.token
        )
        if self.wrap_source is not None:
            source = self.wrap_source(source)
        self._runtime = HandlerRuntime(
            self.handler,
            source,
            RayExecutor(self.handler, log=self.log),
            rng=random.Random(self.seed),
        )
        return await self._runtime.run()

    async def stats(self) -> HandlerStats:
        """What the runtime has done so far."""
        if self._runtime is None:
            return HandlerStats(
                name=self.handler.name, queue=self.handler.options.queue, transport="-"
            )
        return self._runtime.snapshot()

    async def drain(self, grace_s: float | None = None) -> HandlerStats:
        """Stop taking, finish or release what runs (see HandlerRuntime.drain)."""
        if self._runtime is None:
            if self._main is not None:
                self._main.cancel()
            return await self.stats()
        return await self._runtime.drain(grace_s)

    async def pid(self) -> int:
        """The actor's process id (tests kill it)."""
        return os.getpid()


# ------------------------------------------------------------------ the driver side


class HandlerRun:
    """A handler running in the cluster, seen from the process that started it."""

    def __init__(self, actor: Any, handler: Handler) -> None:
        self.actor = actor
        self.handler = handler

    def ensure_running(self, timeout: float = 60.0) -> HandlerStats:
        """Make sure the runtime runs (after a restart of its actor, too); its stats."""
        return ray.get(self.actor.ensure_running.remote(), timeout=timeout)

    def stats(self, timeout: float = 60.0) -> HandlerStats:
        """What it has done so far."""
        return ray.get(self.actor.stats.remote(), timeout=timeout)

    def drain(self, timeout: float | None = None) -> HandlerStats:
        """Stop taking; wait for running tasks up to ``timeout`` s (default the handler's
        ``drain_timeout``), release the rest; the final stats."""
        wait = (self.handler.options.drain_timeout if timeout is None else timeout) + 60
        return ray.get(self.actor.drain.remote(timeout), timeout=wait)

    def pid(self) -> int:
        """The actor's process id."""
        return ray.get(self.actor.pid.remote(), timeout=60)

    def kill(self) -> None:
        """End the actor at once (no drain: leases expire)."""
        ray.kill(self.actor, no_restart=True)

    def serve(
        self,
        stop: threading.Event,
        *,
        heartbeat_s: float = 1.0,
        report: Callable[[HandlerStats], None] | None = None,
    ) -> HandlerStats:
        """Keep the runtime running until ``stop`` is set (``report`` gets its stats every
        heartbeat), then drain it; the final stats."""
        while not stop.wait(heartbeat_s):
            try:
                stats = self.ensure_running()
            except (rex.RayActorError, rex.ActorUnavailableError, rex.GetTimeoutError) as exc:
                log.warning("handler %s: actor not answering: %r", self.handler.name, exc)
                continue
            if report is not None:
                report(stats)
        return self.drain()


def _init_ray(address: str | None) -> None:
    if ray.is_initialized():
        return
    start = init_local if address is None else ray.init
    start(
        address=address,
        include_dashboard=False if address is None else None,
        logging_level=logging.WARNING,
        log_to_driver=True,
    )
    forward_ray_output()  # the workers' lines in this process's log format (evq handle)


def start(
    handler: Handler,
    *,
    server: str = DEFAULT_URL,
    transport: str = "auto",
    token: str | None = None,
    ray_address: str | None = None,
    wrap_source: Callable[[Source], Source] | None = None,
    seed: int | None = None,
    log: LogConfig | None = None,
) -> HandlerRun:
    """Start ``handler`` in the Ray cluster (this process's, or a new local one); its
    processes log as ``log`` says (default: text, drop, INFO).

    Raises:
        ValueError: an unknown transport.
        QueueError: it could not start (``direct`` without shards in the cluster).
        HandlerStartError: its actor could not start.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
    _init_ray(ray_address)
    actor = (
        ray.remote(HandlerActor)
        .options(
            num_cpus=0,
            max_restarts=-1,
            max_task_retries=-1,
            max_concurrency=1000,
        )
        .remote(handler, server, transport, token, wrap_source, seed, log)
    )
    started = HandlerRun(actor, handler)
    try:
        started.ensure_running()
    except rex.RayTaskError as exc:
        started.kill()
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        raise cause from None
    except rex.RayActorError as exc:  # its creation failed (e.g. the module did not import)
        started.kill()
        raise HandlerStartError(f"the handler's actor did not start: {_first_line(exc)}") from None
    return started


def run(
    handler: Handler,
    *,
    server: str = DEFAULT_URL,
    transport: str = "auto",
    token: str | None = None,
    ray_address: str | None = None,
    report: Callable[[HandlerStats], None] | None = None,
    log: LogConfig | None = None,
) -> HandlerStats:
    """Run ``handler`` until SIGTERM or SIGINT, then drain it; the final stats.

    Raises:
        ValueError, QueueError: as :func:`start`.
    """
    _init_ray(ray_address)  # first: ray.init sets a SIGTERM handler of its own
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        started = start(handler, server=server, transport=transport, token=token, log=log)
        try:
            return started.serve(stop, report=report)
        finally:
            started.kill()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
