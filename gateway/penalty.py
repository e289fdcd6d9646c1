"""A cost to the sender: peers whose requests fail as HTTP are refused at accept for a while.

A request that does not parse (smuggling-shaped heads, a header past the limits, bytes that
are not HTTP) or that comes too slowly (408) costs the gateway an accept, a parse and an
answer, on the event loop every other client waits in; sent again and again on new
connections, they starved a well-behaved client tenfold (loadtest/RESULTS.md, live attacks).
:class:`Penalties` counts such *offences* per peer address; ``limit`` of them within
``window_s`` and the address is *refused*: its new connections are closed as soon as they
are accepted, with a 429 and ``Retry-After``, before any protocol object, parse or task
exists (:mod:`gateway.accept`), for ``ban_s``, doubled at each ban that follows within
``max_ban_s`` of the last, up to ``max_ban_s``. An address that goes on connecting during
its ban (``silence_after`` refused connections) is *silenced*: the kernel drops its new
connections before they are accepted, for the rest of the ban.

Requests that parse but are refused by the API (a bad body, an unknown queue, a 401) are not
offences: they are answered like any other. The addresses in ``exempt`` (a trusted proxy in
front: every client arrives from it) are never refused.

Pure bookkeeping (the caller gives the time); memory is bounded: at most ``max_peers``
addresses are remembered, the least recently offending forgotten first.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Peer", "Penalties"]

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(slots=True)
class Peer:
    """What is remembered of one address."""

    window_start: float = 0.0
    offences: int = 0  # within the window that started at window_start
    refused_until: float = 0.0
    last_ban_s: float = 0.0  # the last ban's length (0: none yet)
    refused: int = 0  # connections refused during the current ban


@dataclass(slots=True)
class Penalties:
    """Offences per peer address, and which addresses are refused (see the module)."""

    limit: int = 20  # offences within window_s that get an address refused; 0: never
    window_s: float = 10.0
    ban_s: float = 10.0
    max_ban_s: float = 300.0
    max_peers: int = 100_000
    # Connections refused during one ban past which the address is *silenced*: the kernel
    # drops its new connections unanswered for the rest of the ban (gateway/accept.py), so a
    # flood that ignores the 429s costs the gateway nothing at all.
    silence_after: int = 100
    max_silenced: int = 1000
    exempt: tuple[IpNetwork, ...] = ()
    peers: OrderedDict[str, Peer] = field(default_factory=OrderedDict)
    silent: dict[str, float] = field(default_factory=dict)  # address → end of its ban
    offences: dict[str, int] = field(default_factory=dict)  # by reason, since the start
    refusals: int = 0  # connections refused at accept, since the start
    bans: int = 0  # addresses refused, since the start

    @classmethod
    def of(cls, limit: int, ban_s: float, exempt: Iterable[str] = ()) -> Penalties:
        """Penalties with ``limit`` and ``ban_s``, never refusing the networks ``exempt``."""
        return cls(limit=limit, ban_s=ban_s, exempt=tuple(ipaddress.ip_network(n) for n in exempt))

    def offend(self, peer: str | None, reason: str, now: float) -> float | None:
        """One offence of ``peer`` (an address; None: not known) at ``now`` (seconds).
        The length of the ban it earned, or None when the address is not refused (yet)."""
        self.offences[reason] = self.offences.get(reason, 0) + 1
        if peer is None or self.limit <= 0 or self._exempt(peer):
            return None
        record = self.peers.pop(peer, None)
        if record is None:
            record = Peer(window_start=now)
            while len(self.peers) >= self.max_peers:
                self.peers.popitem(last=False)
        self.peers[peer] = record  # the most recent offender last
        if now - record.window_start >= self.window_s:
            record.window_start, record.offences = now, 0
        record.offences += 1
        if record.offences < self.limit or now < record.refused_until:
            return None
        again = record.last_ban_s > 0 and now - record.refused_until < self.max_ban_s
        ban = min(self.max_ban_s, record.last_ban_s * 2 if again else self.ban_s)
        record.refused_until, record.last_ban_s = now + ban, ban
        record.window_start, record.offences, record.refused = now, 0, 0
        self.bans += 1
        return ban

    def refused(self, peer: str, now: float) -> float:
        """How long ``peer``'s connections are still refused at ``now`` (0: not refused)."""
        record = self.peers.get(peer)
        if record is None or now >= record.refused_until:
            return 0.0
        self.refusals += 1
        record.refused += 1
        if record.refused == self.silence_after and len(self.silent) < self.max_silenced:
            self.silent[peer] = record.refused_until
        return record.refused_until - now

    def silenced(self, now: float) -> dict[str, float]:
        """The addresses whose connections are dropped unanswered at ``now``, each with how
        long it stays so."""
        for peer in [p for p, until in self.silent.items() if until <= now]:
            del self.silent[peer]
        return {peer: until - now for peer, until in self.silent.items()}

    def refusing(self, now: float) -> int:
        """Addresses refused at ``now``."""
        return sum(1 for record in self.peers.values() if now < record.refused_until)

    def _exempt(self, peer: str) -> bool:
        if not self.exempt:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self.exempt)
