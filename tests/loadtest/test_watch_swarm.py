"""loadtest/watch_swarm.py (the package loadtest/swarm/ behind a thin script) without
``evq serve``: the script's docstring is its ``--help``, the options are checked, a client
process's swarm arms its watchers on the profiler's lean WebSocket server, the memory
profile's PUTs wait for the gateway's ``/readyz`` (a stand-in gateway recovering), the
server's processes are found by their listening port, and the summary reads as a table (the
tests that start a process or open sockets are marked ``integration``; each takes well under
a second).

The tool against a real server is a documented command (loadtest/RESULTS.md), bounded by
its own options; it is not part of the suite."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

from swarm import memprof
from swarm.cli import parse_args
from swarm.client import Swarm, SwarmSpec
from swarm.common import C_ARMED, C_CONNECTED, C_FAILED, N_COUNTERS, now
from swarm.http_client import Http
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


class Recovering:
    """A stand-in for the profile server: its control port answers at once; its gateway
    answers ``/readyz`` 503 until asked ``polls`` times, and a PUT 503 until then, as a
    gateway whose shard is still recovering does."""

    def __init__(self, polls: int) -> None:
        self.polls, self.asked, self.versions = polls, 0, 0

    @property
    def ready(self) -> bool:
        return self.asked >= self.polls

    async def gc(self, request: web.Request) -> web.Response:
        return web.json_response([0, 0, 0])

    async def readyz(self, request: web.Request) -> web.Response:
        self.asked += 1
        if self.ready:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "recovering"}, status=503)

    async def put(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.json_response({"message": "shard 0 is still recovering"}, status=503)
        self.versions += 1
        return web.json_response({"version": self.versions})

    def apps(self) -> tuple[web.Application, web.Application]:
        control, gateway = web.Application(), web.Application()
        control.router.add_get("/_profile/gc", self.gc)
        gateway.router.add_get("/readyz", self.readyz)
        gateway.router.add_put("/v1/keys/{key}", self.put)
        return control, gateway


Serve = Callable[[web.Application], Awaitable[TestServer]]


@pytest.fixture
def idle_process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process standing for the profile server's (its pid, its exit status)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)


async def _profile_args(fake: Recovering, serve: Serve, kind: str) -> argparse.Namespace:
    control, gateway = fake.apps()
    ctl, gw = await serve(control), await serve(gateway)
    return argparse.Namespace(
        host="127.0.0.1", port=gw.port, control_port=ctl.port, profile_kind=kind
    )


@pytest.mark.integration  # a subprocess or sockets
async def test_the_profiles_puts_wait_until_the_gateway_has_recovered(
    aiohttp_server: Any, idle_process: subprocess.Popen[bytes]
) -> None:
    fake = Recovering(polls=2)
    args = await _profile_args(fake, aiohttp_server, "gateway")
    ctl = Http(args.host, args.control_port)
    await memprof._await_server(args, ctl, idle_process)
    run = await memprof._profile_puts(args, ctl, idle_process.pid, 32)  # a 503 would raise
    assert (fake.versions, run["gc_collections"]) == (32, [0, 0, 0])
    assert fake.asked == 2  # a 503, then a 200
    ctl.close()


@pytest.mark.integration  # a subprocess or sockets
async def test_a_gateway_that_never_recovers_is_a_clear_error(
    aiohttp_server: Any, idle_process: subprocess.Popen[bytes]
) -> None:
    args = await _profile_args(Recovering(polls=10**9), aiohttp_server, "gateway")
    ctl = Http(args.host, args.control_port)
    with pytest.raises(RuntimeError, match=r"gateway was not ready within 0\.5 s") as exc:
        await memprof._await_server(args, ctl, idle_process, ready_timeout_s=0.5)
    assert "GET /readyz: 503" in str(exc.value)
    assert "recovering" in str(exc.value)
    ctl.close()


@pytest.mark.integration  # a subprocess or sockets
async def test_only_the_gateway_has_a_readiness_to_wait_for(
    aiohttp_server: Any, idle_process: subprocess.Popen[bytes]
) -> None:
    fake = Recovering(polls=10**9)
    args = await _profile_args(fake, aiohttp_server, "bare")
    ctl = Http(args.host, args.control_port)
    await memprof._await_server(args, ctl, idle_process, ready_timeout_s=0.5)
    assert fake.asked == 0
    ctl.close()


@pytest.fixture
def exited_process() -> subprocess.Popen[bytes]:
    """A process that has exited with 3 (a profile server that failed)."""
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait(10)
    return proc


@pytest.mark.integration  # a subprocess or sockets
async def test_a_profile_server_that_exited_is_a_clear_error(
    aiohttp_server: Any, exited_process: subprocess.Popen[bytes]
) -> None:
    args = await _profile_args(Recovering(polls=1), aiohttp_server, "gateway")
    with pytest.raises(RuntimeError, match="did not start: it exited with 3"):
        await memprof._await_server(args, Http(args.host, args.control_port), exited_process)


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
