"""The dashboard: a page at ``/`` (its files under ``/dashboard/``) and ``GET /v1/status``.

The page (``index.html``, ``app.js``, ``chart.js``, ``style.css`` beside this file, shipped
as package data) needs nothing from outside the server: it lists the queues with
``GET /v1/queues``, follows each one's counts through one-shot watches of ``queue:{name}``
on the ``/v1/ws`` WebSocket, and shows the shards' recovery reports from ``/v1/status``.
README.md beside this file describes it.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import msgspec
from aiohttp import web

from actors.status import ShardStatus
from gateway import native
from gateway.presence import PRESENCE
from gateway.tasks import forwarded

__all__ = ["FILES", "routes", "status_doc"]

# The files the page is made of, and their content types; nothing else is served.
FILES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "chart.js": "text/javascript",
    "console.js": "text/javascript",
    "style.css": "text/css",
}
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}

routes = web.RouteTableDef()


@functools.cache
def _file(name: str) -> bytes:
    """One of the page's files (read once per process)."""
    return resources.files(__name__).joinpath(name).read_bytes()


def _serve(name: str) -> web.Response:
    return web.Response(
        body=_file(name), content_type=FILES[name], charset="utf-8", headers=_HEADERS
    )


@routes.get("/")
async def page(request: web.Request) -> web.Response:
    """The dashboard page."""
    return _serve("index.html")


@routes.get("/dashboard/{name}")
async def asset(request: web.Request) -> web.Response:
    """One of the page's scripts or its style sheet."""
    name = request.match_info["name"]
    if name not in FILES or name == "index.html":
        raise web.HTTPNotFound(text=f"no dashboard file {name!r}")
    return _serve(name)


@routes.get("/v1/status")
async def status(request: web.Request) -> web.Response:
    """Every shard's readiness and what its recovery found (also while recovering), and
    the gateways that serve (the first process's list, asked from a worker process)."""
    answer = await forwarded(request)
    if answer is not None:
        return answer
    statuses = await request.app[native.DIRECTORY].status()
    doc = status_doc(statuses)
    doc["gateways"] = await request.app[PRESENCE].gateways()
    return native.reply(request, doc)


def status_doc(statuses: list[ShardStatus]) -> dict[str, Any]:
    """The ``/v1/status`` document (gateway/WIRE.md) of the shards' statuses."""
    return {
        "ready": bool(statuses) and all(s.ready for s in statuses),
        "shards": [_shard_doc(s) for s in statuses],
    }


def _shard_doc(s: ShardStatus) -> dict[str, Any]:
    reports = []
    for report in s.reports:
        doc = msgspec.to_builtins(report)
        doc["clean"] = report.clean
        reports.append(doc)
    return {
        "index": s.index,
        "ready": s.ready,
        "queues": s.queues,
        "recovering": s.recovering,
        "failed": dict(s.failed),
        "log": None if s.log is None else msgspec.to_builtins(s.log),
        "reports": reports,
    }
