"""Python clients of the native API v1: :class:`AsyncClient` (aiohttp) and :class:`Client`.

Both speak every endpoint of gateway/WIRE.md over one keep-alive connection pool (async)
or one keep-alive connection (sync, http.client; not thread-safe: one per thread).
Requests are built and replies parsed by the pure ``evq.client_wire``.

Errors: a non-2xx reply raises the ``actors.errors`` class named by its error code, with
``fields["status"]``; no reply at all raises :class:`TransportError` (an ``Unavailable``)
with ``fields["sent"]``.

Servers: ``base_url`` is one URL (a gateway, or a Service in front of several), or several
(a list, or one string with commas: ``EVQ_SERVER`` and ``--server`` take that form). After a
failure to reach one (no connection, or no reply), the client moves to the next, and the
retry below goes there at once: every gateway of a cluster serves every queue.

Retries: up to ``retries`` more attempts, with exponential backoff and jitter, on 429 and
503 (honouring Retry-After) and on connection failures. When a failure leaves the outcome
unknown (the connection broke after the request went out), only calls that are safe to
repeat are resent: every put carries a per-message idempotency key (the caller's, or a
random one made once and kept across retries), so a resent put never duplicates. ``take``
and ``purge`` are resent only when the request surely never reached the server (a lost
take reply leaves its messages reserved until their visibility timeout ends). Any call may
raise TransportError, Overloaded or NotReady once its retries are spent.

``put`` takes a body (bytes or str), a :class:`NewMessage`, or an iterable of them; keyword
options apply to bare bodies. ``auto_key=False`` sends no generated key: on a FIFO queue
with content-based dedup a key would replace the content hash.

``watch_loop`` yields each new state of a key by one-shot long-polls, each resubscribed
with the version last seen: changes between two polls fold into the newest state.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import inspect
import os
import random
import select
import ssl
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import MethodType, TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload
from urllib.parse import urlsplit

from actors.errors import QueueError
from evq import client_wire as wire
from evq.client_wire import (
    DEFAULT_URL,
    Body,
    ItemResult,
    KeyValue,
    Message,
    MessagePage,
    NewMessage,
    PutResult,
    QueueConfig,
    QueueInfo,
    QueueStats,
    Receipt,
    Resend,
    RetryPolicy,
    TransportError,
)

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "Client",
    "ItemResult",
    "KeyValue",
    "Message",
    "MessagePage",
    "NewMessage",
    "PutResult",
    "QueueConfig",
    "QueueInfo",
    "QueueStats",
    "Resend",
    "RetryPolicy",
    "TransportError",
    "tls_context",
]

T = TypeVar("T")
P = ParamSpec("P")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class _Answer(Generic[T]):
    """What a call answers without a request (an ack of no messages)."""

    value: T


_Call = wire.Call[T] | _Answer[T]


class _Endpoint(Generic[P, T]):
    """One call of the API, defined once for both clients.

    ``build`` turns a call's arguments into its request (a pure :class:`client_wire.Call`);
    each client class gets a function that sends it with the client's retries and servers
    (``_Base.__init_subclass__``): a coroutine function on :class:`AsyncClient`, a blocking
    one on :class:`Client`. Both carry ``build``'s name, docstring and signature. The
    descriptor's overloads are what a type checker sees.
    """

    def __init__(self, build: Callable[Concatenate[Any, P], _Call[T]]) -> None:
        def blocking(client: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
            call = build(client, *args, **kwargs)
            return call.value if isinstance(call, _Answer) else client._run(call)

        async def awaiting(client: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
            call = build(client, *args, **kwargs)
            return call.value if isinstance(call, _Answer) else await client._run(call)

        signature = inspect.signature(build)
        answer = str(signature.return_annotation).removeprefix("_Call[").removesuffix("]")
        signature = signature.replace(return_annotation=answer)
        self._blocking = _dressed(blocking, build, signature)
        self._awaiting = _dressed(awaiting, build, signature)
        self.__doc__, self.__name__ = build.__doc__, build.__name__

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Callable[..., Any]: ...
    @overload
    def __get__(
        self, client: AsyncClient, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, client: Client, owner: type[Any]) -> Callable[P, T]: ...
    def __get__(self, client: Any, owner: type[Any]) -> Any:
        # Only reached on _Base itself: each client class holds the functions (see above).
        function = self._awaiting if issubclass(owner, AsyncClient) else self._blocking
        return function if client is None else MethodType(function, client)


def _dressed(method: F, build: Callable[..., Any], signature: inspect.Signature) -> F:
    """``method`` with ``build``'s name, docstring and signature (for help() and IDEs)."""
    functools.update_wrapper(method, build)
    method.__signature__ = signature  # type: ignore[attr-defined]
    return method


def tls_context(ca_bundle: str | None = None) -> ssl.SSLContext:
    """A client TLS context that verifies the server's certificate and name against
    ``ca_bundle`` (a PEM file, or a directory of hashed PEM files), else the system's CAs.

    Raises:
        OSError: the bundle does not read. ssl.SSLError: it holds no certificate.
    """
    if ca_bundle and os.path.isdir(ca_bundle):
        return ssl.create_default_context(capath=ca_bundle)
    return ssl.create_default_context(cafile=ca_bundle or None)


class _Base:
    """What both clients share: their settings, retries and servers, and every call of the
    API, each defined once (:class:`_Endpoint`); a client adds only its transport."""

    _awaits = False  # a client's calls are coroutine functions

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give the client each call as a plain function of its own kind: a method like
        any other for ``inspect``, ``unittest.mock.create_autospec`` and subclasses."""
        super().__init_subclass__(**kwargs)
        for name, value in vars(_Base).items():
            if isinstance(value, _Endpoint):
                setattr(cls, name, value._awaiting if cls._awaits else value._blocking)

    # The client's transports, hot commands apart (client_wire.Call.hot): [other, hot].
    _links: list[Any]

    def __init__(
        self,
        base_url: str | Sequence[str] = DEFAULT_URL,
        *,
        timeout: float = 30.0,
        retries: int | RetryPolicy = 3,
        token: str | None = None,
        binary: bool = False,
        rng: random.Random | None = None,
        ca_bundle: str | None = None,
    ) -> None:
        self._links = [None, None]  # opened on first use
        # https: verify the server against this CA bundle (a PEM file or a directory of
        # them), else $EVQ_CA_BUNDLE, else the system's CAs.
        self.ca_bundle = ca_bundle or os.environ.get("EVQ_CA_BUNDLE") or None
        self._tls: ssl.SSLContext | None = None
        self.servers = _servers(base_url)
        self._use(0)
        self.timeout = timeout
        self.policy = retries if isinstance(retries, RetryPolicy) else RetryPolicy(retries=retries)
        self.binary = binary
        self._token = token
        self._rng = rng if rng is not None else random.Random()

    def _use(self, index: int) -> None:
        """Send from now on to server ``index`` of :attr:`servers`."""
        self._server = index
        self.base_url = self.servers[index]
        self._parts = urlsplit(self.base_url)
        self._prefix = self._parts.path.rstrip("/")

    def _fail_over(self) -> bool:
        """After a transport failure: move to the next server, if there is another."""
        if len(self.servers) < 2:
            return False
        self._use((self._server + 1) % len(self.servers))
        return True

    def _pause_after(self, attempt: int, error: QueueError, resend: Resend) -> float | None:
        """After failed attempt ``attempt``: move to the next server if the failure was the
        transport's; return the pause before the next attempt, or None to raise ``error``."""
        moved = isinstance(error, TransportError) and self._fail_over()
        if moved:
            self._left_server()
        pause = self.policy.next_pause(attempt, error, resend, self._rng)
        if pause is not None and moved and attempt == 0:
            pause = 0.0  # another gateway: no reason to wait before the first try
        return pause

    def _left_server(self) -> None:
        """The client moved to another server (connections to the old one may go)."""

    def _tls_context(self) -> ssl.SSLContext:
        """The context https connections verify the server with (made once)."""
        if self._tls is None:
            self._tls = tls_context(self.ca_bundle)
        return self._tls

    def _prepare(self, call: wire.Call[Any]) -> wire.Prepared:
        return wire.prepare(call, binary=self.binary, token=self._token)

    # ---------------------------------------------------------------- queues

    @_Endpoint
    def create_queue(
        self,
        name: str,
        *,
        id_mode: str | None = None,
        visibility_timeout: float | None = None,
        max_receives: int | None = None,
        dead_letter_queue: str | None = None,
        retention: float | None = None,
        max_message_bytes: int | None = None,
        fifo: bool | None = None,
        delay: float | None = None,
        idempotency_window: float | None = None,
        content_based_dedup: bool | None = None,
        take_rate: int | None = None,
        put_rate: int | None = None,
        max_in_flight: int | None = None,
        fair: bool | None = None,
    ) -> _Call[QueueInfo]:
        """Create a queue (``created`` False when it exists with these settings); safe to retry.
        ``take_rate``/``put_rate``: messages a second over the whole cluster; ``max_in_flight``:
        messages reserved at once; ``fair`` (standard queues): messages handed out fairly
        across their groups (all four settable later with :meth:`update_queue`).

        Raises:
            QueueExists: it exists with other settings.
            BadRequest: a setting is invalid.
        """
        settings = _settings(
            id_mode,
            visibility_timeout,
            max_receives,
            dead_letter_queue,
            retention,
            max_message_bytes,
            fifo,
            delay,
            idempotency_window,
            content_based_dedup,
            take_rate,
            put_rate,
            max_in_flight,
            fair,
        )
        return wire.create_queue(name, settings)

    @_Endpoint
    def list_queues(self) -> _Call[list[str]]:
        """Names of all queues, sorted; safe to retry."""
        return wire.list_queues()

    @_Endpoint
    def get_queue(self, name: str) -> _Call[QueueInfo]:
        """Settings and stats of a queue; safe to retry.

        Raises:
            QueueNotFound: no such queue.
        """
        return wire.get_queue(name)

    @_Endpoint
    def queue_history(self, name: str) -> _Call[list[dict[str, Any]]]:
        """The queue's counts a minute at a time over the last hour, oldest first, and the
        counts now last: each ``{"at", "ready", "delayed", "reserved", "enqueued",
        "acked"}`` (``enqueued`` and ``acked`` are totals: their differences are rates).

        Raises:
            QueueNotFound: no such queue.
        """
        return wire.queue_history(name)

    @_Endpoint
    def update_queue(self, name: str, **changes: Any) -> _Call[QueueInfo]:
        """Change settings (not id_mode or fifo); safe to retry.

        Raises:
            QueueNotFound: no such queue.
            BadRequest: a setting is invalid.
        """
        return wire.update_queue(name, changes)

    @_Endpoint
    def delete_queue(self, name: str) -> _Call[None]:
        """Delete a queue and its messages; resent after a lost reply, which may then raise.

        Raises:
            QueueNotFound: no such queue (also when a lost first attempt had deleted it).
        """
        return wire.delete_queue(name)

    @_Endpoint
    def pause(self, name: str) -> _Call[bool]:
        """Pause the queue: its takes (native, SQS, handlers) hand out nothing until
        :meth:`resume`; puts, acks and the rest go on. Durable; True.

        Raises:
            QueueNotFound: no such queue.
            Forbidden: the token is not the queue's admin.
        """
        return wire.pause(name, True)

    @_Endpoint
    def resume(self, name: str) -> _Call[bool]:
        """Resume a paused queue's takes (waiting long-poll takes get messages at once);
        False (not paused).

        Raises:
            QueueNotFound: no such queue.
            Forbidden: the token is not the queue's admin.
        """
        return wire.pause(name, False)

    @_Endpoint
    def purge(self, name: str) -> _Call[int]:
        """Delete every message; number deleted. Resent only if surely not received.

        Raises:
            QueueNotFound: no such queue.
        """
        return wire.purge(name)

    # ---------------------------------------------------------------- messages

    @_Endpoint
    def put(
        self,
        queue: str,
        messages: Body | NewMessage | Iterable[Body | NewMessage],
        *,
        delay: float | None = None,
        activate_at: float | None = None,
        group: str | None = None,
        attributes: dict[str, str] | None = None,
        id: str | None = None,
        idempotency_key: str | None = None,
        auto_key: bool = True,
    ) -> _Call[list[PutResult]]:
        """Put one body / NewMessage or many (options apply to bare bodies); always resent.

        Raises:
            QueueNotFound: no such queue.
            BadRequest: an invalid message; TooLarge: a body over the queue's limit.
            Conflict: a client id reused with another body.
        """
        defaults = dict(
            delay=delay,
            activate_at=activate_at,
            group=group,
            attributes=attributes,
            id=id,
            idempotency_key=idempotency_key,
        )
        items = wire.as_messages(messages, defaults)
        return wire.put(queue, items, binary=self.binary, auto_key=auto_key)

    @_Endpoint
    def take(
        self,
        queue: str,
        max: int = 1,
        *,
        wait: float | None = None,
        visibility_timeout: float | None = None,
    ) -> _Call[list[Message]]:
        """Reserve up to ``max`` ready messages, waiting up to ``wait`` s; resent only if unsent.

        Raises:
            QueueNotFound: no such queue.
        """
        return wire.take(queue, max, wait, visibility_timeout)

    @_Endpoint
    def ack(self, queue: str, *items: Receipt) -> _Call[list[ItemResult]]:
        """Delete taken messages; a resent ack may answer ``not_found`` for one done before.

        Raises:
            QueueNotFound: no such queue.
        """
        return wire.ack(queue, items) if items else _Answer([])

    @_Endpoint
    def release(
        self,
        queue: str,
        *items: Receipt,
        delay: float | None = None,
        activate_at: float | None = None,
        reason: str | None = None,
    ) -> _Call[list[ItemResult]]:
        """Give taken messages back, optionally later, optionally saying why they failed
        (``reason``, up to 1 KiB: peek and browse show each message's last five, and a dead
        letter keeps them); a resent one may answer ``stale_lease``.

        Raises:
            QueueNotFound: no such queue.
        """
        return wire.release(queue, items, delay, activate_at, reason) if items else _Answer([])

    @_Endpoint
    def touch(
        self, queue: str, *items: Receipt, visibility_timeout: float | None = None
    ) -> _Call[list[ItemResult]]:
        """Extend leases (results carry ``lease_expires_at``); safe to retry.

        Raises:
            QueueNotFound: no such queue.
        """
        return wire.touch(queue, items, visibility_timeout) if items else _Answer([])

    @_Endpoint
    def get_message(self, queue: str, message_id: str) -> _Call[Message]:
        """A message's current view (``state``, no lease); safe to retry.

        Raises:
            QueueNotFound, MessageNotFound: no such queue or message.
        """
        return wire.get_message(queue, message_id)

    @_Endpoint
    def browse(
        self, queue: str, state: str = "ready", *, limit: int = 100, after: str | None = None
    ) -> _Call[MessagePage]:
        """A page of the messages in ``state`` (``ready``, ``delayed``, ``reserved``) in its
        order, after ``after`` (a page's ``next``); changes nothing; safe to retry.

        Raises:
            QueueNotFound: no such queue. BadRequest: a bad state, limit or cursor.
        """
        return wire.browse(queue, state, limit, after)

    @_Endpoint
    def update_message(
        self,
        queue: str,
        message: Message | str,
        *,
        body: Body | None = None,
        delay: float | None = None,
        activate_at: float | None = None,
        lease: str | None = None,
    ) -> _Call[Message]:
        """Change body and/or activation time (a Message brings its lease); answers the view.

        Raises:
            MessageNotFound: no such message. Conflict: reserved and no lease given.
            StaleLease: the lease is not the current one (also on a resend after a lost
                reply, when the first attempt had already ended the lease).
        """
        return _update(self, queue, message, body, delay, activate_at, lease)

    @_Endpoint
    def run_now(
        self, queue: str, message: Message | str, *, lease: str | None = None
    ) -> _Call[Message]:
        """Make a delayed (or ready) message ready now, first in line among those due
        (its activation time becomes now); a reserved one needs its lease.

        Raises:
            MessageNotFound: no such message. Conflict: reserved and no lease given.
        """
        return _update(self, queue, message, None, 0.0, None, lease)

    @_Endpoint
    def reschedule(
        self,
        queue: str,
        message: Message | str,
        *,
        delay: float | None = None,
        activate_at: float | None = None,
        lease: str | None = None,
    ) -> _Call[Message]:
        """Run again later instead of acking: ends the lease, resets the receive count.

        Raises:
            MessageNotFound: no such message. StaleLease: the lease is not the current one.
            Conflict: reserved and no lease given.
        """
        if (delay is None) == (activate_at is None):
            raise ValueError("reschedule needs exactly one of delay and activate_at")
        return _update(self, queue, message, None, delay, activate_at, lease)

    @_Endpoint
    def delete_message(
        self, queue: str, message: Message | str, lease: str | None = None, *, force: bool = False
    ) -> _Call[None]:
        """Delete one message (a reserved one needs its lease, or ``force``: an admin's,
        and its lease holder's next ack is answered ``stale_lease``); a resent one may raise.

        Raises:
            MessageNotFound: no such message (also when a lost first attempt deleted it).
            StaleLease, Conflict: reserved and the lease is stale or missing.
            Forbidden: ``force`` without admin on the queue.
        """
        mid, lease = _message_ref(message, lease)
        return wire.delete_message(queue, mid, None if force else lease, force)

    # ---------------------------------------------------------------- keys, watches

    @_Endpoint
    def set_key(self, key: str, value: Any) -> _Call[int]:
        """Set a key to a JSON value; answers its new version. Safe to retry."""
        return wire.set_key(key, value)

    @_Endpoint
    def get_key(self, key: str) -> _Call[KeyValue]:
        """A key's value and version (version 0: never set)."""
        return wire.get_key(key)

    @_Endpoint
    def watch(self, key: str, version: int = 0, *, wait: float = 30.0) -> _Call[KeyValue | None]:
        """The key's state once its version is past ``version``; None after ``wait`` s (204)."""
        return wire.watch(key, version, wait)

    # ---------------------------------------------------------------- administration

    @_Endpoint
    def shards(self) -> _Call[dict[str, Any]]:
        """The shard count, the placement map's generation, each shard's state and queues,
        and the resize under way (``task``, ``moves``)."""
        return wire.shards()

    @_Endpoint
    def resize_shards(self, count: int) -> _Call[str]:
        """Start resizing the running server to ``count`` shards, queue by queue: the id of
        its task (follow it with :meth:`task`).

        Raises:
            Conflict: a resize runs already.
            BadRequest: ``count`` is out of range.
        """
        return wire.resize_shards(count)

    @_Endpoint
    def restart_shards(self) -> _Call[str]:
        """Start a rolling restart: each shard in turn hands its queues to a spare, starts
        afresh (the code installed now) and takes them back; the id of its task.

        Raises:
            Conflict: a resize or a restart runs already.
        """
        return wire.restart_shards()

    @_Endpoint
    def redrive(
        self,
        queue: str,
        *,
        to: str | None = None,
        rate: int | None = None,
        ids: Sequence[str] | None = None,
    ) -> _Call[str]:
        """Move a dead-letter queue's messages back to the queues they came from (or all to
        ``to``), at most ``rate`` a second; only ``ids``, if given: the id of its task
        (follow it with :meth:`task`, stop it with :meth:`cancel_task`).

        Raises:
            QueueNotFound: no such queue (or no ``to``).
            Conflict: a redrive of the queue runs already.
            BadRequest: ``rate`` or ``ids`` out of range.
        """
        return wire.redrive(queue, to, rate, ids)

    @_Endpoint
    def tasks(self) -> _Call[list[dict[str, Any]]]:
        """The tasks the gateways ran last (resizes, restarts, redrives), oldest first."""
        return wire.tasks()

    @_Endpoint
    def task(self, task_id: str) -> _Call[dict[str, Any]]:
        """One task: ``state`` (running, done, cancelled, failed), ``done`` of ``total``.

        Raises:
            TaskNotFound: no such task on this gateway.
        """
        return wire.task(task_id)

    @_Endpoint
    def cancel_task(self, task_id: str) -> _Call[dict[str, Any]]:
        """Ask a running task to stop after its current step.

        Raises:
            TaskNotFound: no such task. Conflict: it is not running.
        """
        return wire.cancel_task(task_id)

    # ---------------------------------------------------------------- service

    @_Endpoint
    def health(self) -> _Call[bool]:
        """True when the process answers /healthz."""
        return wire.health()

    @_Endpoint
    def ready(self) -> _Call[bool]:
        """True when /readyz says ready (logs replayed), False while recovering."""
        return wire.ready()


def _servers(base_url: str | Sequence[str]) -> list[str]:
    """The server URLs: one, several (a list, or one string with commas), or a Service's."""
    urls = base_url.split(",") if isinstance(base_url, str) else list(base_url)
    urls = [u.strip().rstrip("/") for u in urls if u.strip()]
    if not urls:
        raise ValueError("base_url names no server")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port][/prefix], not {url!r}")
    return urls


def _settings(
    id_mode: str | None,
    visibility_timeout: float | None,
    max_receives: int | None,
    dead_letter_queue: str | None,
    retention: float | None,
    max_message_bytes: int | None,
    fifo: bool | None,
    delay: float | None,
    idempotency_window: float | None,
    content_based_dedup: bool | None,
    take_rate: int | None,
    put_rate: int | None,
    max_in_flight: int | None,
    fair: bool | None,
) -> dict[str, Any]:
    return {k: v for k, v in locals().items() if v is not None}


def _message_ref(message: Message | str, lease: str | None) -> tuple[str, str | None]:
    if isinstance(message, Message):
        return message.id, lease if lease is not None else message.lease
    return message, lease


def _update(
    client: _Base,
    queue: str,
    message: Message | str,
    body: Body | None,
    delay: float | None,
    activate_at: float | None,
    lease: str | None,
) -> wire.Call[Message]:
    mid, lease = _message_ref(message, lease)
    return wire.update_message(
        queue,
        mid,
        body=body,
        delay=delay,
        activate_at=activate_at,
        lease=lease,
        binary=client.binary,
    )


# ====================================================================== async


class AsyncClient(_Base):
    """Asyncio client on one aiohttp session; use ``async with`` or call :meth:`close`."""

    _awaits = True
    _links: list[aiohttp.ClientSession | None]  # hot commands on a session of their own

    async def __aenter__(self) -> Self:
        self._open()
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the sessions and their connections."""
        for i, session in enumerate(self._links):
            if session is not None:
                await session.close()
            self._links[i] = None

    def _open(self, hot: bool = False) -> aiohttp.ClientSession:
        session = self._links[hot]
        if session is None or session.closed:
            import aiohttp  # loaded on first use: the CLI and the blocking Client never need it

            tls = any(u.startswith("https:") for u in self.servers)
            connector = aiohttp.TCPConnector(ssl=self._tls_context()) if tls else None
            session = self._links[hot] = aiohttp.ClientSession(connector=connector)
        return session

    async def _exchange(
        self, req: wire.Prepared, hold: float
    ) -> tuple[int, bytes, str | None, str | None]:
        import aiohttp  # in sys.modules by now (_open): a dictionary lookup

        timeout = aiohttp.ClientTimeout(total=self.timeout + hold, sock_connect=self.timeout)
        url = self.base_url + req.target
        try:
            async with self._open(req.hot).request(
                req.method, url, data=req.body, headers=req.headers, timeout=timeout
            ) as resp:
                data = await resp.read()
                return (
                    resp.status,
                    data,
                    resp.headers.get("Content-Type"),
                    resp.headers.get("Retry-After"),
                )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
            raise TransportError(f"cannot connect to {self.base_url}: {e}", sent=False) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            reason = str(e) or type(e).__name__
            raise TransportError(f"{req.method} {req.target}: {reason}", sent=True) from e

    async def _run(self, call: wire.Call[T]) -> T:
        req = self._prepare(call)
        attempt = 0
        while True:
            try:
                status, data, ctype, retry_after = await self._exchange(req, call.hold)
                return wire.handle_reply(call, status, data, ctype, retry_after)
            except QueueError as error:
                pause = self._pause_after(attempt, error, call.resend)
                if pause is None:
                    raise
            attempt += 1
            await asyncio.sleep(pause)

    # ---------------------------------------------------------------- iterating

    async def browse_all(
        self, queue: str, state: str = "ready", *, limit: int = 100
    ) -> AsyncIterator[Message]:
        """Every message in ``state``, page after page: one that stays in the state with
        the same time (activation, lease expiry) while this runs is yielded exactly once.

        Raises:
            QueueNotFound: no such queue. BadRequest: a bad state or limit.
        """
        after = None
        while True:
            page = await self.browse(queue, state, limit=limit, after=after)
            for message in page.messages:
                yield message
            if page.next is None:
                return
            after = page.next

    async def watch_loop(
        self, key: str, *, version: int = 0, wait: float = 30.0
    ) -> AsyncIterator[KeyValue]:
        """Each new state of a key (first the current one, if set), by resubscribing watches."""
        while True:
            state = await self.watch(key, version, wait=wait)
            if state is None:
                continue
            yield state
            version = state.version


# ====================================================================== sync


class Client(_Base):
    """Blocking client on one keep-alive http.client connection; one per thread."""

    _links: list[http.client.HTTPConnection | None]  # hot commands on a connection of their own

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        for hot in (False, True):
            self._drop(hot)

    def _left_server(self) -> None:
        self.close()  # its connections lead to the server that failed

    def _drop(self, hot: bool) -> None:
        conn = self._links[hot]
        if conn is not None:
            conn.close()
            self._links[hot] = None

    def _connection(self, hot: bool) -> http.client.HTTPConnection:
        """The open connection, or a new one (the old one dropped if the server closed it)."""
        conn = self._links[hot]
        if conn is not None and conn.sock is not None:
            # Readable while idle means EOF (or junk): the server closed it; do not send on it.
            readable, _, _ = select.select([conn.sock], [], [], 0)
            if not readable:
                return conn
        self._drop(hot)
        host, port = self._parts.hostname or "", self._parts.port
        if self._parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                host, port, timeout=self.timeout, context=self._tls_context()
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        try:
            conn.connect()
        except OSError as e:
            conn.close()
            raise TransportError(f"cannot connect to {self.base_url}: {e}", sent=False) from e
        self._links[hot] = conn
        return conn

    def _exchange(
        self, req: wire.Prepared, hold: float
    ) -> tuple[int, bytes, str | None, str | None]:
        conn = self._connection(req.hot)
        try:
            assert conn.sock is not None
            conn.sock.settimeout(self.timeout + hold)
            conn.request(req.method, self._prefix + req.target, body=req.body, headers=req.headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self._drop(req.hot)
            reason = str(e) or type(e).__name__
            raise TransportError(f"{req.method} {req.target}: {reason}", sent=True) from e
        if resp.will_close:
            self._drop(req.hot)
        return resp.status, data, resp.getheader("Content-Type"), resp.getheader("Retry-After")

    def _run(self, call: wire.Call[T]) -> T:
        req = self._prepare(call)
        attempt = 0
        while True:
            try:
                status, data, ctype, retry_after = self._exchange(req, call.hold)
                return wire.handle_reply(call, status, data, ctype, retry_after)
            except QueueError as error:
                pause = self._pause_after(attempt, error, call.resend)
                if pause is None:
                    raise
            attempt += 1
            time.sleep(pause)

    # ---------------------------------------------------------------- iterating

    def browse_all(
        self, queue: str, state: str = "ready", *, limit: int = 100
    ) -> Iterator[Message]:
        """Every message in ``state``, page after page: one that stays in the state with
        the same time (activation, lease expiry) while this runs is yielded exactly once.

        Raises:
            QueueNotFound: no such queue. BadRequest: a bad state or limit.
        """
        after = None
        while True:
            page = self.browse(queue, state, limit=limit, after=after)
            yield from page.messages
            if page.next is None:
                return
            after = page.next

    def watch_loop(self, key: str, *, version: int = 0, wait: float = 30.0) -> Iterator[KeyValue]:
        """Each new state of a key (first the current one, if set), by resubscribing watches."""
        while True:
            state = self.watch(key, version, wait=wait)
            if state is None:
                continue
            yield state
            version = state.version
