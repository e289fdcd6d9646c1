"""The batchers: the right reply to the right caller, errors kept apart, bounded; one
batcher per shard, carrying the commands of all its queues."""

from __future__ import annotations

import asyncio
import random

import pytest

from actors.core import commands as cmd
from actors.errors import BadRequest, Overloaded, QueueError, Unavailable, WrongShard
from actors.shard import QueueShard
from gateway.batcher import SHED_S, Batcher, Batchers


class Shard:
    """A stand-in shard: answers each command with a value derived from it, after a delay;
    records the batches it was sent."""

    def __init__(self, delay: float = 0.005, fail_on: object = None) -> None:
        self.delay = delay
        self.fail_on = fail_on
        self.batches: list[list[object]] = []
        self.concurrent = 0
        self.max_concurrent = 0

    async def send(self, commands: list[object]) -> list[object]:
        self.batches.append(list(commands))
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            await asyncio.sleep(self.delay * random.random())
        finally:
            self.concurrent -= 1
        return [BadRequest(f"bad {c}") if c == self.fail_on else ("done", c) for c in commands]


async def test_every_caller_gets_the_reply_to_its_own_command_under_concurrency() -> None:
    shard = Shard()
    batcher = Batcher(shard.send, max_in_flight=2, split_at=8)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(500)))
    assert results == [("done", i) for i in range(500)]
    assert sum(len(b) for b in shard.batches) == 500
    assert len(shard.batches) < 500  # commands were gathered into batches
    assert batcher.idle


async def test_one_failing_command_in_a_batch_fails_only_itself() -> None:
    shard = Shard(fail_on=7)
    batcher = Batcher(shard.send)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(20)), return_exceptions=True)
    for i, r in enumerate(results):
        if i == 7:
            assert isinstance(r, BadRequest)
            assert r.message == "bad 7"
        else:
            assert r == ("done", i)
    assert any(7 in b and len(b) > 1 for b in shard.batches)  # it really shared a batch


async def test_an_idle_batcher_sends_at_once_and_gathers_while_a_call_is_in_flight() -> None:
    gate = asyncio.Event()
    sent: list[list[object]] = []

    async def send(commands: list[object]) -> list[object]:
        sent.append(list(commands))
        await gate.wait()
        return list(commands)

    batcher = Batcher(send, max_in_flight=2, split_at=1000)
    first = asyncio.ensure_future(batcher.submit("a"))
    for _ in range(3):
        await asyncio.sleep(0)
    assert sent == [["a"]]  # sent at once, alone
    rest = [asyncio.ensure_future(batcher.submit(x)) for x in "bcd"]
    for _ in range(3):
        await asyncio.sleep(0)
    assert sent == [["a"]]  # gathered behind the call in flight
    gate.set()
    assert await first == "a"
    assert [await r for r in rest] == ["b", "c", "d"]
    assert sent == [["a"], ["b", "c", "d"]]


async def test_a_second_parallel_call_opens_past_the_threshold_and_no_more() -> None:
    shard = Shard(delay=0.02)
    batcher = Batcher(shard.send, max_in_flight=2, split_at=10)
    await asyncio.gather(*(batcher.submit(i) for i in range(200)))
    assert shard.max_concurrent == 2


async def test_a_batch_carries_about_max_batch_bytes_and_a_bigger_command_alone() -> None:
    shard = Shard(delay=0.01)
    batcher = Batcher(shard.send, max_batch_bytes=10, size=lambda c: c)  # type: ignore[arg-type]
    results = await asyncio.gather(*(batcher.submit(c) for c in (1, 4, 4, 4, 30, 2, 2)))
    assert results == [("done", c) for c in (1, 4, 4, 4, 30, 2, 2)]
    assert shard.batches == [[1], [4, 4], [4], [30], [2, 2]]  # each <= 10, or one command


async def test_batchers_count_the_bodies_of_puts() -> None:
    sent: list[list[object]] = []

    async def send(shard: int, items: list[tuple[str, object]]) -> list[object]:
        sent.append([c for _, c in items])
        await asyncio.sleep(0.01)
        return [None for _ in items]

    batchers = Batchers(send, lambda queue: 0, max_batch_bytes=3 << 20)
    put = cmd.Put([cmd.NewMessage(body=b"x" * (1 << 20))])  # 1 MiB
    await asyncio.gather(*(batchers.submit("q", c) for c in [put] * 8 + [cmd.Take(max=1)] * 4))
    assert [len(b) for b in sent] == [1, 3, 3, 1 + 4]  # at most 3 MiB of bodies each


async def test_too_many_waiting_commands_are_refused_with_overloaded() -> None:
    gate = asyncio.Event()

    async def send(commands: list[object]) -> list[object]:
        await gate.wait()
        return list(commands)

    batcher = Batcher(send, max_in_flight=1, max_waiting=5)
    accepted = [asyncio.ensure_future(batcher.submit(i)) for i in range(6)]  # 1 in flight + 5
    await asyncio.sleep(0)
    with pytest.raises(Overloaded):
        await batcher.submit("one too many")
    gate.set()
    assert [await a for a in accepted] == list(range(6))


async def test_a_shard_that_cannot_be_reached_fails_the_whole_batch_with_unavailable() -> None:
    async def send(commands: list[object]) -> list[object]:
        raise ConnectionError("gone")

    batcher = Batcher(send)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in results)


async def test_a_wrong_number_of_results_is_an_error_for_every_caller() -> None:
    async def send(commands: list[object]) -> list[object]:
        return [*commands, "one too many"]

    batcher = Batcher(send)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, QueueError) for r in results)


async def test_batchers_carry_the_queues_of_a_shard_together_and_drop_idle_ones() -> None:
    calls: list[tuple[int, list[tuple[str, object]]]] = []
    shards = {"a": 0, "b": 0, "c": 1}

    async def send(shard: int, items: list[tuple[str, object]]) -> list[object]:
        calls.append((shard, list(items)))
        await asyncio.sleep(0.001)
        return [(queue, c) for queue, c in items]

    batchers = Batchers(send, shards.__getitem__)
    results = await asyncio.gather(
        *(batchers.submit(q, i) for i in range(30) for q in ("a", "b", "c"))
    )
    assert results == [(q, i) for i in range(30) for q in ("a", "b", "c")]
    assert all(shards[q] == shard for shard, items in calls for q, _ in items)
    # a and b share shard 0: some frame carried commands of both
    assert any({q for q, _ in items} == {"a", "b"} for shard, items in calls if shard == 0)
    # in order within each queue
    for q in ("a", "b", "c"):
        sent = [c for _, items in calls for queue, c in items if queue == q]
        assert sent == list(range(30))
    assert len(batchers) == 0  # all idle again: nothing kept per shard


async def test_a_shards_memory_refusal_of_a_put_stands_for_its_puts_a_moment(
    budgeted_shard: QueueShard,
) -> None:
    # Found by loadtest/overload.py: under 10x overload every refused put still carried its
    # bodies to the shard, which decoded them only to refuse them (~500 MB/s), and the
    # shards crept past their budget plus the requests in flight.
    shard = budgeted_shard
    sent: list[object] = []

    async def send(index: int, items: list[tuple[str, object]]) -> list[object]:
        sent.extend(c for _, c in items)
        return [(await shard.execute_many(q, [c]))[0] for q, c in items]

    batchers = Batchers(send, lambda queue: 0)
    put = cmd.Put([cmd.NewMessage(body=b"x")])
    assert not isinstance(await batchers.submit("q", put), Exception)
    shard.memory.budget, shard.memory._checked = 1, 0.0  # over it from now on
    with pytest.raises(Overloaded) as refused:
        await batchers.submit("q", put)
    assert len(sent) == 2
    with pytest.raises(Overloaded) as again:  # refused in the gateway, not sent
        await batchers.submit("q", put)
    assert len(sent) == 2
    assert again.value.message == refused.value.message
    assert again.value.fields["queue"] == "q"
    await batchers.submit("q", cmd.Take(max=1))  # other commands still go
    assert len(sent) == 3
    shard.memory.budget, shard.memory._checked = 1 << 40, 0.0
    await asyncio.sleep(SHED_S)
    assert not isinstance(await batchers.submit("q", put), Exception)  # sent, let in
    assert len(sent) == 4


# ---------------------------------------------------------------- started without a task


class StartingShard(Shard):
    """A stand-in shard that can also take a batch without a task (``start``): it answers
    through the callback a moment later, from a plain loop callback (as a connection's
    ``data_received``), and refuses to start while ``connected`` is False."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.connected = True
        self.started: list[list[object]] = []
        self.answer: object = None  # None: the results; else what the callback gets

    def start(self, commands: list[object], then: object) -> bool:
        if not self.connected:
            return False
        self.started.append(list(commands))
        outcome = self.answer
        if outcome is None:
            outcome = [("done", c) for c in commands]
        asyncio.get_running_loop().call_later(0.002, then, outcome)  # type: ignore[arg-type]
        return True


async def test_a_started_batch_answers_its_callers_and_the_next_batch_goes_out() -> None:
    shard = StartingShard()
    batcher = Batcher(shard.send, start=shard.start, max_in_flight=2, split_at=8)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(300)))
    assert results == [("done", i) for i in range(300)]
    assert shard.batches == []  # every batch was started, none sent by a task
    assert sum(len(b) for b in shard.started) == 300
    assert len(shard.started) < 300
    assert batcher.idle
    assert batcher.stats.commands == 300


async def test_a_batch_that_cannot_start_goes_through_send() -> None:
    shard = StartingShard()
    shard.connected = False
    batcher = Batcher(shard.send, start=shard.start)
    assert await asyncio.gather(*(batcher.submit(i) for i in range(5))) == [
        ("done", i) for i in range(5)
    ]
    assert shard.started == []
    assert sum(len(b) for b in shard.batches) == 5


async def test_a_started_batch_that_fails_fails_each_caller() -> None:
    shard = StartingShard()
    shard.answer = Unavailable("the connection to the queue's shard broke")
    batcher = Batcher(shard.send, start=shard.start)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in results), results
    shard.answer = [("done", 1), ("done", 2)]  # two results for one command
    with pytest.raises(Unavailable, match="2 results for 1"):
        await batcher.submit(1)
    assert batcher.idle


async def test_a_start_that_raises_fails_its_batch_and_the_batcher_goes_on() -> None:
    shard = StartingShard()
    calls = 0

    def start(commands: list[object], then: object) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("cannot encode")
        return shard.start(commands, then)

    batcher = Batcher(shard.send, start=start)
    with pytest.raises(Unavailable, match="cannot encode"):
        await batcher.submit("x")
    assert await batcher.submit("y") == ("done", "y")
    assert batcher.idle


async def test_batchers_start_each_shard_s_batches_through_the_directory(tmp_path: object) -> None:
    started: list[tuple[int, list[object]]] = []

    def start(shard: int, items: list[object], then: object) -> bool:
        started.append((shard, list(items)))
        asyncio.get_running_loop().call_soon(then, [("done", i) for i in items])  # type: ignore[arg-type]
        return True

    async def send(shard: int, items: list[object]) -> list[object]:
        raise AssertionError("not used when the batch starts")

    batchers = Batchers(send, lambda q: int(q[-1]), start=start)
    put = cmd.Put([cmd.NewMessage(body=b"x")])
    assert await batchers.submit("q1", put) == ("done", ("q1", put))
    assert await batchers.submit("q0", cmd.Stats()) == ("done", ("q0", cmd.Stats()))
    assert [s for s, _ in started] == [1, 0]


def _disagreeing(rounds: int) -> tuple[Batchers, list[int]]:
    """Batchers over two shards that send a command back and forth ``rounds`` times (each
    names the other: one was given the newest map, the other not yet), then serve it."""
    where = {"q": 0}
    sent: list[int] = []

    async def send(shard: int, items: list[tuple[str, object]]) -> list[object]:
        sent.append(shard)
        if len(sent) <= rounds:
            return [WrongShard("elsewhere", queue="q", shard=1 - shard, generation=1)]
        return ["served"]

    def reroute(queue: str, refusal: WrongShard) -> bool:
        where[queue] = refusal.fields["shard"]
        return True

    return Batchers(send, lambda q: where[q], reroute=reroute), sent


async def test_shards_that_disagree_for_a_moment_are_waited_for_not_answered() -> None:
    """A rolling restart showed it: a command bounced between a shard given the newest map
    and one not given it yet ran out of hops and reached the client as a 503. Past the
    hops, each resend waits a moment (as for a queue that moves)."""
    batchers, sent = _disagreeing(12)
    assert await batchers.submit("q", cmd.Stats()) == "served"
    assert len(sent) == 13


async def test_shards_that_keep_disagreeing_answer_the_refusal_in_the_end() -> None:
    batchers, sent = _disagreeing(10_000)
    with pytest.raises(WrongShard):
        await asyncio.wait_for(batchers.submit("q", cmd.Stats()), 10)
    assert 4 < len(sent) < 100  # waited between resends, then gave up (MOVING_WAIT_S)
