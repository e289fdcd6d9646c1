"""Fixtures of the integration tests: real ``evq serve`` subprocesses on 127.0.0.1.

Each server starts its own local Ray (~4 s, ~600 MiB), so a module shares one server
(``server``) wherever a test does not need a fresh one, and every test uses queue names
of its own (``names``). Servers are always stopped gracefully at the end of their fixture
and their whole session (Ray included) is reaped by :mod:`tests.integration.server`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.shard import placement
from evq.client import Client
from tests.integration.server import Server

SHARDS = 2  # the shared servers run two shards, so that queues land on different ones

_serial = itertools.count()


class ServerFactory:
    """Starts servers on fresh data directories and stops every one of them at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.servers: list[Server] = []

    def __call__(
        self,
        *args: str,
        data: Path | None = None,
        start: bool = True,
        wait_ready: bool = True,
        env: dict[str, str] | None = None,
    ) -> Server:
        """A server with ``args`` on ``data`` (default: a new directory), started
        (``env``: its environment, else the suite's)."""
        if data is None:
            data = self.root / f"data-{next(_serial)}"
        server = Server(data, *args, env=env)
        self.servers.append(server)
        if start:
            server.start(wait_ready=wait_ready)
        return server

    def close(self) -> None:
        """Stop every server gracefully (kill on failure) and reap its session."""
        errors = []
        for server in self.servers:
            if server.proc is None:
                continue
            try:
                if server.running():
                    server.stop(timeout=45)
                else:
                    server._reap_session(0)
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
                server.kill()
        if errors:
            raise errors[0]


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """A factory of servers that live as long as the test."""
    factory = ServerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server (two shards) shared by the tests of a module."""
    factory = ServerFactory(tmp_path_factory.mktemp("evq"))
    try:
        yield factory("--shards", str(SHARDS))
    finally:
        factory.close()


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    """A JSON client of the shared server, without retries (errors show as they are)."""
    with Client(server.url, retries=0, timeout=20) as c:
        yield c


class Names:
    """Unique queue names for one test (the shared server outlives it)."""

    def __init__(self, test: str) -> None:
        self.stem = re.sub(r"[^A-Za-z0-9_-]", "-", test)[:40].strip("-")

    def __call__(self, label: str = "q", *, fifo: bool = False) -> str:
        name = f"{self.stem}-{label}-{next(_serial)}"
        return name + ".fifo" if fifo else name

    def on_shard(self, shard: int, label: str = "q", count: int = SHARDS) -> str:
        """A fresh name placed on ``shard`` of ``count`` (actors.shard.placement)."""
        for _ in range(10_000):
            name = self(label)
            if placement(name, count) == shard:
                return name
        raise AssertionError("no name found for the shard")


@pytest.fixture
def names(request: pytest.FixtureRequest) -> Names:
    """Queue names unique to this test."""
    return Names(request.node.name)
