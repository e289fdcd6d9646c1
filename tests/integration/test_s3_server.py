"""``evq serve --store s3://bucket/prefix`` end to end, against moto's S3 server on 127.0.0.1.

One store lives through four server runs (the shards keep a local copy of the log to read
bodies back from): puts, takes and acks; a graceful restart that
keeps every message and lease; puts in flight when the whole server (Ray and shards
included) is killed with SIGKILL, after which every put that was answered is there; then
the pipeline (``evq pipeline stats`` and ``audit``, PySpark in local mode, subprocesses
with the same AWS environment) reads the store and accounts for every message. Snapshots are
taken every few records, so the restarts and the writes prune the live log as they go: the
pipeline counts every put from the archive and what is left of the live log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from actors.errors import QueueError
from actors.log import keys
from actors.shard import placement
from evq.client import Client
from tests.conftest import CREDENTIALS, REGION, S3Server
from tests.integration.server import ROOT, Server, server_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

QUEUE = "s3-jobs"
BOTH_JOBS = """
import json, sys
from evq.cli.main import main
sys.exit(max(main(argv) for argv in json.loads(sys.argv[1])))
"""


def aws_env() -> dict[str, str]:
    """The environment of every process that reaches the store: moto's credentials."""
    return server_env(
        AWS_ACCESS_KEY_ID=CREDENTIALS["access_key_id"],
        AWS_SECRET_ACCESS_KEY=CREDENTIALS["secret_access_key"],
        AWS_REGION=REGION,
    )


def put_until_refused(url: str, acknowledged: list[str], stop: threading.Event) -> None:
    """Put batches of ten until the server stops answering; note the ids it answered."""
    with Client(url, retries=0, timeout=10) as client:
        n = 0
        while not stop.is_set():
            try:
                results = client.put(QUEUE, [f"late-{n}-{i}" for i in range(10)])
            except QueueError:
                return
            acknowledged += [r.id for r in results]
            n += 1


def take_all(client: Client) -> dict[str, str]:
    """Every ready message: id -> body (taken for ten minutes)."""
    found: dict[str, str] = {}
    while batch := client.take(QUEUE, 1000, visibility_timeout=600):
        found.update((m.id, m.body_text) for m in batch)
    return found


def test_a_server_on_s3_keeps_every_acknowledged_message_and_the_pipeline_reads_it(
    s3_server: S3Server, tmp_path: Path
) -> None:
    prefix = s3_server.fresh_prefix()
    store = f"s3://{s3_server.bucket}/{prefix}"
    server = Server(
        tmp_path / "unused",
        *("--store", store, "--endpoint", s3_server.endpoint, "--region", REGION),
        *("--shards", "2", "--segment-cache", str(tmp_path / "cache")),
        *("--snapshot-every-records", "10"),  # the live log is pruned into the archive
        env=aws_env(),
    )
    server.start()
    try:
        with Client(server.url, retries=0, timeout=30) as client:
            client.create_queue(QUEUE, visibility_timeout=600)
            client.create_queue("s3-other")
            client.put("s3-other", ["on the other shard, maybe"])
            put: dict[str, str] = {}  # id -> body
            for n in range(5):
                texts = [f"m{n}-{i}" for i in range(20)]
                put |= {r.id: t for r, t in zip(client.put(QUEUE, texts), texts, strict=True)}
            taken = client.take(QUEUE, 30)
            client.ack(QUEUE, *taken[:20])
            leased = {m.id for m in taken[20:]}
        assert server.stop() == 0
        # the shards read bodies back from their local copy of the log, not from S3
        copied = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
        assert {p.relative_to(tmp_path / "cache").parts[0] for p in copied} == {
            "shard-0000",
            "shard-0001",
        }

        server.start()  # graceful restart: messages and leases as they were
        with Client(server.url, retries=0, timeout=30) as client:
            stats = client.get_queue(QUEUE).stats
            assert stats is not None
            assert (stats.total, stats.reserved, stats.acked) == (80, 10, 20)
        late: list[str] = []
        stop = threading.Event()
        producer = threading.Thread(target=put_until_refused, args=(server.url, late, stop))
        producer.start()
        time.sleep(1.5)
        server.kill()  # SIGKILL, the whole session: gateway, Ray, shards
        stop.set()
        producer.join(30)
        assert len(late) >= 10, "no put was answered before the kill"

        server.start()
        with Client(server.url, retries=0, timeout=30) as client:
            ready = take_all(client)
            assert leased.isdisjoint(ready)  # still leased: the kill lost no lease either
            assert set(late) <= set(ready), "an acknowledged put was lost"
            assert set(put) - {m.id for m in taken} <= set(ready)
            assert all(ready[mid] == put[mid] for mid in set(put) & set(ready))
            assert {m.id for m in taken[:20]}.isdisjoint(ready)  # acked stays acked
        every_put = len(ready) + len(leased) + 20  # ready, leased or acked: each put once
        assert server.stop() == 0
    finally:
        if server.running():
            server.kill()

    # Both jobs as ``evq pipeline`` runs them, in one process: one JVM and Spark session.
    endpoint = ["--endpoint", s3_server.endpoint, "--region", REGION]
    jobs = [
        ["pipeline", job, "--store", store, "--out", str(tmp_path / job), *endpoint]
        for job in ("stats", "audit")
    ]
    jobs[0].append("--no-report")
    done = subprocess.run(
        [sys.executable, "-c", BOTH_JOBS, json.dumps(jobs)],
        cwd=ROOT,
        env=aws_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    queues = json.loads((tmp_path / "stats" / "queues.json").read_text())
    assert set(queues) == {QUEUE, "s3-other"}
    stats = queues[QUEUE]["stats"]
    assert stats["acked"] == 20
    assert stats["enqueued"] == every_put  # from the archive and the rest of the live log
    assert queues["s3-other"]["stats"]["enqueued"] == 1
    # ...of which the restarts had pruned the beginning: it is only in the archive now
    first_segment = f"{prefix}/{keys.wal_segment_key(placement(QUEUE, 2), 1)}"
    s3 = s3_server.boto3_client()
    try:
        listed = s3.list_objects_v2(Bucket=s3_server.bucket, Prefix=f"{prefix}/")
        kept = {o["Key"] for o in listed.get("Contents", [])}
        while listed.get("IsTruncated"):
            token = listed["NextContinuationToken"]
            listed = s3.list_objects_v2(
                Bucket=s3_server.bucket, Prefix=f"{prefix}/", ContinuationToken=token
            )
            kept |= {o["Key"] for o in listed.get("Contents", [])}
    finally:
        s3.close()
    assert first_segment not in kept
    assert any(
        k.startswith(f"{prefix}/archive/") and k.endswith(first_segment[len(prefix) :])
        for k in kept
    )
