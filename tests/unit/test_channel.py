"""The gateway↔shard data channel over real TCP on 127.0.0.1, with an in-process shard.

Every command type goes through and comes back with its reply type; errors keep their class
and fields; a wrong secret is refused; a cancelled waiting take is cancelled in the shard; a
broken connection fails the calls in flight with Unavailable and the next call reconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from actors import channel
from actors.channel import ChannelClient, ChannelServer
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.errors import (
    BadRequest,
    MessageNotFound,
    QueueExists,
    QueueNotFound,
    StaleLease,
    Unavailable,
)
from actors.log.store import LocalDirStore
from actors.settings import QueueSettings
from actors.shard import QueueShard

SECRET = "s3cret"


class CountingShard:
    """The shard as a channel service, counting takes cancelled in it."""

    def __init__(self, shard: QueueShard) -> None:
        self.shard = shard
        self.takes_cancelled = 0
        self.hold: asyncio.Event | None = None  # set: batches wait for it in the shard

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shard, name)

    def begin(self, items: list[tuple[str, object]]) -> Any:
        return None if self.hold is not None else self.shard.begin(items)

    async def run_batch(self, items: list[tuple[str, object]]) -> list[Any]:
        if self.hold is not None:
            await self.hold.wait()
        return await self.shard.run_batch(items)

    async def take(self, name: str, command: cmd.Take, wait_s: float) -> Any:
        try:
            return await self.shard.take(name, command, wait_s)
        except asyncio.CancelledError:
            self.takes_cancelled += 1
            raise


class Rig:
    def __init__(self, shard: QueueShard, encrypt: bool | None = None) -> None:
        self.shard = shard
        self.service = CountingShard(shard)
        self.server = ChannelServer(self.service, SECRET, encrypt=encrypt)
        self.address: tuple[str, int] | None = None
        self.asked = 0

    @property
    def takes_cancelled(self) -> int:
        return self.service.takes_cancelled

    async def where(self) -> tuple[str, int]:
        self.asked += 1
        assert self.address is not None
        return self.address

    def client(self, secret: str = SECRET) -> ChannelClient:
        return ChannelClient(self.where, secret)


# Every test runs on a plain loopback channel (the embedded server's) and a sealed one.
@pytest.fixture(params=[None, True], ids=["plain", "sealed"])
async def rig(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    store = LocalDirStore(tmp_path)
    shard = QueueShard(0, 1, store)
    await shard.start()
    await shard.create("q", QueueSettings(), [])
    r = Rig(shard, request.param)
    r.address = await r.server.start("127.0.0.1")
    yield r
    await r.server.close()
    await shard.close()
    await store.close()


async def test_every_reply_type_round_trips(rig: Rig) -> None:
    client = rig.client()
    try:
        [put] = await client.execute_many(
            "q", [cmd.Put([cmd.NewMessage(body=b"\x00bin", attributes={"k": [1, "x"]})])]
        )
        assert isinstance(put[0], rp.PutResult)
        [taken] = await client.execute_many("q", [cmd.Take(5)])
        assert [d.body for d in taken] == [b"\x00bin"]
        assert isinstance(taken[0], rp.Delivery)
        assert taken[0].attributes == {"k": [1, "x"]}
        mid, lease = taken[0].id, taken[0].lease
        stats, peek, acked = await client.execute_many(
            "q", [cmd.Stats(), cmd.Peek(mid), cmd.Ack([cmd.LeaseRef(mid, lease)])]
        )
        assert isinstance(stats, rp.StatsView)
        assert stats.reserved == 1
        assert isinstance(peek, rp.MessageView)
        assert peek.id == mid
        assert [r.status for r in acked] == [rp.OK]
        [described] = await client.execute_many("q", [cmd.Describe()])
        assert isinstance(described, rp.Description)
        assert described.stats.acked == 1
        [purged] = await client.execute_many("q", [cmd.Purge()])
        assert purged == 0
    finally:
        await client.close()


async def test_errors_keep_their_class_code_and_fields(rig: Rig) -> None:
    client = rig.client()
    try:
        await client.execute_many("q", [cmd.Put([cmd.NewMessage(body=b"x")])])
        [taken] = await client.execute_many("q", [cmd.Take(1)])
        mid = taken[0].id
        results = await client.execute_many(
            "q",
            [
                cmd.Update(id=mid, body=b"y", lease="not-the-lease"),
                cmd.Peek("no-such-id"),
                cmd.Take(0),
            ],
        )
        assert isinstance(results[0], StaleLease)
        assert isinstance(results[1], MessageNotFound)
        assert isinstance(results[2], BadRequest)
        assert results[2].code == "BadRequest"
        assert results[2].message
        local = await rig.shard.execute_many("q", [cmd.Peek("no-such-id")])
        assert results[1].message == local[0].message
        assert results[1].fields == local[0].fields
        [missing] = await client.execute_many("nope", [cmd.Stats()])
        assert isinstance(missing, QueueNotFound)
    finally:
        await client.close()


async def test_a_wrong_secret_is_refused(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    client = rig.client("wrong")
    try:
        with pytest.raises(Unavailable):
            await asyncio.wait_for(client.execute_many("q", [cmd.Stats()]), 5)
    finally:
        await client.close()
    stats = (await rig.shard.execute_many("q", [cmd.Stats()]))[0]
    assert stats.total == 0
    refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.message]
    assert refusals, "the refusal is not in the log"
    assert "EVQ_CLUSTER_SECRET" in refusals[0]
    assert "127.0.0.1" in refusals[0]  # from where


async def test_a_waiting_take_is_answered_by_a_put_from_another_connection(rig: Rig) -> None:
    waiter, putter = rig.client(), rig.client()
    try:
        take = asyncio.ensure_future(waiter.take("q", cmd.Take(1), 10.0))
        await asyncio.sleep(0.2)
        assert not take.done()
        await putter.execute_many("q", [cmd.Put([cmd.NewMessage(body=b"wake")])])
        got = await asyncio.wait_for(take, 5)
        assert [d.body for d in got] == [b"wake"]
    finally:
        await waiter.close()
        await putter.close()


async def test_cancelling_a_waiting_take_cancels_it_in_the_shard(rig: Rig) -> None:
    client = rig.client()
    try:
        take = asyncio.ensure_future(client.take("q", cmd.Take(1), 30.0))
        await asyncio.sleep(0.2)
        take.cancel()
        with pytest.raises(asyncio.CancelledError):
            await take
        for _ in range(100):
            if rig.takes_cancelled:
                break
            await asyncio.sleep(0.02)
        assert rig.takes_cancelled == 1
        # The message put afterwards is not swallowed by the cancelled waiter.
        await client.execute_many("q", [cmd.Put([cmd.NewMessage(body=b"after")])])
        [taken] = await client.execute_many("q", [cmd.Take(1)])
        assert [d.body for d in taken] == [b"after"]
    finally:
        await client.close()


async def test_a_broken_connection_fails_calls_in_flight_and_the_next_call_reconnects(
    rig: Rig,
) -> None:
    client = rig.client()
    try:
        await client.execute_many("q", [cmd.Stats()])
        assert rig.asked == 1
        waiting = asyncio.ensure_future(client.take("q", cmd.Take(1), 30.0))
        await asyncio.sleep(0.2)
        await rig.server.close()  # drops every connection
        with pytest.raises(Unavailable):
            await asyncio.wait_for(waiting, 5)
        # The shard comes back on a new port; the client asks where it is now.
        rig.server = ChannelServer(rig.service, SECRET)
        rig.address = await rig.server.start("127.0.0.1")
        [stats] = await client.execute_many("q", [cmd.Stats()])
        assert isinstance(stats, rp.StatsView)
        assert rig.asked == 2
    finally:
        await client.close()


async def test_an_unreachable_shard_is_unavailable(rig: Rig) -> None:
    await rig.server.close()
    rig.address = ("127.0.0.1", 1)  # nothing listens there
    client = rig.client()
    try:
        with pytest.raises(Unavailable):
            await client.execute_many("q", [cmd.Stats()])
    finally:
        await client.close()


async def test_many_concurrent_calls_on_one_connection_get_their_own_answers(rig: Rig) -> None:
    client = rig.client()
    try:
        bodies = [f"m{i}".encode() for i in range(200)]
        results = await asyncio.gather(
            *(client.execute_many("q", [cmd.Put([cmd.NewMessage(body=b)])]) for b in bodies)
        )
        ids = [r[0][0].id for r in results]
        assert len(set(ids)) == 200
        peeks = await asyncio.gather(*(client.execute_many("q", [cmd.Peek(i)]) for i in ids))
        assert [p[0].body for p in peeks] == bodies
    finally:
        await client.close()


def test_every_command_has_a_reply_type() -> None:
    from typing import get_args

    from actors import channel

    assert set(get_args(cmd.Command)) <= set(channel._REPLY_TYPES)


async def test_admin_calls_and_key_watches_over_the_channel(rig: Rig) -> None:
    client = rig.client()
    try:
        created, settings = await client.create("other", QueueSettings(max_receives=3), [])
        assert created is True
        assert settings.max_receives == 3
        with pytest.raises(QueueExists):
            await client.create("other", QueueSettings(max_receives=4), ["max_receives"])
        assert await client.names() == ["other", "q"]
        status = await client.status()
        assert status.ready is True
        assert status.queues == 2
        await client.delete("other")
        with pytest.raises(QueueNotFound):
            await client.delete("other")
        assert await client.names() == ["q"]
        # A key watch is one-shot: answered at once when behind, else on the next change.
        now = await client.watch_key("app:x", -1)
        assert (now.version, now.value) == (0, None)
        waiting = asyncio.ensure_future(client.watch_key("app:x", 0))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        [set_view] = await client.execute_many(*set_key_command("app:x", {"n": 1}))
        got = await asyncio.wait_for(waiting, 5)
        assert (got.version, got.value) == (set_view.version, {"n": 1})
        with pytest.raises(BadRequest):
            await client.watch_key("sys:shutdown", 0)  # sys: keys live in the gateways
    finally:
        await client.close()


def set_key_command(key: str, value: Any) -> tuple[str, list[object]]:
    from actors.keyspace import set_key_command as make

    queue, command = make(key, value)
    return queue, [command]


# The first loop's connection is abandoned with its loop (nothing can close it any more):
# its transport warns when collected, here, inside this test.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_client_used_from_a_new_event_loop_connects_again(tmp_path: Path) -> None:
    """A client's connection belongs to the loop that made it: once that loop is gone (a
    second ``asyncio.run``), the next call connects again instead of writing into a transport
    no loop serves (it used to wait forever)."""
    import gc
    import threading

    ready: list[tuple[str, int]] = []
    served = threading.Event()
    stop = threading.Event()

    def serve() -> None:  # the shard on a loop of its own, in another thread
        async def run() -> None:
            store = LocalDirStore(tmp_path)
            shard = QueueShard(0, 1, store)
            await shard.start()
            await shard.create("q", QueueSettings(), [])
            server = ChannelServer(shard, SECRET)
            ready.append(await server.start("127.0.0.1"))
            served.set()
            await asyncio.to_thread(stop.wait)
            await server.close()
            await shard.close()
            await store.close()

        asyncio.run(run())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert served.wait(30), "the shard did not start"
    asked = 0

    async def where() -> tuple[str, int]:
        nonlocal asked
        asked += 1
        return ready[0]

    client = ChannelClient(where, SECRET)

    async def put(body: bytes, close: bool = False) -> Any:
        [results] = await asyncio.wait_for(
            client.execute_many("q", [cmd.Put([cmd.NewMessage(body=body)])]), 10
        )
        if close:
            await client.close()
        return results

    try:
        assert asyncio.run(put(b"first"))[0].status == "created"
        assert asyncio.run(put(b"second", close=True))[0].status == "created"
        assert asked == 2  # one connection per loop
    finally:
        stop.set()
        thread.join(30)
        gc.collect()


async def test_a_brief_status_leaves_out_each_queues_recovery_report(tmp_path: Path) -> None:
    # /readyz and /metrics ask every shard on each probe and scrape: a shard of many queues
    # has a recovery report per queue, which only the dashboard's status page shows.
    import msgspec

    from actors import channel

    store = LocalDirStore(tmp_path)
    first = QueueShard(0, 1, store)
    await first.start()
    for name in ("a", "b", "c"):
        await first.create(name, QueueSettings(), [])
    await first.close()
    shard = QueueShard(0, 1, store)
    await shard.start()
    rig = Rig(shard)
    rig.address = await rig.server.start("127.0.0.1")
    client = rig.client()
    try:
        full, brief = await client.status(), await client.status(brief=True)
        assert sorted(r.queue for r in full.reports) == ["a", "b", "c"]
        assert brief.reports == []
        assert (brief.ready, brief.queues, brief.log) == (full.ready, 3, full.log)
        # A gateway of before asks with no brief field: the whole status, as it expects.
        old = msgspec.msgpack.encode(["Status", 7])
        assert msgspec.msgpack.decode(old, type=channel.Status) == channel.Status(7, False)
    finally:
        await client.close()
        await rig.server.close()
        await shard.close()
        await store.close()


# ---------------------------------------------------------------- calls without a task


async def test_a_started_batch_is_answered_in_the_connection_s_own_callback(rig: Rig) -> None:
    client = rig.client()
    try:
        assert not client.start_batch([("q", cmd.Stats())], print)  # not connected yet
        await client.execute_many("q", [cmd.Stats()])  # connects
        got: list[Any] = []
        body = b"started"
        items: list[tuple[str, object]] = [("q", cmd.Put([cmd.NewMessage(body=body)]))]
        items.append(("nowhere", cmd.Stats()))
        assert client.start_batch(items, got.append)
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.01)
        [[put, missing]] = got
        assert isinstance(missing, QueueNotFound)
        [peek] = await client.execute_many("q", [cmd.Peek(put[0].id)])
        assert peek.body == body
        connection = client._connection
        assert connection is not None
        assert connection.pending == {}  # an answered call leaves the table
    finally:
        await client.close()


async def test_a_started_batch_learns_of_a_broken_connection(rig: Rig) -> None:
    client = rig.client()
    try:
        await client.execute_many("q", [cmd.Stats()])
        rig.service.hold = asyncio.Event()  # the shard holds the next batch unanswered
        got: list[Any] = []
        assert client.start_batch([("q", cmd.Stats())], got.append)
        await asyncio.sleep(0.2)
        assert got == []
        await rig.server.close()  # drops every connection
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.01)
        [error] = got
        assert isinstance(error, Unavailable)
        rig.service.hold.set()
    finally:
        await client.close()


async def test_a_failing_callback_is_logged_and_the_connection_goes_on(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    client = rig.client()
    try:
        await client.execute_many("q", [cmd.Stats()])

        def broken(results: Any) -> None:
            raise RuntimeError("a bug in the caller")

        assert client.start_batch([("q", cmd.Stats())], broken)
        [stats] = await client.execute_many("q", [cmd.Stats()])  # answered after it
        assert isinstance(stats, rp.StatsView)
        assert "a call's callback failed" in caplog.text
    finally:
        await client.close()


async def test_a_key_s_watchers_are_told_before_the_reply_of_the_call_that_set_it(
    rig: Rig,
) -> None:
    queue, [first] = set_key_command("app/colour", "red")
    await rig.shard.run_batch([(queue, first)])  # the key's partition exists from here on
    before = await rig.shard.keys.get("app/colour")
    _, [command] = set_key_command("app/colour", "blue")
    seen: list[Any] = []
    call = rig.shard.begin([(queue, command)])
    assert call is not None
    # What the key's table holds when the reply leaves (in the same step as the release).
    call.on_done(lambda results: seen.append(rig.shard.keys.table.state("app/colour")))
    await call.future
    [state] = seen
    assert state.value == "blue"
    assert state.version > before.version


async def test_a_refusal_crosses_the_channel_and_the_directory_resends_where_it_says(
    tmp_path: Path,
) -> None:
    """Two shards behind their channels, a map that moves one queue: a ChannelDirectory
    routing by the hash is refused (WrongShard, with the shard and generation, over the
    wire), learns the way and resends, for creation, hot commands and a waiting take."""
    from actors.directory import ChannelDirectory
    from actors.errors import WrongShard
    from actors.log.placement import read_placement, write_placement
    from actors.log.shard_recovery import placement

    store = LocalDirStore(tmp_path)
    name = "moved"
    target = 1 - placement(name, 2)
    start = await read_placement(store, 2)
    await write_placement(store, start, start.moved({name: target}))
    shards = [QueueShard(i, 2, store) for i in range(2)]
    servers = [ChannelServer(shard, SECRET) for shard in shards]
    for shard in shards:
        await shard.start()
    addresses = [await server.start("127.0.0.1") for server in servers]

    async def where(index: int) -> tuple[str, int]:
        return addresses[index]

    directory = ChannelDirectory(2, SECRET, where)
    client = ChannelClient(lambda: where(1 - target), SECRET)
    try:
        [refused] = await client.execute_many(name, [cmd.Stats()])
        assert isinstance(refused, WrongShard)
        assert refused.fields == {"queue": name, "shard": target, "generation": 1}
        created, _ = await directory.create(name, QueueSettings(), [])
        assert created
        assert directory.shard_of(name) == target
        assert await shards[target].names() == [name]
        directory.routes.clear()
        waiting = asyncio.ensure_future(directory.take(name, cmd.Take(1), 5.0))
        await asyncio.sleep(0.05)
        [put] = await directory.execute_many(name, [cmd.Put([cmd.NewMessage(body=b"x")])])
        assert isinstance(put[0], rp.PutResult)
        taken = await asyncio.wait_for(waiting, 5)
        assert [d.body for d in taken] == [b"x"]
        assert await directory.names_by_shard() == [[name] if i == target else [] for i in range(2)]
    finally:
        await client.close()
        await directory.close()
        for server in servers:
            await server.close()
        for shard in shards:
            await shard.close()
        await store.close()


@pytest.fixture
def quick_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The silent-connection watch in tenths of a second instead of seconds."""
    monkeypatch.setattr(channel, "PING_AFTER_S", 0.2)
    monkeypatch.setattr(channel, "SILENT_S", 0.5)
    monkeypatch.setattr(channel, "WATCH_EVERY_S", 0.05)


async def test_a_silent_shard_fails_its_calls_and_the_next_call_reaches_the_new_one(
    rig: Rig, quick_watch: None
) -> None:
    """A shard process paused (or cut off) keeps its connection open and says nothing: the
    gateway asks for its status, hears nothing, drops the connection (the calls fail,
    Unavailable) and asks where the shard is now: Ray's new incarnation."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # reads nothing, answers nothing

    paused = await asyncio.start_server(silent, "127.0.0.1", 0)
    live = rig.address
    rig.address = paused.sockets[0].getsockname()[:2]
    client = rig.client()
    try:
        began = asyncio.get_running_loop().time()
        with pytest.raises(Unavailable, match="cannot be reached"):  # no challenge came
            await asyncio.wait_for(client.execute_many("q", [cmd.Stats()]), 10)
        assert asyncio.get_running_loop().time() - began < 5
        assert accepted  # it was connected, not refused
        rig.address = live  # Ray now names the new incarnation
        [stats] = await client.execute_many("q", [cmd.Stats()])
        assert isinstance(stats, rp.StatsView)
    finally:
        await client.close()
        paused.close()
        for writer in accepted:
            writer.close()


async def test_a_slow_call_on_a_live_shard_is_not_mistaken_for_silence(
    rig: Rig, quick_watch: None
) -> None:
    """A batch that takes longer than the watch's limits (held in the shard) still gets its
    answer: the shard answers the status requests meanwhile."""
    rig.service.hold = asyncio.Event()
    client = rig.client()
    try:
        call = asyncio.ensure_future(client.execute_many("q", [cmd.Stats()]))
        await asyncio.sleep(1.5)  # three times PING_AFTER_S + SILENT_S
        assert not call.done()
        rig.service.hold.set()
        [stats] = await asyncio.wait_for(call, 5)
        assert isinstance(stats, rp.StatsView)
    finally:
        await client.close()


async def test_a_queue_s_history_crosses_the_channel(rig: Rig) -> None:
    client = rig.client()
    try:
        put = cmd.Put([cmd.NewMessage(body=b"x") for _ in range(3)])
        await client.execute_many("q", [put])
        [taken] = await client.execute_many("q", [cmd.Take(1)])
        await client.execute_many("q", [cmd.Ack([cmd.LeaseRef(taken[0].id, taken[0].lease)])])
        *minutes, now = await client.history("q")
        assert (now.ready, now.reserved, now.enqueued, now.acked) == (2, 0, 3, 1)
        # a sample a minute (two if one began meanwhile), each the counts after a commit
        assert 1 <= len(minutes) <= 2, minutes
        seen = {(0, 0, 0), (3, 3, 0), (2, 3, 0), (2, 3, 1)}
        assert all((m.ready, m.enqueued, m.acked) in seen for m in minutes), minutes
        assert all(m.at_ms <= now.at_ms for m in minutes)
        with pytest.raises(QueueNotFound):
            await client.history("nope")
    finally:
        await client.close()
