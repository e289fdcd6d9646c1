"""The contract's routes that this version does not serve yet (gateway/planned.py) answer
501 NotImplemented in the API's error model, JSON or msgpack, and the contract names each."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gateway.planned import PLANNED
from tests.unit.gateway.conftest import Api

ROOT = Path(__file__).resolve().parents[3]
ROUTES = sorted(PLANNED)


def _concrete(route: str) -> str:
    return route.replace("{name}", "orders").replace("{id}", "task-1")


@pytest.mark.parametrize(("method", "route"), ROUTES, ids=[f"{m} {r}" for m, r in ROUTES])
async def test_a_route_not_built_yet_answers_501_not_implemented(
    api: Api, method: str, route: str
) -> None:
    path = _concrete(route)
    async with api.client.request(method, path, json={"count": 2}) as resp:
        assert resp.status == 501
        doc = await resp.json()
    assert doc["error"]["code"] == "NotImplemented"
    assert PLANNED[(method, route)] in doc["error"]["message"]
    headers = {"Accept": "application/msgpack"}
    async with api.client.request(method, path, headers=headers) as resp:
        assert (resp.status, resp.content_type) == (501, "application/msgpack")
        assert msgspec.msgpack.decode(await resp.read())["error"]["code"] == "NotImplemented"


def test_the_contract_names_every_route_not_built_yet() -> None:
    contract = (ROOT / "docs" / "API.md").read_text()
    for method, route in ROUTES:
        written = route.replace("/resume", "/pause")  # written "`…/pause` / `…/resume`"
        assert f"`{method} {written}" in contract, route
