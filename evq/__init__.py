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

What is public (``__all__``; see the note above ``_CLIENTS``): the clients (:class:`Client`,
blocking; :class:`AsyncClient`, asyncio) and the types they take and give, the handler SDK
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

import importlib as _importlib
from types import ModuleType as _ModuleType
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from actors.errors import *  # noqa: F403 (the error family: actors.errors.__all__)
from evq.client_wire import DEFAULT_URL as DEFAULT_URL
from evq.client_wire import ItemResult as ItemResult
from evq.client_wire import KeyValue as KeyValue
from evq.client_wire import Message as Message
from evq.client_wire import MessagePage as MessagePage
from evq.client_wire import NewMessage as NewMessage
from evq.client_wire import PutResult as PutResult
from evq.client_wire import QueueConfig as QueueConfig
from evq.client_wire import QueueInfo as QueueInfo
from evq.client_wire import QueueStats as QueueStats
from evq.client_wire import Resend as Resend
from evq.client_wire import RetryPolicy as RetryPolicy
from evq.client_wire import TransportError as TransportError

if _TYPE_CHECKING:
    from evq.client import AsyncClient as AsyncClient
    from evq.client import Client as Client
    from evq.handlers import *  # noqa: F403 (the handler SDK: evq.handlers.__all__)

# What is public: every name of this module that does not start with "_" and is not one of
# its submodules (the errors and the clients' types, imported at once), the two clients and
# the handler SDK (evq.handlers' ``__all__``), imported on first use. ``__all__`` itself is
# made on first use too: it names the handler SDK, which only evq.handlers lists.
_CLIENTS = ("AsyncClient", "Client")


def _public() -> list[str]:
    handlers = _importlib.import_module("evq.handlers")
    eager = (
        n for n, v in globals().items() if not n.startswith("_") and not isinstance(v, _ModuleType)
    )
    return sorted({*eager, *_CLIENTS, *handlers.__all__})


def _home(name: str) -> str | None:
    """The module a name imported on first use comes from (None: not such a name)."""
    if name in _CLIENTS:
        return "evq.client"
    if name.startswith("__"):
        return None  # a module attribute some tool probes for: no reason to load the SDK
    return "evq.handlers" if name in _importlib.import_module("evq.handlers").__all__ else None


def __getattr__(name: str) -> _Any:
    if name == "__all__":
        return _public()
    home = _home(name)
    if home is None:
        raise AttributeError(f"module 'evq' has no attribute {name!r}")
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value  # found at once next time
    return value


def __dir__() -> list[str]:
    return _public()
