"""The one mapping from errors to HTTP: statuses, bodies, Retry-After.

Handlers never build error responses themselves: they raise :class:`QueueError`s and the
middleware here turns them (and aiohttp's own HTTP errors) into
``{"error": {"code", "message"}}`` with the status of API.md.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from actors.errors import ErrorKind, QueueError

__all__ = [
    "MAX_BODY",
    "STATUS",
    "error_middleware",
    "error_response",
    "prefers_msgpack",
    "status_of",
    "wants_msgpack",
]

log = logging.getLogger(__name__)

STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID: 400,
    ErrorKind.UNAUTHORIZED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.OVERLOADED: 429,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.FENCED: 503,  # the gateway retries elsewhere; to a client it is "try again"
    ErrorKind.DATA: 500,
    ErrorKind.INTERNAL: 500,
}
RETRY_AFTER_S = {429: 1, 503: 1}

# aiohttp's own errors (routing, body size) in our error model.
_HTTP_CODES = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    413: "TooLarge",
    415: "BadRequest",
}

MAX_BODY = web.AppKey("max_body", int)  # set by make_app; used in the 413 message

_json = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()
MSGPACK = "application/msgpack"


def status_of(exc: QueueError) -> int:
    """The HTTP status for an error."""
    return STATUS.get(exc.kind, 500)


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    msgpack: bool = False,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An error reply in our model, with Retry-After where retrying makes sense."""
    doc = {"error": {"code": code, "message": message}}
    headers = dict(headers or {})
    if status in RETRY_AFTER_S:
        headers.setdefault("Retry-After", str(RETRY_AFTER_S[status]))
    if msgpack:
        return web.Response(
            status=status, body=_msgpack.encode(doc), content_type=MSGPACK, headers=headers
        )
    return web.Response(
        status=status, body=_json.encode(doc), content_type="application/json", headers=headers
    )


def retry_seconds(exc: QueueError) -> int | None:
    """When the error says how long to wait (``retry_after_ms``, a rate limit's): whole
    seconds, at least one."""
    wait = exc.fields.get("retry_after_ms")
    if not isinstance(wait, int):
        return None
    return max(1, -(-wait // 1000))


def retry_header(exc: QueueError) -> dict[str, str] | None:
    seconds = retry_seconds(exc)
    return None if seconds is None else {"Retry-After": str(seconds)}


MSGPACK_TYPES = (MSGPACK, "application/x-msgpack")


def wants_msgpack(request: web.Request) -> bool:
    """Whether the reply should be msgpack (the request's type, or Accept)."""
    return prefers_msgpack(request.headers.get("Accept", ""), request.content_type)


def prefers_msgpack(accept: str, content_type: str) -> bool:
    """:func:`wants_msgpack` from the two header values (``content_type`` without
    parameters)."""
    if any(t in accept for t in MSGPACK_TYPES):
        return True
    return content_type in MSGPACK_TYPES and "json" not in accept


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turn every error into the API's error body."""
    try:
        return await handler(request)
    except QueueError as exc:
        return error_response(
            status_of(exc),
            exc.code,
            exc.message,
            msgpack=wants_msgpack(request),
            headers=retry_header(exc),
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, "BadRequest" if exc.status < 500 else "InternalError")
        message = exc.text or exc.reason
        if exc.status == 413:
            message = f"request body over the server's limit of {request.app[MAX_BODY]} bytes"
        kept = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        return error_response(
            exc.status, code, message, msgpack=wants_msgpack(request), headers=kept
        )
    except (ConnectionResetError, TimeoutError):
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(
            500, "InternalError", "internal error", msgpack=wants_msgpack(request)
        )
