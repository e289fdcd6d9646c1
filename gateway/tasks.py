"""Long-running administrative work a gateway runs for a caller, as tasks (docs/API.md,
"Tasks and administration"): ``GET /v1/tasks`` lists them, ``GET /v1/tasks/{id}`` shows
one, ``DELETE /v1/tasks/{id}`` cancels one that runs.

A task is a coroutine run in the gateway that started it, with a progress (``done`` of
``total``) and a flag it reads between steps to stop when cancelled. What it changes is
stored as it goes (a resize's placement map), so a task cut short, by a cancel or by its
gateway dying, is resumed by starting it again. A gateway keeps the tasks it ran last.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from actors.clock import Clock, SystemClock
from actors.errors import Conflict, QueueError, TaskNotFound
from gateway import native

__all__ = ["FORWARD", "TASKS", "Task", "Tasks", "forwarded", "routes"]

log = logging.getLogger(__name__)

KEPT = 100  # finished tasks a gateway remembers


class Task:
    """One task: what it is, how far it got, how it ended."""

    def __init__(self, kind: str, detail: dict[str, Any], clock: Clock) -> None:
        self.clock = clock
        self.id = f"{kind}-{secrets.token_hex(6)}"
        self.kind = kind
        self.detail = detail
        self.state = "running"
        self.done = 0
        self.total = 0
        self.started_at = clock.now_ms() / 1000
        self.finished_at: float | None = None
        self.error: dict[str, str] | None = None
        self.cancel_asked = False
        self.job: asyncio.Task[Any] | None = None

    def progress(self, done: int, total: int) -> None:
        """How far it got (``done`` of ``total`` steps)."""
        self.done, self.total = done, total

    def cancelled(self) -> bool:
        """Whether it was asked to stop (read between steps)."""
        return self.cancel_asked

    def view(self) -> dict[str, Any]:
        """The task as the API shows it."""
        doc: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "state": self.state,
            "done": self.done,
            "total": self.total,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            **self.detail,
        }
        if self.error is not None:
            doc["error"] = self.error
        return doc


class Tasks:
    """The tasks of one gateway process."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self.tasks: OrderedDict[str, Task] = OrderedDict()

    def running(self, kind: str) -> Task | None:
        """The task of that kind that runs now, if any."""
        return next(
            (t for t in self.tasks.values() if t.kind == kind and t.state == "running"), None
        )

    def start(self, kind: str, work: Callable[[Task], Awaitable[Any]], **detail: Any) -> Task:
        """Run ``work(task)`` as a new task of ``kind`` (one at a time per kind).

        Raises:
            Conflict: one of that kind runs already.
        """
        busy = self.running(kind)
        if busy is not None:
            raise Conflict(f"task {busy.id} ({kind}) is running: cancel it or wait", task=busy.id)
        task = Task(kind, detail, self.clock)
        self.tasks[task.id] = task
        task.job = asyncio.ensure_future(self._run(task, work))
        self._trim()
        return task

    async def _run(self, task: Task, work: Callable[[Task], Awaitable[Any]]) -> None:
        try:
            await work(task)
            task.state = "done"
        except QueueError as exc:
            task.state = "cancelled" if task.cancel_asked else "failed"
            task.error = {"code": exc.code, "message": exc.message}
            log.warning("task %s %s: %s: %s", task.id, task.state, exc.code, exc.message)
        except asyncio.CancelledError:
            task.state = "cancelled"
            raise
        except Exception as exc:  # a task never takes the gateway down: it says why it failed
            task.state = "failed"
            task.error = {"code": "InternalError", "message": f"{type(exc).__name__}: {exc}"}
            log.exception("task %s failed", task.id)
        finally:
            task.finished_at = task.clock.now_ms() / 1000

    def get(self, task_id: str) -> Task:
        """Raises: TaskNotFound."""
        task = self.tasks.get(task_id)
        if task is None:
            raise TaskNotFound(f"no task {task_id} on this gateway", task=task_id)
        return task

    def cancel(self, task_id: str) -> Task:
        """Ask a running task to stop after its current step.

        Raises:
            TaskNotFound: no such task.
            Conflict: it is not running.
        """
        task = self.get(task_id)
        if task.state != "running":
            raise Conflict(f"task {task_id} is {task.state}, not running", task=task_id)
        task.cancel_asked = True
        return task

    def _trim(self) -> None:
        finished = [t.id for t in self.tasks.values() if t.state != "running"]
        for task_id in finished[: max(0, len(finished) - KEPT)]:
            del self.tasks[task_id]

    async def close(self) -> None:
        """Stop every running task (the gateway stops): a rerun resumes it."""
        jobs = [t.job for t in self.tasks.values() if t.job is not None and not t.job.done()]
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)


TASKS = web.AppKey("tasks", Tasks)
# In a gateway worker process (evq serve --workers N): sends a request on to the main
# process, which runs every task (and alone starts shards), so that any process answers
# for every task.
Forward = Callable[[web.Request], Awaitable[web.Response]]
FORWARD: web.AppKey[Forward] = web.AppKey("forward")
routes = web.RouteTableDef()


async def forwarded(request: web.Request) -> web.Response | None:
    """The main process's answer to ``request`` when this is a worker process (None: answer
    it here)."""
    forward = request.app.get(FORWARD)
    return None if forward is None else await forward(request)


@routes.get("/v1/tasks")
async def list_tasks(request: web.Request) -> web.Response:
    """Every task this gateway remembers, oldest first."""
    if (answer := await forwarded(request)) is not None:
        return answer
    tasks = request.app[TASKS]
    return native.reply(request, {"tasks": [t.view() for t in tasks.tasks.values()]})


@routes.get("/v1/tasks/{id}")
async def get_task(request: web.Request) -> web.Response:
    """One task."""
    if (answer := await forwarded(request)) is not None:
        return answer
    return native.reply(request, request.app[TASKS].get(request.match_info["id"]).view())


@routes.delete("/v1/tasks/{id}")
async def cancel_task(request: web.Request) -> web.Response:
    """Ask a running task to stop after its current step."""
    if (answer := await forwarded(request)) is not None:
        return answer
    return native.reply(request, request.app[TASKS].cancel(request.match_info["id"]).view())
