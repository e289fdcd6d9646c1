"""The object store over obstore: S3, GCS, Azure and obstore's in-memory store.

:func:`actors.log.stores.open_store` builds it from a URL. The contract is the one in
:mod:`actors.log.store`'s docstring.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import obstore
from obstore import exceptions as obx
from obstore.store import MemoryStore, S3Store, from_url

from actors.errors import BadRequest
from actors.log.store import KeyNotFound, StoreError, check_key

if TYPE_CHECKING:  # typed dicts of obstore's stubs only
    from obstore.store import ClientConfig, RetryConfig, S3Config

__all__ = ["ObstoreStore", "open_obstore"]

# obstore reports a missing object as the builtin FileNotFoundError; NotFoundError is its
# deprecated predecessor, caught too in case a backend still raises it.
_NOT_FOUND = (FileNotFoundError, obx.NotFoundError)
# A create-only put on an existing key: AlreadyExistsError on most backends (S3 maps its 412
# here too), PreconditionError on some.
_EXISTS = (obx.AlreadyExistsError, obx.PreconditionError)
# Refused before the store changed anything: a failed write is then not ambiguous.
_REFUSED = (obx.PermissionDeniedError, obx.UnauthenticatedError, obx.InvalidPathError)
_FAILURES = (obx.BaseError, OSError, ValueError)
# How many times a create-only PUT whose answer was lost is read back and, if it did not
# land, sent again: a flaky network may reset two uploads in a row.
_RESENDS = 3


def _error(op: str, key: str, exc: BaseException, *, ambiguous: bool) -> StoreError:
    # obstore messages carry a multi-line Rust debug dump; the first line says what happened.
    summary = str(exc).split("\n", 1)[0][:500]
    return StoreError(f"{op} {key!r} failed: {summary}", op=op, key=key, ambiguous=ambiguous)


class ObstoreStore:
    """An :class:`~actors.log.store.ObjectStore` over any obstore store."""

    def __init__(
        self, store: Any, url: str, *, write_slots: int = 8, resend_ms: int | None = None
    ) -> None:
        self.store = store
        self.url = url
        # For how long after its first request a create-only PUT whose answer was lost may be
        # sent again (put_if_absent).
        self.resend_ms = RETRY_TIMEOUT_MS if resend_ms is None else resend_ms
        # Object stores answer in milliseconds: several segment writes in flight keep a busy
        # queue's throughput from being capped at one batch per round trip.
        self.write_slots = write_slots

    def __repr__(self) -> str:
        return f"ObstoreStore({self.url!r})"

    async def get(self, key: str) -> bytes:
        """The object's bytes. Raises: KeyNotFound, StoreError, BadRequest."""
        check_key(key)
        try:
            result = await obstore.get_async(self.store, key)
            return bytes(await result.bytes_async())
        except _NOT_FOUND:
            raise KeyNotFound(f"no object {key!r}", key=key) from None
        except _FAILURES as e:
            raise _error("get", key, e, ambiguous=False) from e

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create the object unless the key exists; True if created (or if a request of
        ours whose answer was lost had created it: the key holds exactly ``data``).

        Raises: StoreError, BadRequest.
        """
        check_key(key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.resend_ms / 1000
        try:
            return await self._create(key, data)
        except StoreError as first:
            if not first.fields["ambiguous"]:
                raise
            error = first
        # The answer was lost (a reset or a timeout: obstore does not retry those for a
        # conditional PUT; or 5xx until its retries ran out): learn what happened instead of
        # passing the doubt on. Our bytes there: it landed. Other bytes: someone else's, as
        # after a 412. Nothing there: send the same bytes again (while the retry budget
        # lasts: after a 5xx storm obstore has spent it already); should an earlier request
        # land late, one of them gets 412 and the key holds our bytes either way.
        for _ in range(_RESENDS):
            try:
                return await self.get(key) == data
            except KeyNotFound:
                pass
            except StoreError:
                raise error from None
            if loop.time() >= deadline:
                break
            try:
                return await self._create(key, data)
            except StoreError as again:
                if not again.fields["ambiguous"]:
                    raise
                error = again
        raise error

    async def _create(self, key: str, data: bytes) -> bool:
        try:
            # A single request (no multipart) so the If-None-Match condition covers the body.
            await obstore.put_async(self.store, key, data, mode="create", use_multipart=False)
        except _EXISTS:
            # Usually another writer won. But obstore retries a create-only PUT after a 5xx,
            # and when the first attempt had landed the retry sees 412: then the key holds
            # *our* bytes. Callers that must know compare what is stored (the log writer
            # does, ObjectLogDevice._taken).
            return False
        except _REFUSED as e:
            raise _error("put_if_absent", key, e, ambiguous=False) from e
        except _FAILURES as e:
            raise _error("put_if_absent", key, e, ambiguous=True) from e
        return True

    async def put(self, key: str, data: bytes) -> None:
        """Create or overwrite the object. Raises: StoreError, BadRequest."""
        check_key(key)
        try:
            await obstore.put_async(self.store, key, data, mode="overwrite", use_multipart=False)
        except _REFUSED as e:
            raise _error("put", key, e, ambiguous=False) from e
        except _FAILURES as e:
            raise _error("put", key, e, ambiguous=True) from e

    async def list(self, prefix: str) -> list[str]:
        """Sorted keys starting with ``prefix``. Raises: StoreError, BadRequest."""
        check_key(prefix, prefix=True)
        # obstore matches prefixes by whole segments ("a/c" finds "a/c/x" but not "a/cd", nor
        # the object "a/c" itself), so list the last complete segment and filter here.
        head = prefix.rpartition("/")[0]
        try:
            stream = obstore.list(self.store, head or None, chunk_size=1000)
            metas = await stream.collect_async()
        except _FAILURES as e:
            raise _error("list", prefix, e, ambiguous=False) from e
        return sorted(m["path"] for m in metas if m["path"].startswith(prefix))

    async def delete(self, key: str) -> None:
        """Remove the object if it exists. Raises: StoreError, BadRequest."""
        check_key(key)
        try:
            await obstore.delete_async(self.store, key)
        except _NOT_FOUND:
            return  # S3 and memory say OK for a missing key; local and GCS raise
        except _FAILURES as e:
            raise _error("delete", key, e, ambiguous=True) from e

    async def close(self) -> None:
        """Nothing to release: obstore's clients close when the store is dropped."""


# ---------------------------------------------------------------- construction

# AWS SDK names first; the service-specific endpoint wins over the generic one, as in the SDKs.
_S3_ENV = {
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "session_token": ("AWS_SESSION_TOKEN",),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
}

# How long one request may take, and for how long obstore may retry one call (after a 5xx
# or a dropped connection; a conditional PUT is not retried after a timeout or a reset, see
# put_if_absent). obstore's own defaults (30 s per request, retries for 3 minutes) would
# hold a shard's log write, and every command behind it, for minutes; these bound a block
# write, put_if_absent's reading back and resending included, to ~20 s when PUTs hang and
# ~30 s when the whole store does, so a stuck store becomes a 503 that the client retries.
# A log segment is at most LogSettings.max_batch_bytes (16 MiB): well within 10 s of any S3
# endpoint a shard uses.
REQUEST_TIMEOUT_MS = 10_000
CONNECT_TIMEOUT_MS = 3_000
RETRY_TIMEOUT_MS = 15_000
MAX_RETRIES = 6
_LIMITS_ENV = {
    "request_timeout_ms": "EVQ_S3_REQUEST_TIMEOUT_MS",
    "retry_timeout_ms": "EVQ_S3_RETRY_TIMEOUT_MS",
}


def s3_limits(
    environ: Mapping[str, str], options: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """evq's default client options (timeouts) and retry config for S3, from the options
    ``request_timeout_ms`` and ``retry_timeout_ms`` (taken out of ``options``), else
    ``EVQ_S3_REQUEST_TIMEOUT_MS`` and ``EVQ_S3_RETRY_TIMEOUT_MS``, else the defaults above.

    Raises: BadRequest.
    """
    limits = {}
    for name, default in (
        ("request_timeout_ms", REQUEST_TIMEOUT_MS),
        ("retry_timeout_ms", RETRY_TIMEOUT_MS),
    ):
        value = options.pop(name, None) or environ.get(_LIMITS_ENV[name]) or default
        try:
            limits[name] = int(value)
        except (TypeError, ValueError):
            raise BadRequest(f"{name} must be a whole number of ms, not {value!r}") from None
        if limits[name] <= 0:
            raise BadRequest(f"{name} must be positive, not {value!r}")
    request_ms = limits["request_timeout_ms"]
    client = {
        "timeout": timedelta(milliseconds=request_ms),
        "connect_timeout": timedelta(milliseconds=min(CONNECT_TIMEOUT_MS, request_ms)),
    }
    retry = {
        "max_retries": MAX_RETRIES,
        "retry_timeout": timedelta(milliseconds=limits["retry_timeout_ms"]),
        "backoff": {
            "init_backoff": timedelta(milliseconds=100),
            "max_backoff": timedelta(seconds=2),
            "base": 2,
        },
    }
    return client, retry


def s3_config(
    environ: Mapping[str, str], options: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The S3Store config and client options from the environment and explicit options.

    Explicit options win over the environment; options obstore does not know are passed on
    for it to check.
    """
    config: dict[str, Any] = {}
    for name, variables in _S3_ENV.items():
        value = options.get(name) or next((environ[v] for v in variables if environ.get(v)), None)
        if value:
            config[name] = value
    config.update({k: v for k, v in options.items() if k not in _S3_ENV and v is not None})
    client_options = dict(config.pop("client_options", None) or {})
    endpoint = config.get("endpoint")
    if endpoint:
        # obstore reads AWS_ENDPOINT_URL_S3 itself and lets it beat ``endpoint``: set both,
        # or an explicit endpoint= would lose to the environment.
        config["aws_endpoint_url_s3"] = endpoint
        # S3-compatible servers (moto, MinIO, Ceph) want path-style URLs.
        config.setdefault("virtual_hosted_style_request", False)
        if endpoint.startswith("http://"):
            client_options.setdefault("allow_http", True)
    return config, client_options


def open_obstore(url: str, **options: Any) -> ObstoreStore:
    """Open ``memory://``, ``s3://bucket/prefix``, ``gs://bucket/prefix`` or ``az://...``.

    Raises: BadRequest.
    """
    parts = urlsplit(url)
    if parts.password is not None:  # do not echo the URL: it holds a secret
        raise BadRequest(
            "credentials in a store URL are not supported; use options or the environment"
        )
    scheme = parts.scheme.lower()
    prefix = parts.path.strip("/")
    if prefix:
        check_key(prefix)
    try:
        if scheme == "memory":
            if options:
                raise BadRequest(f"options {sorted(options)} do not apply to memory://", url=url)
            return ObstoreStore(MemoryStore(), "memory://")
        if scheme in ("s3", "s3a"):
            if not parts.netloc:
                raise BadRequest("an s3:// URL needs a bucket: s3://bucket/prefix", url=url)
            options = dict(options)
            client_defaults, retry_default = s3_limits(os.environ, options)
            retry_ms = int(retry_default["retry_timeout"] / timedelta(milliseconds=1))
            config, client_options = s3_config(os.environ, options)
            client_options = {**client_defaults, **client_options}
            retry_config = config.pop("retry_config", None) or retry_default
            # Plain dicts from the options and the environment: S3Store checks their keys
            # and values itself (ValueError or TypeError, caught below).
            store = S3Store(
                parts.netloc,
                prefix=prefix or None,
                config=cast("S3Config", config),
                client_options=cast("ClientConfig", client_options),
                retry_config=cast("RetryConfig", retry_config),
            )
            return ObstoreStore(store, url, resend_ms=retry_ms)
        # GCS and Azure: obstore's own URL parsing (its path becomes the prefix) and its
        # environment variables (GOOGLE_*, AZURE_*); options are its config keys.
        return ObstoreStore(from_url(url.rstrip("/"), **options), url)
    except (obx.BaseError, ValueError, TypeError) as e:
        # Construction does no I/O: a failure here is a bad URL or configuration.
        summary = str(e).split("\n", 1)[0]
        raise BadRequest(f"cannot open store {url!r}: {summary}", url=url) from e
