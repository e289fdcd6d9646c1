"""The task board (gateway/tasks.py): the gateways of one store see each other's tasks. Two
``Tasks`` registries on one real local store stand for two gateways of a cluster: a task
run by one is listed and shown by the other, refused a twin there, cancelled from there,
and shown failed once its gateway stops publishing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.clock import ManualClock
from actors.errors import Conflict, QueueError, TaskNotFound
from actors.log.store import LocalDirStore
from gateway import tasks as tasks_mod
from gateway.tasks import STALE_S, Board, Task, Tasks


@pytest.fixture
def gateways(tmp_path: Path) -> tuple[Tasks, Tasks, ManualClock]:
    store = LocalDirStore(tmp_path / "store")
    clock = ManualClock()
    return Tasks(clock, Board(store, clock)), Tasks(clock, Board(store, clock)), clock


async def _until(check: object, what: str) -> None:
    for _ in range(500):
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_a_task_of_one_gateway_is_listed_shown_and_exclusive_on_another(
    gateways: tuple[Tasks, Tasks, ManualClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, _ = gateways
    monkeypatch.setattr(tasks_mod, "BEAT_S", 0.02)
    release = asyncio.Event()

    async def work(task: Task) -> None:
        task.progress(1, 4)
        await release.wait()
        task.progress(4, 4)

    task = await a.start("resize", work, count=3)
    await _until(lambda: _has(b, task.id), "the task never reached the board")
    shown = await b.view(task.id)
    assert (shown["kind"], shown["state"], shown["count"]) == ("resize", "running", 3)
    assert [v["id"] for v in await b.views()] == [task.id]
    with pytest.raises(Conflict, match=task.id):
        await b.start("resize", work)
    with pytest.raises(Conflict, match=task.id):
        await b.start("restart", work, exclusive=("resize",))
    assert (await b.running_anywhere("resize") or {}).get("id") == task.id
    release.set()
    await asyncio.wait_for(task.job, 5)  # type: ignore[arg-type]
    ended = await b.view(task.id)
    assert (ended["state"], ended["done"], ended["total"]) == ("done", 4, 4)
    assert await b.running_anywhere("resize") is None
    with pytest.raises(TaskNotFound):
        await b.view("resize-nosuchtask")


async def _has(tasks: Tasks, task_id: str) -> bool:
    try:
        await tasks.view(task_id)
    except TaskNotFound:
        return False
    return True


async def test_a_cancel_asked_of_another_gateway_stops_the_task_at_its_next_beat(
    gateways: tuple[Tasks, Tasks, ManualClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, _ = gateways
    monkeypatch.setattr(tasks_mod, "BEAT_S", 0.02)

    async def work(task: Task) -> None:
        step = 0
        while not task.cancelled():
            step += 1
            task.progress(step, 1000)
            await asyncio.sleep(0.01)
        raise QueueError("cancelled between steps")

    task = await a.start("resize", work)
    await _until(lambda: _has(b, task.id), "the task never reached the board")
    asked = await b.cancel(task.id)
    assert asked["state"] == "running"
    await asyncio.wait_for(task.job, 5)  # type: ignore[arg-type]
    assert task.state == "cancelled"
    await _until(
        lambda: _state(b, task.id, "cancelled"), "the cancel never reached the other gateway"
    )
    with pytest.raises(Conflict, match="not running"):
        await b.cancel(task.id)


async def _state(tasks: Tasks, task_id: str, state: str) -> bool:
    return (await tasks.view(task_id))["state"] == state


async def test_a_running_task_whose_gateway_stopped_publishing_shows_failed(
    gateways: tuple[Tasks, Tasks, ManualClock],
) -> None:
    """A gateway that died mid-task published it running, last, some time ago."""
    _, b, clock = gateways
    assert b.board is not None
    dead = Task("resize", {"count": 3}, clock)
    await b.board.publish(dead.view())
    clock.advance(int(STALE_S * 1000) - 1)
    assert (await b.view(dead.id))["state"] == "running"
    with pytest.raises(Conflict):
        await b.start("resize", _forever)
    clock.advance(2)
    lost = await b.view(dead.id)
    assert (lost["state"], lost["error"]["code"]) == ("failed", "GatewayLost")
    again = await b.start("resize", _forever)  # a stale one does not block a new one
    assert again.id != dead.id
    await b.close()
    assert again.state == "cancelled"


async def _forever(task: Task) -> None:
    await asyncio.Event().wait()
