"""Every evq process logs in the format asked for, naming its shard or its handler and queue,
and ``drop`` mode never blocks a process on a stuck log sink.

One ``evq serve --log-format json`` (two shards): the shards' own log files (their fd 2 in
Ray's session directory) and the server's output (its own records and the shards' lines
Ray forwards) are JSON records, each shard's naming it. ``evq handle --log-format json``
(a Ray of its own, over HTTP) forwards its handler's and workers' records, each naming the
handler and the queue, among them the one the user's function logged.
"""

from __future__ import annotations

import contextlib
import json
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evq.client import Client
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

HANDLER = "tests.integration.logging_funcs:log_it"
RECORD_KEYS = {"ts", "level", "logger", "msg"}


def records(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON record (Ray's own ``:job_id:`` and ``:actor_name:``
    markers in a worker's file apart); fails on a line that is not one."""
    docs = []
    for line in text.splitlines():
        if not line.strip() or line.startswith(":"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON record: {line!r}") from None
        assert isinstance(doc, dict), line
        assert set(doc) >= RECORD_KEYS, doc
        docs.append(doc)
    return docs


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("evq") / "data"
    server = Server(data, "--shards", "2", "--log-format", "json").start()
    try:
        yield server
    finally:
        if server.running():
            server.stop(timeout=45)


def test_shards_log_json_records_naming_their_shard(server: Server) -> None:
    def both_started() -> dict[int, str]:
        logs = server.shard_logs()
        return logs if len(logs) == 2 and all("recovered" in t for t in logs.values()) else {}

    logs = eventually(both_started, timeout=30, what="two shards recovered")
    assert isinstance(logs, dict)
    shards = set()
    for text in logs.values():
        docs = records(text)
        (index,) = {d["shard"] for d in docs}  # every record of the process names one shard
        assert any(d["msg"] == f"shard {index}/2: recovering" for d in docs)
        shards.add(index)
    assert shards == {0, 1}

    def forwarded() -> set[int]:
        """The shards whose "recovered" record reached the gateway's log, once both did
        (Ray forwards each worker's output on its own schedule)."""
        docs = records(server.log())  # the gateway's own records and the shards', all JSON
        found = {d["shard"] for d in docs if "shard" in d and "recovered" in d["msg"]}
        return found if len(found) >= 2 else set()

    assert eventually(forwarded, timeout=30, what="both shards forwarded") == {0, 1}
    assert any(d["logger"] == "evq.serve" for d in records(server.log()))


@contextlib.contextmanager
def handle(args: list[str], out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``evq handle`` in a session of its own, its log (stderr) in ``out``, reaped whatever
    happens."""
    with out.open("ab") as sink:
        proc = subprocess.Popen(
            [*EVQ, "handle", *args, "--status-every", "0"],
            cwd=ROOT,
            env=server_env(),
            stdout=subprocess.DEVNULL,  # its status lines, not its log
            stderr=sink,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        kill_until_gone(lambda: [p for p in session_pids(proc.pid) if _alive(p)])
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


def test_a_handler_and_its_workers_log_json_naming_handler_and_queue(
    server: Server, tmp_path: Path
) -> None:
    with Client(server.url, retries=0, timeout=20) as client:
        client.create_queue("logged")
        (put,) = client.put("logged", ["hello"])
    out = tmp_path / "handle.log"
    args = [HANDLER, "--server", server.url, "--transport", "http", "--log-format", "json"]
    with handle(args, out) as proc:

        def the_workers_record() -> list[dict[str, Any]]:
            docs = records(out.read_text(errors="replace"))
            return [d for d in docs if d["msg"] == f"handled message {put.id}"]

        (worker,) = eventually(the_workers_record, timeout=90, what="the worker's record")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    docs = records(out.read_text(errors="replace"))
    assert worker["logger"] == "evq.test.handler"
    named = [d for d in docs if d.get("handler") == "log_it" and d.get("queue") == "logged"]
    assert any(d["msg"].startswith("handler log_it: handling logged") for d in named)
    assert worker in named


# A process set up as a shard is (actors.logsetup.configure), logging as fast as it can
# from its event loop into a stderr pipe nobody reads; it says on stdout when it is done.
LOGGER = textwrap.dedent(
    """
    import asyncio, logging, sys
    from actors import logsetup

    logsetup.configure(logsetup.LogConfig(format="json", mode=sys.argv[1]), shard=0)

    async def main():
        log = logging.getLogger("evq.test.flood")
        for i in range(50_000):
            log.info("record %d of a flood", i)
            if i % 1000 == 0:
                await asyncio.sleep(0)
        print("done", logsetup.dropped(), flush=True)

    asyncio.run(main())
    """
)


def flood(mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", LOGGER, mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,  # never read: the sink is stuck once the pipe is full
        text=True,
    )


def test_drop_mode_never_blocks_a_process_on_a_stuck_sink_and_block_mode_does() -> None:
    dropping = flood("drop")
    try:
        assert dropping.stdout is not None
        ready, _, _ = select.select([dropping.stdout], [], [], 30)
        assert ready, "the process blocked on its stuck log sink"
        line = dropping.stdout.readline()
        assert line.startswith("done "), line
        assert int(line.split()[1]) > 0  # the pipe filled: records were dropped, and counted
    finally:
        dropping.kill()
        dropping.communicate()
    blocking = flood("block")
    try:
        time.sleep(3)
        assert blocking.poll() is None  # still waiting for the sink: the pipe is really stuck
    finally:
        blocking.kill()
        blocking.communicate()
