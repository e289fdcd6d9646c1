"""Schema validation of one manifest object, offline.

Built-in kinds with ``kubernetes-validate`` in strict mode (unknown fields are errors); the
custom resources (RayCluster, RayService, RayJob, SparkApplication) with ``jsonschema``
against the CRDs' schemas in ``../shared/k8s-crds`` (upstream data, read from there, never
copied here). An object of a kind neither knows is a problem too: kubernetes-validate alone
would let it pass.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate.utils import SchemaNotFoundError

from tests.k8s.objects import Obj, name

__all__ = ["CRD_DIR", "K8S_VERSION", "schema_problems"]

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT.parent / "shared" / "k8s-crds"
K8S_VERSION = "1.33"  # the oldest Kubernetes the manifests are meant for
# Groups whose kinds are custom resources: their schemas come from CRD_DIR.
CRD_GROUPS = ("ray.io", "sparkoperator.k8s.io")


@functools.cache
def _crd_schemas() -> dict[str, Any]:
    with (CRD_DIR / "_jsonschema.json").open() as f:
        return json.load(f)  # type: ignore[no-any-return]


@functools.cache
def _crd_validator(key: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_crd_schemas()[key])


def schema_problems(obj: Obj) -> list[str]:
    """The object against its schema (CRD or built-in, strict)."""
    # Validation is pure and the broken-manifest tests revalidate the same objects often.
    return list(_schema_problems(json.dumps(obj, sort_keys=True)))


@functools.lru_cache(maxsize=512)
def _schema_problems(text: str) -> tuple[str, ...]:
    obj = json.loads(text)
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    key = f"{api_version}|{kind}"
    if key in _crd_schemas():
        errors = sorted(_crd_validator(key).iter_errors(obj), key=lambda e: list(e.path))
        return tuple(f"{name(obj)}: schema: {_where(e.path)}: {e.message[:300]}" for e in errors)
    if api_version.split("/")[0] in CRD_GROUPS:
        return (f"{name(obj)}: no CRD schema for {api_version} {kind}",)
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return (f"{name(obj)}: schema: {_where(e.path)}: {e.message[:300]}",)
    except SchemaNotFoundError:
        return (f"{name(obj)}: Kubernetes {K8S_VERSION} has no {api_version} {kind}",)
    return ()


def _where(path: Any) -> str:
    return ".".join(str(p) for p in path) or "(root)"
