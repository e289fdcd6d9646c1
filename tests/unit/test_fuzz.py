"""A short fuzzing run of every decoder that reads bytes from outside (loadtest/fuzz_targets.py)
under hypothesis, and every input a fuzzer ever found replayed (tests/data/fuzz/<target>/).
A decoder may refuse an input only with its documented errors (``EXPECTED``); anything else
is a crash. The long campaign is ``loadtest/fuzz.py`` (atheris; loadtest/RESULTS.md)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.fuzz_targets import EXPECTED, SEEDS, TARGETS

REGRESSIONS = Path(__file__).resolve().parents[1] / "data" / "fuzz"
NAMES = sorted(TARGETS)


def _mutated(seed: bytes) -> st.SearchStrategy[bytes]:
    """``seed`` with a few bytes changed, inserted or cut (the shape of a near-valid input)."""

    @st.composite
    def mutate(draw: st.DrawFn) -> bytes:
        data = bytearray(seed)
        for _ in range(draw(st.integers(1, 6))):
            at = draw(st.integers(0, len(data)))
            kind = draw(st.sampled_from(["flip", "insert", "cut"]))
            if kind == "flip" and at < len(data):
                data[at] = draw(st.integers(0, 255))
            elif kind == "insert":
                data[at:at] = draw(st.binary(min_size=1, max_size=8))
            else:
                del data[at : at + draw(st.integers(1, 8))]
        return bytes(data)

    return mutate()


def _inputs(name: str) -> st.SearchStrategy[bytes]:
    seeds = SEEDS.get(name) or []
    return st.one_of(st.binary(max_size=512), *(_mutated(s) for s in seeds))


def _feed(name: str, data: bytes) -> None:
    with contextlib.suppress(EXPECTED):
        TARGETS[name](data)


@pytest.mark.parametrize("name", NAMES)
def test_each_seed_is_a_valid_input(name: str) -> None:
    for seed in SEEDS.get(name) or []:
        TARGETS[name](seed)  # nothing refused: mutations start from real inputs


@pytest.mark.parametrize("name", NAMES)
def test_a_short_fuzzing_run_finds_no_crash(name: str) -> None:
    @settings(max_examples=300, deadline=1000, suppress_health_check=list(HealthCheck))
    @given(data=_inputs(name))
    def run(data: bytes) -> None:
        _feed(name, data)

    run()


FOUND = sorted(
    (target.name, found.name)
    for target in REGRESSIONS.iterdir()
    if target.is_dir()
    for found in target.iterdir()
)


def test_every_target_of_the_regression_corpus_exists() -> None:
    assert FOUND, "the regression corpus is empty"
    assert {name for name, _ in FOUND} <= set(TARGETS)


@pytest.mark.parametrize(("name", "found"), FOUND, ids=[f"{n}/{f}" for n, f in FOUND])
def test_what_a_fuzzer_once_found_is_refused_cleanly(name: str, found: str) -> None:
    _feed(name, (REGRESSIONS / name / found).read_bytes())
