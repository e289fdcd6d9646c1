"""The manifests in k8s/, validated offline: rendered like ``kubectl apply -k`` would, then each
object against its schema (built-in kinds with kubernetes-validate, strict; custom resources
against the CRDs in ../shared/k8s-crds) and the rules of :mod:`tests.k8s.checks`. Broken
variants of the real manifests show that each check rejects what it should.
"""

from __future__ import annotations

import copy
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.checks import problems
from tests.k8s.kustomize import render
from tests.k8s.schemas import CRD_DIR, K8S_VERSION, schema_problems

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
SPARK_ADDON = K8S / "spark-operator"

Objs = list[dict[str, Any]]
CRD_FILES = ("_jsonschema.json", "ray.io_*.yaml", "sparkoperator.k8s.io_*.yaml")


@pytest.fixture(scope="module")
def base() -> Objs:
    """The main kustomization, rendered."""
    return render(K8S)


@pytest.fixture(scope="module")
def addon() -> Objs:
    """The spark-operator add-on, rendered."""
    return render(SPARK_ADDON)


def find(objects: Objs, kind: str, name: str) -> dict[str, Any]:
    """The object of ``kind`` named ``name``."""
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise AssertionError(f"no {kind}/{name} in the rendering")


def test_the_crd_schemas_are_read_from_the_shared_folder() -> None:
    for name in CRD_FILES:
        assert list(CRD_DIR.glob(name)), (CRD_DIR, name)
    for folder in (K8S, ROOT / "tests"):
        copied = [p for name in CRD_FILES for p in folder.rglob(name)]
        assert not copied, f"the CRD schemas must not be copied into the repository: {copied}"


def test_the_deployment_has_every_part_the_issue_asks_for(base: Objs) -> None:
    kinds = {(o["apiVersion"], o["kind"]) for o in base}
    assert {
        ("ray.io/v1", "RayCluster"),
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
        ("policy/v1", "PodDisruptionBudget"),
        ("v1", "Secret"),
        ("batch/v1", "CronJob"),
    } <= kinds
    jobs = {o["metadata"]["name"] for o in base if o["kind"] == "CronJob"}
    assert jobs == {"evq-pipeline-stats", "evq-pipeline-audit", "evq-pipeline-archive"}


def test_rendering_puts_everything_in_one_namespace_with_the_common_label(base: Objs) -> None:
    for obj in base:
        meta = obj["metadata"]
        assert meta["labels"]["app.kubernetes.io/part-of"] == "evq", obj["kind"]
        if obj["kind"] != "Namespace":
            assert meta["namespace"] == "evq", obj["kind"]


def test_every_object_passes_its_schema_and_the_rules(base: Objs) -> None:
    assert problems(base) == []


def test_the_spark_operator_add_on_passes_on_top_of_the_base(addon: Objs, base: Objs) -> None:
    assert find(addon, "SparkApplication", "evq-archive")
    assert problems(addon, context=base) == []


def test_the_add_on_alone_lacks_the_base_config(addon: Objs) -> None:
    found = problems(addon)
    assert any("missing ConfigMap 'evq-config'" in p for p in found), found


def test_the_s3_secret_reaches_the_shards_and_the_jobs(base: Objs) -> None:
    ray = find(base, "RayCluster", "evq-ray")
    [workers] = ray["spec"]["workerGroupSpecs"]
    container = workers["template"]["spec"]["containers"][0]
    assert {"secretRef": {"name": "evq-s3"}} in container["envFrom"]
    for obj in base:
        if obj["kind"] == "CronJob":
            pod = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            assert {"secretRef": {"name": "evq-s3"}} in pod["containers"][0]["envFrom"]
    config = find(base, "ConfigMap", "evq-config")["data"]
    assert config["EVQ_STORE"].startswith("s3://")


def test_the_cluster_secret_reaches_the_gateway_that_joins_the_ray_cluster(base: Objs) -> None:
    gateway = find(base, "Deployment", "evq-gateway")["spec"]["template"]["spec"]
    container = gateway["containers"][0]
    assert "--ray-address" in " ".join(container["args"])  # joining: the secret is required
    assert {"secretRef": {"name": "evq-cluster"}} in container["envFrom"]
    assert "EVQ_CLUSTER_SECRET" in find(base, "Secret", "evq-cluster")["stringData"]
    # and the shards' nodes, which read it there (it does not travel through Ray)
    workers = _workers(base)["template"]["spec"]["containers"][0]
    assert {"secretRef": {"name": "evq-cluster"}} in workers["envFrom"]


def test_the_gateway_is_replicated_replaced_one_at_a_time_and_budgeted(base: Objs) -> None:
    deployment = find(base, "Deployment", "evq-gateway")
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0  # a new pod first
    labels = spec["template"]["metadata"]["labels"]
    budgets = [
        o
        for o in base
        if o["kind"] == "PodDisruptionBudget"
        and o["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ]
    assert len(budgets) == 1
    assert budgets[0]["spec"]["maxUnavailable"] == 1
    container = spec["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    sources = {ref["secretRef"]["name"] for ref in container["envFrom"] if "secretRef" in ref}
    assert {"evq-cluster", "evq-tokens", "evq-s3"} <= sources


# ---------------------------------------------------------------- broken manifests


def _gateway(objs: Objs) -> dict[str, Any]:
    return find(objs, "Deployment", "evq-gateway")["spec"]["template"]["spec"]["containers"][0]


def _workers(objs: Objs) -> dict[str, Any]:
    return find(objs, "RayCluster", "evq-ray")["spec"]["workerGroupSpecs"][0]


def _spark(objs: Objs) -> dict[str, Any]:
    return find(objs, "SparkApplication", "evq-archive")["spec"]


def _set(target: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        target = target.setdefault(part, {})
    target[last] = value


def _pop(target: dict[str, Any], path: str) -> None:
    *parents, last = path.split(".")
    for part in parents:
        target = target[part]
    del target[last]


Mutation = Callable[[Objs], None]

BROKEN: list[tuple[str, Mutation, str]] = [
    # Schemas: built-in kinds, strict.
    (
        "unknown field in a container",
        lambda o: _set(_gateway(o), "imagePullPolcy", "Always"),
        "schema",
    ),
    (
        "service port that is not a number",
        lambda o: _set(find(o, "Service", "evq-gateway")["spec"]["ports"][0], "port", "http"),
        "schema",
    ),
    (
        "a Deployment of an API version Kubernetes dropped",
        lambda o: _set(find(o, "Deployment", "evq-gateway"), "apiVersion", "extensions/v1beta1"),
        f"Kubernetes {K8S_VERSION} has no extensions/v1beta1 Deployment",
    ),
    (
        "CronJob schedule missing",
        lambda o: _pop(find(o, "CronJob", "evq-pipeline-audit"), "spec.schedule"),
        "schema",
    ),
    (
        "a kind no schema knows",
        lambda o: o.append(
            {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
        ),
        f"Kubernetes {K8S_VERSION} has no example.com/v1 Widget",
    ),
    # Schemas: custom resources against the CRDs.
    (
        "worker group without a name",
        lambda o: _pop(_workers(o), "groupName"),
        "'groupName' is a required property",
    ),
    (
        "misspelt RayCluster field",
        lambda o: _set(find(o, "RayCluster", "evq-ray")["spec"], "headGroupSpc", {}),
        "Additional properties are not allowed",
    ),
    (
        "rayStartParams value that is not a string",
        lambda o: _set(_workers(o), "rayStartParams.num-cpus", 2),
        "is not of type 'string'",
    ),
    (
        "RayCluster of an unknown version",
        lambda o: _set(find(o, "RayCluster", "evq-ray"), "apiVersion", "ray.io/v2"),
        "no CRD schema for ray.io/v2 RayCluster",
    ),
    # Rules: what evq serve itself refuses at start.
    (
        "gateway on the pod address without tokens",
        lambda o: _gateway(o)["envFrom"].remove({"secretRef": {"name": "evq-tokens"}}),
        "listens on 0.0.0.0 without tokens",
    ),
    (
        "gateway on the pod address without TLS",
        lambda o: _pop(find(o, "ConfigMap", "evq-config")["data"], "EVQ_TLS_CERT"),
        "serves plain HTTP on 0.0.0.0",
    ),
    (
        "certificate not on a mounted volume",
        lambda o: _pop(_gateway(o), "volumeMounts"),
        "EVQ_TLS_CERT /etc/evq/tls/tls.crt is not on a mounted volume",
    ),
    (
        "probe speaking HTTP to the HTTPS port",
        lambda o: _pop(_gateway(o)["readinessProbe"]["httpGet"], "scheme"),
        "readinessProbe speaks HTTP to the HTTPS port",
    ),
    (
        "shard nodes without the cluster secret",
        lambda o: _workers(o)["template"]["spec"]["containers"][0]["envFrom"].pop(),
        "Ray worker group 'shards' (its shards) does not hold the gateway's cluster secret",
    ),
    (
        "cluster secret too short",
        lambda o: _set(find(o, "Secret", "evq-cluster"), "stringData.EVQ_CLUSTER_SECRET", "short"),
        "without a cluster secret of at least 16 characters",
    ),
    # Rules: replicas and quantities.
    (
        "worker group minReplicas above maxReplicas",
        lambda o: _set(_workers(o), "minReplicas", 5),
        "min replicas 5 > max replicas 4",
    ),
    (
        "worker group replicas above maxReplicas",
        lambda o: _set(_workers(o), "replicas", 9),
        "replicas 9 outside [2, 4]",
    ),
    (
        "memory in a unit Kubernetes does not know",
        lambda o: _set(_gateway(o), "resources.limits.memory", "4GB"),
        "not a quantity: '4GB'",
    ),
    (
        "cpu request above its limit",
        lambda o: _set(_gateway(o), "resources.requests.cpu", "2500m"),
        "cpu request 2.500 exceeds its limit 2",
    ),
    (
        "claim size that is not a quantity",
        lambda o: _set(
            find(o, "PersistentVolumeClaim", "evq-reports")["spec"],
            "resources.requests.storage",
            "lots",
        ),
        "not a quantity: 'lots'",
    ),
    # Rules: probes and ports.
    (
        "readiness probe on /healthz",
        lambda o: _set(_gateway(o), "readinessProbe.httpGet.path", "/healthz"),
        "readinessProbe must GET /readyz",
    ),
    (
        "no liveness probe",
        lambda o: _pop(_gateway(o), "livenessProbe"),
        "livenessProbe must GET /healthz, not None",
    ),
    (
        "probe on a port the container does not declare",
        lambda o: _set(_gateway(o), "livenessProbe.httpGet.port", "metrics"),
        "livenessProbe port 'metrics' is not a container port",
    ),
    (
        "service target port the pods do not have",
        lambda o: _set(find(o, "Service", "evq-gateway")["spec"]["ports"][0], "targetPort", 8080),
        "target 8080 is not a port of template",
    ),
    (
        "service selector that matches no pod",
        lambda o: _set(
            find(o, "Service", "evq-gateway")["spec"], "selector.app.kubernetes.io/component", "gw"
        ),
        "matches no pod template",
    ),
    (
        "gateway port in the config differs from the container port",
        lambda o: _set(find(o, "ConfigMap", "evq-config")["data"], "EVQ_PORT", "9000"),
        "evq serve listens on 9000, not a container port",
    ),
    (
        "gateway bound to loopback",
        lambda o: _set(find(o, "ConfigMap", "evq-config")["data"], "EVQ_HOST", "127.0.0.1"),
        "EVQ_HOST must not be loopback",
    ),
    # Rules: disruption budget, termination, references, shard capacity.
    (
        "disruption budget that selects nothing",
        lambda o: _set(
            find(o, "PodDisruptionBudget", "evq-shard-nodes")["spec"]["selector"]["matchLabels"],
            "app.kubernetes.io/component",
            "shards",
        ),
        "matches no pod template",
    ),
    (
        "disruption budget with both bounds",
        lambda o: _set(
            find(o, "PodDisruptionBudget", "evq-shard-nodes")["spec"], "minAvailable", 1
        ),
        "exactly one of minAvailable and maxUnavailable",
    ),
    (
        "grace period shorter than the graceful stop",
        lambda o: _set(
            find(o, "Deployment", "evq-gateway")["spec"]["template"]["spec"],
            "terminationGracePeriodSeconds",
            30,
        ),
        "terminationGracePeriodSeconds 30 leaves no time",
    ),
    (
        "gateway without preStop",
        lambda o: _pop(_gateway(o), "lifecycle"),
        "no preStop hook",
    ),
    (
        "secret that does not exist",
        lambda o: _set(
            _workers(o)["template"]["spec"]["containers"][0]["envFrom"][0], "secretRef.name", "s3"
        ),
        "missing Secret 's3'",
    ),
    (
        "config key that does not exist",
        lambda o: _pop(find(o, "ConfigMap", "evq-config")["data"], "EVQ_REGION"),
        "has no key 'EVQ_REGION'",
    ),
    (
        "volume mount without its volume",
        lambda o: _set(
            find(o, "CronJob", "evq-pipeline-stats")["spec"]["jobTemplate"]["spec"]["template"][
                "spec"
            ],
            "volumes",
            [],
        ),
        "mount 'reports' names no volume",
    ),
    (
        "shard nodes too small to take over every shard",
        lambda o: _set(_workers(o), "rayStartParams.resources", '"{\\"evq_shard\\": 4}"'),
        "no Ray worker group offers 8 units of 'evq_shard'",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "expected"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN]
)
def test_a_broken_base_manifest_is_rejected(base: Objs, mutate: Mutation, expected: str) -> None:
    broken = copy.deepcopy(base)
    mutate(broken)
    found = problems(broken)
    assert any(expected in p for p in found), found


BROKEN_SPARK: list[tuple[str, Mutation, str]] = [
    (
        "application type misspelt",
        lambda o: _set(_spark(o), "type", "Pyhton"),
        "'Pyhton' is not one of",
    ),
    (
        "no main application file",
        lambda o: _pop(_spark(o), "mainApplicationFile"),
        "'mainApplicationFile' is a required property",
    ),
    (
        "minExecutors above maxExecutors",
        lambda o: _set(_spark(o), "dynamicAllocation.minExecutors", 6),
        "min executors 6 > max executors 4",
    ),
    (
        "driver memory in Kubernetes units",
        lambda o: _set(_spark(o), "driver.memory", "2Gi"),
        "not a Spark size: '2Gi'",
    ),
    (
        "core limit that is not a quantity",
        lambda o: _set(_spark(o), "executor.coreLimit", "one"),
        "not a quantity: 'one'",
    ),
    (
        "driver service account that does not exist",
        lambda o: _set(_spark(o), "driver.serviceAccount", "spark"),
        "missing ServiceAccount 'spark'",
    ),
    (
        "role binding to a missing role",
        lambda o: _set(find(o, "RoleBinding", "evq-spark")["roleRef"], "name", "spark-role"),
        "missing Role 'spark-role'",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "expected"), [b[1:] for b in BROKEN_SPARK], ids=[b[0] for b in BROKEN_SPARK]
)
def test_a_broken_spark_application_is_rejected(
    addon: Objs, base: Objs, mutate: Mutation, expected: str
) -> None:
    broken = copy.deepcopy(addon)
    mutate(broken)
    found = problems(broken, context=base)
    assert any(expected in p for p in found), found


def test_a_rayservice_is_checked_against_its_own_crd(base: Objs) -> None:
    cluster = find(base, "RayCluster", "evq-ray")
    service = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "evq"},
        "spec": {"rayClusterConfig": copy.deepcopy(cluster["spec"])},
    }
    assert schema_problems(service) == []
    service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = "four"
    found = schema_problems(service)
    assert any("is not of type 'integer'" in p for p in found), found


def test_the_spark_entry_runs_evq_pipeline_with_the_configured_store(addon: Objs) -> None:
    spec = _spark(addon)
    prefix = "local:///opt/evq/"  # k8s/Dockerfile copies the repository there
    assert spec["mainApplicationFile"].startswith(prefix)
    entry = ROOT / spec["mainApplicationFile"][len(prefix) :]
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location("pipeline_main", entry)  # type: ignore[arg-type]
    )
    module.__spec__.loader.exec_module(module)  # type: ignore[union-attr]
    argv = module.pipeline_argv(spec["arguments"], {"EVQ_STORE": "s3://b/p"})
    assert argv == ["pipeline", "archive", "--out", "/archive", "--store", "s3://b/p"]
    given = module.pipeline_argv(["stats", "--store", "s3://x", "--out", "/o"], {"EVQ_STORE": "y"})
    assert given == ["pipeline", "stats", "--store", "s3://x", "--out", "/o"]
    assert re.search(r"^COPY\b.* \. /opt/evq$", (K8S / "Dockerfile").read_text(), re.M)
