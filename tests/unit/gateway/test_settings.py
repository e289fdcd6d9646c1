"""``evq serve`` settings: the shard count's default and the checks on it."""

from __future__ import annotations

import argparse
import os

import pytest

from actors.errors import BadRequest
from gateway.settings import SHARD_MEMORY_SHARE, SHARD_PROCESS_MIB, ServerSettings, load_settings


def test_the_default_shard_count_is_one_per_two_cpus_bounded_by_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 64 * 1024**3 // 4096}  # 64 GiB
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    for cpus, expected in ((1, 1), (2, 1), (3, 1), (4, 2), (16, 8)):
        monkeypatch.setattr(os, "cpu_count", lambda cpus=cpus: cpus)
        assert ServerSettings().shard_count() == expected
    pages["SC_PHYS_PAGES"] = 2 * 1024**3 // 4096  # 2 GiB: memory bounds it
    by_memory = int(2 * 1024 * SHARD_MEMORY_SHARE / SHARD_PROCESS_MIB)
    assert ServerSettings().shard_count() == max(1, min(8, by_memory))
    assert ServerSettings(shards=5).shard_count() == 5


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_a_shard_count_below_one_is_refused(value: str) -> None:
    with pytest.raises(BadRequest, match="shards"):
        load_settings(argparse.Namespace(), {"EVQ_SHARDS": value})
    assert load_settings(argparse.Namespace(), {"EVQ_SHARDS": "3"}).shards == 3
