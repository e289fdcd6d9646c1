"""The load fleets' message mix (loadtest/locustfiles/mix.py): sizes from 1 B to 1 MiB in the
stated proportions, requests that respect the API's and SQS's limits, repeatable per seed.

mix.py is loaded by path and never imports Locust (whose import patches the standard
library for gevent, which would upset the rest of the test session).
"""

from __future__ import annotations

import ast
import importlib.util
import random
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

PATH = Path(__file__).resolve().parents[2] / "loadtest" / "locustfiles" / "mix.py"
DRAWS = 200_000


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("evq_loadtest_mix", PATH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mix = _load()


def test_the_mix_imports_neither_locust_nor_gevent() -> None:
    imported = set()
    for node in ast.walk(ast.parse(PATH.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"locust", "gevent"}, imported


def test_sizes_span_1_byte_to_1_mib_in_the_stated_proportions() -> None:
    rng = random.Random(7)
    sizes = [mix.message_size(rng) for _ in range(DRAWS)]
    assert min(sizes) == 1
    assert max(sizes) == mix.MIB
    buckets = Counter(
        next(i for i, ((low, high), _) in enumerate(mix.SIZE_BUCKETS) if low <= s <= high)
        for s in sizes
    )
    total_weight = sum(w for _, w in mix.SIZE_BUCKETS)
    for i, (_, weight) in enumerate(mix.SIZE_BUCKETS):
        assert buckets[i] / DRAWS == pytest.approx(weight / total_weight, abs=0.005), i
    assert sizes.count(1) / DRAWS == pytest.approx(0.066, abs=0.005)


def test_delays_are_mostly_none_some_retries_a_few_schedules() -> None:
    rng = random.Random(8)
    delays = [mix.delay_s(rng) for _ in range(DRAWS)]
    none = sum(1 for d in delays if d == 0) / DRAWS
    retry = sum(1 for d in delays if 1 <= d <= 60) / DRAWS
    scheduled = sum(1 for d in delays if 300 <= d <= 3600) / DRAWS
    assert (none, retry, scheduled) == pytest.approx((0.85, 0.10, 0.05), abs=0.005)


def test_batch_labels_name_the_batch_buckets() -> None:
    assert [mix.batch_label(n) for n in (1, 2, 10, 11, 100, 101, 1000)] == [
        "1",
        "2-10",
        "2-10",
        "11-100",
        "11-100",
        "101-1000",
        "101-1000",
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**32), st.sampled_from([(1000, mix.MIB), (10, 256 * 1024)])
)
def test_every_request_respects_its_limits(seed: int, limits: tuple[int, int]) -> None:
    count, body_limit = limits
    rng = random.Random(seed)
    for _ in range(20):
        messages = mix.new_messages(rng, limit=count, body_limit=body_limit)
        assert 1 <= len(messages) <= count
        assert sum(len(m["body"]) for m in messages) <= body_limit
        for m in messages:
            assert 1 <= len(m["body"]) <= body_limit
            assert m["body"].isascii()
            assert m.get("delay", 1) > 0
            assert 1 <= len(m.get("attributes", {"a": "b"})) <= 3


def test_a_seed_repeats_the_same_requests() -> None:
    first = [mix.new_messages(random.Random(3)) for _ in range(5)]
    again = [mix.new_messages(random.Random(3)) for _ in range(5)]
    assert first == again
