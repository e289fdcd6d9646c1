"""Faults of the object store: a shard's log on moto's S3 server, through a proxy that
injects them (loadtest/s3_fault_proxy.py), with the real obstore client.

What a user of an S3-backed queue expects of each fault:

- 500 InternalError and 503 SlowDown: retried with backoff (obstore's retries); a store that
  keeps failing fails the command with a retryable error (``Unavailable``: 503 and
  Retry-After at the gateway) within a bounded time, and the shard serves again by itself
  when the store is back;
- a request that hangs: cut off by the request timeout, never a hang of the queue;
- a connection reset mid-upload: no torn object, the block is sent again;
- a conditional put whose answer is lost after it landed (reset, timeout, or a 5xx in its
  place, which obstore retries into a 412): the writer reads back, recognises its own
  bytes, and goes on; it neither writes the block twice nor gives it up, and it does not
  take its own write for a newer writer's fence.

After every fault, each message put is in the log exactly once and a fresh incarnation
recovers exactly the state the queue had.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import aiohttp
import obstore
import pytest

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.core.ids import SequentialIds
from actors.errors import BadRequest, Unavailable
from actors.log import keys
from actors.log.obstore_store import ObstoreStore, open_obstore
from actors.queue_actor import RELOAD_WAIT_S, QueueActor
from actors.shard import QueueShard
from loadtest.s3_fault_proxy import FaultProxy, Rule
from tests.conftest import CREDENTIALS, REGION, S3Server
from tests.fault.actor_support import (
    NAME,
    assert_state_is_durable,
    close,
    open_actor,
    put,
    put_ids,
    read_log,
    wait_until,
)

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.timeout(60)]

SEED = 19
REQUEST_MS = 1_000  # per request: a hung request costs this much
RETRY_MS = 2_000  # obstore retries a call for this long
SEGMENT = r"/wal/\d{4}/\d{20}\.seg$"  # a shard log segment (claims included)


@pytest.fixture
async def proxy(s3_server: S3Server) -> AsyncIterator[FaultProxy]:
    """A fault proxy in front of the session's moto server, on this test's event loop."""
    p = FaultProxy(s3_server.endpoint, seed=SEED)
    await p.start()
    yield p
    await p.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


class Stores:
    """One prefix of the bucket, seen through the proxy and directly."""

    def __init__(self, s3: S3Server, proxy: FaultProxy) -> None:
        prefix = s3.fresh_prefix()
        self.faulty = open_obstore(
            f"s3://{s3.bucket}/{prefix}",
            endpoint=proxy.url,
            region=REGION,
            **CREDENTIALS,
            request_timeout_ms=REQUEST_MS,
            retry_timeout_ms=RETRY_MS,
        )
        self.direct = s3.store(prefix)


@pytest.fixture
def stores(s3_server: S3Server, proxy: FaultProxy) -> Stores:
    return Stores(s3_server, proxy)


async def ready_actor(stores: Stores, clock: ManualClock) -> QueueActor:
    actor = await open_actor(stores.faulty, clock)
    assert await actor.execute(put("m0")) == [rp.PutResult("m0", rp.CREATED)]
    return actor


async def check_log_and_recovery(actor: QueueActor, stores: Stores, clock: ManualClock) -> Any:
    """Every message once in the log, the in-memory state is what recovery rebuilds, and
    nothing was set aside as damaged or fenced; returns the put ids."""
    await assert_state_is_durable(actor, stores.direct, clock.now_ms())
    ids = put_ids(await read_log(stores.direct))
    assert len(ids) == len(set(ids)), f"a message was written twice: {sorted(ids)}"
    damaged = [k for k in await stores.direct.list(keys.WAL_ROOT) if "/damaged/" in k]
    assert damaged == []
    return sorted(ids)


# ================================================================ limits


def test_s3_stores_bound_each_request_and_their_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    def opened(**options: Any) -> ObstoreStore:
        return open_obstore("s3://b/p", endpoint="http://127.0.0.1:1", region=REGION, **options)

    monkeypatch.delenv("EVQ_S3_REQUEST_TIMEOUT_MS", raising=False)
    monkeypatch.delenv("EVQ_S3_RETRY_TIMEOUT_MS", raising=False)
    st = opened()  # not obstore's 30 s per request and 3 minutes of retries
    assert st.store.client_options["timeout"] == "10s"
    assert st.store.retry_config["retry_timeout"] == timedelta(seconds=15)
    assert st.resend_ms == 15_000
    monkeypatch.setenv("EVQ_S3_REQUEST_TIMEOUT_MS", "2500")
    monkeypatch.setenv("EVQ_S3_RETRY_TIMEOUT_MS", "4000")
    st = opened()
    assert st.store.client_options["timeout"] == "2s 500ms"
    assert st.store.retry_config["retry_timeout"] == timedelta(seconds=4)
    assert st.resend_ms == 4_000
    st = opened(request_timeout_ms=700, client_options={"timeout": "1s"})
    assert st.store.client_options["timeout"] == "1s"  # obstore's own option wins
    assert st.store.client_options["connect_timeout"] == "700ms"
    with pytest.raises(BadRequest):
        opened(retry_timeout_ms="soon")


# ================================================================ 500 and 503


@pytest.mark.parametrize("fault", ["internal_error", "slow_down"])
async def test_5xx_answers_are_retried_and_the_block_lands_once(
    stores: Stores, proxy: FaultProxy, clock: ManualClock, fault: str
) -> None:
    actor = await ready_actor(stores, clock)
    try:
        epoch = actor.epoch
        proxy.add(Rule(fault, method="PUT", key=SEGMENT, times=3))
        assert await actor.execute(put("a", "b")) == [
            rp.PutResult("a", rp.CREATED),
            rp.PutResult("b", rp.CREATED),
        ]
        assert proxy.fired(fault) == 3
        assert actor.epoch == epoch  # no failure reached the shard: no reload
        assert await check_log_and_recovery(actor, stores, clock) == ["a", "b", "m0"]
    finally:
        await close(actor, snapshot=False)


@pytest.mark.parametrize("fault", ["slow_down", "internal_error", "hang", "reset_upload"])
async def test_a_store_that_keeps_failing_fails_puts_retryably_in_bounded_time_then_heals(
    stores: Stores, proxy: FaultProxy, clock: ManualClock, fault: str
) -> None:
    actor = await ready_actor(stores, clock)
    try:
        proxy.add(Rule(fault, method="PUT", key=SEGMENT, times=None, hold_s=30))
        started = time.perf_counter()
        with pytest.raises(Unavailable):
            await actor.execute(put("lost"))
        took = time.perf_counter() - started
        # obstore's retries, reading back, and sending again within the retry budget
        assert took < (2 * RETRY_MS + REQUEST_MS) / 1000 + 2, took
        assert proxy.fired(fault) >= 1
        proxy.clear()  # the store is back: the shard reloads its log by itself
        done = await asyncio.wait_for(actor.execute(put("after")), 20)
        assert done == [rp.PutResult("after", rp.CREATED)]
        ids = await check_log_and_recovery(actor, stores, clock)
        assert ids == ["after", "m0"]  # "lost" never landed: the proxy forwarded none
    finally:
        await close(actor, snapshot=False)


async def test_commands_that_arrive_during_an_outage_fail_retryably_instead_of_waiting(
    stores: Stores, proxy: FaultProxy, clock: ManualClock
) -> None:
    # After a failed write the shard reads its log again until the store answers; a
    # command that comes meanwhile waits a little for that, then gets a clean 503.
    actor = await ready_actor(stores, clock)
    try:
        proxy.add(Rule("slow_down", method="PUT", key=SEGMENT, times=None))
        with pytest.raises(Unavailable):
            await actor.execute(put("lost"))
        started = time.perf_counter()
        with pytest.raises(Unavailable) as info:
            await asyncio.wait_for(actor.execute(put("later")), RELOAD_WAIT_S + 5)
        assert time.perf_counter() - started >= RELOAD_WAIT_S - 0.1
        assert "nothing was done" in info.value.message  # not an ambiguous failure
        proxy.clear()
        done = await asyncio.wait_for(actor.execute(put("after")), 20)
        assert done == [rp.PutResult("after", rp.CREATED)]
        assert await check_log_and_recovery(actor, stores, clock) == ["after", "m0"]
    finally:
        await close(actor, snapshot=False)


# ================================================================ hangs and resets


async def test_a_hung_segment_put_is_cut_off_by_the_timeout_and_sent_again(
    stores: Stores, proxy: FaultProxy, clock: ManualClock
) -> None:
    actor = await ready_actor(stores, clock)
    try:
        epoch = actor.epoch
        proxy.add(Rule("hang", method="PUT", key=SEGMENT, hold_s=30))
        started = time.perf_counter()
        assert await actor.execute(put("a")) == [rp.PutResult("a", rp.CREATED)]
        took = time.perf_counter() - started
        assert REQUEST_MS / 1000 <= took < REQUEST_MS / 1000 + 3, took
        assert actor.epoch == epoch
        assert await check_log_and_recovery(actor, stores, clock) == ["a", "m0"]
    finally:
        await close(actor, snapshot=False)


async def test_an_upload_reset_midway_leaves_no_torn_object_and_is_sent_again(
    stores: Stores, proxy: FaultProxy, clock: ManualClock, s3_server: S3Server
) -> None:
    actor = await ready_actor(stores, clock)
    try:
        epoch = actor.epoch
        proxy.add(Rule("reset_upload", method="PUT", key=SEGMENT, reset_after=0.5))
        body = random.Random(SEED).randbytes(256 * 1024)  # incompressible: a long upload
        big = cmd.Put([cmd.NewMessage(body=body, id="big")])
        assert await actor.execute(big) == [rp.PutResult("big", rp.CREATED)]
        assert proxy.fired("reset_upload") == 1
        assert actor.epoch == epoch
        assert await check_log_and_recovery(actor, stores, clock) == ["big", "m0"]
        # Every segment object is whole (read_log decoded each); none is a cut-off upload.
        [key] = [k for k, s in await read_log(stores.direct) if "big" in put_ids([(k, s)])]
        assert len(await stores.direct.get(key)) > len(body)
    finally:
        await close(actor, snapshot=False)


async def test_two_resets_in_a_row_of_one_upload_still_land_it_once(
    stores: Stores, proxy: FaultProxy, clock: ManualClock
) -> None:
    actor = await ready_actor(stores, clock)
    try:
        epoch = actor.epoch
        proxy.add(Rule("reset_upload", method="PUT", key=SEGMENT, times=2))
        assert await actor.execute(put("a")) == [rp.PutResult("a", rp.CREATED)]
        assert proxy.fired("reset_upload") == 2
        assert actor.epoch == epoch
        assert await check_log_and_recovery(actor, stores, clock) == ["a", "m0"]
    finally:
        await close(actor, snapshot=False)


# ================================================================ a lost answer


@pytest.mark.parametrize("then", ["reset", "hang", "internal_error", "slow_down"])
async def test_a_conditional_put_whose_answer_was_lost_is_recognised_as_our_own(
    stores: Stores, proxy: FaultProxy, clock: ManualClock, then: str
) -> None:
    # The proxy forwards the create-only PUT, moto stores the segment, and the answer is
    # lost: a reset, a timeout, or a 5xx in its place (obstore then retries, and the retry
    # meets 412 Precondition Failed, as a zombie writer's would).
    actor = await ready_actor(stores, clock)
    try:
        epoch = actor.epoch
        rule = Rule("lost_answer", method="PUT", key=SEGMENT, conditional=True, then=then)
        proxy.add(rule)
        assert await actor.execute(put("a", "b")) == [
            rp.PutResult("a", rp.CREATED),
            rp.PutResult("b", rp.CREATED),
        ]
        assert rule.fired == 1
        assert actor.epoch == epoch  # recognised at once: no failure, no reload, no fence
        assert await actor.execute(put("c")) == [rp.PutResult("c", rp.CREATED)]
        assert await check_log_and_recovery(actor, stores, clock) == ["a", "b", "c", "m0"]
        assert {s.epoch for _, s in await read_log(stores.direct)} == {epoch}
    finally:
        await close(actor, snapshot=False)


async def test_after_a_lost_answer_another_writers_bytes_are_not_taken_for_ours(
    stores: Stores, proxy: FaultProxy
) -> None:
    # The first PUT hangs (it never reaches the server) and, meanwhile, another client
    # creates the key: reading back must say "taken", not "ours".
    store: ObstoreStore = stores.faulty
    proxy.add(Rule("hang", method="PUT", hold_s=30))
    ours = asyncio.ensure_future(store.put_if_absent("k/seg", b"ours"))
    await wait_until(lambda: proxy.fired("hang") == 1, "the first PUT hangs")
    assert await stores.direct.put_if_absent("k/seg", b"theirs")
    assert await ours is False
    assert await stores.direct.get("k/seg") == b"theirs"


# ================================================================ faults of reads


@pytest.mark.parametrize(
    ("fault", "key", "times"),
    [
        ("reset_download", SEGMENT, 2),  # obstore resumes the body where it broke
        ("internal_error", r"^/[^/]+/?$", 2),  # a LIST of the bucket
        ("hang", SEGMENT, 1),  # a second one would outlast the retry budget (2 s)
    ],
    ids=["reset-download", "list-500", "hang"],
)
async def test_a_shard_recovers_through_faults_of_its_reads_and_cuts_nothing(
    stores: Stores, proxy: FaultProxy, clock: ManualClock, fault: str, key: str, times: int
) -> None:
    # A read cut short must never pass for a torn segment: recovery would cut acknowledged
    # blocks off an object that is whole.
    actor = await ready_actor(stores, clock)
    try:
        body = random.Random(SEED).randbytes(64 * 1024)
        await actor.execute(cmd.Put([cmd.NewMessage(body=body, id="big")]))
        await actor.execute(put("a", "b"))
    finally:
        await close(actor, snapshot=False)
    before = {k: await stores.direct.get(k) for k in await stores.direct.list(keys.WAL_ROOT)}
    rule = proxy.add(Rule(fault, method="GET", key=key, times=times, hold_s=30))
    fresh = await open_actor(stores.faulty, clock, settings=None)
    try:
        assert rule.fired == times
        assert fresh.host.report.clean  # type: ignore[attr-defined]
        assert await check_log_and_recovery(fresh, stores, clock) == ["a", "b", "big", "m0"]
    finally:
        await close(fresh, snapshot=False)
    after = {k: await stores.direct.get(k) for k in before}
    assert after == before  # every object as it was: nothing cut, nothing set aside


async def test_a_shard_that_starts_while_the_store_fails_waits_and_starts_when_it_is_back(
    stores: Stores, proxy: FaultProxy, clock: ManualClock
) -> None:
    # Ray starts a shard again after its process died: the store may be failing just then.
    actor = await ready_actor(stores, clock)
    await close(actor, snapshot=False)
    outage = proxy.add(Rule("slow_down", method="GET", times=None))  # reads and LISTs
    shard = QueueShard(0, 1, stores.faulty, clock=clock, ids=SequentialIds())
    starting = asyncio.ensure_future(shard.start())
    try:
        await wait_until(lambda: outage.fired > 0, "the store refused the shard's reads", 20)
        await asyncio.sleep(RETRY_MS / 1000 + 0.5)  # past one call's retries
        assert not starting.done(), "a shard gave up starting on a store that failed a while"
        assert not shard.status().ready
        proxy.clear()
        assert (await asyncio.wait_for(starting, 20)).ready
        queue = await shard.get(NAME)
        assert await queue.execute(put("after")) == [rp.PutResult("after", rp.CREATED)]
        assert await check_log_and_recovery(queue, stores, clock) == ["after", "m0"]
    finally:
        starting.cancel()
        await shard.close(snapshot=False)


# ================================================================ the proxy itself


async def test_the_proxy_passes_requests_through_and_takes_a_seeded_plan_over_http(
    stores: Stores, proxy: FaultProxy
) -> None:
    store = stores.faulty
    await store.put("p/a", b"a" * 100_000)
    assert await store.put_if_absent("p/b", b"b") is True
    assert await store.put_if_absent("p/b", b"other") is False  # If-None-Match reaches moto
    assert (await obstore.head_async(store.store, "p/a"))["size"] == 100_000
    assert await store.list("p/") == ["p/a", "p/b"]
    await store.delete("p/b")
    assert await stores.direct.list("p/") == ["p/a"]
    assert await store.get("p/a") == b"a" * 100_000

    path = f"/{stores.direct.url.removeprefix('s3://')}/p/a"

    async def run(session: aiohttp.ClientSession, seed: int) -> list[int]:
        rule = {"fault": "internal_error", "method": "GET", "probability": 0.5, "times": None}
        async with session.put("/_faults/rules", json={"seed": seed, "rules": [rule]}) as r:
            assert r.status == 200
        statuses = []
        for _ in range(16):
            async with session.get(path) as r:  # unsigned: moto answers 403 if it gets it
                statuses.append(r.status)
                if r.status == 500:
                    assert "<Code>InternalError</Code>" in await r.text()
        async with session.get("/_faults") as r:
            assert (await r.json())["injected"][-1] == {
                "fault": "internal_error",
                "method": "GET",
                "path": path,
            }
        async with session.delete("/_faults/rules") as r:
            assert (await r.json())["rules"] == []
        return statuses

    async with aiohttp.ClientSession(proxy.url) as session:
        first, again, other = await run(session, 1), await run(session, 1), await run(session, 2)
        async with session.post("/_faults/rules", json={"fault": "flood"}) as r:
            assert r.status == 400
    assert set(first) == {403, 500}
    assert first == again
    assert first != other
