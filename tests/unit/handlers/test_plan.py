"""The runtime's pure rules: backoff, cascade keys, what an outcome means, and sizing."""

from __future__ import annotations

import math
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given

from evq.handlers.api import Backoff, HandlerOptions, Job, Reschedule, Retry, Send
from evq.handlers.plan import (
    DONE,
    Again,
    Failure,
    GiveBack,
    Plan,
    backoff_delay,
    batch_outcomes,
    cascade_key,
    more_tasks,
    plan_outcome,
    resource_limit,
    take_size,
)

NO_JITTER = Backoff(base=1.0, factor=2.0, cap=60.0, jitter=0.0)


def msg(mid: str = "7", receive_count: int = 1, queue: str = "send") -> Job:
    return Job(id=mid, body=b"x", attributes={}, receive_count=receive_count, queue=queue)


# ------------------------------------------------------------------ backoff


@pytest.mark.parametrize(
    ("receives", "expected"), [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (500, 60.0)]
)
def test_backoff_doubles_per_receive_up_to_the_cap(receives: int, expected: float) -> None:
    assert backoff_delay(NO_JITTER, receives, 0.5) == expected


@given(
    base=st.floats(0, 100),
    factor=st.floats(1, 10),
    cap=st.floats(0, 3600),
    jitter=st.floats(0, 1),
    receives=st.integers(0, 10_000),
    draw=st.floats(0, 1, exclude_max=True),
)
def test_backoff_stays_between_the_jittered_floor_and_the_cap(
    base: float, factor: float, cap: float, jitter: float, receives: int, draw: float
) -> None:
    backoff = Backoff(base=base, factor=factor, cap=cap, jitter=jitter)
    delay = backoff_delay(backoff, receives, draw)
    full = backoff_delay(Backoff(base=base, factor=factor, cap=cap, jitter=0.0), receives, draw)
    assert 0 <= delay <= full <= cap
    assert delay >= full * (1 - jitter) - 1e-9


@given(receives=st.integers(1, 200))
def test_backoff_never_shrinks_with_more_receives(receives: int) -> None:
    assert backoff_delay(NO_JITTER, receives + 1, 0) >= backoff_delay(NO_JITTER, receives, 0)


@pytest.mark.parametrize(
    "kwargs", [{"factor": 0.5}, {"jitter": 1.5}, {"base": -1}, {"cap": math.inf}]
)
def test_backoff_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**kwargs)


# ------------------------------------------------------------------ cascade keys


def test_cascade_keys_name_the_source_message_and_the_put() -> None:
    assert cascade_key("send", "42", 0) == "send:42:0"
    assert cascade_key("send", "42", 1) != cascade_key("send", "42", 0)
    assert cascade_key("send", "42", 0) != cascade_key("other", "42", 0)


def test_cascade_keys_stay_within_the_queues_limit() -> None:
    long = cascade_key("q" * 80, "i" * 256, 3)
    assert len(long) <= 256
    assert long == cascade_key("q" * 80, "i" * 256, 3)
    assert long != cascade_key("q" * 80, "i" * 256, 4)


# ------------------------------------------------------------------ outcomes


def test_nothing_returned_means_ack() -> None:
    assert plan_outcome(msg(), None, NO_JITTER, 0.0) == Plan(DONE)


def test_a_put_cascades_with_a_derived_key_then_acks() -> None:
    put = Send("report", b"done")
    assert plan_outcome(msg(), put, NO_JITTER, 0.0) == Plan(DONE, (("send:7:0", put),))


def test_several_puts_get_keys_of_their_own_and_an_explicit_key_wins() -> None:
    a, b = Send("report", "a"), Send("audit", "b", key="run-2024-06-01")
    plan = plan_outcome(msg(), [a, b], NO_JITTER, 0.0)
    assert plan.puts == (("send:7:0", a), ("run-2024-06-01", b))
    assert plan.final == DONE


def test_reschedule_replaces_the_ack_and_may_follow_puts() -> None:
    put = Send("report", b"x")
    plan = plan_outcome(msg(), [put, Reschedule(3600)], NO_JITTER, 0.0)
    assert plan == Plan(Again(3600, None), (("send:7:0", put),))
    assert plan_outcome(msg(), Reschedule(at=5.0), NO_JITTER, 0.0).final == Again(None, 5.0)


def test_a_failure_is_released_after_the_backoff_of_its_receive_count() -> None:
    plan = plan_outcome(msg(receive_count=3), Failure("ValueError: no"), NO_JITTER, 0.0)
    assert plan == Plan(GiveBack(4.0), error="ValueError: no")


def test_retry_releases_with_its_own_delay_or_the_backoff() -> None:
    assert plan_outcome(msg(), Retry(9), NO_JITTER, 0.0) == Plan(GiveBack(9))
    assert plan_outcome(msg(receive_count=2), Retry(), NO_JITTER, 0.0) == Plan(GiveBack(2.0))


@pytest.mark.parametrize(
    "outcome", [42, "ok", [Send("a", "b"), 3], [Reschedule(1), Reschedule(2)], {"a": 1}]
)
def test_anything_else_is_a_failure_that_says_what_was_returned(outcome: object) -> None:
    plan = plan_outcome(msg(), outcome, NO_JITTER, 0.0)
    assert isinstance(plan.final, GiveBack)
    assert plan.puts == ()
    assert plan.error is not None
    assert "the handler returned" in plan.error


def test_batch_outcomes_by_position_by_id_or_all_acked() -> None:
    batch = [msg("1"), msg("2"), msg("3")]
    assert batch_outcomes(batch, None) == [None, None, None]
    assert batch_outcomes(batch, [None, Retry(), None]) == [None, Retry(), None]
    assert batch_outcomes(batch, {"2": Reschedule(5)}) == [None, Reschedule(5), None]


@pytest.mark.parametrize(("result", "text"), [([None], "1 outcomes for 3"), (7, "returned int")])
def test_a_batch_result_of_the_wrong_shape_fails_every_message(result: object, text: str) -> None:
    outcomes = batch_outcomes([msg("1"), msg("2"), msg("3")], result)
    assert len(outcomes) == 3
    assert all(isinstance(o, Failure) and text in o.error for o in outcomes)


# ------------------------------------------------------------------ sizing


def options(**kwargs: object) -> HandlerOptions:
    return HandlerOptions(queue="q", **kwargs)  # type: ignore[arg-type]


def test_nothing_ready_starts_nothing() -> None:
    assert more_tasks(0, 0, None, options()) == 0


def test_per_message_tasks_grow_with_depth_up_to_max_concurrency() -> None:
    opts = options(max_concurrency=8, batch_size=100)
    assert [more_tasks(n, 0, None, opts) for n in (1, 3, 8, 5000)] == [1, 3, 8, 8]
    assert more_tasks(5000, 6, None, opts) == 2
    assert more_tasks(5000, 8, None, opts) == 0


def test_batch_mode_runs_one_task_per_full_batch() -> None:
    opts = options(batch=True, batch_size=100, max_concurrency=8)
    assert [more_tasks(n, 0, None, opts) for n in (1, 100, 101, 250, 10**6)] == [1, 1, 2, 3, 8]


def test_free_resources_bound_the_tasks_but_never_below_one() -> None:
    opts = options(max_concurrency=8)
    assert more_tasks(100, 0, 3, opts) == 3
    assert more_tasks(100, 2, 3, opts) == 1
    assert more_tasks(100, 0, 0, opts) == 1  # Ray queues it until resources free up
    assert more_tasks(100, 1, 0, opts) == 0


@given(
    ready=st.integers(0, 10**6),
    in_flight=st.integers(0, 64),
    limit=st.none() | st.integers(0, 64),
    max_concurrency=st.integers(1, 64),
    batch=st.booleans(),
    batch_size=st.integers(1, 1000),
)
def test_sizing_never_exceeds_its_bounds(
    ready: int,
    in_flight: int,
    limit: int | None,
    max_concurrency: int,
    batch: bool,
    batch_size: int,
) -> None:
    opts = options(max_concurrency=max_concurrency, batch=batch, batch_size=batch_size)
    more = more_tasks(ready, in_flight, limit, opts)
    assert more >= 0
    assert in_flight + more <= max(in_flight, max_concurrency)
    if limit is not None:
        assert in_flight + more <= max(in_flight, limit, 1)
    if ready == 0:
        assert more == 0
    if ready and in_flight == 0:
        assert more >= 1
    size = take_size(ready, more, opts)
    assert 1 <= size <= batch_size
    if more and not batch:
        assert size * more >= min(ready, batch_size * more)  # the tasks cover what is ready


def test_take_size_spreads_few_messages_over_the_tasks() -> None:
    opts = options(batch_size=100)
    assert take_size(10, 8, opts) == 2
    assert take_size(10**6, 8, opts) == 100
    assert take_size(3, 8, options(batch=True, batch_size=50)) == 50


def test_resource_limit_counts_what_fits_next_to_what_runs() -> None:
    need = {"CPU": 0.5, "GPU": 0.0}
    assert resource_limit({"CPU": 1.6}, need, held=2) == 5
    assert resource_limit({"CPU": 1.6, "memory": 10.0}, {"CPU": 0.5, "memory": 4.0}, 0) == 2
    assert resource_limit({}, {"CPU": 1.0}, held=1) == 1
    assert resource_limit({"CPU": 2.0}, {"CPU": 0.0}, held=3) is None


def test_the_rules_and_the_api_are_pure() -> None:
    from tests.unit.test_layering import _imports

    root = Path(__file__).resolve().parents[3] / "evq" / "handlers"
    for module in ("plan.py", "api.py"):
        imported = {name.split(".")[0] for name in _imports(root / module)}
        assert not imported & {"ray", "aiohttp", "asyncio", "os", "time", "random", "socket"}
