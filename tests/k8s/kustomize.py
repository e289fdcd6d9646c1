"""Render a kustomization without kubectl: the small subset of kustomize that k8s/ uses.

Supported: ``resources`` (YAML files, or folders holding a kustomization of their own),
``namespace`` (set on every namespaced object) and ``labels`` with ``pairs`` (added to each
object's own ``metadata.labels``; selectors and pod templates are left alone, as kustomize
does without ``includeSelectors``/``includeTemplates``). Any other key is refused rather than
ignored, so the manifests cannot come to depend on a feature these tests do not apply.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CLUSTER_SCOPED", "KustomizeError", "render"]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
_KEYS = {"apiVersion", "kind", "namespace", "labels", "resources"}
_LABEL_KEYS = {"pairs", "includeSelectors", "includeTemplates"}
# Kinds without a namespace (the ones a deployment like ours could contain).
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "PriorityClass",
    "StorageClass",
}


class KustomizeError(Exception):
    """The kustomization cannot be rendered (missing file, unsupported key, bad YAML)."""


def render(folder: Path) -> list[dict[str, Any]]:
    """The objects the kustomization in ``folder`` produces, in order.

    Raises:
        KustomizeError: what kustomize would refuse, or what this subset does not support.
    """
    return _render(Path(folder), ())


def _render(folder: Path, seen: tuple[Path, ...]) -> list[dict[str, Any]]:
    folder = folder.resolve()
    if folder in seen:
        raise KustomizeError(f"kustomization cycle through {folder}")
    spec = _load_kustomization(folder)
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources") or []:
        if not isinstance(entry, str) or "://" in entry:
            raise KustomizeError(f"{folder}: resource {entry!r} is not a local path")
        path = folder / entry
        if path.is_dir():
            objects += _render(path, (*seen, folder))
        elif path.is_file():
            objects += _load_objects(path)
        else:
            raise KustomizeError(f"{folder}: resource {entry!r} does not exist")
    _set_namespace(objects, spec.get("namespace"), folder)
    for group in spec.get("labels") or []:
        _add_labels(objects, group, folder)
    _check_unique(objects, folder)
    return objects


def _load_kustomization(folder: Path) -> dict[str, Any]:
    for name in KUSTOMIZATION_FILES:
        path = folder / name
        if path.is_file():
            break
    else:
        raise KustomizeError(f"no kustomization in {folder}")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise KustomizeError(f"{path}: {exc}") from None
    if not isinstance(spec, dict):
        raise KustomizeError(f"{path}: not a mapping")
    unsupported = set(spec) - _KEYS
    if unsupported:
        raise KustomizeError(f"{path}: unsupported keys {sorted(unsupported)}")
    if spec.get("kind", "Kustomization") != "Kustomization":
        raise KustomizeError(f"{path}: kind must be Kustomization")
    return spec


def _load_objects(path: Path) -> list[dict[str, Any]]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        raise KustomizeError(f"{path}: {exc}") from None
    for doc in docs:
        if not isinstance(doc, dict) or not {"apiVersion", "kind", "metadata"} <= set(doc):
            raise KustomizeError(f"{path}: every document needs apiVersion, kind and metadata")
    return docs


def _set_namespace(objects: list[dict[str, Any]], namespace: Any, folder: Path) -> None:
    if namespace is None:
        return
    if not isinstance(namespace, str) or not namespace:
        raise KustomizeError(f"{folder}: namespace must be a non-empty string")
    for obj in objects:
        if obj["kind"] == "Namespace":
            obj["metadata"]["name"] = namespace  # kustomize renames the Namespace object
        elif obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace


def _add_labels(objects: list[dict[str, Any]], group: Any, folder: Path) -> None:
    if not isinstance(group, dict) or set(group) - _LABEL_KEYS:
        raise KustomizeError(f"{folder}: labels entries take only {sorted(_LABEL_KEYS)}")
    if group.get("includeSelectors") or group.get("includeTemplates"):
        raise KustomizeError(f"{folder}: includeSelectors/includeTemplates are not supported")
    pairs = group.get("pairs") or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs.items()):
        raise KustomizeError(f"{folder}: label pairs must map strings to strings")
    for obj in objects:
        labels = obj["metadata"].setdefault("labels", {})
        labels.update(copy.deepcopy(pairs))


def _check_unique(objects: list[dict[str, Any]], folder: Path) -> None:
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        meta = obj["metadata"]
        key = (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta.get("name", ""))
        if key in seen:
            raise KustomizeError(f"{folder}: {key[1]} {key[3]!r} appears twice")
        seen.add(key)
