"""Move tasks run by the shards (actors/moves.py): a dead-letter queue's messages go back
where they came from, or to a named queue, at the rate asked, durably across a restart.

Real shards in this process (``LocalDirectory`` over a local store, two shards so that a
move crosses from one shard to the other); no gateway, no Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from actors.core import commands as cmd
from actors.core import replies as rp
from actors.directory import LocalDirectory
from actors.errors import QueueError
from actors.log.store import LocalDirStore
from actors.settings import QueueSettings
from actors.shard import placement

SOURCE, OTHER, DLQ, ELSEWHERE = "orders", "invoices", "dlq", "elsewhere"
assert placement(SOURCE, 2) != placement(DLQ, 2)  # a move crosses shards


async def _open(data: Path) -> LocalDirectory:
    directory = LocalDirectory(LocalDirStore(data), count=2)
    await directory.start()
    assert directory._started is not None
    await directory._started
    return directory


@pytest.fixture
async def queues(tmp_path: Path) -> AsyncIterator[LocalDirectory]:
    directory = await _open(tmp_path)
    dead = QueueSettings(max_receives=1, dead_letter_queue=DLQ, visibility_timeout_ms=100)
    for name, settings in ((DLQ, QueueSettings()), (SOURCE, dead), (OTHER, dead)):
        await directory.create(name, settings, [])
    await directory.create(ELSEWHERE, QueueSettings(), [])
    try:
        yield directory
    finally:
        await directory.close()


async def run(directory: LocalDirectory, queue: str, command: object) -> Any:
    [result] = await directory.execute_many(queue, [command])
    if isinstance(result, QueueError):
        raise result
    return result


async def eventually(check: Callable[[], Awaitable[Any]]) -> Any:
    """``check()``'s first true answer, within 15 s."""
    async with asyncio.timeout(15):
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.02)


async def dead_letter(directory: LocalDirectory, queue: str, bodies: list[bytes]) -> list[str]:
    """Put ``bodies`` into ``queue`` and let each one's only lease run out: they move to the
    dead-letter queue. Their ids, in order."""
    before = (await run(directory, DLQ, cmd.Stats())).ready
    new = [cmd.NewMessage(body=b, attributes={"kind": "test"}) for b in bodies]
    ids = [r.id for r in await run(directory, queue, cmd.Put(new))]
    taken = await run(directory, queue, cmd.Take(len(bodies)))
    assert len(taken) == len(bodies)

    async def arrived() -> bool:
        stats = await run(directory, DLQ, cmd.Stats())
        return bool(stats.ready >= before + len(ids))

    await eventually(arrived)
    return ids


async def task_of(directory: LocalDirectory, queue: str = DLQ) -> rp.MoveTask:
    tasks = await run(directory, queue, cmd.ListMoves())
    return tasks[0]  # type: ignore[no-any-return]


async def ended(directory: LocalDirectory, queue: str = DLQ) -> rp.MoveTask:
    async def done() -> rp.MoveTask | None:
        task = await task_of(directory, queue)
        return task if task.status not in rp.ACTIVE else None

    return await eventually(done)  # type: ignore[no-any-return]


async def peek_all(directory: LocalDirectory, queue: str) -> list[rp.MessageView]:
    return await run(directory, queue, cmd.PeekReady(1000))  # type: ignore[no-any-return]


async def test_a_redrive_sends_each_message_back_where_it_came_from(
    queues: LocalDirectory,
) -> None:
    from_orders = await dead_letter(queues, SOURCE, [b"o1", b"o2", b"o3"])
    from_invoices = await dead_letter(queues, OTHER, [b"i1"])
    [dead] = await run(queues, DLQ, cmd.PeekReady(1))
    sent_at = dead.attributes[cmd.SENT_AT]
    assert dead.id == from_orders[0]  # kept its id on the way in

    started = await run(queues, DLQ, cmd.StartMove("t1"))
    assert (started.to_move, started.status) == (4, "RUNNING")
    task = await ended(queues)
    assert (task.status, task.moved, task.reason) == ("COMPLETED", 4, None)
    assert await peek_all(queues, DLQ) == []
    back = await peek_all(queues, SOURCE)
    assert [m.id for m in back] == from_orders
    assert [m.body for m in back] == [b"o1", b"o2", b"o3"]
    assert back[0].attributes == {"kind": "test", cmd.SENT_AT: sent_at}  # provenance gone
    assert [m.id for m in await peek_all(queues, OTHER)] == from_invoices


async def test_a_named_destination_takes_every_message(queues: LocalDirectory) -> None:
    ids = await dead_letter(queues, SOURCE, [b"a", b"b"])
    await run(queues, DLQ, cmd.StartMove("t1", ELSEWHERE))
    assert (await ended(queues)).status == "COMPLETED"
    assert [m.id for m in await peek_all(queues, ELSEWHERE)] == ids
    assert await peek_all(queues, SOURCE) == []


async def test_the_rate_holds_and_a_cancel_stops_the_task(queues: LocalDirectory) -> None:
    await dead_letter(queues, SOURCE, [b"m%d" % i for i in range(20)])
    started = time.monotonic()
    await run(queues, DLQ, cmd.StartMove("slow", None, 5))

    async def three_moved() -> bool:
        return (await task_of(queues)).moved >= 3

    await eventually(three_moved)
    assert time.monotonic() - started >= 0.35  # 5 per second: the third one after 0.4 s
    moved = await run(queues, DLQ, cmd.CancelMove("slow"))
    task = await ended(queues)
    assert task.status == "CANCELLED"
    assert moved <= task.moved < 20
    dlq = len(await peek_all(queues, DLQ))
    assert dlq + len(await peek_all(queues, SOURCE)) == 20
    assert dlq == 20 - task.moved


async def test_a_missing_destination_fails_the_task_and_keeps_the_messages(
    queues: LocalDirectory,
) -> None:
    await dead_letter(queues, SOURCE, [b"a", b"b"])
    await run(queues, DLQ, cmd.StartMove("t1", "no-such-queue"))
    task = await ended(queues)
    assert (task.status, task.reason, task.moved) == ("FAILED", "QueueNotFound", 0)
    assert len(await peek_all(queues, DLQ)) == 2  # given back at once


async def test_messages_that_came_from_nowhere_stay(queues: LocalDirectory) -> None:
    await run(queues, DLQ, cmd.Put([cmd.NewMessage(body=b"put here %d" % i) for i in range(3)]))
    ids = await dead_letter(queues, SOURCE, [b"a"])
    await run(queues, DLQ, cmd.StartMove("t1"))
    task = await ended(queues)
    assert (task.status, task.moved, task.to_move) == ("COMPLETED", 1, 4)
    assert [m.id for m in await peek_all(queues, SOURCE)] == ids
    assert len(await peek_all(queues, DLQ)) == 3


async def test_a_running_task_goes_on_after_its_shards_restart(tmp_path: Path) -> None:
    directory = await _open(tmp_path)
    dead = QueueSettings(max_receives=1, dead_letter_queue=DLQ, visibility_timeout_ms=100)
    await directory.create(DLQ, QueueSettings(), [])
    await directory.create(SOURCE, dead, [])
    ids = await dead_letter(directory, SOURCE, [b"m%d" % i for i in range(12)])
    await run(directory, DLQ, cmd.StartMove("t1", None, 10))

    async def some_moved() -> bool:
        return (await task_of(directory)).moved >= 2

    await eventually(some_moved)
    await directory.close()  # mid-task; whatever it had taken comes back with its lease

    directory = await _open(tmp_path)
    try:
        task = await ended(directory)
        assert (task.status, task.moved) == ("COMPLETED", 12)

        async def all_back() -> list[rp.MessageView] | None:
            back = await peek_all(directory, SOURCE)
            return back if len(back) == 12 else None

        back = await eventually(all_back)
        assert sorted(m.id for m in back) == sorted(ids)  # each once, none lost
        assert await peek_all(directory, DLQ) == []
    finally:
        await directory.close()


async def test_dead_letters_reach_their_queue_after_any_failure_of_the_route(
    queues: LocalDirectory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route to the dead-letter queue failing with something else than a QueueError (a
    Ray call to a shard that died: ActorDiedError) used to end the routing task and strand
    the dead letters until the queue's next change; they are retried like any failure."""
    shard = queues.shards[placement(SOURCE, 2)]
    real = shard.route_dead_letters
    failures = [RuntimeError("the actor died"), RuntimeError("the actor died")]

    async def flaky(source: str, target: str, letters: list[Any]) -> None:
        if failures:
            raise failures.pop()
        await real(source, target, letters)

    monkeypatch.setattr(shard, "route_dead_letters", flaky)
    ids = await dead_letter(queues, SOURCE, [b"one", b"two"])  # waits for them in the DLQ
    assert not failures  # both failures happened, and the letters arrived after them
    assert len(ids) == 2


async def test_an_outbox_larger_than_a_put_reaches_the_dead_letter_queue(
    queues: LocalDirectory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dead letters that waited (their queue unreachable) pile up past a put's limit of 1000;
    the route sent the whole outbox as one put, refused at every retry, so none ever moved on
    (the campaign during resizes: 7,562 waiting). It sends them a put's worth at a time."""
    shard = queues.shards[placement(SOURCE, 2)]
    real = shard.route_dead_letters
    reachable = asyncio.Event()
    sizes: list[int] = []

    async def unreachable_at_first(source: str, target: str, letters: list[Any]) -> None:
        if not reachable.is_set():
            raise RuntimeError("the dead-letter queue's shard is restarting")
        sizes.append(len(letters))
        await real(source, target, letters)

    monkeypatch.setattr(shard, "route_dead_letters", unreachable_at_first)
    count = 2500
    for start in range(0, count, 1000):
        n = min(1000, count - start)
        new = [cmd.NewMessage(body=b"%d" % (start + i)) for i in range(n)]
        await run(queues, SOURCE, cmd.Put(new))
        assert len(await run(queues, SOURCE, cmd.Take(n))) == n
    source = shard.queues[SOURCE]

    async def all_waiting() -> bool:
        return len(source.state.outbox) == count

    await eventually(all_waiting)  # every lease ran out; the route is failing
    reachable.set()

    async def arrived() -> bool:
        # The source forgets a letter only once the DLQ holds it: wait for both sides.
        in_dlq = (await run(queues, DLQ, cmd.Stats())).ready
        return bool(in_dlq == count and not source.state.outbox)

    await eventually(arrived)
    assert max(sizes) <= 1000  # a put's worth at a time
    assert sum(sizes) == count


async def test_two_changes_in_one_turn_start_one_route_of_the_dead_letters(
    queues: LocalDirectory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route was running once its coroutine had started: two changes in one turn of the
    loop each started a route, and the same letters went to the DLQ twice (CI: 5,000 sent
    for 2,500). Running is its task's, from the moment it is made."""
    shard = queues.shards[placement(SOURCE, 2)]
    real = shard.route_dead_letters
    routes: list[int] = []
    hold = asyncio.Event()

    async def held(source: str, target: str, letters: list[Any]) -> None:
        routes.append(len(letters))
        await hold.wait()
        await real(source, target, letters)

    monkeypatch.setattr(shard, "route_dead_letters", held)
    await run(queues, SOURCE, cmd.Put([cmd.NewMessage(body=b"x")]))
    assert len(await run(queues, SOURCE, cmd.Take(1))) == 1
    source = shard.queues[SOURCE]

    async def routing() -> bool:
        return bool(routes)

    await eventually(routing)  # the lease ran out: a route runs, held
    [router] = [t for t in source._background if "_route_dead_letters" in repr(t.get_coro())]
    router.cancel()  # it stops with the letter still in the outbox
    with contextlib.suppress(asyncio.CancelledError):
        await router
    assert source.state.outbox
    source._changed()
    source._changed()  # the same turn: the route the first started has not run yet
    await asyncio.sleep(0.2)
    assert routes == [1, 1]  # the held one, and one more: not two more
    hold.set()

    async def arrived() -> bool:
        return bool((await run(queues, DLQ, cmd.Stats())).ready == 1 and not source.state.outbox)

    await eventually(arrived)
