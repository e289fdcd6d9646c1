"""Fixtures of the pipeline tests: one real SparkSession (local mode) for the whole session,
and logs written once by the real engine (``logs.py``)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline.session import spark_session
from tests.pipeline.logs import BusyLog, write_bad_log, write_busy_log


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] session with the evq data source (started once: ~10 s)."""
    session = spark_session("local[2]", app="evq-pipeline-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def busy_log(tmp_path_factory: pytest.TempPathFactory) -> BusyLog:
    """The busy log (read-only: copy it before changing it)."""
    return asyncio.run(write_busy_log(tmp_path_factory.mktemp("busy") / "data"))


@pytest.fixture(scope="session")
def bad_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A log the audit must object to, and what it should find."""
    root = tmp_path_factory.mktemp("bad") / "data"
    return root, asyncio.run(write_bad_log(root))


@pytest.fixture
def busy_copy(busy_log: BusyLog, tmp_path: Path) -> Path:
    """A private copy of the busy log."""
    target = tmp_path / "copy"
    shutil.copytree(busy_log.root, target)
    return target
