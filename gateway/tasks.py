"""Long-running administrative work a gateway runs for a caller, as tasks (docs/API.md,
"Tasks and administration"): ``GET /v1/tasks`` lists them, ``GET /v1/tasks/{id}`` shows
one, ``DELETE /v1/tasks/{id}`` cancels one that runs.

A task is a coroutine run in the gateway that started it, with a progress (``done`` of
``total``) and a flag it reads between steps to stop when cancelled. What it changes is
stored as it goes (a resize's placement map), so a task cut short, by a cancel or by its
gateway dying, is resumed by starting it again. A gateway keeps the tasks it ran last.

The gateways of a cluster share a :class:`Board` in the shards' store
(``wal/tasks/<id>.json``): the gateway running a task publishes it every second and at
each step, so every gateway lists and shows it, refuses a second one of its kind (409), and
passes on a cancel (``wal/tasks/<id>.cancel``, read by the running gateway at its next
beat). A running task whose gateway stopped publishing (``STALE_S``) shows as failed
(``GatewayLost``): start it again to resume it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from actors.clock import Clock, SystemClock
from actors.errors import Conflict, QueueError, TaskNotFound
from actors.log.store import KeyNotFound, ObjectStore
from gateway import native

__all__ = [
    "FORWARD",
    "TASKS",
    "Board",
    "Stopped",
    "Task",
    "Tasks",
    "forwarded",
    "new_id",
    "routes",
]

log = logging.getLogger(__name__)

KEPT = 100  # finished tasks a gateway remembers
BOARD_KEPT = 20  # finished tasks the board keeps
BEAT_S = 1.0  # how often a running task is published (and its cancel marker read)
STALE_S = 5.0  # a running task not published for this long: its gateway is gone
BOARD_PREFIX = "wal/tasks/"


def new_id(kind: str) -> str:
    """A fresh task id of ``kind``."""
    return f"{kind}-{secrets.token_hex(6)}"


class Stopped(Exception):
    """A task's work stopped because it was asked to (the task ends cancelled)."""


class Task:
    """One task: what it is, how far it got, how it ended."""

    def __init__(
        self, kind: str, detail: dict[str, Any], clock: Clock, task_id: str | None = None
    ) -> None:
        self.clock = clock
        self.id = task_id or new_id(kind)
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


class Board:
    """The tasks of every gateway of a store, as objects in it (see the module docstring)."""

    def __init__(self, store: ObjectStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    @staticmethod
    def _key(task_id: str, suffix: str = ".json") -> str:
        return f"{BOARD_PREFIX}{task_id}{suffix}"

    async def publish(self, view: dict[str, Any]) -> None:
        """Write a task's view as it is now (with the time: its gateway's beat)."""
        doc = {**view, "published_at": self.clock.now_ms() / 1000}
        await self.store.put(self._key(view["id"]), json.dumps(doc).encode())

    async def views(self) -> list[dict[str, Any]]:
        """Every task on the board (stale running ones shown failed), oldest first."""
        found = []
        for key in await self.store.list(BOARD_PREFIX):
            if key.endswith(".json"):
                with contextlib.suppress(KeyNotFound, ValueError):
                    found.append(self._aged(json.loads(await self.store.get(key))))
        return sorted(found, key=lambda v: v.get("started_at", 0))

    async def view(self, task_id: str) -> dict[str, Any] | None:
        """One task, or None."""
        try:
            return self._aged(json.loads(await self.store.get(self._key(task_id))))
        except (KeyNotFound, ValueError):
            return None

    def _aged(self, view: dict[str, Any]) -> dict[str, Any]:
        published = view.pop("published_at", 0)
        if view.get("state") == "running" and self.clock.now_ms() / 1000 - published > STALE_S:
            view["state"] = "failed"
            view["error"] = {
                "code": "GatewayLost",
                "message": f"the gateway running it stopped {STALE_S:.0f} s ago or more: "
                "start it again to resume it",
            }
        return view

    async def ask_cancel(self, task_id: str) -> None:
        """Ask the gateway running the task to stop it (at its next beat)."""
        await self.store.put(self._key(task_id, ".cancel"), b"")

    async def cancel_asked(self, task_id: str) -> bool:
        """Whether another gateway asked for the task to stop."""
        try:
            await self.store.get(self._key(task_id, ".cancel"))
        except KeyNotFound:
            return False
        return True

    async def trim(self) -> None:
        """Forget the oldest finished tasks beyond ``BOARD_KEPT``."""
        views = await self.views()
        finished = [v["id"] for v in views if v.get("state") != "running"]
        for task_id in finished[: max(0, len(finished) - BOARD_KEPT)]:
            for suffix in (".json", ".cancel"):
                with contextlib.suppress(KeyNotFound):
                    await self.store.delete(self._key(task_id, suffix))


class Tasks:
    """The tasks of one gateway process (and, with a board, those of the other gateways of
    its store)."""

    def __init__(self, clock: Clock | None = None, board: Board | None = None) -> None:
        self.clock = clock or SystemClock()
        self.tasks: OrderedDict[str, Task] = OrderedDict()
        self.board = board

    def running(self, kind: str) -> Task | None:
        """The task of that kind that runs here now, if any."""
        return next(
            (t for t in self.tasks.values() if t.kind == kind and t.state == "running"), None
        )

    async def running_anywhere(self, kind: str) -> dict[str, Any] | None:
        """The view of the task of that kind that runs here or on another gateway."""
        here = self.running(kind)
        if here is not None:
            return here.view()
        return next(
            (v for v in await self._board_views() if v["kind"] == kind and v["state"] == "running"),
            None,
        )

    async def start(
        self,
        kind: str,
        work: Callable[[Task], Awaitable[Any]],
        *,
        exclusive: tuple[str, ...] = (),
        alone: bool = True,
        task_id: str | None = None,
        **detail: Any,
    ) -> Task:
        """Run ``work(task)`` as a new task of ``kind``: one at a time of ``kind`` (unless
        not ``alone``) and of every kind in ``exclusive``, on every gateway of the board.
        ``work`` that raises :class:`Stopped` ends the task cancelled. ``task_id``: its id,
        when the caller needed it first (else a new one).

        Raises:
            Conflict: one runs already.
        """
        for other in ((kind,) if alone else ()) + exclusive:
            busy = await self.running_anywhere(other)
            if busy is not None:
                raise Conflict(
                    f"task {busy['id']} ({other}) is running: cancel it or wait", task=busy["id"]
                )
        task = Task(kind, detail, self.clock, task_id)
        self.tasks[task.id] = task
        task.job = asyncio.ensure_future(self._run(task, work))
        self._trim()
        return task

    async def _board_views(self) -> list[dict[str, Any]]:
        if self.board is None:
            return []
        try:
            return await self.board.views()
        except QueueError as exc:  # the store failed: this gateway's own tasks still show
            log.warning("tasks: the board cannot be read: %s", exc.message)
            return []

    async def _beat(self, board: Board, task: Task) -> None:
        """Publish the task every ``BEAT_S`` while it runs; read its cancel marker."""
        while True:
            try:
                await board.publish(task.view())
                if not task.cancel_asked and await board.cancel_asked(task.id):
                    task.cancel_asked = True
            except QueueError as exc:
                log.warning("task %s: not published: %s", task.id, exc.message)
            await asyncio.sleep(BEAT_S)

    async def _run(self, task: Task, work: Callable[[Task], Awaitable[Any]]) -> None:
        board = self.board
        beat = asyncio.ensure_future(self._beat(board, task)) if board is not None else None
        try:
            await self._work(task, work)
        finally:
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
            if board is not None:
                await self._publish_end(board, task)

    @staticmethod
    async def _publish_end(board: Board, task: Task) -> None:
        try:
            await board.publish(task.view())
            await board.trim()
        except QueueError as exc:
            log.warning("task %s: its end not published: %s", task.id, exc.message)

    async def _work(self, task: Task, work: Callable[[Task], Awaitable[Any]]) -> None:
        try:
            await work(task)
            task.state = "done"
        except Stopped:
            task.state = "cancelled"
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
        """A task of this gateway. Raises: TaskNotFound."""
        task = self.tasks.get(task_id)
        if task is None:
            raise TaskNotFound(f"no task {task_id} on this gateway", task=task_id)
        return task

    async def view(self, task_id: str) -> dict[str, Any]:
        """A task of this gateway or of the board.

        Raises:
            TaskNotFound: no such task.
        """
        task = self.tasks.get(task_id)
        if task is not None:
            return task.view()
        if self.board is not None:
            with contextlib.suppress(QueueError):
                view = await self.board.view(task_id)
                if view is not None:
                    return view
        raise TaskNotFound(f"no task {task_id}", task=task_id)

    async def views(self) -> list[dict[str, Any]]:
        """This gateway's tasks and the board's, oldest first."""
        here = [t.view() for t in self.tasks.values()]
        known = {v["id"] for v in here}
        others = [v for v in await self._board_views() if v["id"] not in known]
        return sorted([*here, *others], key=lambda v: v["started_at"])

    async def cancel(self, task_id: str) -> dict[str, Any]:
        """Ask a running task to stop after its current step (one of another gateway: at
        that gateway's next beat).

        Raises:
            TaskNotFound: no such task.
            Conflict: it is not running.
        """
        task = self.tasks.get(task_id)
        view = task.view() if task is not None else await self.view(task_id)
        if view["state"] != "running":
            raise Conflict(f"task {task_id} is {view['state']}, not running", task=task_id)
        if task is not None:
            task.cancel_asked = True
        else:
            assert self.board is not None  # a view of another gateway's task came from it
            await self.board.ask_cancel(task_id)
        return view

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
        for task in self.tasks.values():  # cancelled before their first step
            if task.state == "running":
                task.state = "cancelled"
                task.finished_at = self.clock.now_ms() / 1000


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
    """Every task this gateway remembers, and those of the other gateways of its store,
    oldest first."""
    if (answer := await forwarded(request)) is not None:
        return answer
    return native.reply(request, {"tasks": await request.app[TASKS].views()})


@routes.get("/v1/tasks/{id}")
async def get_task(request: web.Request) -> web.Response:
    """One task."""
    if (answer := await forwarded(request)) is not None:
        return answer
    return native.reply(request, await request.app[TASKS].view(request.match_info["id"]))


@routes.delete("/v1/tasks/{id}")
async def cancel_task(request: web.Request) -> web.Response:
    """Ask a running task to stop after its current step."""
    if (answer := await forwarded(request)) is not None:
        return answer
    return native.reply(request, await request.app[TASKS].cancel(request.match_info["id"]))
