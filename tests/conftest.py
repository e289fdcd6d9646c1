"""Fixtures shared by every test directory: a local S3 server (moto) for the real-S3 cases;
the JVM options of every Spark the tests start; how pytest-xdist shares out the modules.

The S3 server is moto's real S3 server on 127.0.0.1 (started once per session, only when a
test asks for it); each store gets a fresh key prefix in one shared bucket, or a given one
when several stores must see the same objects (two incarnations of a queue).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from obstore.store import S3Store

from actors.log.obstore_store import ObstoreStore, s3_config
from loadtest.ports import free_port as free_port  # the tests import it from here

# The checks shared by several test modules live in helpers; pytest explains a failed
# ``assert`` only in the modules it rewrites, so it rewrites these too (before their import).
pytest.register_assert_rewrite("tests.integration", "tests.loadtest", "tests.fault")

BUCKET = "evq-test"
# moto accepts any credentials; real-looking values keep obstore's signer content.
CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing"}
REGION = "us-east-1"

_prefixes = itertools.count()

# Every Spark the tests start (the session fixture's, ``evq pipeline`` and spark-submit in
# subprocesses, which inherit the environment) runs small jobs in a JVM that lives seconds to
# minutes: C1 alone and the serial collector spend less CPU than the C2 compiler and parallel
# collector win back (tests/pipeline/test_jobs.py: 97 s of CPU instead of 167), and no web UI.
# Spark's launcher adds SPARK_SUBMIT_OPTS to the driver's JVM and reads spark.* properties.
os.environ.setdefault(
    "SPARK_SUBMIT_OPTS",
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dspark.ui.enabled=false",
)


@dataclass(frozen=True)
class S3Server:
    """A running moto S3 server and the bucket the tests share."""

    endpoint: str
    bucket: str

    def store(self, prefix: str | None = None) -> ObstoreStore:
        """An ObstoreStore over S3Store under a fresh (or the given) prefix of the bucket."""
        prefix = prefix or f"t{next(_prefixes)}"
        config, client_options = s3_config(
            {}, {"endpoint": self.endpoint, "region": REGION, **CREDENTIALS}
        )
        inner = S3Store(self.bucket, prefix=prefix, config=config, client_options=client_options)
        return ObstoreStore(inner, f"s3://{self.bucket}/{prefix}")

    def fresh_prefix(self) -> str:
        """A key prefix no other store of this session uses."""
        return f"t{next(_prefixes)}"

    def boto3_client(self):  # type: ignore[no-untyped-def]
        """A boto3 S3 client for looking behind the store's back (close it after use)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=CREDENTIALS["access_key_id"],
            aws_secret_access_key=CREDENTIALS["secret_access_key"],
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1 with one bucket, for the whole session."""
    from moto.server import ThreadedMotoServer

    from loadtest.moto_s3 import atomic_conditional_writes

    atomic_conditional_writes()  # as S3: of racing conditional puts, one wins
    # werkzeug logs every request at INFO; keep failure reports readable.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        s3 = S3Server(f"http://127.0.0.1:{port}", BUCKET)
        client = s3.boto3_client()
        try:
            client.create_bucket(Bucket=BUCKET)
        finally:
            client.close()
        yield s3
    finally:
        server.stop()


# ------------------------------------------------------------------ pytest-xdist

# Modules whose tests run on one worker, one after the other, beside everything else: those
# that start Spark (one SparkSession per worker process: a JVM of ~1.7 GiB and ~10 s of CPU,
# started once if they share a worker), and the campaigns that load a server to its limits
# and judge how it recovers (overload, chaos): never at the same time as Spark or each other.
_WORKER_GROUPS = {
    "tests/pipeline/": "heavy",
    "tests/integration/test_overload.py": "heavy",
    "tests/integration/test_chaos.py": "heavy",
}


# The order in which the scopes go out: the longest first, so that the last ones running
# are short and no worker idles while another finishes a long module (longest processing
# time first). The "heavy" group (~6 minutes of one worker) goes at once; then the modules
# that start servers, Ray or Spark; then the in-process tests, the most tests first.
_LONG_FIRST = ("tests/integration/", "tests/fault/", "tests/loadtest/")


def _rank(scope: str, tests: int) -> tuple[int, int]:
    """Where ``scope`` (of ``tests`` tests) goes in the queue: lower goes sooner."""
    if scope in _WORKER_GROUPS.values():
        return (0, -tests)
    return (1 if scope.startswith(_LONG_FIRST) else 2, -tests)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``pytest -n N --dist loadfile`` (``make test``), a module's tests stay on one
    worker (its module-scoped servers start once), and the modules of ``_WORKER_GROUPS``
    share one; the scopes go out in the order of :func:`_rank`. (Not ``--dist loadgroup``
    with marks: xdist 3.8 renames the node ids to carry the group, which pytest 9 ignores,
    so every test went its own way.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModuleScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next(
                (g for prefix, g in _WORKER_GROUPS.items() if path.startswith(prefix)), path
            )

        def _assign_work_unit(self, node: Any) -> None:
            first = min(self.workqueue, key=lambda scope: _rank(scope, len(self.workqueue[scope])))
            self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)
