"""``evq serve --workers N``: N gateway processes on one port.

A process may hold at most 20,000 descriptors here, so 100k watchers need several gateway
processes. The main process starts Ray and the shards and serves like the others; it also
starts N-1 worker processes (``python -m gateway.workers``) that listen on the same port with
SO_REUSEPORT, so the kernel spreads new connections over all of them. A worker is not a Ray
driver: it reaches the shards over their data channels, and asks the main process's control
endpoint (loopback only, guarded by the per-serve secret) where a shard listens — again after
each broken connection, since a restarted shard listens elsewhere. Each worker keeps its own
watchers and one upstream watch per key, so a change costs the shards one answer per
process, not per client.

The main process supervises the workers (a worker that dies is started again) and, on
SIGTERM/SIGINT, stops them first (they finish their requests), then closes the shards.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from actors.errors import BadRequest, QueueError, Unavailable
from gateway.app import READY_CHECKS
from gateway.auth import Token
from gateway.door import HUP
from gateway.tasks import FORWARD

__all__ = ["WorkerSpec", "supervise", "worker_main"]

log = logging.getLogger("evq.workers")

SECRET_HEADER = "X-Evq-Secret"
LISTENING = b"evq-worker-listening"
ENV = "EVQ_WORKER_SPEC"


class WorkerSpec(msgspec.Struct, frozen=True):
    """What a worker process is told by the main process (through its environment)."""

    index: int
    settings: dict[str, Any]  # ServerSettings as builtins
    control: str  # http://127.0.0.1:PORT of the main process's control endpoint
    secret: str
    shards: int
    tokens: list[Token] = []  # bearer tokens, read once by the main process


# ------------------------------------------------------------------ main process


def supervise(
    workers: int,
    settings: Any,
    secret: str,
    shards: int,
    address: Callable[[int], Awaitable[tuple[str, int]]],
    tokens: Sequence[Token] = (),
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context for the main app: the control endpoint and N-1 worker processes."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        control = await _start_control(secret, shards, address, app)
        url = f"http://127.0.0.1:{control.addresses[0][1]}"
        builtins = msgspec.to_builtins(settings)
        procs = [
            _Worker(
                WorkerSpec(i, builtins, url, secret, shards, list(tokens)),
                settings.shutdown_timeout_s,
            )
            for i in range(1, workers)
        ]
        for proc in procs:
            await proc.start()
        app[READY_CHECKS].append(lambda: all(p.listening for p in procs))
        app[HUP].extend(p.hangup for p in procs)  # they reload their certificate too
        log.info("%d gateway worker process(es) started", len(procs))
        try:
            yield
        finally:
            await asyncio.gather(*(p.stop() for p in procs))
            await control.runner.cleanup()

    return context


class _Control(msgspec.Struct):
    runner: Any
    addresses: list[Any]


async def _start_control(
    secret: str,
    shards: int,
    address: Callable[[int], Awaitable[tuple[str, int]]],
    main: web.Application,
) -> _Control:
    @web.middleware
    async def guard(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if not hmac.compare_digest(request.headers.get(SECRET_HEADER, ""), secret):
            return web.json_response({"error": "forbidden"}, status=403)
        return await handler(request)

    async def where(request: web.Request) -> web.Response:
        try:
            index = int(request.match_info["index"])
            if index < 0:  # past the count: a shard a resize started (the address says)
                raise ValueError
        except ValueError:
            return web.json_response({"error": "no such shard"}, status=404)
        try:
            host, port = await address(index)
        except QueueError as exc:
            return web.json_response({"error": exc.message}, status=503)
        return web.json_response({"host": host, "port": port})

    from gateway import dashboard, errors, native, presence, tasks
    from gateway import shards as shard_routes

    app = web.Application(middlewares=[guard, errors.error_middleware])
    app.router.add_get("/shards/{index}/address", where)
    # the workers' task and shard administration, run here (gateway/tasks.py, FORWARD)
    app[tasks.TASKS] = main[tasks.TASKS]
    app[native.DIRECTORY] = main[native.DIRECTORY]
    app.add_routes(shard_routes.routes)
    app.add_routes(tasks.routes)
    app[presence.PRESENCE] = main[presence.PRESENCE]  # the gateways, for /v1/status
    app.router.add_get("/v1/status", dashboard.status)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return _Control(runner, list(runner.addresses))


class _Worker:
    """One worker process, started again if it dies while the server runs."""

    def __init__(self, spec: WorkerSpec, stop_timeout_s: float) -> None:
        self.spec = spec
        self.stop_timeout_s = stop_timeout_s
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False
        self.listening = False  # the worker said it listens (once is enough for readiness)
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        env = {**os.environ, ENV: msgspec.json.encode(self.spec).decode()}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.workers", env=env, stdout=asyncio.subprocess.PIPE
        )
        self._watch = asyncio.ensure_future(self._supervise(self.proc))

    async def _supervise(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:  # the worker's stdout says only when it listens
            if line.strip() == LISTENING:
                self.listening = True
        code = await proc.wait()
        if self.stopping:
            return
        log.error("gateway worker %d exited with %s; starting it again", self.spec.index, code)
        await asyncio.sleep(1.0)
        if not self.stopping:
            await self.start()

    def hangup(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGHUP)

    async def stop(self) -> None:
        self.stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.stop_timeout_s + 5)
        except TimeoutError:
            log.error("gateway worker %d did not stop; killing it", self.spec.index)
            proc.kill()
            await proc.wait()


# ------------------------------------------------------------------ worker process


def _control_lookup(spec: WorkerSpec) -> Callable[[int], Awaitable[tuple[str, int]]]:
    session: list[aiohttp.ClientSession] = []

    async def address(index: int) -> tuple[str, int]:
        if not session:
            session.append(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)))
        url = f"{spec.control}/shards/{index}/address"
        try:
            async with session[0].get(url, headers={SECRET_HEADER: spec.secret}) as resp:
                doc = await resp.json()
                if resp.status != 200:
                    raise Unavailable(f"shard {index} cannot be located: {doc.get('error')}")
                return str(doc["host"]), int(doc["port"])
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unavailable(f"the main server process cannot be reached: {exc}") from None

    return address


def _control_forward(spec: WorkerSpec) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Send a request on to the main process's control endpoint; its answer as is."""
    session: list[aiohttp.ClientSession] = []

    async def forward(request: web.Request) -> web.Response:
        if not session:
            session.append(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)))
        headers = {SECRET_HEADER: spec.secret}
        for name in ("Content-Type", "Accept"):
            if name in request.headers:
                headers[name] = request.headers[name]
        url = f"{spec.control}{request.rel_url}"
        try:
            async with session[0].request(
                request.method, url, data=await request.read(), headers=headers
            ) as resp:
                body = await resp.read()
                return web.Response(
                    status=resp.status,
                    body=body,
                    headers={"Content-Type": resp.headers.get("Content-Type", "application/json")},
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unavailable(f"the main server process cannot be reached: {exc}") from None

    return forward


def worker_main() -> int:
    """Entry point of a worker process (``python -m gateway.workers``)."""
    from actors.directory import ChannelDirectory
    from actors.shard import tune_collector
    from gateway import door
    from gateway.app import app_options, make_app
    from gateway.logs import setup_logging
    from gateway.settings import ServerSettings

    try:
        spec = msgspec.json.decode(os.environ[ENV], type=WorkerSpec)
        settings = msgspec.convert(spec.settings, ServerSettings)
    except (KeyError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        print(f"evq worker: bad or missing {ENV}: {exc}", file=sys.stderr)
        return 2
    setup_logging(
        settings.log_level,
        settings.log_format,
        mode=settings.log_mode,
        prefix=f"worker-{spec.index} ",
        fields={"worker": spec.index},
    )
    directory = ChannelDirectory(spec.shards, spec.secret, _control_lookup(spec))
    try:
        options = app_options(settings, spec.secret, spec.tokens)
    except BadRequest as exc:
        print(f"evq worker: {exc}", file=sys.stderr)
        return 2
    app = make_app(directory, options)
    app[FORWARD] = _control_forward(spec)  # tasks run in the main process
    tune_collector()  # after the imports: they stay out of the collector's walks
    with contextlib.suppress(KeyboardInterrupt):
        door.run(
            app,
            host=settings.host,
            port=settings.port,
            reuse_port=True,
            shutdown_timeout=settings.shutdown_timeout_s,
            backlog=4096,  # bursts of connecting watchers
            on_listening=lambda: print(LISTENING.decode(), flush=True),
            tls=settings.tls_files(),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(worker_main())
