"""Fixtures for the log's store tests: every ObjectStore implementation.

The S3 flavour talks to moto's real S3 server (``s3_server`` in ``tests/conftest.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from obstore.store import MemoryStore

from actors.log.faults import FaultyStore
from actors.log.obstore_store import ObstoreStore
from actors.log.store import LocalDirStore, ObjectStore
from tests.conftest import S3Server


def _local(tmp_path: Path) -> ObjectStore:
    return LocalDirStore(tmp_path / "store")


def _memory(tmp_path: Path) -> ObjectStore:
    return ObstoreStore(MemoryStore(), "memory://")


def _faulty_memory(tmp_path: Path) -> ObjectStore:
    # An empty schedule: the wrapper must be invisible.
    return FaultyStore(ObstoreStore(MemoryStore(), "memory://"))


_FACTORIES: dict[str, Callable[[Path], ObjectStore]] = {
    "local": _local,
    "memory": _memory,
    "faulty-memory": _faulty_memory,
}


@pytest.fixture(
    params=[
        "local",
        "memory",
        "faulty-memory",
        pytest.param("s3", marks=pytest.mark.integration),
    ]
)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    """Each ObjectStore implementation in turn, empty."""
    if request.param == "s3":
        s3: S3Server = request.getfixturevalue("s3_server")
        st: ObjectStore = s3.store()
    else:
        st = _FACTORIES[request.param](tmp_path)
    yield st
    await st.close()


@pytest.fixture
async def local_store(tmp_path: Path) -> AsyncIterator[LocalDirStore]:
    """A LocalDirStore under a root that does not exist yet."""
    st = LocalDirStore(tmp_path / "store")
    yield st
    await st.close()
