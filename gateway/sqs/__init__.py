"""The AWS SQS-compatible API (README.md beside this file): both wire protocols on the
gateway's port, translated onto the engine's commands through the native API's batchers."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from aiohttp import web

from actors.clock import Clock, SystemClock
from gateway.auth import Token, sqs_key_callers
from gateway.sqs.addresses import DEFAULT_ACCOUNT, check_account
from gateway.sqs.context import (
    ACCOUNT,
    CALLERS,
    CLOCK,
    KEYS,
    OPEN,
    RECEIPT_KEY,
    SETTINGS_CACHE,
    SettingsCache,
)
from gateway.sqs.handler import handle
from gateway.sqs.receipts import receipt_key

__all__ = ["DEFAULT_ACCOUNT", "handle", "setup"]


def setup(
    app: web.Application,
    *,
    keys: Mapping[str, str] | None = None,
    callers: list[Token] | None = None,
    clock: Clock | None = None,
    open_without_keys: bool = True,
    cluster_secret: str | None = None,
    account_id: str = DEFAULT_ACCOUNT,
) -> None:
    """Serve SQS on ``POST /`` and on queue URLs (``POST /{account}/{queue}``).

    ``keys`` (access key → secret key, each allowed everything) and the ``callers`` that
    have an SQS key pair (with their permissions and rate limits, gateway/auth.py): with
    any, every request must carry a valid AWS Signature V4 by one of them. With none, any
    credentials are accepted if ``open_without_keys`` (a server on loopback), and every
    request is refused otherwise.
    ``cluster_secret`` signs receipt handles, so that every gateway of the cluster accepts
    the others' (None: a key of this process's own). ``account_id`` (12 digits) is the
    account in queue URLs and ARNs.

    Raises:
        ValueError: ``account_id`` is not 12 digits, or an access key is given twice.
    """
    signers = sqs_key_callers(dict(keys or {}))
    signers += [t for t in callers or [] if t.sqs_access_key is not None]
    app[CALLERS] = {t.sqs_access_key or "": t for t in signers}
    if len(app[CALLERS]) != len(signers):
        raise ValueError("an SQS access key is configured twice (sqs_keys and tokens)")
    app[KEYS] = {t.sqs_access_key or "": t.sqs_secret_key or "" for t in signers}
    app[OPEN] = open_without_keys
    app[CLOCK] = clock or SystemClock()
    app[RECEIPT_KEY] = receipt_key(cluster_secret or secrets.token_hex(32))
    app[SETTINGS_CACHE] = SettingsCache()
    app[ACCOUNT] = check_account(account_id)
    app.router.add_post("/", handle)
    app.router.add_post(r"/{account:\d{12}}/{queue}", handle)
