"""How much one gateway process takes on at once: connections held and requests handled.
Past either bound it answers 429 instead of queueing in memory. aiohttp's middleware
(:mod:`gateway.app`) and the front door's fast path (:mod:`gateway.fast`) both ask here.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from actors.errors import Overloaded

__all__ = [
    "EXEMPT",
    "FAST_CONNECTIONS",
    "IN_FLIGHT",
    "LIMITS",
    "Limits",
    "connections",
    "refuse",
]


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """The bounds of one gateway process."""

    max_requests: int = 10_000
    max_connections: int = 15_000  # HTTP connections (watchers apart); a process has 20k fds


LIMITS = web.AppKey("limits", Limits)
IN_FLIGHT = web.AppKey("in_flight", list)  # [int]: requests being handled
FAST_CONNECTIONS = web.AppKey("fast_connections", set)  # connections the fast path serves
# Features whose connections aiohttp holds but which have limits of their own (watchers)
# register here how many they hold: () -> int.
EXEMPT = web.AppKey("exempt_connections", list)


def connections(app: web.Application, server: Any) -> int:
    """HTTP connections this process holds: aiohttp's (``server`` is its ``web.Server``, or
    None) and the fast path's, less those with limits of their own (``app[EXEMPT]``)."""
    registry = getattr(server, "_connections", None) if server is not None else None
    # Server.connections copies its registry into a list on every call (O(connections));
    # the registry's own length is O(1).
    total = len(registry) if registry is not None else 0
    return total + len(app[FAST_CONNECTIONS]) - sum(count() for count in app.get(EXEMPT, ()))


def refuse(app: web.Application, held: int) -> tuple[Overloaded, bool] | None:
    """Why a new request must be refused, and whether its connection should then close;
    None when it may go on (then count it in ``app[IN_FLIGHT]``)."""
    limits = app[LIMITS]
    if held > limits.max_connections:
        return Overloaded("the server holds too many connections; retry shortly"), True
    if app[IN_FLIGHT][0] >= limits.max_requests:
        return Overloaded("the server is handling too many requests; retry shortly"), False
    return None
