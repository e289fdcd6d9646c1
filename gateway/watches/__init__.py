"""Keys and one-shot watches on the HTTP side: ``/v1/keys`` (:mod:`.keys`), ``/v1/watch``
(long poll, :mod:`.longpoll`) and ``/v1/ws`` (WebSocket, :mod:`.websocket`). The bookkeeping
is :mod:`watch.core`; the per-process fan-out and upstream watches are :mod:`.hub`; the
WebSocket wire is :mod:`.codec` (pure); what the transports share (limits, the watchers
held, a state encoded once per change) is :mod:`.watchers`.

This module is what the app installs: the routes, the front door's upgrades, the watch
state, the gauges for ``/metrics``, and the graceful close of every watcher.
"""

from __future__ import annotations

from aiohttp import web

from gateway import limits, metrics, native
from gateway.door import UPGRADES, Upgrade
from gateway.watches import keys, longpoll, sysevents, websocket
from gateway.watches.hub import Hub
from gateway.watches.longpoll import PollConn, open_long_poll
from gateway.watches.watchers import HUB, WATCH_OPTIONS, WATCHERS, Watchers, WatchOptions
from gateway.watches.websocket import (
    CLOSE_GOING_AWAY,
    CLOSE_SLOW,
    WsConn,
    WsProtocol,
    open_websocket,
)

__all__ = [
    "CLOSE_SLOW",
    "HUB",
    "WATCHERS",
    "WATCH_OPTIONS",
    "PollConn",
    "WatchOptions",
    "Watchers",
    "WsConn",
    "WsProtocol",
    "close_watchers",
    "install",
    "open_long_poll",
    "open_websocket",
    "routes",
]

# Every route of the watch endpoints, in the order they are added to the app.
routes = [*keys.routes, *longpoll.routes, *websocket.routes]


async def close_watchers(app: web.Application) -> None:
    """Graceful shutdown: publish ``sys:shutdown``, answer long polls, close WebSockets."""
    hub = app[HUB]
    hub.publish_sys("sys:shutdown", {"reason": "the server is shutting down"})
    await hub.close()
    for conn in list(app[WATCHERS].ws):
        conn.close(CLOSE_GOING_AWAY, "server shutdown", linger=False)
    for poll in list(app[WATCHERS].polls):
        poll.close_after = True
        poll.answer(None)


def install(app: web.Application, options: WatchOptions | None = None) -> None:
    """Add the watch endpoints and their state to ``app``."""
    directory = app[native.DIRECTORY]
    app[HUB] = Hub(directory.watch_key)
    app[WATCH_OPTIONS] = options or WatchOptions()
    watchers = app[WATCHERS] = Watchers()
    # Watchers on aiohttp's connections have a limit of their own, not the HTTP one.
    app.setdefault(limits.EXEMPT, []).append(lambda: watchers.n - watchers.door)
    upgrades: dict[str, Upgrade] = {"/v1/ws": open_websocket, "/v1/watch/": open_long_poll}
    app[UPGRADES] = upgrades
    app.add_routes(routes)
    sysevents.install(app)  # sys:placement, sys:shards, sys:queues
    metrics.register_gauge(
        app,
        "evq_watchers",
        "Watchers held by this process",
        lambda: _watcher_counts(app[WATCHERS]),
        labels=["kind"],
    )
    metrics.register_gauge(
        app,
        "evq_watch_upstream_keys",
        "Keys this process follows upstream (one watch each)",
        lambda: len(app[HUB].following()),
    )


def _watcher_counts(watchers: Watchers) -> dict[tuple[str, ...], float]:
    """Watchers by kind, for ``/metrics``."""
    ws = len(watchers.ws)
    return {("websocket",): ws, ("long_poll",): max(0, watchers.n - ws)}
