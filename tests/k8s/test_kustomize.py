"""The kustomization loader and the quantity parser the manifest tests rely on."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.k8s.kustomize import KustomizeError, render
from tests.k8s.objects import parse_quantity

CONFIG = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata: {{}}\n"


def write(folder: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative name → text) under ``folder``; answer ``folder``."""
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def test_resources_render_in_order_with_namespace_and_labels(tmp_path: Path) -> None:
    root = write(
        tmp_path,
        {
            "kustomization.yaml": (
                "namespace: evq\nlabels:\n  - pairs: {team: queues}\n"
                "resources: [ns.yaml, a.yaml, sub]\n"
            ),
            "ns.yaml": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: other\n",
            "a.yaml": CONFIG.format(name="a") + "---\n" + CONFIG.format(name="b"),
            "sub/kustomization.yaml": "resources: [c.yaml]\n",
            "sub/c.yaml": CONFIG.format(name="c"),
        },
    )
    objs = render(root)
    assert [o["metadata"]["name"] for o in objs] == ["evq", "a", "b", "c"]
    assert "namespace" not in objs[0]["metadata"]  # a Namespace is not namespaced
    assert all(o["metadata"].get("namespace") == "evq" for o in objs[1:])
    assert all(o["metadata"]["labels"] == {"team": "queues"} for o in objs)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"kustomization.yaml": "resources: [gone.yaml]\n"}, "'gone.yaml' does not exist"),
        (
            {"kustomization.yaml": "resources: []\nimages: [{name: evq, newTag: '2'}]\n"},
            "unsupported keys ['images']",
        ),
        (
            {"kustomization.yaml": "resources: [https://example.com/x.yaml]\n"},
            "is not a local path",
        ),
        (
            {
                "kustomization.yaml": "resources: [a.yaml, b.yaml]\n",
                "a.yaml": CONFIG.format(name="same"),
                "b.yaml": CONFIG.format(name="same"),
            },
            "ConfigMap 'same' appears twice",
        ),
        (
            {"kustomization.yaml": "resources: [a.yaml]\n", "a.yaml": "kind: ConfigMap\n"},
            "needs apiVersion, kind and metadata",
        ),
        (
            {"kustomization.yaml": "resources: [a.yaml]\n", "a.yaml": "a: [unclosed\n"},
            "a.yaml",
        ),
        (
            {
                "kustomization.yaml": "resources: [sub]\n",
                "sub/kustomization.yaml": "resources: [..]\n",
            },
            "kustomization cycle",
        ),
        (
            {
                "kustomization.yaml": "labels:\n  - pairs: {a: b}\n    includeSelectors: true\n",
            },
            "includeSelectors/includeTemplates are not supported",
        ),
        ({"other.yaml": ""}, "no kustomization"),
    ],
    ids=[
        "missing file",
        "unsupported key",
        "remote resource",
        "duplicate object",
        "object without metadata",
        "bad yaml",
        "cycle",
        "selector labels",
        "no kustomization",
    ],
)
def test_what_the_loader_cannot_render_is_refused(
    tmp_path: Path, files: dict[str, str], message: str
) -> None:
    with pytest.raises(KustomizeError) as info:
        render(write(tmp_path, files))
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        (2, Decimal(2)),
        ("1.5", Decimal("1.5")),
        ("4Gi", Decimal(4 * 1024**3)),
        ("128Mi", Decimal(128 * 1024**2)),
        ("1k", Decimal(1000)),
        ("1e3", Decimal(1000)),
        ("1E-3", Decimal("0.001")),
        ("100n", Decimal("1e-7")),
    ],
)
def test_quantities_parse_like_kubernetes(text: str | int, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["4GB", "1.5.0", "", "Gi", "ten", "1 Gi", "-", "1ki", True, None])
def test_what_is_not_a_quantity_is_refused(text: object) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(["Ki", "Mi", "Gi", "Ti"]))
def test_binary_suffixes_are_powers_of_1024(n: int, suffix: str) -> None:
    power = ["Ki", "Mi", "Gi", "Ti"].index(suffix) + 1
    assert parse_quantity(f"{n}{suffix}") == n * 1024**power
