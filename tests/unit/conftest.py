"""Fixtures shared by the unit tests of several packages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from actors.log.store import LocalDirStore
from actors.settings import QueueSettings
from actors.shard import QueueShard


@pytest.fixture
async def budgeted_shard(tmp_path: Path) -> AsyncIterator[QueueShard]:
    """A started shard on a local store with a memory budget (far away: 1 TiB; a test moves
    ``shard.memory.budget``) and one queue, ``q``; closed after the test."""
    store = LocalDirStore(tmp_path)
    shard = QueueShard(0, 1, store, memory_budget_bytes=1 << 40)
    await shard.start()
    try:
        await shard.create("q", QueueSettings(), [])
        yield shard
    finally:
        await shard.close()
        await store.close()
