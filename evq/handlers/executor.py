"""Where a handler's tasks run: the interface the runtime submits to, and the errors a
task can end with besides its outcomes.

:class:`LocalExecutor` runs tasks in threads of the runtime's own process (the unit tests,
debugging); ``evq.handlers.cluster.RayExecutor`` runs them in a pool of Ray worker actors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from evq.handlers.api import Handler, Job
from evq.handlers.task import run_task

__all__ = ["Executor", "LocalExecutor", "Running", "TaskFailed", "WorkerLost"]


class WorkerLost(Exception):
    """The process running a task is gone (or the task was cancelled): its outcome is
    unknown, so its messages are left to their leases."""


class TaskFailed(Exception):
    """The task ran but could not call the function (e.g. the handler's module did not
    import there): its messages are released with backoff."""


class Running(Protocol):
    """A submitted task."""

    async def result(self) -> list[Any]:
        """One outcome per message. Raises: WorkerLost, TaskFailed."""
        ...

    def cancel(self) -> None:
        """Ask the task to stop (its answer is no longer wanted)."""
        ...


class Executor(Protocol):
    """Where tasks run."""

    def submit(self, messages: list[Job]) -> Running:
        """Start a task over ``messages``."""
        ...

    async def limit(self, in_flight: Callable[[], int]) -> int | None:
        """How many tasks of this handler the free resources hold (None: unbounded);
        ``in_flight`` counts the handler's running tasks at the moment it is called."""
        ...

    async def close(self) -> None:
        """Release what the executor holds (the runtime has drained)."""
        ...


class _ThreadRun:
    def __init__(self, future: asyncio.Future[list[Any]]) -> None:
        self._future = future

    async def result(self) -> list[Any]:
        try:
            return await asyncio.shield(self._future)
        except asyncio.CancelledError:
            raise WorkerLost("cancelled") from None

    def cancel(self) -> None:
        self._future.cancel()


class LocalExecutor:
    """Runs tasks in threads of this process (tests, debugging); no resource limit."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    def submit(self, messages: list[Job]) -> Running:
        return _ThreadRun(
            asyncio.ensure_future(asyncio.to_thread(run_task, self.handler, messages))
        )

    async def limit(self, in_flight: Callable[[], int]) -> int | None:
        return None

    async def close(self) -> None:
        """Nothing held: threads end with their tasks."""
