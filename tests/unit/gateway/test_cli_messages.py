"""`evq peek`, `evq touch` and `evq release` against the real app over in-process shards
(real HTTP, the real client): what they print, what they change, their exit codes."""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import Any

import pytest

from evq.cli import main as cli
from evq.client import Client
from tests.unit.gateway.conftest import Api


class Run:
    """One finished ``evq`` command."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def docs(self) -> list[Any]:
        """stdout as JSON lines."""
        return [json.loads(line) for line in self.out.splitlines()]

    def rows(self) -> list[list[str]]:
        """stdout as a table: the cells of each line after the header."""
        return [line.split("  ") for line in self.out.splitlines()[1:]]

    def __repr__(self) -> str:
        return f"Run({self.code}, out={self.out!r}, err={self.err!r})"


async def evq(api: Api, *argv: str) -> Run:
    """``evq argv…`` with a real client of the test server (in a thread: it blocks)."""
    server = api.client.server

    def run() -> Run:
        out, err = io.StringIO(), io.StringIO()
        with Client(f"http://{server.host}:{server.port}", retries=0) as client:
            code = cli.main(list(argv), client=client, stdout=out, stderr=err)
        return Run(code, out.getvalue(), err.getvalue())

    return await asyncio.to_thread(run)


async def test_peek_prints_ready_messages_in_take_order_and_takes_nothing(api: Api) -> None:
    await api.create("q")
    a, b = await api.put("q", "first", {"body": "urgent", "activate_at": time.time() - 60})
    r = await evq(api, "peek", "q")
    assert r.code == 0, r
    assert r.out.splitlines()[0].split() == ["ID", "RECEIVES", "ACTIVE_AT", "BODY"]
    assert [(row[0], row[-1]) for row in r.rows()] == [(b, "urgent"), (a, "first")]
    assert r.err == ""  # no more pages
    assert (await api.stats("q"))["ready"] == 2


async def test_peek_pages_with_a_cursor_and_all_follows_every_page(api: Api) -> None:
    await api.create("q")
    ids = await api.put("q", *[{"body": f"m{i}", "delay": 60 + i} for i in range(5)])
    first = await evq(api, "peek", "q", "--state", "delayed", "-n", "2")
    assert [row[0] for row in first.rows()] == ids[:2]
    assert first.err.startswith("more: evq peek q --state delayed --after delayed.")
    after = first.err.split("--after ")[1].strip()
    second = await evq(
        api, "--json", "peek", "q", "--state", "delayed", "-n", "2", "--after", after
    )
    [page] = second.docs()
    assert [m["id"] for m in page["messages"]] == ids[2:4]
    assert page["next"] is not None
    every = await evq(api, "--json", "peek", "q", "--state", "delayed", "-n", "2", "--all")
    assert [d["id"] for d in every.docs()] == ids
    assert {d["state"] for d in every.docs()} == {"delayed"}


async def test_peek_of_reserved_shows_lease_expiry_and_touch_extends_it(api: Api) -> None:
    await api.create("q")
    await api.put("q", "work")
    [m] = await api.take("q", 1, visibility_timeout=5)
    r = await evq(api, "--json", "peek", "q", "--state", "reserved")
    [shown] = r.docs()[0]["messages"]
    assert (shown["id"], shown["lease_expires_at"]) == (m["id"], m["lease_expires_at"])
    assert "lease" not in shown
    touched = await evq(api, "touch", "q", m["id"], m["lease"], "--visibility-timeout", "600")
    assert touched.code == 0, touched
    assert touched.out.split()[:2] == [m["id"], "ok"]
    r = await evq(api, "--json", "peek", "q", "--state", "reserved")
    [shown] = r.docs()[0]["messages"]
    assert shown["lease_expires_at"] >= m["lease_expires_at"] + 590
    human = await evq(api, "peek", "q", "--state", "reserved")
    assert human.out.splitlines()[0].split() == ["ID", "RECEIVES", "EXPIRES", "BODY"]


async def test_touch_with_a_stale_lease_exits_1(api: Api) -> None:
    await api.create("q")
    await api.put("q", "work")
    [m] = await api.take("q", 1)
    r = await evq(api, "--json", "touch", "q", m["id"], "not-the-lease")
    assert r.code == 1, r
    assert r.docs() == [
        {"results": [{"id": m["id"], "status": "stale_lease", "lease_expires_at": None}]}
    ]
    assert "StaleLease" in r.err


@pytest.mark.parametrize("when", [["--delay", "120"], ["--at", "TIME"]])
async def test_release_gives_a_message_back_for_later(api: Api, when: list[str]) -> None:
    await api.create("q")
    await api.put("q", "work")
    [m] = await api.take("q", 1)
    at = time.time() + 120
    argv = [w if w != "TIME" else str(at) for w in when]
    r = await evq(api, "release", "q", m["id"], m["lease"], *argv)
    assert (r.code, r.out.split()) == (0, [m["id"], "ok"]), r
    view = await api.ok("GET", f"/v1/queues/q/messages/{m['id']}")
    assert view["state"] == "delayed"
    assert abs(view["activate_at"] - at) < 5


async def test_release_now_makes_it_ready_and_a_second_release_exits_1(api: Api) -> None:
    await api.create("q")
    await api.put("q", "work")
    [m] = await api.take("q", 1)
    assert (await evq(api, "release", "q", m["id"], m["lease"])).code == 0
    assert (await api.stats("q"))["ready"] == 1
    again = await evq(api, "release", "q", m["id"], m["lease"])
    assert again.code == 1
    assert "StaleLease" in again.err


@pytest.mark.parametrize(
    ("argv", "code", "err"),
    [
        (["peek", "nope"], 1, "QueueNotFound"),
        (["peek", "q", "--after", "nonsense"], 1, "BadRequest"),
        (["peek", "q", "--state", "dead"], 2, "invalid choice"),
        (["peek", "q", "-n", "0"], 2, "must be >= 1"),
        (["peek", "q", "-n", "1001"], 1, "BadRequest"),
        (["release", "q", "1", "L", "--delay", "1", "--at", "2"], 2, "not allowed with"),
    ],
)
async def test_peek_and_release_errors(api: Api, argv: list[str], code: int, err: str) -> None:
    await api.create("q")
    r = await evq(api, *argv)
    assert r.code == code, r
    assert err in r.err
