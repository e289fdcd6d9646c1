"""How much one gateway process takes on at once: connections held and requests handled.
Past either bound it answers 429 instead of queueing in memory. aiohttp's middleware
(:mod:`gateway.app`) and the front door's fast path (:mod:`gateway.fast`) both ask here.
And who is refused outright: the addresses that sent too many requests failing as HTTP
(:class:`Refusals`, over :mod:`gateway.penalty`), asked by the listening site.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from aiohttp import web

from actors.clock import Clock, SystemClock
from actors.errors import Overloaded
from gateway.penalty import Penalties

__all__ = [
    "EXEMPT",
    "FAST_CONNECTIONS",
    "IN_FLIGHT",
    "LIMITS",
    "PENALTIES",
    "Limits",
    "Refusals",
    "connections",
    "offend",
    "peer_address",
    "refuse",
]

log = logging.getLogger(__name__)


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


def peer_address(transport: Any) -> str | None:
    """The address (without the port) at the other end of ``transport``, if known."""
    peer = transport.get_extra_info("peername") if transport is not None else None
    return str(peer[0]) if isinstance(peer, tuple) and peer else None


class Refusals:
    """The gateway process's :class:`Penalties` on its clock, saying once, in the log, when
    an address gets refused."""

    __slots__ = ("clock", "penalties")

    def __init__(self, penalties: Penalties, clock: Clock | None = None) -> None:
        self.penalties = penalties
        self.clock = clock or SystemClock()

    def now(self) -> float:
        return self.clock.now_ms() / 1000

    def offend(self, peer: str | None, reason: str, detail: str = "") -> None:
        """Count an offence of ``peer`` (a request that failed as HTTP: ``reason`` is
        "malformed" or "too_slow"). ``detail`` is ours (a parser's error name), never bytes
        of the request (they may hold a token)."""
        penalties = self.penalties
        ban = penalties.offend(peer, reason, self.now())
        if ban is not None:
            log.warning(
                "refusing connections from %s for %.0f s: %d requests that failed as HTTP "
                "within %.0f s (the last %s%s)",
                peer,
                ban,
                penalties.limit,
                penalties.window_s,
                reason.replace("_", " "),
                f": {detail}" if detail else "",
            )

    def refused(self, peer: str) -> float:
        """How long new connections from ``peer`` are still refused (0: not refused)."""
        if not self.penalties.peers:
            return 0.0
        return self.penalties.refused(peer, self.now())

    def silenced(self) -> dict[str, float]:
        """The addresses whose connections the kernel should drop, and for how long."""
        return self.penalties.silenced(self.now()) if self.penalties.silent else {}

    def refusing(self) -> int:
        """Addresses refused now."""
        return self.penalties.refusing(self.now())


# Who sent requests that failed as HTTP, and which addresses are refused (gateway/penalty.py)
PENALTIES = web.AppKey("penalties", Refusals)


def offend(app: web.Application, peer: str | None, reason: str, detail: str = "") -> None:
    """:meth:`Refusals.offend` of ``app``'s, if it has them."""
    refusals = app.get(PENALTIES)
    if refusals is not None:
        refusals.offend(peer, reason, detail)
