"""The gateway's listening site (gateway/accept.py), on uvloop and on asyncio: a burst of
connections is taken in one turn of a busy loop (libuv alone takes one per turn), HTTP is
served through it, it stops listening when cleaned up, two processes' sites share a port, and
running out of descriptors pauses taking connections instead of spinning."""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import uvloop
from aiohttp import web

from actors.clock import ManualClock
from gateway import accept
from gateway.accept import Acceptor, AcceptSite
from gateway.door import DoorRunner
from gateway.limits import PENALTIES, Refusals
from gateway.penalty import Penalties

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


def run(kind: str, main: Callable[[], Any]) -> Any:
    loop = LOOPS[kind]()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def listener(sock_class: type[socket.socket] = socket.socket) -> socket.socket:
    sock = sock_class(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    return sock


class Counting(asyncio.Protocol):
    """Notes each connection it is made for in ``made``."""

    def __init__(self, made: list[asyncio.BaseTransport]) -> None:
        self.made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.append(transport)


@pytest.mark.parametrize("kind", sorted(LOOPS))
def test_a_burst_of_connections_is_taken_in_a_few_turns_of_a_busy_loop(kind: str) -> None:
    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        made: list[asyncio.BaseTransport] = []
        sock = listener()
        server = Acceptor(loop, sock, lambda: Counting(made))
        port = sock.getsockname()[1]
        clients = []
        for _ in range(300):  # the kernel completes each handshake: all wait to be taken
            c = socket.socket()
            c.connect(("127.0.0.1", port))
            clients.append(c)
        turns = 0

        def busy() -> None:  # a loop whose every turn lasts 20 ms, as under load
            nonlocal turns
            turns += 1
            time.sleep(0.02)
            if turns < 10:
                loop.call_soon(busy)

        loop.call_soon(busy)
        while turns < 10:  # noqa: ASYNC110 (counting the loop's turns is the point)
            await asyncio.sleep(0)
        taken = len(made)
        server.close()
        for t in made:
            t.close()
        for c in clients:
            c.close()
        return taken, turns

    taken, turns = run(kind, main)
    assert turns == 10
    assert taken == 300  # libuv's own listener takes ~1 per turn: ~10


@pytest.mark.parametrize("kind", sorted(LOOPS))
def test_the_site_serves_http_and_stops_listening_when_cleaned_up(kind: str) -> None:
    async def main() -> None:
        app = web.Application()

        async def hello(request: web.Request) -> web.Response:
            return web.Response(text="hello")

        app.router.add_get("/", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        site = AcceptSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site.port
        assert port > 0
        assert site.name == f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.get(f"http://127.0.0.1:{port}/") as r:
                    assert r.status == 200
                    assert await r.text() == "hello"
        await runner.cleanup()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)

    run(kind, main)


def test_two_sites_share_a_port_with_reuse_port() -> None:
    async def main() -> None:
        runners, sites = [], []
        for _ in range(2):
            runner = web.AppRunner(web.Application())
            await runner.setup()
            port = sites[0].port if sites else 0
            site = AcceptSite(runner, "127.0.0.1", port, reuse_port=True)
            await site.start()
            runners.append(runner)
            sites.append(site)
        assert sites[0].port == sites[1].port
        without = AcceptSite(runners[0], "127.0.0.1", sites[0].port)
        with pytest.raises(OSError, match="in use") as raised:
            await without.start()  # not sharing: the port is taken
        assert raised.value.errno == errno.EADDRINUSE
        for runner in runners:
            await runner.cleanup()

    run("uvloop", main)


class OutOfDescriptors(socket.socket):
    """A listening socket whose first ``fail`` accepts fail with EMFILE."""

    fail = 0
    tries = 0

    def accept(self) -> tuple[socket.socket, Any]:
        type(self).tries += 1
        if type(self).fail:
            type(self).fail -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


def test_running_out_of_descriptors_pauses_taking_connections_then_resumes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(accept, "RESOURCE_PAUSE_S", 0.3)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        made: list[asyncio.BaseTransport] = []
        OutOfDescriptors.fail, OutOfDescriptors.tries = 1, 0
        sock = listener(OutOfDescriptors)
        server = Acceptor(loop, sock, lambda: Counting(made))
        client = socket.socket()
        client.connect(sock.getsockname())
        await asyncio.sleep(0.15)
        # one failed try, then no more while paused (a readable socket would spin)
        assert OutOfDescriptors.tries == 1
        assert made == []
        deadline = loop.time() + 5
        while not made and loop.time() < deadline:  # noqa: ASYNC110 (polls a plain list)
            await asyncio.sleep(0.02)
        assert len(made) == 1  # taken once the pause ended
        server.close()
        assert not server.is_serving()
        await server.wait_closed()
        made[0].close()
        client.close()

    run("uvloop", main)


async def _send_from(source: str, port: int, request: bytes) -> bytes:
    """``request`` on a new connection from ``source``; all that comes back."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(request)
    try:
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        return b"<reset>"
    finally:
        writer.close()


@pytest.mark.parametrize("kind", sorted(LOOPS))
def test_an_address_whose_requests_fail_as_http_is_refused_at_accept(kind: str) -> None:
    """Two requests that do not parse from 127.0.0.2 (the limit): its next connections get
    a 429 with Retry-After as soon as they are taken, before aiohttp sees them, until the
    ban ends; 127.0.0.1 is served throughout."""

    async def main() -> None:
        app = web.Application()

        async def hello(request: web.Request) -> web.Response:
            return web.Response(text="hello")

        app.router.add_get("/", hello)
        clock = ManualClock()
        app[PENALTIES] = Refusals(Penalties(limit=2, window_s=10, ban_s=30), clock)
        runner = DoorRunner(app)
        await runner.setup()
        site = AcceptSite(runner, "127.0.0.1", 0)
        await site.start()
        good = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        smuggled = b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
        try:
            for _ in range(2):
                answer = await _send_from("127.0.0.2", site.port, smuggled)
                assert answer.startswith(b"HTTP/1.0 400 "), answer
            for source in ("127.0.0.2", "127.0.0.2"):
                answer = await _send_from(source, site.port, good)
                assert answer.startswith(b"HTTP/1.1 429 "), answer
                assert b"\r\nRetry-After: 30\r\n" in answer
                assert b'"code": "Overloaded"' in answer
            assert (await _send_from("127.0.0.1", site.port, good)).endswith(b"hello")
            clock.advance(31_000)  # the ban is over
            assert (await _send_from("127.0.0.2", site.port, good)).endswith(b"hello")
            penalties = app[PENALTIES].penalties
            assert (penalties.offences, penalties.bans, penalties.refusals) == (
                {"malformed": 2},
                1,
                2,
            )
        finally:
            await runner.cleanup()

    run(kind, main)


def _connects_from(source: str, port: int, within: float) -> bool:
    """Whether a connection from ``source`` is set up within ``within`` seconds."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(within)
    try:
        sock.connect(("127.0.0.1", port))
        return True
    except TimeoutError:
        return False
    finally:
        sock.close()


@pytest.mark.parametrize("kind", sorted(LOOPS))
def test_an_address_that_goes_on_connecting_while_refused_is_dropped_by_the_kernel(
    kind: str,
) -> None:
    """Refused, 127.0.0.2 connects again and again: past ``silence_after`` refusals the
    listening socket's filter drops its SYNs (its connections never come up, the gateway
    never sees them) until the ban ends; 127.0.0.1 connects and is served throughout."""

    async def main() -> None:
        app = web.Application()

        async def hello(request: web.Request) -> web.Response:
            return web.Response(text="hello")

        app.router.add_get("/", hello)
        penalties = Penalties(limit=1, window_s=10, ban_s=1.5, silence_after=3)
        app[PENALTIES] = Refusals(penalties)
        runner = DoorRunner(app)
        await runner.setup()
        site = AcceptSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site.port
        good = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        loop = asyncio.get_running_loop()
        try:
            assert (await _send_from("127.0.0.2", port, b"\x00\r\n\r\n")).startswith(
                b"HTTP/1.0 400"
            )
            for _ in range(3):
                assert (await _send_from("127.0.0.2", port, good)).startswith(b"HTTP/1.1 429")
            assert penalties.silent.keys() == {"127.0.0.2"}
            dropped = await loop.run_in_executor(None, _connects_from, "127.0.0.2", port, 0.5)
            assert not dropped
            assert (await _send_from("127.0.0.1", port, good)).endswith(b"hello")
            assert penalties.refusals == 3  # the dropped one never reached the gateway
            await asyncio.sleep(1.6)  # the ban is over: the filter is lifted
            assert (await _send_from("127.0.0.2", port, good)).endswith(b"hello")
            assert not penalties.silent
        finally:
            await runner.cleanup()

    run(kind, main)
