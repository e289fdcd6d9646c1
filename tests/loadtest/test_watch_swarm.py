"""loadtest/watch_swarm.py (the package loadtest/swarm/ behind a thin script) without
``evq serve``: the script's docstring is its ``--help``, the options are checked, a client
process's swarm arms its watchers on the profiler's lean WebSocket server, the server's
processes are found by their listening port, and the summary reads as a table (the tests
that start a process or open sockets are marked ``integration``; each takes well under a
second).

The tool against a real server is a documented command (loadtest/RESULTS.md), bounded by
its own options; it is not part of the suite."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

from swarm import memprof
from swarm.cli import parse_args
from swarm.client import Swarm, SwarmSpec
from swarm.common import C_ARMED, C_CONNECTED, C_FAILED, N_COUNTERS, now
from swarm.memprof_server import LeanWs
from swarm.report import table
from swarm.server import fds, rss, server_processes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration  # a subprocess or sockets
def test_help_is_the_scripts_docstring_and_every_option() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "loadtest" / "watch_swarm.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.startswith("usage: watch_swarm.py ")
    assert "A swarm of one-shot watchers against ``evq serve`` (issue 5)." in out
    for option in ("--serve", "--mode {ws,poll}", "--burst BURST", "--profile-memory"):
        assert option in out
    assert memprof.ENTRY == ROOT / "loadtest" / "watch_swarm.py"  # --profile-server runs it


@pytest.mark.parametrize(
    "argv",
    [["-n", "0"], ["--url", "http://10.0.0.1:8700"], ["-n", "20000", "--procs", "1"]],
)
def test_bad_arguments_exit_with_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2


def test_watchers_are_spread_over_client_processes_and_sources() -> None:
    args = parse_args(["-n", "30000", "--keys", "3", "--url", "http://127.0.0.1:9000"])
    assert (args.procs, args.sources, args.host, args.port) == (3, 3, "127.0.0.1", 9000)
    assert len(args.key_list) == 3
    assert all(k.startswith("swarm-") for k in args.key_list)


@pytest.mark.integration  # a subprocess or sockets
async def test_a_swarm_arms_every_watcher_on_the_lean_server() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(LeanWs, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    spec = SwarmSpec(
        index=0,
        host="127.0.0.1",
        port=port,
        mode="ws",
        keys=["k"],
        sources=["127.0.0.2"],
        connect_concurrency=8,
        connect_timeout_s=5.0,
        retries=0,
        poll_timeout_s=5.0,
        deadline=now() + 60,
    )
    swarm = Swarm(spec, [0] * N_COUNTERS)
    try:
        result = await swarm.connect(20, 0, 1, 10.0)
    finally:
        swarm.close()
        server.close()
        await server.wait_closed()
    counters = result["counters"]
    assert (counters[C_CONNECTED], counters[C_ARMED], counters[C_FAILED]) == (20, 20, 0)


@pytest.fixture
def listener() -> Iterator[tuple[int, int]]:
    """A child process listening on a free port: (its pid, the port)."""
    code = (
        "import socket, sys\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    try:
        yield child.pid, int(child.stdout.readline())
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)
        child.stdout.close()


@pytest.mark.integration  # a subprocess or sockets
def test_the_server_is_the_process_listening_on_the_port(listener: tuple[int, int]) -> None:
    pid, port = listener
    assert server_processes(port, None) == [pid]
    assert server_processes(port, pid) == [pid]
    assert rss([pid])[0] > 0
    assert fds(pid) >= 3


@pytest.mark.integration  # a subprocess or sockets
def test_a_process_that_is_gone_holds_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert rss([child.pid]) == [0]
    assert fds(child.pid) == -1


def test_the_summary_is_a_table_of_labelled_rows() -> None:
    doc = {
        "machine": {"nproc": 2, "mem_total_gib": 8.0, "load_start": [0.1, 0.2, 0.3]},
        "config": {"n": 3, "mode": "ws", "keys": 1, "procs": 1, "sources": 1},
        "server": {"url": "http://127.0.0.1:8700"},
        "correctness": {
            "at_final_version": 3,
            "watchers_requested": 3,
            "not_at_final_version": 0,
            "lost_connections": 0,
            "errors": 0,
        },
        "failure": "TimeoutError: late",
    }
    lines = table(doc).splitlines()
    assert lines[0] == "machine      2 cores, 8.0 GiB, load [0.1, 0.2, 0.3]"
    assert "correctness  3/3 at the final version; 0 not; lost 0; errors 0" in lines
    assert lines[-1] == "FAILED       TimeoutError: late"
