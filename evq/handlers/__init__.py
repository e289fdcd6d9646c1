"""Handlers: a Python function, pointed at a queue, run in Ray workers.

    from evq.handlers import Job, Send, handler, run

    @handler("send", batch_size=100, max_concurrency=16, num_cpus=0.25)
    def send(message: Job) -> Send | None:
        mail(message.json())
        return Send("report", message.body)

    run(send, server="http://127.0.0.1:8700")  # or: evq handle mymodule:send

The runtime (one Ray actor per handler) takes batches from the queue, runs the function over
each chunk in a pool of worker actors (the handler's resources each; one kept warm when
idle), acks what succeeds, releases what fails with backoff, extends the leases of long
chunks, puts cascaded messages exactly once, and sizes its concurrency from the queue's depth
(watched) and the cluster's free resources. See :mod:`evq.handlers.api` for what a
function may return and :mod:`evq.handlers.cluster` for how it runs.

``start`` / ``run`` import Ray on first use; the rest of this package does not need it.
"""

from __future__ import annotations

from typing import Any

from evq.handlers.api import (
    Backoff,
    Handler,
    HandlerOptions,
    Job,
    Reschedule,
    Retry,
    Send,
    handler,
    load_handler,
)
from evq.handlers.runtime import HandlerStats

__all__ = [
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
]


def start(handler: Handler, **options: Any) -> Any:
    """Start ``handler`` in the Ray cluster; a :class:`~evq.handlers.cluster.HandlerRun`.
    Options as :func:`evq.handlers.cluster.start`."""
    from evq.handlers import cluster

    return cluster.start(handler, **options)


def run(handler: Handler, **options: Any) -> HandlerStats:
    """Run ``handler`` until SIGTERM/SIGINT, then drain it. Options as
    :func:`evq.handlers.cluster.run`."""
    from evq.handlers import cluster

    return cluster.run(handler, **options)
