"""Behind a TLS-terminating proxy: what the proxy says about the request, believed only from it.

A request that comes from a trusted proxy's address has its scheme from the first
``X-Forwarded-Proto`` (``http`` or ``https``; SQS queue URLs are built from it) and its remote
address from ``X-Forwarded-For``: the last address in the chain that is not itself a trusted
proxy (the addresses before it are the client's to write, so they are not believed). Headers
from anyone else are ignored: a client cannot make itself look like another address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

__all__ = ["Network", "forwarded_middleware", "origin"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _trusted(address: str | None, networks: Sequence[Network]) -> bool:
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    return any(ip in network for network in networks)


def origin(
    remote: str | None, proto: str | None, chain: str | None, networks: Sequence[Network]
) -> tuple[str | None, str | None]:
    """(scheme, remote address) of a request from ``remote`` with those headers; None for
    what stays as the connection says."""
    if not _trusted(remote, networks):
        return None, None
    scheme = None
    if proto:
        first = proto.split(",")[0].strip().lower()
        scheme = first if first in ("http", "https") else None
    client = None
    if chain:
        for hop in reversed([h.strip() for h in chain.split(",") if h.strip()]):
            client = hop
            if not _trusted(hop, networks):
                break
    return scheme, client


def forwarded_middleware(
    networks: Sequence[Network],
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware that applies :func:`origin` to every request."""

    @web.middleware
    async def forwarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        scheme, remote = origin(
            request.remote,
            request.headers.get("X-Forwarded-Proto"),
            request.headers.get("X-Forwarded-For"),
            networks,
        )
        if scheme is None and remote is None:
            return await handler(request)
        if scheme is not None and remote is not None:
            request = request.clone(scheme=scheme, remote=remote)
        elif scheme is not None:
            request = request.clone(scheme=scheme)
        else:
            request = request.clone(remote=remote or "")
        return await handler(request)

    return forwarded
