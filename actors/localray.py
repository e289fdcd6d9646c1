"""A Ray runtime of this machine alone, started by the process that needs it (``evq serve``
without ``--ray-address``, ``evq handle`` without a cluster).

Ray's head starts, besides its GCS and raylet, an autoscaler monitor and the dashboard's API
server. A runtime of one node that its own process created and stops uses neither: nothing
scales it, and evq never asks for Ray's dashboard (it starts Ray with
``include_dashboard=False``, which still starts the API server). The two cost a start of two
shards ~3 s of CPU of ~9 and ~2 s of its ~7 s until ready, and a stop ~1 s more
(loadtest/RESULTS.md, "A local runtime's start"). :func:`init_local` starts the head
without them.

``ray.init`` has no option for either (``ray start --head`` has ``--no-monitor`` but still
starts the API server), so the head's two starting methods are replaced for the duration of
the call. Ray is pinned (pyproject.toml); if a release renames them, the runtime starts
whole, as it did before, and a warning says so.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import ray

log = logging.getLogger(__name__)

# The head's methods that start the two processes a local runtime does without.
_SKIPPED = ("start_monitor", "start_api_server")


@contextlib.contextmanager
def _without_monitor_and_api_server() -> Iterator[None]:
    from ray._private.node import Node

    if not all(callable(getattr(Node, name, None)) for name in _SKIPPED):
        log.warning("this Ray has no %s: its local runtime starts them", " or ".join(_SKIPPED))
        yield
        return
    saved = {name: getattr(Node, name) for name in _SKIPPED}

    def skip(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    for name in _SKIPPED:
        setattr(Node, name, skip)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(Node, name, method)


def init_local(**options: Any) -> None:
    """``ray.init(**options)`` for a new local runtime (no ``address``), without the
    autoscaler monitor and the dashboard's API server."""
    with _without_monitor_and_api_server():
        ray.init(**options)
