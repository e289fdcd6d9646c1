"""What a schema cannot say about the manifests, and :func:`problems`, which checks it all.

:func:`problems` answers a list of messages (empty when everything holds), each starting
with the object it is about (``Kind/name``): first the object's schema
(:mod:`tests.k8s.schemas`), then these rules: replica bounds, resource quantities (and
requests ≤ limits), probes of the gateway on /readyz and /healthz, probe and Service ports
that name a real container port, selectors of Services and PodDisruptionBudgets that select
something, references to ConfigMaps, Secrets, volumes and service accounts that exist, a
termination grace period that covers the gateway's graceful stop, a gateway on a pod
address with tokens and (when it joins Ray) a cluster secret, and Ray nodes that can host
every shard.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

from gateway.settings import MIN_SECRET_CHARS
from tests.k8s.objects import Obj, Pod, World, data_of, name, parse_quantity, pods_of, target_name
from tests.k8s.schemas import schema_problems

__all__ = ["problems"]

DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0  # gateway/settings.py: ServerSettings.shutdown_timeout_s


def problems(objects: list[Obj], context: list[Obj] | None = None) -> list[str]:
    """Everything wrong with ``objects``; references may also point into ``context`` (objects
    applied before, e.g. the base of an add-on)."""
    found: list[str] = []
    world = World([*objects, *(context or [])])
    for obj in objects:
        found += schema_problems(obj)
        for rule in RULES:
            found += [f"{name(obj)}: {message}" for message in rule(obj, world)]
    return found


# ---------------------------------------------------------------- quantities

# Spark's own size strings (spark.driver.memory): a number and an optional unit.
_SPARK_SIZE = re.compile(r"^\d+[kmgtp]?b?$", re.IGNORECASE)


def _resources_problems(where: str, resources: Obj) -> list[str]:
    found: list[str] = []
    parsed: dict[str, dict[str, Decimal]] = {"requests": {}, "limits": {}}
    for part in ("requests", "limits"):
        for resource, value in (resources.get(part) or {}).items():
            try:
                parsed[part][resource] = parse_quantity(value)
            except ValueError as e:
                found.append(f"{where}: {part}.{resource}: {e}")
    for resource, request in parsed["requests"].items():
        limit = parsed["limits"].get(resource)
        if limit is not None and request > limit:
            found.append(f"{where}: {resource} request {request} exceeds its limit {limit}")
    return found


def check_quantities(obj: Obj, world: World) -> list[str]:
    """Every resource quantity parses; no request exceeds its limit."""
    found: list[str] = []
    for pod in pods_of(obj):
        for c in pod.containers():
            where = f"{pod.where}, container {c.get('name')}"
            found += _resources_problems(where, c.get("resources") or {})
    if obj.get("kind") == "PersistentVolumeClaim":
        found += _resources_problems("claim", (obj.get("spec") or {}).get("resources") or {})
    if obj.get("kind") == "SparkApplication":
        for role in ("driver", "executor"):
            spec = (obj.get("spec") or {}).get(role) or {}
            for field in ("coreRequest", "coreLimit"):
                if field in spec:
                    try:
                        parse_quantity(spec[field])
                    except ValueError as e:
                        found.append(f"{role}.{field}: {e}")
            for field in ("memory", "memoryOverhead", "memoryLimit"):
                if field in spec and not _SPARK_SIZE.match(str(spec[field])):
                    found.append(f"{role}.{field}: not a Spark size: {spec[field]!r}")
    return found


# ---------------------------------------------------------------- replicas


def _bounds(where: str, low: Any, high: Any, *, what: str) -> list[str]:
    if isinstance(low, int) and isinstance(high, int) and low > high:
        return [f"{where}: min {what} {low} > max {what} {high}"]
    return []


def check_replicas(obj: Obj, world: World) -> list[str]:
    """min ≤ replicas ≤ max wherever an object bounds a count."""
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    found: list[str] = []
    if kind in ("RayCluster", "RayService"):
        if kind == "RayService":
            spec = spec.get("rayClusterConfig") or {}
        for group in spec.get("workerGroupSpecs") or []:
            where = f"worker group {group.get('groupName')}"
            low, high = group.get("minReplicas"), group.get("maxReplicas")
            found += _bounds(where, low, high, what="replicas")
            replicas = group.get("replicas")
            bounded = all(isinstance(n, int) for n in (replicas, low, high))
            if bounded and not low <= replicas <= high:
                found.append(f"{where}: replicas {replicas} outside [{low}, {high}]")
    elif kind == "HorizontalPodAutoscaler":
        found += _bounds(
            "autoscaler", spec.get("minReplicas", 1), spec.get("maxReplicas"), what="replicas"
        )
    elif kind == "SparkApplication":
        dyn = spec.get("dynamicAllocation") or {}
        low, initial, high = (
            dyn.get(k) for k in ("minExecutors", "initialExecutors", "maxExecutors")
        )
        found += _bounds("dynamicAllocation", low, high, what="executors")
        found += _bounds("dynamicAllocation", low, initial, what="executors (initial)")
        found += _bounds("dynamicAllocation", initial, high, what="executors (initial)")
    return found


# ---------------------------------------------------------------- ports and probes


def _port_names(container: Obj) -> tuple[set[str], set[int]]:
    ports = container.get("ports") or []
    return {p["name"] for p in ports if "name" in p}, {p.get("containerPort") for p in ports}


def _has_port(container: Obj, port: Any) -> bool:
    names, numbers = _port_names(container)
    return port in names if isinstance(port, str) else port in numbers


def is_evq_server(container: Obj) -> bool:
    """Whether the container runs ``evq serve``."""
    words = " ".join(
        str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]
    )
    return bool(re.search(r"\bevq serve\b", words))


_PROBES = {"readinessProbe": "/readyz", "livenessProbe": "/healthz"}


def check_probes(obj: Obj, world: World) -> list[str]:
    """Probes name a declared port; evq servers are probed on /readyz and /healthz."""
    found: list[str] = []
    for pod in pods_of(obj):
        for c in pod.containers():
            where = f"{pod.where}, container {c.get('name')}"
            for probe_name in ("readinessProbe", "livenessProbe", "startupProbe"):
                probe = c.get(probe_name) or {}
                for handler in ("httpGet", "tcpSocket", "grpc"):
                    port = (probe.get(handler) or {}).get("port")
                    if port is not None and not _has_port(c, port):
                        found.append(f"{where}: {probe_name} port {port!r} is not a container port")
            if not is_evq_server(c):
                continue
            for probe_name, path in _PROBES.items():
                got = ((c.get(probe_name) or {}).get("httpGet") or {}).get("path")
                if got != path:
                    found.append(f"{where}: {probe_name} must GET {path}, not {got!r}")
    return found


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_service(obj: Obj, world: World) -> list[str]:
    """A Service selects pods, and each of its target ports is a port of every one of them."""
    if obj.get("kind") != "Service":
        return []
    spec = obj.get("spec") or {}
    selector = spec.get("selector") or {}
    selected = [pod for _, pod in world.pods() if _selects(selector, pod.labels)]
    if not selected:
        return [f"selector {selector} matches no pod template"]
    found = []
    for port in spec.get("ports") or []:
        target = port.get("targetPort", port.get("port"))
        for pod in selected:
            if not any(_has_port(c, target) for c in pod.spec.get("containers") or []):
                found.append(
                    f"port {port.get('name')}: target {target!r} is not a port of {pod.where}"
                )
    return found


def check_disruption_budget(obj: Obj, world: World) -> list[str]:
    """A PodDisruptionBudget selects pods and sets exactly one bound."""
    if obj.get("kind") != "PodDisruptionBudget":
        return []
    spec = obj.get("spec") or {}
    found = []
    if ("minAvailable" in spec) == ("maxUnavailable" in spec):
        found.append("set exactly one of minAvailable and maxUnavailable")
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    if not any(_selects(selector, pod.labels) for _, pod in world.pods()):
        found.append(f"selector {selector} matches no pod template")
    return found


# ---------------------------------------------------------------- references


def _pod_references(pod: Pod, world: World) -> list[str]:
    found: list[str] = []

    def need(kind: str, ref_name: Any, what: str) -> Obj | None:
        target = world.get(kind, str(ref_name))
        if target is None:
            found.append(f"{pod.where}: {what} refers to a missing {kind} {ref_name!r}")
        return target

    volumes = {v.get("name") for v in pod.spec.get("volumes") or []}
    for v in pod.spec.get("volumes") or []:
        if "persistentVolumeClaim" in v:
            need("PersistentVolumeClaim", v["persistentVolumeClaim"].get("claimName"), "volume")
        if "configMap" in v and not v["configMap"].get("optional"):
            need("ConfigMap", v["configMap"].get("name"), "volume")
        if "secret" in v and not v["secret"].get("optional"):
            need("Secret", v["secret"].get("secretName"), "volume")
    if "serviceAccountName" in pod.spec:
        need("ServiceAccount", pod.spec["serviceAccountName"], "serviceAccountName")
    for c in pod.containers():
        for mount in c.get("volumeMounts") or []:
            if mount.get("name") not in volumes:
                found.append(f"{pod.where}: mount {mount.get('name')!r} names no volume")
        found += _env_references(c, need)
    return found


def _env_references(container: Obj, need: Any) -> list[str]:
    found: list[str] = []
    for source in container.get("envFrom") or []:
        for kind, ref in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if ref in source and not source[ref].get("optional"):
                need(kind, source[ref].get("name"), "envFrom")
    for var in container.get("env") or []:
        for kind, ref in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
            key_ref = (var.get("valueFrom") or {}).get(ref)
            if not key_ref or key_ref.get("optional"):
                continue
            target = need(kind, key_ref.get("name"), f"env {var.get('name')}")
            key = key_ref.get("key")
            if target is not None and key not in data_of(target):
                found.append(
                    f"env {var.get('name')}: {kind} {target_name(target)} has no key {key!r}"
                )
    return found


def check_references(obj: Obj, world: World) -> list[str]:
    """ConfigMaps, Secrets, claims, volumes and service accounts referred to exist."""
    found: list[str] = []
    for pod in pods_of(obj):
        found += _pod_references(pod, world)
    kind = obj.get("kind")
    if kind == "SparkApplication":
        spec = obj.get("spec") or {}
        for role in ("driver", "executor"):
            role_spec = dict(spec.get(role) or {})
            pod = Pod(role, {}, {"volumes": spec.get("volumes") or [], "containers": [role_spec]})
            if "serviceAccount" in role_spec:
                pod.spec["serviceAccountName"] = role_spec["serviceAccount"]
            found += _pod_references(pod, world)
    if kind == "RoleBinding":
        role = obj.get("roleRef") or {}
        if world.get(str(role.get("kind")), str(role.get("name"))) is None:
            found.append(f"roleRef refers to a missing {role.get('kind')} {role.get('name')!r}")
        for subject in obj.get("subjects") or []:
            if (
                subject.get("kind") == "ServiceAccount"
                and world.get("ServiceAccount", subject.get("name", "")) is None
            ):
                found.append(f"subject refers to a missing ServiceAccount {subject.get('name')!r}")
    return found


# ---------------------------------------------------------------- the evq gateway


def _sleep_s(handler: Obj) -> float:
    command = " ".join(str(w) for w in ((handler.get("exec") or {}).get("command") or []))
    m = re.search(r"\bsleep\s+(\d+(?:\.\d+)?)", command)
    seconds = float(m.group(1)) if m else 0.0
    return seconds + float((handler.get("sleep") or {}).get("seconds", 0))


def _tls_problems(c: dict[str, Any], env: dict[str, str], where: str) -> list[str]:
    """evq serve refuses plain HTTP off loopback unless a proxy in front terminates TLS; its
    certificate and key must be files in the pod; its probes must then speak HTTPS."""
    if env.get("EVQ_HOST", "127.0.0.1") in ("127.0.0.1", "localhost"):
        return []
    cert, key = env.get("EVQ_TLS_CERT"), env.get("EVQ_TLS_KEY")
    proxied = env.get("EVQ_BEHIND_TLS_PROXY", "").lower() in ("true", "1", "yes")
    if not (cert and key):
        if proxied:
            return []
        return [
            f"{where}: serves plain HTTP on {env.get('EVQ_HOST')} (no EVQ_TLS_CERT and "
            "EVQ_TLS_KEY, nor EVQ_BEHIND_TLS_PROXY)"
        ]
    found = []
    mounts = [m.get("mountPath", "").rstrip("/") + "/" for m in c.get("volumeMounts") or []]
    for setting, path in (("EVQ_TLS_CERT", cert), ("EVQ_TLS_KEY", key)):
        if not any(path.startswith(m) for m in mounts):
            found.append(f"{where}: {setting} {path} is not on a mounted volume")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = (c.get(probe) or {}).get("httpGet")
        if get is not None and get.get("scheme", "HTTP") != "HTTPS":
            found.append(f"{where}: {probe} speaks HTTP to the HTTPS port")
    return found


def check_gateway(obj: Obj, world: World) -> list[str]:
    """An evq server listens on its declared port and has time for its graceful stop."""
    found: list[str] = []
    for pod in pods_of(obj):
        for c in pod.containers():
            if not is_evq_server(c):
                continue
            where = f"{pod.where}, container {c.get('name')}"
            env = world.env(c)
            port = int(env.get("EVQ_PORT", "8700"))
            if not _has_port(c, port):
                found.append(f"{where}: evq serve listens on {port}, not a container port")
            if env.get("EVQ_HOST", "127.0.0.1") in ("127.0.0.1", "localhost"):
                found.append(f"{where}: EVQ_HOST must not be loopback in a pod")
            elif not (env.get("EVQ_TOKENS") or env.get("EVQ_TOKENS_FILE")):
                # evq serve refuses an open API on a non-loopback address (exit 2).
                found.append(f"{where}: listens on {env.get('EVQ_HOST')} without tokens")
            found += _tls_problems(c, env, where)
            words = " ".join(str(w) for w in [*(c.get("command") or []), *(c.get("args") or [])])
            if "--ray-address" in words and not (
                len(env.get("EVQ_CLUSTER_SECRET", "")) >= MIN_SECRET_CHARS
                or env.get("EVQ_CLUSTER_SECRET_FILE")
            ):
                found.append(
                    f"{where}: joins a Ray cluster without a cluster secret of at least "
                    f"{MIN_SECRET_CHARS} characters"
                )
            pre_stop = (c.get("lifecycle") or {}).get("preStop")
            if not pre_stop:
                found.append(f"{where}: no preStop hook to leave the Service before stopping")
            needed = _sleep_s(pre_stop or {}) + float(
                env.get("EVQ_SHUTDOWN_TIMEOUT_S", DEFAULT_SHUTDOWN_TIMEOUT_S)
            )
            grace = pod.spec.get("terminationGracePeriodSeconds", 30)
            if grace < needed + 10:
                found.append(
                    f"{where}: terminationGracePeriodSeconds {grace} leaves no time to snapshot "
                    f"after preStop + shutdown timeout ({needed:g} s); give it at least 10 s more"
                )
            found += _shard_capacity(where, env, world)
            if "--ray-address" in words:
                found += _shard_secret(where, env, world)
    return found


def _ray_resources(group: Obj) -> dict[str, float]:
    raw = (group.get("rayStartParams") or {}).get("resources")
    if not raw:
        return {}
    text = raw.strip()
    if text.startswith('"') and text.endswith('"'):  # KubeRay's shell-quoted JSON
        text = json.loads(text)
    return {k: float(v) for k, v in json.loads(text).items()}


def _shard_capacity(where: str, env: dict[str, str], world: World) -> list[str]:
    """Shards need EVQ_SHARD_RESOURCE: some worker group must offer it for every shard, or a
    node's death would leave shards nowhere to restart."""
    resource = env.get("EVQ_SHARD_RESOURCE")
    if not resource or "EVQ_SHARDS" not in env:
        return []
    shards = int(env["EVQ_SHARDS"])
    offers = []
    for obj in world.objects:
        if obj.get("kind") == "RayCluster":
            for group in (obj.get("spec") or {}).get("workerGroupSpecs") or []:
                offers.append(_ray_resources(group).get(resource, 0.0))
    if not offers or max(offers) < shards:
        return [f"{where}: no Ray worker group offers {shards} units of {resource!r} per node"]
    return []


def _shard_secret(where: str, env: dict[str, str], world: World) -> list[str]:
    """The shards read the cluster secret from their node (the gateway sends them only its
    fingerprint): every worker group that offers the shards' resource must hold the
    gateway's."""
    resource = env.get("EVQ_SHARD_RESOURCE")
    if not resource:
        return []
    mine = (env.get("EVQ_CLUSTER_SECRET"), env.get("EVQ_CLUSTER_SECRET_FILE"))
    found = []
    for obj in world.objects:
        if obj.get("kind") != "RayCluster":
            continue
        for group in (obj.get("spec") or {}).get("workerGroupSpecs") or []:
            if not _ray_resources(group).get(resource):
                continue
            for c in ((group.get("template") or {}).get("spec") or {}).get("containers") or []:
                theirs = world.env(c)
                if (
                    theirs.get("EVQ_CLUSTER_SECRET"),
                    theirs.get("EVQ_CLUSTER_SECRET_FILE"),
                ) != mine:
                    found.append(
                        f"{where}: Ray worker group {group.get('groupName')!r} (its shards) "
                        "does not hold the gateway's cluster secret in its environment"
                    )
    return found


RULES = (
    check_quantities,
    check_replicas,
    check_probes,
    check_service,
    check_disruption_budget,
    check_references,
    check_gateway,
)
