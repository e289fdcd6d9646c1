"""The server's own events as watch keys (gateway/watches/sysevents.py): ``sys:placement``
follows a resize, ``sys:shards`` each shard's state, ``sys:queues`` the queues created and
deleted; each changes version only when what it says changes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.watches import sysevents
from tests.unit.gateway.conftest import Api, Serve
from tests.unit.gateway.test_resize import _resize


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sysevents, "SYS_POLL_S", 0.05)


async def _next(api: Api, key: str, version: int) -> dict[str, Any]:
    reply = await api.call("GET", f"/v1/watch/{key}?version={version}&timeout=10")
    assert reply.status == 200, (key, reply.status)
    return dict(reply.doc)


async def test_sys_keys_say_the_map_the_shards_and_the_queues(serve: Serve) -> None:
    api = await serve(count=1)
    placed = await _next(api, "sys:placement", 0)
    assert placed["value"] == {"generation": 0, "count": 1}
    shards = await _next(api, "sys:shards", 0)
    states = [shards["value"]["shards"][0]["state"]]
    while states[-1] != "ready":  # what the first looks saw at the start: then ready
        shards = await _next(api, "sys:shards", shards["version"])
        states.append(shards["value"]["shards"][0]["state"])
    assert set(states) <= {"starting", "recovering", "ready"}
    assert shards["value"] == {"count": 1, "shards": [{"index": 0, "state": "ready"}]}
    queues = await _next(api, "sys:queues", 0)
    assert queues["value"] == {"count": 0, "created": [], "deleted": []}

    waiting = asyncio.ensure_future(_next(api, "sys:queues", queues["version"]))
    await api.create("alpha")
    await api.create("beta")
    got = await waiting
    created = list(got["value"]["created"])
    if got["value"]["count"] == 1:  # the two creations fell in two looks
        got = await _next(api, "sys:queues", got["version"])
        created += got["value"]["created"]
    assert (sorted(created), got["value"]["count"]) == (["alpha", "beta"], 2)
    await api.ok("DELETE", "/v1/queues/alpha", status=204)
    gone = await _next(api, "sys:queues", got["version"])
    assert gone["value"] == {"count": 1, "created": [], "deleted": ["alpha"]}

    following = asyncio.ensure_future(_next(api, "sys:placement", placed["version"]))
    more = asyncio.ensure_future(_next(api, "sys:shards", shards["version"]))
    assert (await _resize(api, 3))["state"] == "done"
    seen = await following
    while seen["value"]["count"] != 3:
        seen = await _next(api, "sys:placement", seen["version"])
    assert seen["value"]["generation"] >= 1
    states = await more
    seen_states = set()
    # The value names a new shard as soon as it exists: it may say "recovering" a look or
    # two before "ready" (CI, 2026-12-01). Each look's states are ones a shard passes by.
    while states["value"]["count"] != 3 or any(
        s["state"] != "ready" for s in states["value"]["shards"]
    ):
        seen_states |= {s["state"] for s in states["value"]["shards"]}
        states = await _next(api, "sys:shards", states["version"])
    assert seen_states <= {"starting", "recovering", "ready"}, seen_states
    assert [s["state"] for s in states["value"]["shards"]] == ["ready"] * 3
    assert [s["index"] for s in states["value"]["shards"]] == [0, 1, 2]


async def test_a_sys_key_changes_version_only_when_its_value_changes(api: Api) -> None:
    first = await _next(api, "sys:placement", 0)
    reply = await api.call("GET", f"/v1/watch/sys:placement?version={first['version']}&timeout=0.5")
    assert reply.status == 204  # nothing changed in several looks
    again = await api.ok("GET", "/v1/keys/sys:placement")
    assert again == first
