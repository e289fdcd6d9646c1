"""What a handler author writes against: the message a function gets, what it may return,
and the options of a handler.

A handler is a plain or ``async`` function registered for a queue::

    @handler("send", batch_size=100, max_concurrency=16, num_cpus=0.25)
    def send(message: Job) -> Send | None:
        deliver(message.json())
        return Send("report", message.body)  # cascade: put into "report", then ack

What the function returns decides what happens to the message:

- ``None`` — done: the message is acked;
- :class:`Send` (or a list of them) — a cascade: the messages are put into their queues, then
  the source message is acked. Each put carries an idempotency key derived from the source
  queue and message id (``Send.key`` overrides it), so a crash between the put and the ack
  puts nothing twice: the redelivered message is handled again and its puts are duplicates;
- :class:`Reschedule` — periodic work: the message gets a new activation time instead of an
  ack (its receive count starts again); it may follow puts in a list;
- :class:`Retry` — try again later without raising (counts a receive, like a failure);
- an exception — a failure: the message is released with a backoff delay (a new activation
  time, kept by the queue, so retries survive restarts); after the queue's ``max_receives``
  deliveries the queue moves it to its dead-letter queue.

In batch mode (``batch=True``) the function gets the list of messages and returns ``None``
(ack them all), a sequence with one outcome per message, or a mapping from message id to
outcome (ids not in it are acked). Raising fails the whole batch.

Nothing here imports Ray: handlers are plain functions, unit-tested as such.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from actors.settings import MAX_BATCH  # messages per take (API.md)

__all__ = [
    "MAX_BATCH",
    "Backoff",
    "Handler",
    "HandlerOptions",
    "Job",
    "Reschedule",
    "Retry",
    "Send",
    "handler",
    "load_handler",
    "resolve",
]


@dataclass(frozen=True, slots=True)
class Job:
    """One message as a handler sees it (the lease stays with the runtime)."""

    id: str
    body: bytes
    attributes: Mapping[str, Any]
    receive_count: int
    queue: str
    enqueued_at: float = 0.0
    activate_at: float = 0.0
    group: str | None = None

    @property
    def text(self) -> str:
        """The body decoded as UTF-8.

        Raises:
            UnicodeDecodeError: a binary body.
        """
        return self.body.decode("utf-8")

    def json(self) -> Any:
        """The body parsed as JSON.

        Raises:
            ValueError: the body is not JSON.
        """
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class Send:
    """A message for another queue (a cascade step); put before the source is acked.

    ``key`` replaces the derived idempotency key (``{source}:{id}:{index}``). Give one when a
    message is handled more than once on purpose (a periodic job that cascades each run):
    the derived key would make the later runs' puts duplicates within the target queue's
    ``idempotency_window``.
    """

    queue: str
    body: bytes | str
    delay: float | None = field(default=None, kw_only=True)
    activate_at: float | None = field(default=None, kw_only=True)
    attributes: Mapping[str, str] | None = field(default=None, kw_only=True)
    group: str | None = field(default=None, kw_only=True)
    id: str | None = field(default=None, kw_only=True)
    key: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.queue, str) or not self.queue:
            raise ValueError("Send needs a queue name")
        if not isinstance(self.body, bytes | str) or not self.body:
            raise ValueError("Send needs a non-empty body (bytes or str)")
        if self.delay is not None and self.activate_at is not None:
            raise ValueError("Send takes a delay or an activate_at, not both")

    @property
    def body_bytes(self) -> bytes:
        """The body as bytes (a str travels as UTF-8)."""
        return self.body.encode() if isinstance(self.body, str) else self.body


@dataclass(frozen=True, slots=True)
class Reschedule:
    """Run this message again later instead of acking it: ``delay`` seconds from now, or at
    Unix time ``at``."""

    delay: float | None = None
    at: float | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if (self.delay is None) == (self.at is None):
            raise ValueError("Reschedule needs exactly one of delay and at")
        if self.delay is not None and not self.delay >= 0:
            raise ValueError("Reschedule delay must be >= 0 seconds")


@dataclass(frozen=True, slots=True)
class Retry:
    """Release the message for another try, after ``delay`` seconds (None: the backoff)."""

    delay: float | None = None

    def __post_init__(self) -> None:
        if self.delay is not None and not self.delay >= 0:
            raise ValueError("Retry delay must be >= 0 seconds")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry delays: ``min(cap, base * factor ** (receives - 1))`` seconds, shortened by a
    random share of up to ``jitter`` (0..1) so that failures do not come back in step."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if not (self.base >= 0 and self.cap >= 0 and math.isfinite(self.cap)):
            raise ValueError("backoff base and cap must be finite seconds >= 0")
        if not self.factor >= 1:
            raise ValueError("backoff factor must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("backoff jitter must be between 0 and 1")


@dataclass(frozen=True)
class HandlerOptions:
    """How a handler runs; see the package documentation for each option."""

    queue: str
    name: str = ""
    batch_size: int = 100
    batch: bool = False
    max_concurrency: int = 8
    visibility_timeout: float | None = None
    backoff: Backoff = field(default_factory=Backoff)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None
    resources: Mapping[str, float] | None = None
    runtime_env: Mapping[str, Any] | None = None
    drain_timeout: float = 30.0
    warm_workers: int = 1  # idle workers kept for the next message (each holds its resources)

    def __post_init__(self) -> None:
        if not isinstance(self.queue, str) or not self.queue:
            raise ValueError("a handler needs a queue name")
        if not isinstance(self.batch_size, int) or not 1 <= self.batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be 1..{MAX_BATCH}, not {self.batch_size!r}")
        if not isinstance(self.max_concurrency, int) or self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, not {self.max_concurrency!r}")
        if self.visibility_timeout is not None and not self.visibility_timeout > 0:
            raise ValueError("visibility_timeout must be > 0 seconds")
        if not (self.num_cpus >= 0 and self.num_gpus >= 0):
            raise ValueError("num_cpus and num_gpus must be >= 0")
        if self.memory is not None and self.memory <= 0:
            raise ValueError("memory must be > 0 bytes")
        if not self.drain_timeout >= 0:
            raise ValueError("drain_timeout must be >= 0 seconds")
        if not isinstance(self.warm_workers, int) or self.warm_workers < 0:
            raise ValueError(f"warm_workers must be >= 0, not {self.warm_workers!r}")

    def ray_options(self) -> dict[str, Any]:
        """The Ray options each worker asks for."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus}
        if self.num_gpus:
            options["num_gpus"] = self.num_gpus
        if self.memory is not None:
            options["memory"] = self.memory
        if self.resources:
            options["resources"] = dict(self.resources)
        if self.runtime_env:
            options["runtime_env"] = dict(self.runtime_env)
        return options


class Handler:
    """A function and the options it runs with; calling it calls the function."""

    def __init__(self, fn: Callable[..., Any], options: HandlerOptions) -> None:
        if not callable(fn):
            raise ValueError(f"a handler must be callable, not {fn!r}")
        self.fn = fn
        self.options = options if options.name else dataclasses.replace(options, name=_name(fn))
        self.is_async = inspect.iscoroutinefunction(fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Handler({self.options.name!r}, queue={self.options.queue!r})"

    @property
    def name(self) -> str:
        """The handler's name (default: the function's)."""
        return self.options.name

    def with_options(self, **changes: Any) -> Handler:
        """The same function with some options changed.

        Raises:
            ValueError: an invalid option.
        """
        return Handler(self.fn, dataclasses.replace(self.options, **changes))

    def __reduce__(self) -> tuple[Any, ...]:
        # A decorated module-level function is no longer reachable under its own name (the
        # module attribute is this Handler), so it travels as "module:qualname" and is found
        # again by import on the other side; anything else travels as it is.
        ref = _reference(self.fn)
        if ref is not None:
            return (_rebuild, (ref, self.options))
        return (Handler, (self.fn, self.options))


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "handler"))


def _reference(fn: Callable[..., Any]) -> str | None:
    """``module:qualname`` when that name finds ``fn`` (or a Handler around it) by import."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return None
    try:
        found = _attribute(importlib.import_module(module), qualname)
    except (ImportError, AttributeError):
        return None
    if found is fn or (isinstance(found, Handler) and found.fn is fn):
        return f"{module}:{qualname}"
    return None


def _attribute(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _rebuild(ref: str, options: HandlerOptions) -> Handler:
    module, _, qualname = ref.partition(":")
    found = _attribute(importlib.import_module(module), qualname)
    return Handler(found.fn if isinstance(found, Handler) else found, options)


def resolve(ref: str) -> Any:
    """The object named ``module:function`` (a plain function, or a :class:`Handler`).

    Raises:
        ValueError: a malformed reference, or nothing callable there.
        ImportError: the module cannot be imported.
    """
    module_name, sep, qualname = ref.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"a handler is named module:function, not {ref!r}")
    module = importlib.import_module(module_name)
    try:
        found = _attribute(module, qualname)
    except AttributeError:
        raise ValueError(f"{module_name} has no {qualname!r}") from None
    if not callable(found):
        raise ValueError(f"{ref} is not callable")
    return found


def load_handler(ref: str, **options: Any) -> Handler:
    """The handler named ``module:function`` (a plain function or a :class:`Handler`);
    ``options`` override its own (a plain function needs at least ``queue``).

    Raises:
        ValueError: a malformed reference, nothing callable there, or invalid options.
        ImportError: the module cannot be imported.
    """
    found = resolve(ref)
    if isinstance(found, Handler):
        return found.with_options(**options) if options else found
    if "queue" not in options:
        raise ValueError(f"{ref} is a plain function: give the queue it handles")
    return Handler(found, HandlerOptions(**options))


def handler(queue: str, **options: Any) -> Callable[[Callable[..., Any]], Handler]:
    """Register the decorated function (plain or ``async``) as the handler of ``queue``.

    Options: ``batch_size`` (messages per take, 1..1000, default 100), ``batch`` (call the
    function once per batch with a list, default per message), ``max_concurrency`` (chunks
    running at once, default 8), ``visibility_timeout`` (seconds a take reserves; default the
    queue's; leases of long chunks are extended), ``backoff`` (:class:`Backoff`), Ray's
    ``num_cpus`` / ``num_gpus`` / ``memory`` / ``resources`` / ``runtime_env`` for each
    worker, ``warm_workers`` (idle workers kept for the next message, default 1),
    ``drain_timeout`` (seconds a stop waits for running chunks before releasing their
    messages), ``name``.

    Raises:
        ValueError: an invalid option.
    """
    settings = HandlerOptions(queue=queue, **options)

    def wrap(fn: Callable[..., Any]) -> Handler:
        return Handler(fn, settings)

    return wrap
