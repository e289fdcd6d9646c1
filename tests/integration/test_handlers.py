"""Handlers on a real local Ray against a real ``evq serve`` in the same Ray cluster.

The test process starts Ray (``ray.init(num_cpus=2)``) and the server joins it with
``--ray-address``, so the handler actors this process starts find the server's shards and
take straight from them (``direct``); the same runtime also goes through the server's HTTP
API (``http``). The handler functions live in ``tests.integration.handler_funcs`` (the Ray
workers import them) and write what they do to per-test log files.

``evq handle`` runs as a subprocess twice: with a Ray of its own over HTTP (the default
set-up), and joined to this cluster; both drain on SIGTERM.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from evq.client import Client
from evq.handlers import Backoff, HandlerStats, load_handler, start
from evq.handlers.cluster import HandlerRun
from tests.integration import handler_funcs
from tests.integration.conftest import Names
from tests.integration.local_ray import local_ray
from tests.integration.server import (
    EVQ,
    ROOT,
    Server,
    _alive,
    eventually,
    kill_until_gone,
    server_env,
    session_pids,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

FUNCS = "tests.integration.handler_funcs:"


@dataclass
class Cluster:
    """The test's Ray cluster and the server that joined it."""

    address: str
    server: Server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Ray in this process (never ``ray stop``), and ``evq serve`` joined to it. The Ray
    node holds the cluster secret in its environment (this process's, which its raylet and
    workers inherit): the shards and the handlers read it there, as on a cluster's nodes."""
    secret = "handler-tests-cluster-secret"
    before = os.environ.get("EVQ_CLUSTER_SECRET")
    os.environ["EVQ_CLUSTER_SECRET"] = secret
    try:
        with local_ray(num_cpus=2, namespace="evq-handler-tests") as ray:
            address = ray.get_runtime_context().gcs_address
            server = Server(
                tmp_path_factory.mktemp("evq") / "data",
                *("--ray-address", address),
                env=server_env(EVQ_CLUSTER_SECRET=secret),
            )
            try:
                server.start()
                yield Cluster(address, server)
            finally:
                if server.running():
                    server.stop(timeout=45)
    finally:
        if before is None:
            os.environ.pop("EVQ_CLUSTER_SECRET", None)
        else:
            os.environ["EVQ_CLUSTER_SECRET"] = before


@pytest.fixture
def client(cluster: Cluster) -> Iterator[Client]:
    with Client(cluster.server.url, timeout=20) as c:
        yield c


@pytest.fixture
def names(request: pytest.FixtureRequest) -> Names:
    return Names(request.node.name)


@pytest.fixture
def handlers(cluster: Cluster) -> Iterator[Any]:
    """Starts handlers in the cluster; ends every one of them after the test."""
    runs: list[HandlerRun] = []

    def run(ref: str, queue: str, transport: str = "direct", **options: Any) -> HandlerRun:
        options.setdefault("num_cpus", 0.1)
        handler = load_handler(FUNCS + ref, queue=queue, **options)
        started = start(handler, server=cluster.server.url, transport=transport, seed=7)
        runs.append(started)
        return started

    run.raw = runs  # type: ignore[attr-defined]
    yield run
    for started in runs:
        with contextlib.suppress(Exception):
            started.drain(0)
        with contextlib.suppress(Exception):
            started.kill()


def bodies(log: Path, count: int, **extra: Any) -> list[str]:
    return [json.dumps({"log": str(log), "n": n, **extra}) for n in range(count)]


def events(log: Path, kind: str) -> list[list[str]]:
    return [f for f in handler_funcs.lines(str(log)) if f[0] == kind]


def wait_stats(run: HandlerRun, check: Any, timeout: float = 60.0, what: str = "") -> HandlerStats:
    """The handler's stats once ``check`` passes on them."""

    def ready() -> HandlerStats | None:
        stats = run.stats()
        return stats if check(stats) else None

    return eventually(ready, timeout=timeout, what=what)  # type: ignore[return-value]


# ------------------------------------------------------------------ the runtime on Ray


@pytest.mark.parametrize("transport", ["direct", "http"])
def test_handlers_of_a_paused_queue_take_nothing_until_it_is_resumed(
    client: Client, names: Names, handlers: Any, tmp_path: Path, transport: str
) -> None:
    queue = names("paused")
    client.create_queue(queue)
    log = tmp_path / "log"
    assert client.pause(queue) is True
    ids = [r.id for r in client.put(queue, bodies(log, 20))]  # puts go on while paused
    run = handlers("record", queue, transport, batch_size=5, max_concurrency=2)
    wait_stats(run, lambda s: s.state == "running", what="the handler running")
    time.sleep(2)  # it watches the queue and waits in a take, and gets nothing
    stats = run.stats()
    assert (stats.acked, stats.taken) == (0, 0), stats
    assert not events(log, "handled")
    info = client.get_queue(queue).stats
    assert info is not None
    assert (info.ready, info.paused) == (20, True)
    assert client.resume(queue) is False
    wait_stats(run, lambda s: s.acked == 20, what="20 acks after the resume")
    assert {f[1] for f in events(log, "handled")} == set(ids)


@pytest.mark.parametrize("transport", ["direct", "http"])
def test_every_message_is_handled_at_least_once_and_acked_once(
    client: Client, names: Names, handlers: Any, tmp_path: Path, transport: str
) -> None:
    queue = names("work")
    client.create_queue(queue)
    log = tmp_path / "log"
    ids = [r.id for r in client.put(queue, bodies(log, 100))]
    run = handlers("record", queue, transport, batch_size=10, max_concurrency=4)
    final = wait_stats(run, lambda s: s.acked == 100, what="100 acks")
    assert final.transport == transport
    assert {f[1] for f in events(log, "handled")} == set(ids)
    stats = client.get_queue(queue).stats
    assert stats is not None
    assert (stats.total, stats.acked) == (0, 100)
    assert (final.stale, final.released, final.errors) == (0, 0, 0)


def test_a_raising_task_is_retried_with_backoff_and_finally_dead_lettered(
    client: Client, names: Names, handlers: Any, tmp_path: Path
) -> None:
    dead, queue = names("dead"), names("flaky")
    client.create_queue(dead)
    client.create_queue(queue, max_receives=3, dead_letter_queue=dead)
    log = tmp_path / "log"
    [put] = client.put(queue, bodies(log, 1))
    backoff = Backoff(base=0.5, factor=2.0, cap=10.0, jitter=0.0)
    run = handlers("always_fail", queue, backoff=backoff)
    eventually(lambda: client.get_queue(dead).stats.total == 1, timeout=60, what="dead letter")
    attempts = [(int(f[2]), float(f[3])) for f in events(log, "attempt")]
    assert [n for n, _ in attempts] == [1, 2, 3]
    assert attempts[1][1] - attempts[0][1] >= 0.45  # base
    assert attempts[2][1] - attempts[1][1] >= 0.95  # base * factor
    assert client.get_queue(queue).stats.total == 0
    [letter] = client.take(dead, 10)
    assert letter.attributes["evq.source_id"] == put.id
    assert run.stats().released == 3


def test_a_killed_worker_s_message_is_redelivered_after_its_lease_and_handled(
    client: Client, names: Names, handlers: Any, tmp_path: Path
) -> None:
    queue = names("fragile")
    client.create_queue(queue, visibility_timeout=3)
    log = tmp_path / "log"
    client.put(queue, bodies(log, 1))
    run = handlers("die_once", queue)
    [line] = eventually(lambda: events(log, "pid"), timeout=60, what="the task's pid")
    os.kill(int(line[2]), signal.SIGKILL)
    killed_at = time.time()
    [handled] = eventually(lambda: events(log, "handled"), timeout=30, what="redelivery")
    assert int(handled[2]) == 2  # the second delivery
    assert float(handled[3]) - killed_at >= 1.5  # after the lease ran out, not at once
    final = wait_stats(run, lambda s: s.acked == 1, what="the ack")
    assert final.abandoned == 1
    stats = client.get_queue(queue).stats
    assert (stats.total, stats.acked) == (0, 1)


def test_a_cascade_survives_a_crash_between_put_and_ack_without_duplicates(
    cluster: Cluster, client: Client, names: Names, handlers: Any, tmp_path: Path
) -> None:
    source, target = names("send"), names("report")
    client.create_queue(source, visibility_timeout=2)
    client.create_queue(target)
    log, marker = tmp_path / "log", tmp_path / "crashed"
    client.put(source, bodies(log, 10, next=target))
    handler = load_handler(FUNCS + "forward", queue=source, num_cpus=0.1, batch_size=5)
    crash = functools.partial(handler_funcs.CrashAfterPut, marker=str(marker))
    run = start(handler, server=cluster.server.url, wrap_source=crash)
    handlers.raw.append(run)

    def drained() -> bool:
        run.ensure_running()  # what `evq handle` does every second: restarts after a crash
        return client.get_queue(source).stats.total == 0

    eventually(drained, timeout=90, interval=0.5, what="the source queue empty")
    assert marker.exists()  # the handler's actor was killed after a put, before its ack
    assert len(events(log, "forward")) > 10  # so some messages were handled twice
    target_stats = client.get_queue(target).stats
    assert target_stats.total == 10
    taken = client.take(target, 100)
    assert sorted(m.body for m in taken) == sorted(b.encode() for b in bodies(log, 10, next=target))
    assert run.stats().put_duplicate >= 1  # the restarted actor's repeated puts


def test_a_periodic_handler_runs_on_schedule(
    client: Client, names: Names, handlers: Any, tmp_path: Path
) -> None:
    queue = names("cron")
    client.create_queue(queue, id_mode="client")
    log = tmp_path / "log"
    client.put(queue, json.dumps({"log": str(log), "every": 1.0}), id="digest")
    run = handlers("tick", queue)
    ticks = eventually(lambda: len(t := events(log, "tick")) >= 4 and t, timeout=60, what="ticks")
    times = [float(f[3]) for f in ticks]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.9 <= g <= 2.5 for g in gaps), gaps
    assert all(int(f[2]) == 1 for f in ticks)  # each run is a fresh first receive
    stats = run.stats()
    assert stats.acked == 0
    assert stats.rescheduled >= 3
    assert client.get_queue(queue).stats.total == 1  # the job stays in its queue


def test_concurrency_grows_with_depth_and_falls_to_zero(
    client: Client, names: Names, handlers: Any, tmp_path: Path
) -> None:
    queue = names("depth")
    client.create_queue(queue)
    log = tmp_path / "log"
    run = handlers("nap", queue, num_cpus=0, max_concurrency=4, batch_size=2)
    wait_stats(run, lambda s: s.state == "running", what="running")
    client.put(queue, bodies(log, 1, sleep=0.3))
    assert wait_stats(run, lambda s: s.acked == 1, what="one ack").peak_in_flight == 1
    client.put(queue, bodies(log, 24, sleep=0.3))
    final = wait_stats(run, lambda s: s.acked == 25 and s.in_flight == 0, what="25 acks")
    assert final.peak_in_flight == 4
    time.sleep(1.5)
    idle = run.stats()
    assert (idle.in_flight, idle.takes) == (0, final.takes)  # idle: no tasks, no polling


def test_free_cluster_resources_bound_the_concurrency(
    client: Client, names: Names, handlers: Any, tmp_path: Path
) -> None:
    queue = names("cpu")
    client.create_queue(queue)
    log = tmp_path / "log"
    run = handlers("nap", queue, num_cpus=1, max_concurrency=8, batch_size=1)
    # Enough work to outlast a look at the cluster that still counts a CPU held by an earlier
    # test's task (resource reports lag by up to a second): the runtime looks again and
    # grows to what is free, never past it.
    client.put(queue, bodies(log, 12, sleep=0.5))
    final = wait_stats(run, lambda s: s.acked == 12, what="twelve acks")
    assert final.peak_in_flight == 2  # the cluster has two CPUs


# ------------------------------------------------------------------ evq handle


class Handle:
    """``evq handle`` in a session of its own, reaped whatever happens."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*EVQ, "handle", *args, "--status-every", "0"],
                cwd=ROOT,
                env=env or server_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def reap(self) -> None:
        kill_until_gone(lambda: [p for p in session_pids(self.proc.pid) if _alive(p)])
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


@pytest.fixture
def handle(tmp_path: Path) -> Iterator[Any]:
    started: list[Handle] = []

    def run(*args: str) -> Handle:
        h = Handle(list(args), tmp_path / f"handle-{len(started)}.out")
        started.append(h)
        return h

    yield run
    for h in started:
        h.reap()


def test_evq_handle_drains_on_sigterm_finishing_what_runs(
    cluster: Cluster, client: Client, names: Names, handle: Any, tmp_path: Path
) -> None:
    queue = names("mail")
    client.create_queue(queue)
    log = tmp_path / "log"
    client.put(queue, bodies(log, 4, sleep=3))
    cli = handle(
        FUNCS + "nap",
        *("--queue", queue, "--server", cluster.server.url),
        *("--max-concurrency", "2", "--batch-size", "1", "--num-cpus", "0"),
    )
    started = eventually(
        lambda: len(s := events(log, "start")) == 2 and s, timeout=120, what=cli.output
    )
    assert cli.stop(timeout=60) == 0, cli.output()
    done = events(log, "done")
    assert {f[1] for f in done} == {f[1] for f in started}  # finished, not cut off
    assert len(events(log, "start")) == 2  # nothing more was taken
    stats = client.get_queue(queue).stats
    assert (stats.acked, stats.ready, stats.reserved) == (2, 2, 0)
    assert "(http, stopped): acked 2" in cli.output()  # its own Ray: over HTTP


def test_evq_handle_in_the_cluster_releases_what_outlasts_the_drain(
    cluster: Cluster, client: Client, names: Names, handle: Any, tmp_path: Path
) -> None:
    queue = names("stuck")
    client.create_queue(queue)
    log = tmp_path / "log"
    client.put(queue, bodies(log, 1, sleep=60))
    cli = handle(
        FUNCS + "nap",
        *("--queue", queue, "--ray-address", cluster.address, "--num-cpus", "0"),
        *("--drain-timeout", "1"),
    )
    eventually(lambda: events(log, "start"), timeout=90, what=cli.output)
    assert cli.stop(timeout=45) == 0, cli.output()
    stats = client.get_queue(queue).stats
    assert (stats.ready, stats.reserved, stats.acked) == (1, 0, 0)
    assert "(direct, stopped): acked 0" in cli.output()
    assert "drained 1, put 0 (+0 duplicate), running 0 task(s)" in cli.output()


def test_evq_handle_refuses_a_queue_that_does_not_exist(cluster: Cluster, names: Names) -> None:
    queue = names("nowhere")
    result = subprocess.run(
        [*EVQ, "handle", FUNCS + "record", "--queue", queue, "--server", cluster.server.url],
        cwd=ROOT,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "QueueNotFound" in result.stderr


def test_the_mailing_example_runs_in_the_cluster_and_says_what_happened(
    cluster: Cluster, names: Names
) -> None:
    prefix = names("mail")
    command = [sys.executable, "examples/mailing.py", "--server", cluster.server.url]
    command += ["--ray-address", cluster.address, "--prefix", prefix]
    command += ["--mails", "6", "--every", "0.5", "--digests", "2"]
    result = subprocess.run(
        command, cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "(direct):" in out
    assert "send:   5 sent" in out
    assert "5 report(s) cascaded, 0 duplicate(s)" in out
    assert "dead:   1 dead-lettered after 3 deliveries: nobody@invalid.example" in out
    assert "report: 5 report(s) tallied" in out
