"""Routes the API contract (docs/API.md) names that this version does not serve yet: each
answers 501 with ``{"error": {"code": "NotImplemented", …}}``, after the same authentication
and permission checks as a served route would have (``gateway/auth.py``), so that clients and
checks outside the repository learn what is missing, not a bare 404. A route leaves this
table when it is built."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.errors import error_response, wants_msgpack

__all__ = ["PLANNED", "routes"]

# (method, route) → what it will do, for the 501's message
PLANNED: dict[tuple[str, str], str] = {
    ("POST", "/v1/queues/{name}/pause"): "pausing a queue",
    ("POST", "/v1/queues/{name}/resume"): "resuming a queue",
    ("POST", "/v1/queues/{name}/redrive"): "native redrive of a dead-letter queue",
}


def _answer(what: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def not_implemented(request: web.Request) -> web.Response:
        return error_response(
            501,
            "NotImplemented",
            f"{what} is in the API contract but not in this version of evq",
            msgpack=wants_msgpack(request),
        )

    return not_implemented


routes = [web.route(method, path, _answer(what)) for (method, path), what in PLANNED.items()]
