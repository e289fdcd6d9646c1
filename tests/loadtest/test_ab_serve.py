"""loadtest/ab_serve.py's figures: which field each row reads, and the summary's medians
and per-round ratios. The A/B itself needs the shared harness's load generator and minutes
of two servers: a documented command (loadtest/RESULTS.md), not part of the suite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

import ab_serve


def _rec(**run: float) -> dict[str, object]:
    return {"runs": [run]}


def test_each_row_reads_its_own_figure() -> None:
    assert ab_serve.rate("p16", _rec(put_s=1200.0, acked_s=3.0)) == 1200.0
    assert ab_serve.rate("mixed", _rec(put_s=1200.0, acked_s=600.0)) == 600.0
    assert ab_serve.rate("batch", _rec(put_s=900.0)) == 90_000.0  # messages, 100 a put
    with pytest.raises(ValueError, match="unpack"):
        ab_serve.rate("p1", {"runs": [{"put_s": 1.0}, {"put_s": 2.0}]})  # one run a record


def test_the_summary_gives_medians_and_the_rounds_ratios() -> None:
    figures = {"p1": {"a": [100.0, 200.0, 300.0], "b": [110.0, 260.0, 270.0]}}
    p50 = {"a": [1.0, 2.0, 3.0], "b": [0.5, 1.5, 2.5]}
    summary = ab_serve.summarize(figures, p50)
    assert summary["p1"]["a"] == 200.0
    assert summary["p1"]["b"] == 260.0
    assert summary["p1"]["rounds_b_over_a"] == [1.1, 1.3, 0.9]
    assert summary["p1"]["b_over_a"] == 1.1  # the median of the rounds' ratios
    assert summary["p1_p50_ms"] == {"a": 2.0, "b": 1.5}
    assert "p1_p50_ms" not in ab_serve.summarize(figures, {"a": [], "b": []})


def test_another_tree_runs_with_its_directory_first_on_the_path(tmp_path: Path) -> None:
    started = {}

    class Fake:
        def __init__(self, data: Path, log: Path, extra: list[str], **kw: object) -> None:
            started.update(data=data, extra=extra, **kw)

    real = ab_serve.EvqServe
    ab_serve.EvqServe = Fake  # type: ignore[assignment,misc]
    try:
        ab_serve.start("b", tmp_path, ["EVQ_UVLOOP=0", "X=a=b"], "--shards 1", tmp_path)
    finally:
        ab_serve.EvqServe = real  # type: ignore[misc]
    assert started["env"] == {"EVQ_UVLOOP": "0", "X": "a=b", "PYTHONPATH": str(tmp_path)}
    assert started["cwd"] == tmp_path
    assert started["extra"] == ["--shards", "1"]
    assert started["data"] == tmp_path / "data-b"
