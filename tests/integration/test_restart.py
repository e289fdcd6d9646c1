"""Durability of a real ``evq serve``: graceful restarts (SIGTERM, exit 0) with every kind
of state, SIGTERM and SIGKILL of the whole server during put storms, recovery of a big log
(``/readyz`` 503 meanwhile), timers that fall due while the server is down, and a shard
actor process killed under a running server (Ray restarts it; its queues recover).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from actors.errors import MessageNotFound, NotReady, QueueError, QueueNotFound, Unavailable
from actors.shard import placement
from evq.client import AsyncClient, Client, Message, NewMessage
from tests.integration.conftest import SHARDS, Names, ServerFactory
from tests.integration.server import (
    EVQ,
    ROOT,
    Server,
    eventually,
    free_port,
    request,
    server_env,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def view(c: Client, queue: str, mid: str) -> dict[str, Any]:
    """What must survive a restart of one message (everything but the lease token)."""
    m = c.get_message(queue, mid)
    return {
        "state": m.state,
        "body": m.body,
        "activate_at": m.activate_at,
        "enqueued_at": m.enqueued_at,
        "receive_count": m.receive_count,
        "lease_expires_at": m.lease_expires_at,
        "attributes": m.attributes,
        "group": m.group,
    }


def drain(c: Client, queue: str) -> list[Message]:
    """Take every message of a queue (long leases), until it answers none."""
    out: list[Message] = []
    while True:
        batch = c.take(queue, 1000, visibility_timeout=600)
        if not batch:
            return out
        out += batch


def recovered_cleanly(server: Server) -> str:
    """The logs since the server's start (its own and its shards') show no failed
    recovery and no error at all; answers the shards' logs."""
    shards = "\n".join(server.shard_logs().values())
    for log in (server.log(), shards):
        assert "did not recover" not in log, log
        assert "Traceback" not in log, log
        assert not [line for line in log.splitlines() if " ERROR " in line], log
    return shards


def recovery_reports(server: Server) -> list[dict[str, Any]]:
    """The per-queue reports in the shards' "recovered" log lines since the server's start
    (each names the queues recovery replayed records of, or found damage in)."""
    reports = []
    for log in server.shard_logs().values():
        for line in log.splitlines():
            if " recovered: {" in line:
                reports += json.loads(line.split(" recovered: ", 1)[1])["queues"]
    return reports


# ------------------------------------------------------------------ graceful restart


def dlq_pair(names: Names, *, same_shard: bool) -> tuple[str, str]:
    """A (queue, dead-letter queue) pair on the same shard or on different shards."""
    for _ in range(1000):
        src, dlq = names("src"), names("dlq")
        if (placement(src, SHARDS) == placement(dlq, SHARDS)) == same_shard:
            return src, dlq
    raise AssertionError("no pair found")


def test_graceful_restart_keeps_every_state(make_server: ServerFactory, names: Names) -> None:
    server = make_server("--shards", str(SHARDS))
    plain, fifo, ids, timers = names("plain"), names("jobs", fifo=True), names("ids"), names("t")
    same, across = dlq_pair(names, same_shard=True), dlq_pair(names, same_shard=False)

    with Client(server.url, retries=0, timeout=20) as c:
        c.create_queue(plain, visibility_timeout=45, retention=7200, max_message_bytes=5000)
        c.create_queue(fifo, content_based_dedup=True)
        c.create_queue(ids, id_mode="client", delay=90)
        c.create_queue(timers)
        for src, dlq in (same, across):
            c.create_queue(dlq)
            c.create_queue(src, max_receives=1, dead_letter_queue=dlq, visibility_timeout=20)

        now = time.time()
        ready = [r.id for r in c.put(plain, ["r1", "r2", "r3"], attributes={"a": "1"})]
        c.put(plain, NewMessage(body="old", activate_at=now - 100))  # taken first below
        delayed = [r.id for r in c.put(plain, ["d1", "d2"], delay=300)]
        [reserved] = c.take(plain, 1, visibility_timeout=300)
        assert reserved.body == b"old"
        keyed = c.put(plain, "keyed", idempotency_key="idem-1")[0]
        c.put(fifo, ["f1", "f2"], group="g")
        [head] = c.take(fifo, 1, visibility_timeout=300)  # f2 waits behind it
        c.put(ids, "client body", id="job-7")
        for src, _dlq in (same, across):
            c.put(src, "poison")
            [p] = c.take(src)
            c.release(src, p)  # its only receive ended: dead-lettered

        gone, emptied = names("gone"), names("emptied")
        for q in (gone, emptied):
            c.create_queue(q)
            c.put(q, ["x", "y"])
        c.delete_queue(gone)
        assert c.purge(emptied) == 2

        def dead_lettered() -> bool:  # and routed: counted at the source, queued at the DLQ
            sources = [c.get_queue(s).stats for s, _ in (same, across)]
            dlqs = [c.get_queue(d).stats for _, d in (same, across)]
            return all(i is not None and i.dead_lettered == 1 for i in sources) and all(
                i is not None and i.total == 1 for i in dlqs
            )

        eventually(dead_lettered, timeout=10, what="dead letters routed")

        queues = c.list_queues()
        infos = {q: c.get_queue(q) for q in queues if q != timers}
        mids = [*ready, *delayed, reserved.id, keyed.id]
        messages = {(plain, mid): view(c, plain, mid) for mid in mids}
        messages[(fifo, head.id)] = view(c, fifo, head.id)
        messages[(ids, "job-7")] = view(c, ids, "job-7")

        # Due while the server is down: a delay and a lease.
        [due] = c.put(timers, "due", delay=2)
        c.put(timers, "expires")
        [expiring] = c.take(timers, visibility_timeout=3)

    # A long poll waiting when SIGTERM arrives answers "nothing yet" at once.
    waiter = Client(server.url, retries=0, timeout=20)
    with ThreadPoolExecutor(1) as pool:
        polling = pool.submit(waiter.take, timers, 1, wait=60)
        time.sleep(0.5)
        assert not polling.done()
        stopping = time.monotonic()
        assert server.stop() == 0  # SIGTERM: graceful, exit code 0
        assert time.monotonic() - stopping < 15
        assert polling.result(timeout=5) == []
    waiter.close()
    log = server.log()
    assert "queues closed" in log, log
    assert "evq stopped" in log, log
    server.start()
    recovered_cleanly(server)

    with Client(server.url, retries=0, timeout=20) as c:
        assert c.list_queues() == queues
        assert gone not in queues
        with pytest.raises(QueueNotFound):
            c.get_queue(gone)
        for q, info in infos.items():
            after = c.get_queue(q)
            assert after.settings == info.settings, q
            assert info.stats is not None
            assert after.stats is not None
            for field in info.stats.__struct_fields__:
                if field != "oldest_ready_age":
                    assert getattr(after.stats, field) == getattr(info.stats, field), (q, field)
        for (q, mid), before in messages.items():
            assert view(c, q, mid) == before, (q, mid)

        # Leases taken before the restart are still valid, and still the only valid ones.
        assert c.take(fifo, 5) == []  # the group is still blocked by its reserved head
        [t] = c.touch(plain, reserved, visibility_timeout=300)
        assert t.ok
        assert [r.status for r in c.ack(plain, reserved)] == ["ok"]
        assert [r.status for r in c.ack(fifo, head)] == ["ok"]
        assert [m.body for m in c.take(fifo, 5)] == [b"f2"]
        # Ready messages in their order; delayed ones still delayed.
        assert [m.id for m in c.take(plain, 10)] == [*ready, keyed.id]
        assert {view(c, plain, d)["state"] for d in delayed} == {"delayed"}
        # Idempotency and client ids remember what they saw.
        again = c.put(plain, "keyed", idempotency_key="idem-1")[0]
        assert (again.id, again.status) == (keyed.id, "duplicate")
        assert c.put(ids, "client body", id="job-7")[0].status == "duplicate"
        # Dead letters stayed where they went, counted once.
        for src, dlq in (same, across):
            stats = c.get_queue(src).stats
            assert stats is not None
            assert (stats.dead_lettered, stats.total) == (1, 0)
            [letter] = c.take(dlq, 5)
            assert letter.body == b"poison"

        # What fell due while the server was down happened on its restart.
        assert c.get_message(timers, due.id).state == "ready"
        back = c.get_message(timers, expiring.id)
        assert (back.state, back.receive_count) == ("ready", 1)
        assert [r.status for r in c.ack(timers, expiring)] == ["stale_lease"]
        assert sorted(m.body for m in c.take(timers, 5)) == [b"due", b"expires"]


# ------------------------------------------------------------------ put storms


class Storm:
    """Many producers putting into ``queues`` through one AsyncClient until the server
    goes away, recording what was attempted and what was acknowledged."""

    def __init__(self, server: Server, queues: list[str], producers: int = 32) -> None:
        self.server = server
        self.queues = queues
        self.producers = producers
        self.attempted: dict[str, str] = {}  # body -> queue
        self.acked: dict[str, str] = {}  # body -> id, for puts the server answered
        self.failures: list[QueueError] = []

    async def _produce(self, c: AsyncClient, p: int) -> None:
        i = 0
        while True:
            queue = self.queues[(p + i) % len(self.queues)]
            bodies = [f"p{p}-{i}-{k}" for k in range(1 + i % 3)]
            for b in bodies:
                self.attempted[b] = queue
            try:
                results = await c.put(queue, bodies)
            except QueueError as exc:  # the server went away under us: outcome unknown
                self.failures.append(exc)
                return
            for b, r in zip(bodies, results, strict=True):
                assert r.status == "created"
                self.acked[b] = r.id
            i += 1

    async def run(self, until: Callable[[], Awaitable[object]], after: float) -> None:
        """Put until ``until()`` (called ``after`` s into the storm) has ended the server."""
        async with AsyncClient(self.server.url, retries=0, timeout=10) as c:
            for q in self.queues:
                await c.create_queue(q)
            tasks = [asyncio.ensure_future(self._produce(c, p)) for p in range(self.producers)]
            try:
                await asyncio.sleep(after)
                assert not any(t.done() for t in tasks), "producers stopped before the end"
                acked_before = len(self.acked)
                await until()
                await asyncio.wait_for(asyncio.gather(*tasks), 30)
            finally:
                for t in tasks:
                    t.cancel()
        assert acked_before > 200, f"too few puts before the end: {acked_before}"
        assert len(self.failures) == self.producers
        assert all(isinstance(f, Unavailable | NotReady) for f in self.failures), self.failures
        assert set(self.attempted) - set(self.acked), "no put was caught in flight"

    def check_after_restart(self) -> None:
        """Every acknowledged put is there under its id, and nothing but attempted ones."""
        with Client(self.server.url, retries=0, timeout=30) as c:
            found: dict[str, str] = {}
            for q in self.queues:
                total = c.get_queue(q).stats.total  # type: ignore[union-attr]
                messages = drain(c, q)
                assert len(messages) == total
                for m in messages:
                    body = m.body.decode()
                    assert body not in found, f"{body} stored twice"
                    assert self.attempted.get(body) == q, f"{body} was never put into {q}"
                    found[body] = m.id
            missing = sorted(b for b in self.acked if b not in found)
            assert not missing, f"{len(missing)} acknowledged puts lost, e.g. {missing[:5]}"
            wrong = sorted(b for b in self.acked if found[b] != self.acked[b])
            assert not wrong, f"ids changed: {wrong[:5]}"
            # The recovered logs keep working.
            for q in self.queues:
                assert c.put(q, "after")[0].status == "created"


async def test_sigterm_during_put_storm_keeps_every_acknowledged_put(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", str(SHARDS))
    queues = [names.on_shard(0, "storm"), names.on_shard(1, "storm")]
    storm = Storm(server, queues)
    await storm.run(until=lambda: asyncio.to_thread(server.stop), after=1.5)
    assert server.proc is not None
    assert server.proc.returncode == 0
    server.start()
    recovered_cleanly(server)
    storm.check_after_restart()


async def test_sigkill_during_put_storm_loses_no_acknowledged_put(
    make_server: ServerFactory, names: Names
) -> None:
    # snapshots every 0.3 s, each encoded in a forked child of its shard (every queue's:
    # the threshold is 0), so the kill may catch children at work too
    forked = ("--snapshot-every-s", "0.3", "--snapshot-fork-above", "0")
    server = make_server("--shards", str(SHARDS), *forked)
    queues = [names.on_shard(0, "storm"), names.on_shard(1, "storm")]
    storm = Storm(server, queues)

    def kill() -> None:
        """Once both shards wrote a snapshot encoded in a child (their own logs say so)."""
        eventually(
            lambda: sum("in a child" in text for text in server.shard_logs().values()) == SHARDS,
            timeout=30,
            what=lambda: str(server.shard_logs())[-3000:],
        )
        server.kill()

    # SIGKILL of every process of the server (gateway, Ray, shard actors) mid-storm.
    await storm.run(until=lambda: asyncio.to_thread(kill), after=2.0)
    server.start()
    recovered_cleanly(server)
    storm.check_after_restart()


# ------------------------------------------------------------------ big log


NO_SNAPSHOTS = ("--snapshot-every-records", "100000000", "--snapshot-every-s", "1e6")
# messages: ~12 s to put, ~1.5 s to replay here (a first channel connection's handshake
# waits for a turn of the recovering shard's loop: a window of 0.5 s was too short)
BIG = 600_000


def load_big(server: Server, name: str, total: int = BIG, batch: int = 1000) -> None:
    """Create ``name`` and put ``total`` small messages into it, ``batch`` per record."""

    async def load() -> None:
        async with AsyncClient(server.url, retries=0, timeout=30) as c:
            await c.create_queue(name)
            gate = asyncio.Semaphore(8)

            async def put(i: int) -> None:
                async with gate:
                    bodies = [f"m{i}-{j}" for j in range(batch)]
                    await c.put(name, bodies, auto_key=False)

            await asyncio.gather(*(put(i) for i in range(total // batch)))

    asyncio.run(load())


def test_readyz_is_503_while_a_big_log_recovers(make_server: ServerFactory, names: Names) -> None:
    server = make_server("--shards", "1", *NO_SNAPSHOTS)
    name = names("big")
    total = BIG
    load_big(server, name)
    server.kill()  # no snapshot on the way down: the whole log must be replayed

    server.start(wait_ready=False)  # /healthz answers; recovery may still run
    statuses: list[tuple[int, dict[str, Any]]] = []
    errors: list[QueueError] = []
    with Client(server.url, retries=0, timeout=20) as c:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            # The queue call first: replaying 200k messages takes ~0.5 s here, and the
            # window between a 503 and the end of recovery can be shorter than a request.
            try:
                c.get_queue(name)
            except NotReady as exc:
                errors.append(exc)
            status, doc = request("GET", server.url + "/readyz")
            statuses.append((status, doc))
            if status == 200:
                break
            time.sleep(0.01)
        assert statuses[-1] == (200, {"status": "ready"})
        recovering = [doc for status, doc in statuses if status == 503]
        assert recovering, "never saw /readyz answer 503 while recovering"
        assert all(doc["status"] == "recovering" for doc in recovering)
        assert recovering[-1]["shards"][0]["ready"] is False
        assert errors, "no queue call was refused while recovering"
        assert all(e.fields["status"] == 503 and e.code == "NotReady" for e in errors)

        stats = c.get_queue(name).stats
        assert stats is not None
        assert (stats.total, stats.ready) == (total, total)
        [first] = c.take(name)
        assert first.body.startswith(b"m")
    recovered_cleanly(server)
    [queue] = [q for q in recovery_reports(server) if q["queue"] == name]
    assert queue["records_replayed"] == total // 1000 + 1  # its creation and its puts
    assert queue["discarded"] == []


def test_dead_letter_due_at_restart_reaches_a_dlq_whose_shard_recovers_later(
    make_server: ServerFactory, names: Names
) -> None:
    """A lease that ended while the server was down dead-letters its message on restart,
    even when the dead-letter queue's shard is still replaying a big log at that moment."""
    server = make_server("--shards", str(SHARDS), *NO_SNAPSHOTS)
    big, dlq, src = names.on_shard(1, "big"), names.on_shard(1, "dlq"), names.on_shard(0, "src")
    assert sorted([big, dlq]) == [big, dlq]  # a shard recovers its queues in name order
    load_big(server, big)
    with Client(server.url, retries=0, timeout=20) as c:
        c.create_queue(dlq)
        c.create_queue(src, max_receives=1, dead_letter_queue=dlq)
        [r] = c.put(src, "poison")
        [m] = c.take(src, visibility_timeout=1)  # ends while the server is down
    server.kill()  # no snapshots: the dead-letter queue's shard replays the big log
    time.sleep(1)
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        letters = c.take(dlq, 5, wait=10)
        stats = c.get_queue(src).stats
        logs = "\n".join(server.shard_logs().values())
        routing = [line for line in logs.splitlines() if "dead-letter" in line]
        assert [x.body for x in letters] == [b"poison"], (
            f"the dead letter never reached {dlq}: source stats {stats}; shard logs: {routing}"
        )
        assert stats is not None
        assert (stats.dead_lettered, stats.total) == (1, 0)

        # The source records that the copy is in once the dead-letter queue's write is
        # durable: after the copy can be taken, not before.
        def settled() -> bool:
            stats = c.get_queue(src).stats
            assert stats is not None
            return (stats.dead_lettered, stats.dead_letter_pending, stats.total) == (1, 0, 0)

        eventually(settled, timeout=10, what="the source's dead letter settled")
        with pytest.raises(MessageNotFound):
            c.get_message(src, m.id)
        # a server-id dead-letter queue assigns its own id; the copy says where it came from
        assert letters[0].attributes["evq.source_queue"] == src
        assert letters[0].attributes["evq.source_id"] == r.id


# ------------------------------------------------------------------ shard crash


def test_killed_shard_actor_is_restarted_and_recovers_its_queues(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", str(SHARDS))
    victim, bystander = names.on_shard(1, "victim"), names.on_shard(0, "bystander")
    c = Client(server.url, retries=0, timeout=20)
    for q in (victim, bystander):
        c.create_queue(q, visibility_timeout=300)
    ids = [r.id for r in c.put(victim, [f"v{i}" for i in range(5)])]
    c.put(victim, "later", delay=300)
    [held] = c.take(victim)
    c.put(bystander, "b")
    before = {mid: view(c, victim, mid) for mid in ids}

    pids = eventually(
        lambda: len(server.shard_pids()) == SHARDS and server.shard_pids(), timeout=10
    )
    assert isinstance(pids, dict)
    old = pids[placement(victim, SHARDS)]
    os.kill(old, signal.SIGKILL)
    eventually(lambda: old not in server.pids(), timeout=10, what="shard process gone")

    meanwhile: list[tuple[str, object]] = []

    def answers() -> bool:
        try:
            stats = c.get_queue(victim).stats
        except (Unavailable, NotReady) as exc:  # fine while Ray restarts the shard
            meanwhile.append((exc.code, exc.fields.get("status")))
            return False
        return stats is not None

    eventually(answers, timeout=60, interval=0.2, what="the victim's queue answers again")
    assert all(status == 503 for _code, status in meanwhile), meanwhile
    assert server.running()
    new = server.shard_pids().get(placement(victim, SHARDS))
    assert new is not None
    assert new != old
    assert server.shard_pids()[placement(bystander, SHARDS)] == pids[placement(bystander, SHARDS)]

    stats = c.get_queue(victim).stats
    assert stats is not None
    assert (stats.ready, stats.reserved, stats.delayed, stats.total) == (4, 1, 1, 6)
    for mid, seen_before in before.items():
        assert view(c, victim, mid) == seen_before
    # The lease survived the crash; the queue works as before.
    assert [r.status for r in c.ack(victim, held)] == ["ok"]
    assert [m.id for m in c.take(victim, 10)] == ids[1:]
    assert c.take(bystander)[0].body == b"b"
    c.close()
    assert server.stop() == 0


# ------------------------------------------------------------------ the shard count


def test_the_shard_count_is_kept_and_changed_only_by_reshard(
    make_server: ServerFactory, names: Names
) -> None:
    """The store remembers the count it was written with: a later start without --shards uses
    it, one with another count is refused, and ``evq reshard`` changes it — after a SIGKILL,
    with every message, lease and key kept."""
    server = make_server("--shards", "2")
    queues = [names("rs") for _ in range(6)]
    with Client(server.url, retries=0, timeout=20) as c:
        for q in queues:
            c.create_queue(q)
            c.put(q, [f"{q}/{i}" for i in range(4)])
        [held] = c.take(queues[0], 1, visibility_timeout=600)
        c.set_key("app:reshard", {"n": 1})
    server.kill()  # the records are in the shard logs only

    command = [*EVQ, "serve", "--data", str(server.data), "--port", str(free_port())]
    refused = subprocess.run(
        [*command, "--shards", "3"], cwd=ROOT, env=server_env(), capture_output=True, timeout=120
    )
    assert refused.returncode == 2
    assert b"written with 2 shard(s), not 3" in refused.stderr
    assert b"evq reshard --shards 3" in refused.stderr

    changed = subprocess.run(
        [*EVQ, "reshard", "--data", str(server.data), "--shards", "3"],
        cwd=ROOT,
        env=server_env(),
        capture_output=True,
        timeout=120,
    )
    assert changed.returncode == 0, changed.stderr.decode()
    assert b"2 shard(s) -> 3 shard(s)" in changed.stdout
    assert (server.data / "wal" / "LAYOUT").read_bytes().startswith(b'{"format":2,"shards":3')

    again = make_server(data=server.data)  # no --shards: the store's count
    assert "3 shard(s)" in again.log()
    with Client(again.url, retries=0, timeout=20) as c:
        c.ack(queues[0], held)  # the lease taken before the change still holds
        for q in queues:
            bodies = sorted(m.body.decode() for m in drain(c, q))
            expected = [f"{q}/{i}" for i in range(4)]
            assert bodies == [b for b in expected if b != held.body.decode()]
        assert c.get_key("app:reshard").value == {"n": 1}
