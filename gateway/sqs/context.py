"""What an SQS action works with: its parameters, its queue, and the gateway's own paths to
the shards (the native API's batchers and directory; nothing of them is duplicated here)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from actors.clock import Clock
from actors.core import commands as cmd
from actors.core.replies import Description
from actors.settings import QueueSettings
from gateway import hot, native
from gateway.auth import Token
from gateway.sqs.access import denied, permits
from gateway.sqs.addresses import arn, name_of_url
from gateway.sqs.wire import Call, Params

__all__ = [
    "ACCOUNT",
    "CLOCK",
    "KEYS",
    "OPEN",
    "RECEIPT_KEY",
    "SETTINGS_CACHE",
    "Context",
    "SettingsCache",
]

DEFAULT_REGION = "us-east-1"
SETTINGS_TTL_S = 1.0  # how long a gateway trusts a queue's settings it has read


class SettingsCache:
    """Queue settings this gateway read recently: sends and receives need a few of them
    (FIFO deduplication, size limit, default wait) without a second call to the shard."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self.entries: dict[str, tuple[float, QueueSettings]] = {}

    def get(self, name: str, now: float) -> QueueSettings | None:
        entry = self.entries.get(name)
        if entry is None or entry[0] < now:
            return None
        return entry[1]

    def put(self, name: str, settings: QueueSettings, now: float) -> None:
        if len(self.entries) >= self.limit:
            self.entries.clear()
        self.entries[name] = (now + SETTINGS_TTL_S, settings)

    def forget(self, name: str) -> None:
        self.entries.pop(name, None)


KEYS = web.AppKey("sqs_keys", dict)  # access key → secret key; empty: any credentials pass
# Whether requests may come without keys configured (loopback only, like the native API).
OPEN = web.AppKey("sqs_open", bool)
CLOCK = web.AppKey("sqs_clock", Clock)
RECEIPT_KEY = web.AppKey("sqs_receipt_key", bytes)  # signs receipt handles (receipts.py)
SETTINGS_CACHE = web.AppKey("sqs_settings", SettingsCache)
ACCOUNT = web.AppKey("sqs_account", str)  # the account of every queue URL and ARN
CALLERS = web.AppKey("sqs_callers", dict)  # access key → Token (gateway/auth.py)


class Context:
    """One SQS request being served."""

    def __init__(
        self,
        request: web.Request,
        call: Call,
        region: str,
        path_queue: str | None,
        caller: Token | None = None,
    ) -> None:
        self.caller = caller  # who signed the request (None: no keys are configured)
        self.request = request
        self.app = request.app
        self.action = call.action
        self.params = Params(call.params, query=call.protocol == "query")
        self.region = region
        self.path_queue = path_queue

    # ---------------------------------------------------------------- names

    @property
    def base_url(self) -> str:
        """Where the client reached us: queue URLs start with it."""
        return f"{self.request.scheme}://{self.request.host}"

    @property
    def account(self) -> str:
        """The server's SQS account id."""
        return self.app[ACCOUNT]

    def url(self, name: str) -> str:
        """The URL of queue ``name``."""
        return f"{self.base_url}/{self.account}/{name}"

    def arn(self, name: str) -> str:
        """The ARN of queue ``name`` (in the region of the request)."""
        return arn(self.region, name, self.account)

    def queue(self) -> str:
        """The queue the request is about: ``QueueUrl`` (or a bare queue name there), or
        the URL it was posted to. Whether it exists is for the call on it to find out.

        Raises:
            SqsError: MissingParameter, QueueDoesNotExist.
        """
        url = self.params.string("QueueUrl", required=self.path_queue is None)
        if url is None:
            assert self.path_queue is not None
            return self.path_queue
        return name_of_url(url, self.account)

    @property
    def receipt_key(self) -> bytes:
        """The key that signs this cluster's receipt handles."""
        return self.app[RECEIPT_KEY]

    def may(self, level: str, queue: str) -> bool:
        """Whether the caller holds ``level`` (read, write, admin) on ``queue``."""
        return permits(self.caller, level, queue)

    def require(self, level: str, queue: str) -> None:
        """Raises: SqsError AccessDenied, unless the caller holds ``level`` on ``queue``."""
        if self.caller is not None and not permits(self.caller, level, queue):
            raise denied(self.caller, self.action, self.arn(queue))

    def now_ms(self) -> int:
        """The gateway's clock."""
        return self.app[CLOCK].now_ms()

    # ---------------------------------------------------------------- shards

    async def run(self, queue: str, command: object) -> Any:
        """One command on one queue, through the queue's batcher. Raises: QueueError."""
        return await native.run(self.request, queue, command)

    async def describe(self, queue: str) -> Description:
        """The queue's name, settings and stats. Raises: QueueError."""
        desc: Description = await self.run(queue, cmd.Describe())
        self._cache(queue, desc.settings)
        return desc

    async def settings(self, queue: str) -> QueueSettings:
        """The queue's settings, as read at most a second ago. Raises: QueueError."""
        now = self._loop_time()
        cached = self.app[SETTINGS_CACHE].get(queue, now)
        if cached is not None:
            return cached
        return (await self.describe(queue)).settings

    def forget(self, queue: str) -> None:
        """Settings of ``queue`` changed here: read them afresh next time."""
        self.app[SETTINGS_CACHE].forget(queue)

    def _cache(self, queue: str, settings: QueueSettings) -> None:
        self.app[SETTINGS_CACHE].put(queue, settings, self._loop_time())

    @staticmethod
    def _loop_time() -> float:
        return asyncio.get_running_loop().time()

    async def take(self, queue: str, take: cmd.Take, wait_s: float) -> list[Any]:
        """Reserve messages, waiting up to ``wait_s`` for the first. Raises: QueueError."""
        if wait_s <= 0:
            return await self.run(queue, take)
        # The native API's long poll: one waiting call that the shard answers as soon as
        # a message is ready, bounded per gateway, cancelled with the client's connection.
        return await hot.waiting_take(self.request.app, queue, take, wait_s)
