"""A real gateway for the SQS tests: ``make_app`` over a ``LocalDirectory`` on 127.0.0.1.

boto3 is synchronous, so the server runs its own event loop in a thread and the tests are
plain functions that talk to it over real HTTP, exactly as an SQS client talks to evq.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import boto3
import pytest
from aiohttp import web
from botocore.config import Config
from botocore.exceptions import ClientError

from actors.clock import Clock
from actors.directory import LocalDirectory
from actors.log.store import LocalDirStore
from gateway.app import AppOptions, make_app
from gateway.sqs.context import CLOCK, KEYS

REGION = "us-east-1"
ACCOUNT = "000000000000"
_names = itertools.count()


class SqsServer:
    """The gateway app served by a thread of its own."""

    def __init__(
        self,
        data: Path,
        *,
        keys: Mapping[str, str] | None = None,
        options: AppOptions | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.data = data
        self.keys = dict(keys or {})
        self.clock = clock
        self.options = options or AppOptions()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="sqs-test-server", daemon=True)
        self.started = threading.Event()
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._boot())
        except BaseException as exc:  # shown by start()
            self.error = exc
            self.started.set()
            return
        self.started.set()
        self.loop.run_forever()

    async def _boot(self) -> None:
        directory = LocalDirectory(LocalDirStore(self.data), count=2)
        app = make_app(directory, self.options)
        if self.keys:  # plain keys (each allowed everything), beside the options' callers
            app[KEYS] = {**app[KEYS], **self.keys}
        if self.clock is not None:
            app[CLOCK] = self.clock
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def start(self) -> SqsServer:
        self.thread.start()
        self.started.wait(30)
        if self.error is not None:
            raise self.error
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=5) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the test server did not get ready")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.runner is not None:
            future = asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop)
            future.result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()

    def client(self, **options: Any) -> Any:
        """A boto3 SQS client of this server (no retries: errors show as they are)."""
        config = Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=30)
        kwargs: dict[str, Any] = {
            "endpoint_url": self.url,
            "region_name": REGION,
            "aws_access_key_id": "anything",
            "aws_secret_access_key": "anything",
            "config": config,
        }
        kwargs.update(options)
        return boto3.session.Session().client("sqs", **kwargs)

    def queue_url(self, name: str) -> str:
        return f"{self.url}/{ACCOUNT}/{name}"


def unique(label: str = "q", *, fifo: bool = False) -> str:
    """A queue name no other test uses."""
    name = f"{label}-{next(_names)}"
    return name + ".fifo" if fifo else name


@contextlib.contextmanager
def running(data: Path, **options: Any) -> Iterator[SqsServer]:
    """A started server that stops at the end of the block (the modules' fixtures use it)."""
    server = SqsServer(data, **options).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def client_of(server: SqsServer, **options: Any) -> Iterator[Any]:
    """A boto3 SQS client, closed at the end of the block."""
    client = server.client(**options)
    try:
        yield client
    finally:
        client.close()


def expected_md5(message_attributes: Mapping[str, Any]) -> str:
    """The MD5 of message attributes (as boto3 shows them) by moto's SQS model, an
    implementation of AWS's algorithm independent of ours."""
    from moto.sqs.models import Message

    message = Message("id", "body")
    message.message_attributes = dict(message_attributes)
    return message.attribute_md5  # type: ignore[no-any-return]


def native(server: SqsServer, method: str, path: str, doc: Any = None) -> Any:
    """A call to the native API of the same gateway (JSON in, JSON out)."""
    import json

    data = None if doc is None else json.dumps(doc).encode()
    request = urllib.request.Request(
        server.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def error_code(exc: Any) -> tuple[str, str]:
    """(exception class name, Error.Code) of a botocore ClientError."""
    return type(exc).__name__, exc.response["Error"]["Code"]


# (Code, QueryErrorCode) of AWS's InvalidParameterValue in the JSON protocol
INVALID = ("InvalidParameterValue", "InvalidParameterValueException")


def error(call: Any, **kwargs: Any) -> tuple[str, str, str]:
    """(Code, QueryErrorCode, Message) of a call that fails with status 400."""
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    response = info.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 400, response
    e = response["Error"]
    return e["Code"], e.get("QueryErrorCode", ""), e["Message"]
