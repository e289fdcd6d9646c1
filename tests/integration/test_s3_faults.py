"""``evq serve --store s3://…`` on a flaky object store: moto's S3 server behind the fault
proxy (loadtest/s3_fault_proxy.py), under put/take/ack load, while each kind of fault
fires in turn on the shard log's segment PUTs.

Each fault that the store layer can see through (a few 500s or 503s, a hung request, a
connection reset mid-upload, a create whose answer is lost after it landed) costs no
command: every put, take and ack is answered "ok". An outage (503 SlowDown on every PUT)
fails puts with 503 and Retry-After within bounded time, and the server answers again by
itself once the store is back. Afterwards, and after a SIGKILL of the whole server and a
restart, every acknowledged put is there (or was taken), no acknowledged message comes back,
and the log holds no message twice.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from actors.core import events as ev
from actors.errors import QueueError
from evq.client import Client
from loadtest.s3_fault_proxy import FaultProxy, Rule
from tests.conftest import CREDENTIALS, REGION, S3Server
from tests.fault.actor_support import read_log
from tests.integration.server import Server, server_env

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.timeout(300)]

QUEUE = "flaky"
SEED = 19
REQUEST_MS = 1_500
RETRY_MS = 2_000
SEGMENT = r"/wal/\d{4}/\d{20}\.seg$"

# (name, rule, faults to wait for): each passes without failing a command
PASSING = [
    ("500", Rule("internal_error", method="PUT", key=SEGMENT, times=3), 3),
    ("503", Rule("slow_down", method="PUT", key=SEGMENT, times=3, retry_after_s=1), 3),
    ("hang", Rule("hang", method="PUT", key=SEGMENT, hold_s=30), 1),
    ("reset", Rule("reset_upload", method="PUT", key=SEGMENT, times=2), 2),
    ("lost", Rule("lost_answer", method="PUT", key=SEGMENT, conditional=True, times=2), 2),
    (
        "lost-500",
        Rule("lost_answer", method="PUT", key=SEGMENT, conditional=True, then="internal_error"),
        1,
    ),
]


@dataclass
class Load:
    """What the producer and the consumer were told."""

    acked_puts: set[str] = field(default_factory=set)  # bodies whose put was answered ok
    put_errors: list[tuple[float, QueueError, float]] = field(default_factory=list)
    taken: Counter[str] = field(default_factory=Counter)  # body -> deliveries
    acked: set[str] = field(default_factory=set)  # bodies whose ack was answered ok
    other_errors: list[QueueError] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def produce(self, url: str) -> None:
        with Client(url, retries=0, timeout=60) as client:
            for n in range(1_000_000):
                if self.stop.is_set():
                    return
                bodies = [f"p{n}-{i}" for i in range(5)]
                started = time.monotonic()
                try:
                    client.put(QUEUE, bodies)
                except QueueError as e:
                    self.put_errors.append((started, e, time.monotonic() - started))
                    continue
                self.acked_puts.update(bodies)

    def consume(self, url: str) -> None:
        with Client(url, retries=0, timeout=60) as client:
            while not self.stop.is_set():
                try:
                    batch = client.take(QUEUE, 50, wait=0.2, visibility_timeout=600)
                    self.taken.update(m.body_text for m in batch)
                    if batch:
                        results = client.ack(QUEUE, *batch)
                        self.acked.update(
                            m.body_text for m, r in zip(batch, results, strict=True) if r.ok
                        )
                except QueueError as e:
                    self.other_errors.append(e)


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    p = FaultProxy(s3_server.endpoint, seed=SEED).start_in_thread()
    yield p
    p.stop_thread()


def wait_for(predicate: object, what: str, within: float) -> float:
    """Seconds until ``predicate()`` holds."""
    started = time.monotonic()
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() - started < within, f"not within {within}s: {what}"
        time.sleep(0.02)
    return time.monotonic() - started


def answers_again(url: str) -> float:
    """Seconds until a put is answered ok."""
    started = time.monotonic()
    with Client(url, retries=0, timeout=60) as client:
        for n in range(1_000_000):
            try:
                client.put(QUEUE, [f"probe-{n}"])
                return time.monotonic() - started
            except QueueError:
                assert time.monotonic() - started < 30, "the server did not answer again"
                time.sleep(0.1)
    raise AssertionError("unreachable")


def take_all(url: str) -> Counter[str]:
    found: Counter[str] = Counter()
    with Client(url, retries=0, timeout=30) as client:
        while batch := client.take(QUEUE, 1000, visibility_timeout=600):
            found.update(m.body_text for m in batch)
    return found


def test_a_server_on_a_flaky_s3_keeps_every_acknowledged_put_through_each_fault(
    s3_server: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    prefix = s3_server.fresh_prefix()
    env = server_env(
        AWS_ACCESS_KEY_ID=CREDENTIALS["access_key_id"],
        AWS_SECRET_ACCESS_KEY=CREDENTIALS["secret_access_key"],
        AWS_REGION=REGION,
        EVQ_S3_REQUEST_TIMEOUT_MS=str(REQUEST_MS),
        EVQ_S3_RETRY_TIMEOUT_MS=str(RETRY_MS),
    )
    server = Server(
        tmp_path / "unused",
        *("--store", f"s3://{s3_server.bucket}/{prefix}", "--endpoint", proxy.url),
        *("--region", REGION, "--shards", "1"),
        env=env,
    )
    load = Load()
    try:
        server.start()
        ready = run_load_through_faults_then_restart(server, proxy, load, s3_server, prefix)
    finally:
        load.stop.set()
        if server.running():
            server.kill()
    leased = set(load.taken) - load.acked
    assert load.acked_puts <= load.acked | leased | set(ready), "an acknowledged put was lost"
    assert load.acked.isdisjoint(ready), "an acknowledged message came back"
    assert set(load.taken).isdisjoint(ready), "a leased message came back early"
    assert [b for b, n in (load.taken + ready).items() if n > 1] == [], "delivered twice"


def run_load_through_faults_then_restart(
    server: Server, proxy: FaultProxy, load: Load, s3_server: S3Server, prefix: str
) -> Counter[str]:
    """Fire each fault under load, then an outage; SIGKILL the server, check its log,
    restart it; return what is ready then."""
    threads = [
        threading.Thread(target=load.produce, args=(server.url,), daemon=True),
        threading.Thread(target=load.consume, args=(server.url,), daemon=True),
    ]
    with Client(server.url, retries=0, timeout=30) as client:
        client.create_queue(QUEUE, visibility_timeout=600)
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(load.acked) > 20, "load is flowing", 20)
        for name, rule, fires in PASSING:
            proxy.plan([rule])
            wait_for(lambda r=rule, n=fires: r.fired >= n, f"{name} fired", 20)  # type: ignore[misc]
            proxy.clear()
            before = len(load.acked_puts)
            wait_for(lambda b=before: len(load.acked_puts) > b, f"puts after {name}", 20)  # type: ignore[misc]
            assert not load.put_errors, f"{name}: {load.put_errors}"
            assert not load.other_errors, f"{name}: {load.other_errors}"

        # An outage: every segment PUT answers 503 SlowDown for a while.
        outage = proxy.add(Rule("slow_down", method="PUT", key=SEGMENT, times=None))
        wait_for(lambda: bool(load.put_errors), "a put failed in the outage", 20)
        proxy.clear()
        assert outage.fired >= 1
        assert answers_again(server.url) < 20
        for _, error, took in load.put_errors:
            assert error.fields["status"] == 503, error
            assert error.fields.get("retry_after") is not None, error
            assert took < (2 * RETRY_MS + REQUEST_MS) / 1000 + 5, took
        before = len(load.acked)
        wait_for(lambda: len(load.acked) > before + 10, "takes and acks after the outage", 20)
    finally:
        load.stop.set()
        for t in threads:
            t.join(60)

    # SIGKILL of the whole server: recovery from the log alone. No snapshot was taken (every
    # 200,000 records or 5 minutes, and at a graceful stop), so no segment was pruned: the
    # log holds every put.
    server.kill()
    log = asyncio.run(read_log(s3_server.store(prefix), QUEUE))
    logged = Counter(
        item.body.decode()
        for _, segment in log
        for event in segment.events
        if isinstance(event, ev.MessagesPut)
        for item in event.items
    )
    assert [b for b, n in logged.items() if n > 1] == [], "a message was logged twice"
    assert load.acked_puts <= set(logged), "an acknowledged put is not in the log"
    server.start()
    ready = take_all(server.url)
    assert server.stop() == 0
    return ready
