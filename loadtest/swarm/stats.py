"""Percentiles and medians of the run's figures."""

from __future__ import annotations

import math

__all__ = ["dist_ms", "median", "pct"]


def pct(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values (nan when empty)."""
    if not sorted_values:
        return math.nan
    k = max(0, math.ceil(p / 100 * len(sorted_values)) - 1)
    return sorted_values[k]


def dist_ms(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {
        "p50_ms": round(pct(s, 50) * 1000, 1),
        "p99_ms": round(pct(s, 99) * 1000, 1),
        "max_ms": round(s[-1] * 1000, 1) if s else math.nan,
        "min_ms": round(s[0] * 1000, 1) if s else math.nan,
    }


def median(values: list[float]) -> float:
    s = sorted(v for v in values if not math.isnan(v))
    if not s:
        return math.nan
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
