"""gateway/presence.py: gateways that share a store list each other while they beat, drop
out once they stop, and are deleted long after; one without a store lists itself."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from actors.clock import ManualClock
from actors.log.store import LocalDirStore
from gateway import presence
from gateway.presence import GONE_S, PREFIX, STALE_S, Presence


def _presence(store: LocalDirStore | None, clock: ManualClock, listen: str) -> Presence:
    return Presence(store, lambda: {"listen": listen, "processes": 2, "watchers": 7}, clock)


def _listed(gateways: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    return [(g["listen"], g["self"]) for g in gateways]


async def test_gateways_of_one_store_list_each_other_until_one_stops_beating(
    tmp_path: Path,
) -> None:
    store = LocalDirStore(tmp_path)
    clock = ManualClock()
    a = _presence(store, clock, "http://a:8700")
    clock.advance(1000)
    b = _presence(store, clock, "http://b:8700")
    await a.beat()
    await b.beat()
    assert _listed(await a.gateways()) == [("http://a:8700", True), ("http://b:8700", False)]
    assert _listed(await b.gateways()) == [("http://a:8700", False), ("http://b:8700", True)]
    [first, _] = await b.gateways()
    assert (first["processes"], first["watchers"], first["pid"]) == (2, 7, a.record()["pid"])
    assert first["started_at"] < b.started_at

    clock.advance(int(STALE_S * 1000) - 1000)  # a beats no more; b goes on
    await b.beat()
    assert [g["last_seen_s"] for g in await b.gateways()] == [STALE_S - 1, 0.0]
    clock.advance(2000)
    await b.beat()
    assert _listed(await b.gateways()) == [("http://b:8700", True)]  # a is stale
    assert len(await store.list(PREFIX)) == 2  # ... but still on the board

    clock.advance(int(GONE_S * 1000))
    await b.beat()  # deletes a's record, keeps its own
    assert [json.loads(await store.get(k))["listen"] for k in await store.list(PREFIX)] == [
        "http://b:8700"
    ]
    await b.leave()
    assert await store.list(PREFIX) == []


async def test_a_gateway_without_a_store_lists_itself_as_it_is_now() -> None:
    clock = ManualClock()
    watchers = [3]
    alone = Presence(None, lambda: {"listen": None, "watchers": watchers[0]}, clock)
    await alone.beat()  # nothing to publish to
    watchers[0] = 5
    [me] = await alone.gateways()
    assert (me["self"], me["watchers"], me["last_seen_s"]) == (True, 5, 0.0)
    assert me["id"] == alone.id


async def test_what_is_not_a_gateway_s_record_is_passed_over_and_cleared(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    clock = ManualClock()
    a = _presence(store, clock, "http://a:8700")
    await a.leave()  # nothing of its own yet: nothing to delete, no error
    for name, data in [("junk", b"{not json"), ("list", b"[1, 2]"), ("anon", b'{"seen_at": 1}')]:
        await store.put(f"{PREFIX}{name}.json", data)
    clock.advance(1000)
    await a.beat()  # the three are "gone" (never seen): deleted
    assert _listed(await a.gateways()) == [("http://a:8700", True)]
    assert await store.list(PREFIX) == [f"{PREFIX}{a.id}.json"]


async def test_beating_goes_on_through_a_store_that_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(presence, "BEAT_S", 0.01)
    store = LocalDirStore(tmp_path)
    failures = [RuntimeError("the store is down"), OSError("and then this")]
    put = store.put

    async def flaky(key: str, data: bytes) -> None:
        if failures:
            raise failures.pop(0)
        await put(key, data)

    monkeypatch.setattr(store, "put", flaky)
    beating = asyncio.ensure_future(_presence(store, ManualClock(), "http://a:8700").run())
    try:
        for _ in range(500):
            if await store.list(PREFIX):
                break
            await asyncio.sleep(0.01)
        assert failures == []
        assert len(await store.list(PREFIX)) == 1  # published once the store came back
    finally:
        beating.cancel()
