"""The Kubernetes manifests as shipped start: the gateway container's exact command and
environment, taken from the rendered manifests, run here against a Ray node and an S3 server.

What a pod has and this machine has not is replaced, and only that:

- ``RAY_HEAD_ADDRESS`` (the head's Service name) is a one-node Ray cluster on 127.0.0.2
  that plays both the RayCluster's head and its ``shards`` worker group: it offers the
  worker group's ``rayStartParams.resources`` and has the worker group's environment
  (Secret ``evq-s3``, ``AWS_REGION``), as the shard pods do;
- ``AWS_ENDPOINT_URL_S3`` is moto's S3 server on 127.0.0.1, where the test creates the
  bucket of ``EVQ_STORE``;
- ``EVQ_PORT`` is a free port (8700 may be taken on a shared machine);
- ``PATH`` finds ``ray`` and ``evq`` in this virtualenv, as the image's does;
- ``RAY_TMPDIR`` gives the container its own ``/tmp``, as a pod has: the head's temp dir is
  ``$RAY_TMPDIR/ray``, where ``ray start`` records the cluster's address for ``--ray-address
  =auto`` to read (the machine's ``/tmp/ray`` may hold another cluster's address, and other
  tests' Ray clusters run beside this one).

The container's ``/bin/sh -c`` line then runs unchanged: ``ray start`` joins the cluster as
a node without CPUs, and ``exec evq serve --ray-address=auto`` starts, creates the shards
on the node that offers ``evq_shard``, and serves HTTPS on ``0.0.0.0`` with the shipped
tokens and certificate (the Secret ``evq-tls`` written where the test's environment points
``EVQ_TLS_*``, as its volume would be mounted).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import S3Server
from tests.integration.server import (
    ROOT,
    _alive,
    eventually,
    free_port,
    kill_until_gone,
    session_pids,
)
from tests.integration.server import request as plain_request
from tests.integration.test_two_node import HEAD_IP, RayNode, cluster_env, ray_status
from tests.k8s.kustomize import render
from tests.k8s.objects import World

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BIN = str(Path(sys.executable).parent)


class Manifests:
    """The rendered base kustomization, and what its pods would run."""

    def __init__(self) -> None:
        self.world = World(render(ROOT / "k8s"))

    def gateway(self) -> dict[str, Any]:
        deployment = self.world.get("Deployment", "evq-gateway")
        assert deployment is not None
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        return container

    def shard_group(self) -> dict[str, Any]:
        cluster = self.world.get("RayCluster", "evq-ray")
        assert cluster is not None
        [group] = [g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "shards"]
        return group

    def config(self) -> dict[str, str]:
        config = self.world.get("ConfigMap", "evq-config")
        assert config is not None
        return dict(config["data"])


@pytest.fixture
def shard_node(s3_server: S3Server) -> Iterator[tuple[str, Manifests, Path]]:
    """A one-node Ray cluster with the shard worker group's resources and environment."""
    manifests = Manifests()
    group = manifests.shard_group()
    [worker] = group["template"]["spec"]["containers"]
    env = {**cluster_env(), **manifests.world.env(worker)}
    env["AWS_ENDPOINT_URL_S3"] = s3_server.endpoint
    resources = json.loads(json.loads(group["rayStartParams"]["resources"]))
    root = Path(tempfile.mkdtemp(prefix="evqk8-", dir="/tmp"))
    port = free_port()
    address = f"{HEAD_IP}:{port}"
    node = RayNode(
        "head",
        [
            "--head",
            *("--port", str(port), "--node-ip-address", HEAD_IP, "--num-cpus", "1"),
            *("--resources", json.dumps(resources)),
            *("--include-dashboard", "false", "--temp-dir", str(root / "ray")),
        ],
        root / "head.log",
        env=env,
    )
    node.start()
    try:
        eventually(
            lambda: ray_status(address).count(" node_") == 1,
            timeout=60,
            interval=1.0,
            what="a one-node Ray cluster",
        )
        yield address, manifests, root
    finally:
        node.kill()
        shutil.rmtree(root, ignore_errors=True)


def test_the_gateway_container_starts_as_shipped_and_serves_with_its_tokens(
    shard_node: tuple[str, Manifests, Path], s3_server: S3Server, tmp_path: Path
) -> None:
    address, manifests, pod_tmp = shard_node
    container = manifests.gateway()
    env = {**cluster_env(), **manifests.world.env(container)}
    env.update(
        RAY_HEAD_ADDRESS=address,
        RAY_TMPDIR=str(pod_tmp),
        AWS_ENDPOINT_URL_S3=s3_server.endpoint,
        EVQ_PORT=str(free_port()),
        PATH=f"{BIN}:{os.environ['PATH']}",
    )
    # The bucket of the manifests' store exists, as the README asks.
    bucket, _, prefix = env["EVQ_STORE"].removeprefix("s3://").partition("/")
    s3 = s3_server.boto3_client()
    try:
        s3.create_bucket(Bucket=bucket)
    finally:
        s3.close()
    # The Secret evq-tls, as its volume mounts it in the pod.
    tls = manifests.world.get("Secret", "evq-tls")
    assert tls is not None
    mounted = tmp_path / "tls"
    mounted.mkdir()
    for name, text in tls["stringData"].items():
        (mounted / name).write_text(text)
    for setting in ("EVQ_TLS_CERT", "EVQ_TLS_KEY"):
        env[setting] = str(mounted / Path(env[setting]).name)
    # The placeholder is self-signed: a client that trusts it verifies the server with it.
    context = ssl.create_default_context(cafile=str(mounted / "tls.crt"))
    url = f"https://127.0.0.1:{env['EVQ_PORT']}"

    def request(*args: Any, **kwargs: Any) -> tuple[int, dict]:
        return plain_request(*args, context=context, **kwargs)

    log_path = tmp_path / "gateway.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [*container["command"], *container["args"]],
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"the container's command exited with {proc.returncode}:\n"
                f"{log_path.read_text(errors='replace')[-4000:]}"
            )
        try:
            return request("GET", f"{url}/readyz", timeout=5)[0] == 200
        except OSError:
            return False

    try:
        eventually(
            ready,
            timeout=180,
            interval=0.5,
            what=lambda: (
                "the gateway's /readyz; its output:\n"
                + log_path.read_text(errors="replace")[-6000:]
            ),
        )
        [token] = json.loads(env["EVQ_TOKENS"])["token"]
        text = log_path.read_text(errors="replace")
        assert "shipped placeholder" in text  # said loudly, for the token and the secret
        assert "TLS certificate is the shipped placeholder" in text
        assert request("PUT", f"{url}/v1/queues/jobs", {})[0] == 401
        bearer = {"Authorization": f"Bearer {token['token']}"}
        status, doc = request("PUT", f"{url}/v1/queues/jobs", {}, headers=bearer)
        assert status in (200, 201), doc
        put = {"messages": [{"body": "hello"}]}
        status, doc = request("POST", f"{url}/v1/queues/jobs/messages", put, headers=bearer)
        assert status == 200, doc
        take = {"max": 10, "visibility_timeout": 30}
        status, doc = request("POST", f"{url}/v1/queues/jobs/take", take, headers=bearer)
        assert status == 200, doc
        assert [m["body"] for m in doc["messages"]] == ["hello"]
        # The log went to the S3 store, written by the shards on the shard node.
        s3 = s3_server.boto3_client()
        try:
            listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
        finally:
            s3.close()
        assert listed.get("KeyCount", 0) > 0
        assert len(ray_nodes(address)) == 2  # the shard node and the gateway's own
    finally:
        kill_until_gone(lambda: [p for p in session_pids(proc.pid) if _alive(p)])
        proc.wait(10)


def ray_nodes(address: str) -> list[str]:
    """The nodes ``ray status`` lists (the shard node and the gateway's own)."""
    return [line for line in ray_status(address).splitlines() if " node_" in line]
