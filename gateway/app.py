"""make_app: the aiohttp application — routes, middlewares, health, readiness, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from ipaddress import ip_network
from typing import Any

import msgspec
from aiohttp import web

from actors.directory import Directory
from actors.log.store import ObjectStore
from gateway import (
    dashboard,
    fast,
    limits,
    metrics,
    native,
    redrive,
    shards,
    sqs,
    tasks,
    watches,
)
from gateway.auth import AUTH, Auth, Token, auth_middleware, retry_after
from gateway.batcher import Batchers
from gateway.errors import MAX_BODY, error_middleware, error_response, wants_msgpack
from gateway.fast import FAST, Fast
from gateway.limits import FAST_CONNECTIONS, IN_FLIGHT, LIMITS, PENALTIES, Limits, Refusals
from gateway.penalty import Penalties
from gateway.presence import ABOUT, PRESENCE, Presence
from gateway.proxy import forwarded_middleware
from gateway.settings import MAX_BODY_BYTES, ServerSettings, is_loopback
from gateway.tasks import TASKS, Board, Tasks
from gateway.watches.watchers import WATCHERS

__all__ = ["AppOptions", "app_options", "make_app"]

log = logging.getLogger(__name__)

READY = web.AppKey("ready", list)  # [bool]: once every shard has recovered
APP_OPTIONS = web.AppKey["AppOptions"]("app_options")
# More conditions of readiness (e.g. the gateway worker processes listen): () -> bool
READY_CHECKS = web.AppKey("ready_checks", list)


class AppOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Gateway limits and behaviour (from ServerSettings)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_requests: int = 10_000
    max_connections: int = 15_000  # HTTP connections (watchers apart); a process has 20k fds
    max_waiting_takes: int = 50_000
    auto_create: bool = False
    batch_in_flight: int = 2
    batch_split_at: int = 128
    max_waiting_per_shard: int = 20_000  # commands waiting for a call toward one shard
    sqs_keys: dict[str, str] = {}  # SQS access key → secret; empty: no signature check
    sqs_open: bool = True  # without keys, accept any request (False: refuse every one)
    sqs_account_id: str = "000000000000"  # the account in SQS queue URLs and ARNs
    # The cluster secret (signs SQS receipt handles alike on every gateway); None: random.
    cluster_secret: str | None = None
    tokens: list[Token] = []  # bearer tokens (gateway/auth.py); empty: no auth
    # Behind a TLS-terminating proxy: the networks whose X-Forwarded-* are believed
    # (gateway/proxy.py); empty: none.
    trusted_proxies: list[str] = []
    refuse_after: int = 20  # requests failing as HTTP within 10 s that get an address refused
    refuse_for_s: float = 10.0
    fast_path: bool = True  # the front door serves the hot commands itself (gateway/fast.py)
    watch: watches.WatchOptions = msgspec.field(default_factory=watches.WatchOptions)


def app_options(
    settings: ServerSettings, cluster_secret: str | None = None, tokens: Sequence[Token] = ()
) -> AppOptions:
    """The gateway's options from the server settings, the cluster secret and the bearer
    tokens read at start (every gateway process alike)."""
    return AppOptions(
        cluster_secret=cluster_secret,
        max_body_bytes=settings.max_body_bytes,
        max_requests=settings.max_requests,
        max_connections=settings.max_connections,
        max_waiting_takes=settings.max_waiting_takes,
        auto_create=settings.auto_create,
        sqs_keys=settings.sqs_key_map(),
        sqs_open=is_loopback(settings.host),
        sqs_account_id=settings.sqs_account_id,
        tokens=list(tokens),
        batch_in_flight=settings.batch_in_flight,
        batch_split_at=settings.batch_split_at,
        trusted_proxies=(
            [str(n) for n in settings.proxy_networks()] if settings.behind_tls_proxy else []
        ),
        refuse_after=settings.refuse_after,
        refuse_for_s=settings.refuse_for_s,
        watch=watches.WatchOptions(
            max_watchers=settings.max_watchers,
            send_buffer_limit=settings.ws_send_buffer_bytes,
        ),
    )


def make_app(directory: Directory, options: AppOptions | None = None) -> web.Application:
    """The gateway application over ``directory``."""
    options = options or AppOptions()
    app = web.Application(
        client_max_size=options.max_body_bytes,
        middlewares=[
            *(
                [forwarded_middleware([ip_network(n) for n in options.trusted_proxies])]
                if options.trusted_proxies
                else []
            ),
            metrics.metrics_middleware,
            *([auth_middleware(_auth_error)] if options.tokens else []),
            _limit_middleware,
            error_middleware,
            _body_middleware,
        ],
    )
    app[AUTH] = Auth(options.tokens)
    app[MAX_BODY] = options.max_body_bytes
    app[APP_OPTIONS] = options
    app[native.DIRECTORY] = directory
    app[native.BATCHERS] = Batchers(
        directory.run_batch,
        directory.shard_of,
        start=getattr(directory, "start_batch", None),  # the channel's and the local ones
        reroute=getattr(directory, "reroute", None),  # a directory that never refuses has none
        max_in_flight=options.batch_in_flight,
        split_at=options.batch_split_at,
        max_waiting=options.max_waiting_per_shard,
    )
    app[native.OPTIONS] = native.Options(
        auto_create=options.auto_create, max_waiting_takes=options.max_waiting_takes
    )
    app[native.WAITING_TAKES] = [0]
    app[native.SHUTTING_DOWN] = asyncio.Event()
    app[READY] = [False]
    app[READY_CHECKS] = []
    app[IN_FLIGHT] = [0]
    app[FAST_CONNECTIONS] = set()
    app[LIMITS] = Limits(max_requests=options.max_requests, max_connections=options.max_connections)
    app[PENALTIES] = Refusals(
        Penalties.of(options.refuse_after, options.refuse_for_s, exempt=options.trusted_proxies)
    )
    app.add_routes(native.routes)
    app[TASKS] = Tasks()
    app[ABOUT] = {}  # evq serve says where it listens (gateway/server.py)
    app[PRESENCE] = Presence(None, lambda: _about(app))
    app.add_routes(shards.routes)  # GET and POST /v1/admin/shards
    app.add_routes(tasks.routes)  # /v1/tasks
    app.add_routes(redrive.routes)  # POST /v1/queues/{name}/redrive
    if options.fast_path:
        app[FAST] = Fast(app)
    watches.install(app, options.watch)
    metrics.install(app)  # GET /metrics
    # POST / and queue URLs (gateway/sqs/README.md)
    sqs.setup(
        app,
        keys=options.sqs_keys,
        callers=options.tokens,
        open_without_keys=options.sqs_open,
        cluster_secret=options.cluster_secret,
        account_id=options.sqs_account_id,
    )
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.add_routes(dashboard.routes)  # GET /, /dashboard/*, /v1/status
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_on_shutdown)
    return app


_WATCH_PATHS = ("/v1/ws", "/v1/watch/")
_ALWAYS = {"/healthz", "/readyz", "/metrics"}


def _auth_error(
    status: int, code: str, message: str, request: web.Request, wait: float | None = None
) -> web.Response:
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="evq"'
    if wait is not None:
        headers["Retry-After"] = retry_after(wait)
    return error_response(status, code, message, msgpack=wants_msgpack(request), headers=headers)


@web.middleware
async def _limit_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Answer 429 past the connections held or the requests handled at once, instead of
    queueing in memory (health, readiness and metrics always answer)."""
    path = request.path
    if path.startswith(_WATCH_PATHS):
        return await handler(request)  # watchers have their own limit (watches.WatchOptions)
    if path in _ALWAYS:
        return await handler(request)
    refused = limits.refuse(request.app, _http_connections(request))
    if refused is not None:
        exc, close = refused
        response = error_response(429, exc.code, exc.message, msgpack=wants_msgpack(request))
        if close:
            response.force_close()  # and let this one go
        return response
    counter = request.app[IN_FLIGHT]
    counter[0] += 1
    try:
        return await handler(request)
    finally:
        counter[0] -= 1


@web.middleware
async def _body_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Read the body before the handler does, and make it come: a body that brings less
    than ``fast.PROGRESS_BYTES`` in ``fast.REQUEST_S`` is answered 408 and its connection
    closed, as on the fast path (gateway/fast.py), so a client that trickles a body holds a
    connection for that long, not for ever. The handler then finds the body read (aiohttp keeps it).

    A trickled *head* never reaches a handler: aiohttp closes a connection that has not
    sent a whole request within its keep-alive time (the runner's, 75 s)."""
    if not request.body_exists or request.content.is_eof():
        return await handler(request)  # no body, or all of it came with the head
    loop = asyncio.get_running_loop()
    mark = [0]

    def check(limit: asyncio.Timeout) -> None:
        """Every REQUEST_S: time out now, unless PROGRESS_BYTES came since the last look."""
        received = request.content.total_bytes
        if received - mark[0] < fast.PROGRESS_BYTES:
            limit.reschedule(loop.time())
        else:
            mark[0] = received
            looks[0] = loop.call_later(fast.REQUEST_S, check, limit)

    looks: list[asyncio.TimerHandle] = []  # the next look (one at a time)
    try:
        async with asyncio.timeout(None) as limit:
            looks.append(loop.call_later(fast.REQUEST_S, check, limit))
            await request.read()  # a body over the limit raises 413: error_middleware answers
    except TimeoutError:
        response = error_response(
            408, "RequestTimeout", "the request came too slowly", msgpack=wants_msgpack(request)
        )
        response.force_close()
        limits.offend(request.app, request.remote, "too_slow")
        # Written and closed here: aiohttp would otherwise linger, reading what the client
        # still trickles, for up to 10 s before it closes.
        await response.prepare(request)
        await response.write_eof()
        if request.transport is not None:
            request.transport.close()
        return response
    finally:
        looks[-1].cancel()
    return await handler(request)


def _http_connections(request: web.Request) -> int:
    """Connections this process holds, watchers apart (they have their own limit)."""
    manager = getattr(request.protocol, "_manager", None)  # aiohttp's web.Server
    return limits.connections(request.app, manager)


async def healthz(request: web.Request) -> web.Response:
    """The process is up (and which gateway process answered)."""
    return web.json_response({"status": "ok", "pid": os.getpid()})


async def readyz(request: web.Request) -> web.Response:
    """200 once every shard has recovered its queues, 503 until then; 503 again, with the
    reason, while a shard's log has failed (a failed fsync: it writes nothing until it is
    restarted). A shard whose disk is full still serves takes and acks: 200, and says so."""
    if not request.app[READY][0] and not all(check() for check in request.app[READY_CHECKS]):
        doc: dict[str, object] = {"status": "starting"}
        return web.json_response(doc, status=503, headers={"Retry-After": "1"})
    statuses = await request.app[native.DIRECTORY].status(brief=True)
    failed = [s for s in statuses if s.log_failed]
    if failed:
        doc = {
            "status": "failed",
            "shards": [{"index": s.index, "log_failed": s.log_failed} for s in failed],
        }
        return web.json_response(doc, status=503, headers={"Retry-After": "1"})
    if request.app[READY][0] or (statuses and all(s.ready for s in statuses)):
        request.app[READY][0] = True
        doc = {"status": "ready"}
        full = [{"index": s.index, "disk_full": s.disk_full} for s in statuses if s.disk_full]
        if full:
            doc["degraded"] = full
        return web.json_response(doc)
    doc = {
        "status": "recovering",
        "shards": [
            {"index": s.index, "ready": s.ready, "queues": s.queues, "recovering": s.recovering}
            for s in statuses
        ],
    }
    return web.json_response(doc, status=503, headers={"Retry-After": "1"})


def _about(app: web.Application) -> dict[str, Any]:
    """What this gateway's presence record says of it now (gateway/presence.py)."""
    watchers = app.get(WATCHERS)
    about: dict[str, Any] = app[ABOUT]
    return {
        "listen": None,
        "processes": 1,
        **about,
        "watchers": 0 if watchers is None else watchers.n,
        "requests_in_flight": app[IN_FLIGHT][0],
    }


def _board_store(directory: object) -> ObjectStore | None:
    """The shards' store, opened for the task board, when this gateway coordinates shards
    over Ray (a gateway that can start them: one of a cluster's, or evq serve's own)."""
    spawner = getattr(directory, "spawner", None)
    return spawner.open_store() if spawner is not None else None


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    """Start recovery with the app; close the queues (drain, snapshot) when it stops."""
    directory = app[native.DIRECTORY]
    await directory.start()
    board_store = _board_store(directory)
    if board_store is not None:  # the gateways of a cluster show each other's tasks
        app[TASKS].board = Board(board_store, app[TASKS].clock)
    presence = app[PRESENCE]
    presence.store = board_store  # ... and each other (the console's cluster page)
    beating = asyncio.ensure_future(presence.run())
    yield
    beating.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await beating
    await presence.leave()
    log.info("calls toward shards: %s", app[native.BATCHERS].stats.summary())
    await app[TASKS].close()  # a resize cut short here is resumed by asking again
    if board_store is not None:
        await board_store.close()
    log.info("closing queues: finishing writes and taking snapshots")
    await directory.close()
    log.info("queues closed")


async def _on_shutdown(app: web.Application) -> None:
    """New connections are refused by now; let waiting takes and watches answer, tell
    watchers of ``sys:shutdown``, close WebSockets."""
    app[native.SHUTTING_DOWN].set()
    await watches.close_watchers(app)
