"""evq: a durable queue server for deferred work. This package is what users import.

    from evq import Client, QueueNotFound

    with Client("http://127.0.0.1:8700") as client:
        client.create_queue("mail")
        client.put("mail", "hello", delay=60)
        for message in client.take("mail", max=10):
            ...
            client.ack("mail", message)

    from evq import Job, Send, handler

    @handler("mail")
    def send(job: Job) -> Send | None: ...

What is public is listed in ``__all__`` below: the clients (:class:`Client`, blocking;
:class:`AsyncClient`, asyncio) and the types they take and give, the handler SDK
(:func:`handler`, :func:`run`, :func:`start` and what a handler may return) and the error
family (every error is a :class:`QueueError` with a stable ``code`` and HTTP status, as in
docs/API.md). Everything else — ``actors``, ``gateway``, ``watch``, ``pipeline`` — is the
server's inside and may change between releases. The ``evq`` command is :mod:`evq.cli`.

The base install (``pip install evq``) needs neither Ray nor Spark: :func:`run` and
:func:`start` load Ray when called (the ``server`` extra). The clients and the handler SDK
are imported on first use (PEP 562), so a process that imports one part of ``evq`` (a
handler's worker imports ``evq.handlers``) does not load the other (the HTTP client,
aiohttp); the errors and the clients' types are light and imported at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from actors.errors import (
    BadRequest,
    Conflict,
    DataError,
    ErrorKind,
    Fenced,
    Forbidden,
    InternalError,
    MessageNotFound,
    NotReady,
    Overloaded,
    QueueError,
    QueueExists,
    QueueNotFound,
    StaleLease,
    TaskNotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from evq.client_wire import (
    DEFAULT_URL,
    ItemResult,
    KeyValue,
    Message,
    MessagePage,
    NewMessage,
    PutResult,
    QueueConfig,
    QueueInfo,
    QueueStats,
    Resend,
    RetryPolicy,
    TransportError,
)

if TYPE_CHECKING:
    from evq.client import AsyncClient, Client
    from evq.handlers import (
        Backoff,
        Handler,
        HandlerOptions,
        HandlerStats,
        Job,
        Reschedule,
        Retry,
        Send,
        handler,
        load_handler,
        run,
        start,
    )

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "Backoff",
    "BadRequest",
    "Client",
    "Conflict",
    "DataError",
    "ErrorKind",
    "Fenced",
    "Forbidden",
    "Handler",
    "HandlerOptions",
    "HandlerStats",
    "InternalError",
    "ItemResult",
    "Job",
    "KeyValue",
    "Message",
    "MessageNotFound",
    "MessagePage",
    "NewMessage",
    "NotReady",
    "Overloaded",
    "PutResult",
    "QueueConfig",
    "QueueError",
    "QueueExists",
    "QueueInfo",
    "QueueNotFound",
    "QueueStats",
    "Reschedule",
    "Resend",
    "Retry",
    "RetryPolicy",
    "Send",
    "StaleLease",
    "TaskNotFound",
    "TooLarge",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "handler",
    "load_handler",
    "run",
    "start",
]

# Where each name imported on first use is defined.
_HOME = {
    **dict.fromkeys(("AsyncClient", "Client"), "evq.client"),
    **dict.fromkeys(
        (
            "Backoff",
            "Handler",
            "HandlerOptions",
            "HandlerStats",
            "Job",
            "Reschedule",
            "Retry",
            "Send",
            "handler",
            "load_handler",
            "run",
            "start",
        ),
        "evq.handlers",
    ),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'evq' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found at once next time
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
