"""Manifest objects as the checks see them: names, pod templates, environments, quantities."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["Obj", "Pod", "World", "data_of", "name", "parse_quantity", "pods_of", "target_name"]

Obj = dict[str, Any]


def target_name(obj: Obj) -> str:
    """An object's name, quoted."""
    return repr((obj.get("metadata") or {}).get("name"))


def name(obj: Obj) -> str:
    """``Kind/name`` of an object, for messages."""
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"


@dataclass
class Pod:
    """A pod template somewhere in an object."""

    where: str
    labels: dict[str, str]
    spec: Obj

    def containers(self) -> list[Obj]:
        """Containers and init containers."""
        return [*(self.spec.get("containers") or []), *(self.spec.get("initContainers") or [])]


class World:
    """Every object of a deployment, looked up by kind and name."""

    def __init__(self, objects: list[Obj]) -> None:
        self.objects = objects

    def get(self, kind: str, obj_name: str) -> Obj | None:
        """The object of ``kind`` named ``obj_name``, if any."""
        for obj in self.objects:
            if obj.get("kind") == kind and obj.get("metadata", {}).get("name") == obj_name:
                return obj
        return None

    def pods(self) -> Iterator[tuple[Obj, Pod]]:
        """Every pod template of every object."""
        for obj in self.objects:
            for pod in pods_of(obj):
                yield obj, pod

    def env(self, container: Obj) -> dict[str, str]:
        """A container's environment as far as the manifests fix it."""
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            for kind, ref in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if ref in source:
                    env.update(data_of(self.get(kind, source[ref].get("name", ""))))
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = str(var["value"])
            ref = (var.get("valueFrom") or {}).get("configMapKeyRef")
            if ref:
                data = data_of(self.get("ConfigMap", ref.get("name", "")))
                if ref.get("key") in data:
                    env[var["name"]] = data[ref["key"]]
        return env


def data_of(obj: Obj | None) -> dict[str, str]:
    if obj is None:
        return {}
    return {**(obj.get("data") or {}), **(obj.get("stringData") or {})}


_TEMPLATE_PATHS = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


def pods_of(obj: Obj) -> list[Pod]:
    """The pod templates an object declares (workloads and Ray clusters)."""
    kind = obj.get("kind")
    templates: list[tuple[str, Any]] = []
    if kind in _TEMPLATE_PATHS:
        node: Any = obj
        for part in _TEMPLATE_PATHS[kind]:
            node = (node or {}).get(part) if isinstance(node, dict) else None
        templates.append(("template", node))
    elif kind in ("RayCluster", "RayService"):
        spec = obj.get("spec") or {}
        if kind == "RayService":
            spec = spec.get("rayClusterConfig") or {}
        templates.append(("head", (spec.get("headGroupSpec") or {}).get("template")))
        for group in spec.get("workerGroupSpecs") or []:
            templates.append((f"worker group {group.get('groupName')}", group.get("template")))
    return [
        Pod(where, dict((t.get("metadata") or {}).get("labels") or {}), t.get("spec") or {})
        for where, t in templates
        if isinstance(t, dict)
    ]


# ---------------------------------------------------------------- quantities

_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{s: Decimal(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
}


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes resource quantity ("500m", "2Gi", "1e3", 4) as a number.

    Raises:
        ValueError: not a quantity.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"not a quantity: {value!r}")
    m = _QUANTITY.match(str(value))
    if m is None:
        raise ValueError(f"not a quantity: {value!r}")
    suffix = m["suffix"] or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(m["num"]) * Decimal(10) ** int(suffix[1:])
        return Decimal(m["num"]) * _SUFFIX[suffix]
    except (InvalidOperation, KeyError):
        raise ValueError(f"not a quantity: {value!r}") from None
