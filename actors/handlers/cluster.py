"""The handler runtime on Ray: one actor per handler, the user's function as Ray tasks.

:func:`start` spawns a :class:`HandlerActor` (no CPU of its own, restarted by Ray if its
process dies) and returns a :class:`HandlerRun` to watch and stop it; :func:`run` does the
same and blocks until SIGTERM/SIGINT, then drains. Inside the actor a
:class:`~actors.handlers.runtime.HandlerRuntime` submits :func:`~actors.handlers.task.run_task`
as Ray tasks with the handler's resource options, and sizes its concurrency from the
cluster's free resources.

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
import logging
import os
import random
import signal
import threading
from collections.abc import Callable
from typing import Any

import ray
import ray.exceptions as rex

from actors.errors import Unavailable
from actors.handlers.api import Handler, Message
from actors.handlers.executor import Running, TaskFailed, WorkerLost
from actors.handlers.plan import resource_limit
from actors.handlers.runtime import HandlerRuntime, HandlerStats
from actors.handlers.source import DirectorySource, HttpSource, Source
from actors.handlers.task import run_task

__all__ = [
    "DEFAULT_SERVER",
    "HandlerActor",
    "HandlerRun",
    "HandlerStartError",
    "RayExecutor",
    "make_source",
    "run",
    "start",
]

log = logging.getLogger(__name__)

DEFAULT_SERVER = "http://127.0.0.1:8700"
NAMESPACE = "evq"  # as actors.spawn: where the shards are found
TRANSPORTS = ("auto", "direct", "http")
RESOURCES_TTL_S = 1.0  # how long a look at the cluster's free resources is reused
SETTLE_S = 0.5  # after a submission, until a task surely shows in the cluster's resources


def _shard_name(index: int) -> str:
    from actors.spawn import shard_name

    return shard_name(index)


class HandlerStartError(RuntimeError):
    """The handler's actor could not start in the cluster."""


# ------------------------------------------------------------------ executor


class _RayRun:
    def __init__(self, ref: Any, submitted_at: float, runs: set[_RayRun]) -> None:
        self.ref = ref
        self.submitted_at = submitted_at
        self._runs = runs
        runs.add(self)

    async def result(self) -> list[Any]:
        try:
            return await self.ref  # type: ignore[no-any-return]
        except (rex.RayTaskError, rex.RuntimeEnvSetupError, rex.TaskUnschedulableError) as exc:
            raise TaskFailed(_first_line(exc)) from None
        except rex.RayError as exc:  # the worker (or its node) died, or a cancel
            raise WorkerLost(f"{type(exc).__name__}: {_first_line(exc)}") from None
        finally:
            self._runs.discard(self)

    def cancel(self) -> None:
        try:
            ray.cancel(self.ref)
        except Exception as exc:  # already finished or gone: nothing to stop
            log.debug("cancel: %r", exc)


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(exc).__name__


class RayExecutor:
    """Runs a handler's tasks on Ray with its resource options."""

    def __init__(self, handler: Handler) -> None:
        options = handler.options
        self._handler = ray.put(handler)  # shipped once, not with every task
        self._remote = ray.remote(run_task).options(  # type: ignore[attr-defined]
            max_retries=0,  # a task that died is not rerun by Ray: its leases expire instead
            retry_exceptions=False,
            name=f"evq-handler:{handler.name}",
            **options.ray_options(),
        )
        self._need = {
            "CPU": options.num_cpus,
            "GPU": options.num_gpus,
            "memory": float(options.memory or 0),
            **dict(options.resources or {}),
        }
        self._seen: tuple[float, dict[str, float]] | None = None
        self._held = 0  # tasks holding resources when the resources were looked at
        self._runs: set[_RayRun] = set()  # submitted, not yet answered

    def submit(self, messages: list[Message]) -> Running:
        now = asyncio.get_running_loop().time()
        return _RayRun(self._remote.remote(self._handler, messages), now, self._runs)

    async def limit(self, in_flight: Callable[[], int]) -> int | None:
        """Tasks of this handler the cluster holds: those already holding resources plus
        what fits in the free ones. A look at the cluster's resources is reused for a
        second. Tasks submitted shortly before a look may not show in it yet (not scheduled,
        or not yet reported), so they are not counted as held: their share is still in
        the free resources, and counting both would overshoot."""
        if not any(v > 0 for v in self._need.values()):
            return None
        loop = asyncio.get_running_loop()
        if self._seen is None or loop.time() - self._seen[0] > RESOURCES_TTL_S:
            available = await asyncio.to_thread(ray.available_resources)
            now = loop.time()
            self._held = sum(1 for r in self._runs if r.submitted_at <= now - SETTLE_S)
            self._seen = (now, available)
        return resource_limit(self._seen[1], self._need, self._held)


# ------------------------------------------------------------------ sources


async def _shard_access() -> tuple[int, str] | None:
    """The shard count and channel secret of the evq server in this cluster, if any."""
    try:
        first = ray.get_actor(_shard_name(0), namespace=NAMESPACE)
    except ValueError:
        return None
    try:
        count, secret = await first.channel_access.remote()
    except (rex.RayActorError, rex.ActorUnavailableError, AttributeError) as exc:
        log.warning("evq shards found but not reachable: %r", exc)
        return None
    return int(count), str(secret)


async def _shard_address(index: int) -> tuple[str, int]:
    try:
        handle = ray.get_actor(_shard_name(index), namespace=NAMESPACE)
        return await handle.address.remote()  # type: ignore[no-any-return]
    except (ValueError, rex.RayActorError, rex.ActorUnavailableError) as exc:
        raise Unavailable(f"shard {index} is not reachable: {type(exc).__name__}") from None


async def _channel_directory() -> Any:
    from gateway.directory import ChannelDirectory

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
    ) -> None:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
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
            self.handler, source, RayExecutor(self.handler), rng=random.Random(self.seed)
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
        return ray.get(self.actor.ensure_running.remote(), timeout=timeout)  # type: ignore[no-any-return]

    def stats(self, timeout: float = 60.0) -> HandlerStats:
        """What it has done so far."""
        return ray.get(self.actor.stats.remote(), timeout=timeout)  # type: ignore[no-any-return]

    def drain(self, timeout: float | None = None) -> HandlerStats:
        """Stop taking; wait for running tasks up to ``timeout`` s (default the handler's
        ``drain_timeout``), release the rest; the final stats."""
        wait = (self.handler.options.drain_timeout if timeout is None else timeout) + 60
        return ray.get(self.actor.drain.remote(timeout), timeout=wait)  # type: ignore[no-any-return]

    def pid(self) -> int:
        """The actor's process id."""
        return ray.get(self.actor.pid.remote(), timeout=60)  # type: ignore[no-any-return]

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
    ray.init(
        address=address,
        include_dashboard=False if address is None else None,
        logging_level=logging.WARNING,
        log_to_driver=True,
    )


def start(
    handler: Handler,
    *,
    server: str = DEFAULT_SERVER,
    transport: str = "auto",
    token: str | None = None,
    ray_address: str | None = None,
    wrap_source: Callable[[Source], Source] | None = None,
    seed: int | None = None,
) -> HandlerRun:
    """Start ``handler`` in the Ray cluster (this process's, or a new local one).

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
        .options(  # type: ignore[attr-defined]
            num_cpus=0,
            max_restarts=-1,
            max_task_retries=-1,
            max_concurrency=1000,
        )
        .remote(handler, server, transport, token, wrap_source, seed)
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
    server: str = DEFAULT_SERVER,
    transport: str = "auto",
    token: str | None = None,
    ray_address: str | None = None,
    report: Callable[[HandlerStats], None] | None = None,
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
        started = start(handler, server=server, transport=transport, token=token)
        try:
            return started.serve(stop, report=report)
        finally:
            started.kill()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
