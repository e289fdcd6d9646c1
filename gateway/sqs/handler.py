"""The aiohttp side of the SQS API: read, authenticate, parse, dispatch, render.

Every answer, success or error, is in the protocol the request came in: JSON 1.0 (with
``x-amzn-query-error`` on errors) or the query protocol's XML. Errors never reach the
native API's error middleware.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from actors.errors import QueueError
from gateway.auth import AUTH, Token, retry_after
from gateway.sqs import render
from gateway.sqs.access import NEW, QUEUE, RULES, SOURCE, TASK
from gateway.sqs.addresses import name_of_arn, name_of_url
from gateway.sqs.context import ACCOUNT, CALLERS, CLOCK, DEFAULT_REGION, KEYS, OPEN, Context
from gateway.sqs.errors import SqsError, from_queue_error
from gateway.sqs.leases import ACTIONS as LEASE_ACTIONS
from gateway.sqs.messages import ACTIONS as MESSAGE_ACTIONS
from gateway.sqs.moves import ACTIONS as MOVE_ACTIONS
from gateway.sqs.moves import decode_handle
from gateway.sqs.permissions import ACTIONS as PERMISSION_ACTIONS
from gateway.sqs.queues import ACTIONS as QUEUE_ACTIONS
from gateway.sqs.sigv4 import parse_authorization, verify
from gateway.sqs.tags import ACTIONS as TAG_ACTIONS
from gateway.sqs.wire import Call, parse_json, parse_query

__all__ = ["ACTIONS", "handle"]

log = logging.getLogger(__name__)

Action = Callable[[Context], Awaitable[dict[str, Any]]]
ACTIONS: dict[str, Action] = {
    **QUEUE_ACTIONS,
    **TAG_ACTIONS,
    **PERMISSION_ACTIONS,
    **MESSAGE_ACTIONS,
    **LEASE_ACTIONS,
    **MOVE_ACTIONS,
}
_FORM = "application/x-www-form-urlencoded"


def _request_id() -> str:
    return str(uuid.UUID(bytes=secrets.token_bytes(16), version=4))


async def handle(request: web.Request) -> web.Response:
    """``POST /`` (and ``POST /{account}/{queue}``) in either SQS protocol."""
    request_id = _request_id()
    protocol = "json" if "X-Amz-Target" in request.headers else "query"
    action = ""
    try:
        body = await _read(request)
        region, caller = _authenticate(request, body)
        call = _parse(request, body)
        action = call.action
        handler = ACTIONS.get(call.action)
        if handler is None:
            raise _unknown_action(call)
        ctx = Context(request, call, region, _path_queue(request), caller)
        if caller is not None:
            _authorize(ctx, caller)
        result = await handler(ctx)
    except SqsError as exc:
        return _error(exc, protocol, request_id)
    except QueueError as exc:
        return _error(from_queue_error(exc), protocol, request_id)
    except Exception:
        log.exception("SQS %s failed", action or "request")
        error = SqsError("InternalError", "internal error", status=500, sender=False)
        return _error(error, protocol, request_id)
    headers = {"x-amzn-RequestId": request_id}
    if protocol == "json":
        return web.Response(
            body=render.json_result(result), content_type=render.JSON_TYPE, headers=headers
        )
    body = render.xml_result(action, result, request_id)
    return web.Response(body=body, content_type="text/xml", headers=headers)


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise SqsError(
            "RequestEntityTooLarge", "The request body is over the server's limit.", status=413
        ) from None


def _authenticate(request: web.Request, body: bytes) -> tuple[str, Token | None]:
    """Check the signature when keys are configured: the request's region, and who signed
    it (None: no keys are configured, or a key given without permissions).

    Raises:
        SqsError: the signature's errors (keys configured only).
    """
    keys = request.app[KEYS]
    if keys:
        signature = verify(
            method=request.method,
            raw_path=request.raw_path,
            headers=request.headers,
            body=body,
            keys=keys,
            now_ms=request.app[CLOCK].now_ms(),
        )
        return signature.region, request.app[CALLERS].get(signature.access_key)
    if not request.app[OPEN]:
        raise SqsError(
            "InvalidClientTokenId",
            "This server's SQS API has no access keys (sqs_access_key in the tokens file, or "
            "EVQ_SQS_KEYS) and it does not listen on loopback only, so it accepts no request.",
            status=403,
        )
    try:  # local development: any credentials; the region only names ARNs
        return parse_authorization(request.headers.get("Authorization", "")).region, None
    except SqsError:
        return DEFAULT_REGION, None


def _authorize(ctx: Context, caller: Token) -> None:
    """The caller's permission for the action on its queue (gateway/sqs/access.py), then
    its rate limit, shared with its native API requests.

    Raises:
        SqsError: AccessDenied; RequestThrottled; the errors of naming the queue.
    """
    level, target = RULES[ctx.action]
    queue = _target_queue(ctx, target)
    if queue is not None:
        ctx.require(level, queue)
    wait = ctx.app[AUTH].admit(caller)
    if wait is not None:
        raise SqsError("RequestThrottled", "Rate exceeded", status=400, retry_after=wait)


def _target_queue(ctx: Context, target: str) -> str | None:
    """The queue an action's permission is checked on (None: checked by the action)."""
    if target == QUEUE:
        return ctx.queue()
    if target == NEW:
        return ctx.params.required("QueueName")
    if target == SOURCE:
        return name_of_arn(ctx.params.required("SourceArn"), ctx.account, "SourceArn")
    if target == TASK:
        _, source_arn = decode_handle(ctx.params.required("TaskHandle"))
        try:
            return name_of_arn(source_arn, ctx.account, "TaskHandle")
        except SqsError:
            return None  # the action answers that the task's queue does not exist
    return None


def _parse(request: web.Request, body: bytes) -> Call:
    target = request.headers.get("X-Amz-Target")
    if target is not None:
        return parse_json(target, body)
    pairs = list(request.query.items())
    if body:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise SqsError("MalformedQueryString", "The form body is not UTF-8.") from None
        pairs.extend(parse_qsl(text, keep_blank_values=True))
    return parse_query(pairs)


def _unknown_action(call: Call) -> SqsError:
    if call.protocol == "json":
        return SqsError("UnknownOperationException", f"Unknown operation AmazonSQS.{call.action}.")
    return SqsError("InvalidAction", f"The action {call.action} is not valid for this endpoint.")


def _path_queue(request: web.Request) -> str | None:
    """The queue of a request posted to a queue URL (older SDKs do that)."""
    account = request.match_info.get("account")
    if account is None:
        return None
    return name_of_url(f"/{account}/{request.match_info['queue']}", request.app[ACCOUNT])


def _error(error: SqsError, protocol: str, request_id: str) -> web.Response:
    headers = {"x-amzn-RequestId": request_id}
    if error.retry_after is not None:
        headers["Retry-After"] = retry_after(error.retry_after)
    elif error.status in (429, 503):
        headers["Retry-After"] = "1"
    if protocol == "json":
        body, extra = render.json_error(error)
        headers.update(extra)
        return web.Response(
            status=error.status, body=body, content_type=render.JSON_TYPE, headers=headers
        )
    return web.Response(
        status=error.status,
        body=render.xml_error(error, request_id),
        content_type="text/xml",
        headers=headers,
    )
