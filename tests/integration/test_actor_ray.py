"""Shard actors on a real in-process Ray: errors cross the Ray boundary with their type and
fields, and a shard whose process dies is restarted by Ray with its queues recovered.

One local Ray runtime for the module (``ray.init(num_cpus=1)``, ~5 s), shut down at the end.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from actors.core import commands as cmd
from actors.directory import RayDirectory
from actors.errors import (
    BadRequest,
    ErrorKind,
    NotReady,
    QueueError,
    QueueExists,
    QueueNotFound,
    Unavailable,
)
from actors.log.placement import Placement
from actors.settings import QueueSettings
from actors.shard import placement
from actors.spawn import NAMESPACE, ShardActor, ShardSpec, spawn_shards
from tests.integration.local_ray import local_ray

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

T = TypeVar("T")

# Before Ray is imported or started: no token auth, everything on loopback.
COUNT = 2


class ProbeShard(ShardActor):
    """The real shard actor plus one call that lets the shard's errors escape (the
    ShardActor's own methods return them as values)."""

    async def take_raising(self, name: str, command: cmd.Take, wait_s: float) -> Any:
        self._ensure_started()
        return await self.shard.take(name, command, wait_s)

    async def delete_raising(self, name: str) -> None:
        self._ensure_started()
        await self.shard.delete(name)


def run_on(directory: RayDirectory, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` in a loop of its own, then close the directory's channels in that loop
    (a channel's connection belongs to the loop that opened it)."""

    async def run() -> T:
        try:
            return await coro
        finally:
            for channel in directory.channels:
                await channel.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[Any]:
    """A local Ray runtime for this module (never ``ray stop``: shutdown stops only ours)."""
    with local_ray(num_cpus=1, namespace=NAMESPACE) as ray:
        yield ray


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def directory(ray_runtime: Any, store: Path) -> RayDirectory:
    """The server's own shards (actors.spawn) behind the gateway's RayDirectory."""
    directory = RayDirectory(
        spawn_shards(ShardSpec(count=COUNT, store=str(store), secret="s")), "s"
    )

    async def ready() -> None:
        await directory.start()
        deadline = time.monotonic() + 60
        while not all(s.ready for s in await directory.status()):
            assert time.monotonic() < deadline, "shards did not get ready"
            await asyncio.sleep(0.1)

    run_on(directory, ready())
    return directory


@pytest.fixture(scope="module")
def probe(ray_runtime: Any, store: Path) -> Any:
    """A ProbeShard actor (index 0 of 1) over its own store."""
    ray = ray_runtime
    handle = (
        ray.remote(ProbeShard)
        .options(max_restarts=0, num_cpus=0, name="probe")
        .remote(0, ShardSpec(count=1, store=str(store / "probe"), secret="s"))
    )
    assert ray.get(handle.start.remote(), timeout=60).ready
    return handle


def test_except_catches_an_error_raised_inside_a_shard_actor(ray_runtime: Any, probe: Any) -> None:
    ray = ray_runtime
    try:
        ray.get(probe.take_raising.remote("missing", cmd.Take(max=1), 0.0), timeout=30)
    except QueueNotFound as exc:
        caught: QueueError = exc
    else:
        pytest.fail("no QueueNotFound")
    # Ray's RayTaskError(QueueNotFound): a QueueNotFound with everything the shard gave it.
    assert isinstance(caught, QueueNotFound)
    assert isinstance(caught, ray.exceptions.RayTaskError)
    assert type(caught.cause) is QueueNotFound
    assert caught.code == "QueueNotFound"
    assert caught.kind is ErrorKind.NOT_FOUND
    assert caught.fields == caught.cause.fields == {"queue": "missing"}
    assert caught.message == caught.cause.message

    with pytest.raises(BadRequest) as bad:
        ray.get(probe.take_raising.remote("bad name!", cmd.Take(max=1), 0.0), timeout=30)
    assert bad.value.code == "BadRequest"
    with pytest.raises(QueueNotFound):
        ray.get(probe.delete_raising.remote("missing"), timeout=30)


def test_directory_turns_raised_errors_into_the_plain_error(ray_runtime: Any, probe: Any) -> None:
    directory = RayDirectory([probe], "s")

    async def call() -> None:
        with pytest.raises(QueueNotFound) as err:
            await directory._call(probe.take_raising.remote("gone", cmd.Take(max=1), 0.0))
        assert type(err.value) is QueueNotFound  # no Ray wrapper left for the gateway
        assert err.value.fields == {"queue": "gone"}

    asyncio.run(call())


def test_errors_keep_type_and_fields_across_ray(ray_runtime: Any, directory: RayDirectory) -> None:
    name = "typed-errors"

    async def scenario() -> None:
        created, settings = await directory.create(
            name, QueueSettings(visibility_timeout_ms=5000), []
        )
        assert created is True
        assert settings.visibility_timeout_ms == 5000

        with pytest.raises(QueueExists) as exists:
            await directory.create(
                name, QueueSettings(visibility_timeout_ms=6000), ["visibility_timeout_ms"]
            )
        assert type(exists.value) is QueueExists
        assert exists.value.fields == {"queue": name}
        assert "visibility_timeout_ms" in exists.value.message

        with pytest.raises(QueueNotFound) as missing:
            await directory.delete("no-such-queue")
        assert type(missing.value) is QueueNotFound
        assert missing.value.fields == {"queue": "no-such-queue"}

        # Per-command errors come back as values, typed, in order.
        results = await directory.execute_many(
            name, [cmd.Peek("12345"), cmd.Put([cmd.NewMessage(body=b"x")])]
        )
        assert type(results[0]).__name__ == "MessageNotFound"
        assert results[0].code == "MessageNotFound"
        assert results[1][0].status == "created"
        [err] = await directory.execute_many("no-such-queue", [cmd.Describe()])
        assert type(err) is QueueNotFound
        assert err.fields == {"queue": "no-such-queue"}

        taken = await directory.take("no-such-queue", cmd.Take(max=1), 0.1)
        assert type(taken) is QueueNotFound

    run_on(directory, scenario())


def test_a_queue_moves_between_shard_actors_with_its_messages_and_leases(
    ray_runtime: Any, directory: RayDirectory
) -> None:
    """The handover over Ray, coordinated by shard 0: the queue's messages, a lease taken
    before the move, and its place in the map carry over; the source refuses it after."""
    name = "moved-over-ray"
    source = placement(name, COUNT)
    target = 1 - source

    async def scenario() -> None:
        await directory.create(name, QueueSettings(), [])
        puts = await directory.execute_many(
            name,
            [
                cmd.Put([cmd.NewMessage(body=b"m%d" % i) for i in range(first, first + 750)])
                for first in (0, 750)
            ],
        )
        assert [len(put) for put in puts] == [750, 750]
        [taken] = await directory.execute_many(name, [cmd.Take(max=1)])
        placed, paused = await directory.move(name, target)
        assert placed.shard_of(name) == target
        assert paused < 30
        by_shard = await directory.names_by_shard()
        assert name in (by_shard[target] or [])
        assert name not in (by_shard[source] or [])
        [acked] = await directory.execute_many(
            name, [cmd.Ack([cmd.LeaseRef(taken[0].id, taken[0].lease)])]
        )
        assert [r.status for r in acked] == ["ok"]
        [rest] = await directory.execute_many(name, [cmd.Take(max=1000)])
        [more] = await directory.execute_many(name, [cmd.Take(max=1000)])
        bodies = sorted(d.body for d in rest + more)
        assert bodies == sorted(b"m%d" % i for i in range(1, 1500))
        directory.placement = Placement(count=COUNT)  # a stale gateway: refused, sent on
        [stats] = await directory.execute_many(name, [cmd.Stats()])
        assert (stats.ready, stats.reserved) == (0, 1499)

    run_on(directory, scenario())


def test_killed_shard_process_is_restarted_with_its_queues(
    ray_runtime: Any, directory: RayDirectory
) -> None:
    name = "survivor"
    index = placement(name, COUNT)
    handle = directory.handles[index]

    async def before() -> list[str]:
        await directory.create(name, QueueSettings(), [])
        [results] = await directory.execute_many(
            name, [cmd.Put([cmd.NewMessage(body=f"m{i}".encode()) for i in range(3)])]
        )
        return [r.id for r in results]

    ids = run_on(directory, before())
    old_pid = ray_runtime.get(handle.pid.remote(), timeout=30)
    os.kill(old_pid, signal.SIGKILL)

    async def after() -> Any:
        deadline = time.monotonic() + 60
        unavailable = 0
        while True:
            assert time.monotonic() < deadline, "the shard did not come back"
            try:
                [stats] = await directory.execute_many(name, [cmd.Describe()])
            except Unavailable:  # the actor died or is restarting
                unavailable += 1
            else:
                if not isinstance(stats, NotReady):  # restarted, still recovering
                    assert not isinstance(stats, QueueError), stats
                    return stats
            await asyncio.sleep(0.2)

    description = run_on(directory, after())
    new_pid = ray_runtime.get(handle.pid.remote(), timeout=30)
    assert new_pid != old_pid
    assert description is not None

    async def check() -> None:
        views = await directory.execute_many(name, [cmd.Peek(i) for i in ids])
        assert [v.body for v in views] == [b"m0", b"m1", b"m2"]
        assert name in await directory.names()

    run_on(directory, check())
