"""The public API: options are checked, handlers travel by reference, outcomes are checked."""

from __future__ import annotations

import asyncio
import pickle
import time

import pytest
from ray import cloudpickle

from evq.handlers import (
    Backoff,
    Handler,
    HandlerOptions,
    Job,
    Reschedule,
    Retry,
    Send,
    handler,
    load_handler,
)
from evq.handlers.plan import Failure
from evq.handlers.task import run_task
from tests.unit.handlers import funcs


def msg(body: bytes = b"x", mid: str = "1") -> Job:
    return Job(id=mid, body=body, attributes={"a": "b"}, receive_count=1, queue="mail")


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"batch_size": 0}, "batch_size must be 1..1000"),
        ({"batch_size": 1001}, "batch_size must be 1..1000"),
        ({"max_concurrency": 0}, "max_concurrency must be >= 1"),
        ({"visibility_timeout": 0}, "visibility_timeout must be > 0"),
        ({"num_cpus": -1}, "num_cpus"),
        ({"memory": 0}, "memory must be > 0"),
        ({"drain_timeout": -1}, "drain_timeout"),
    ],
)
def test_invalid_options_are_refused_with_the_reason(kwargs: dict, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        handler("q", **kwargs)


def test_a_queue_name_is_required() -> None:
    with pytest.raises(ValueError, match="queue name"):
        HandlerOptions(queue="")


def test_ray_options_carry_only_what_was_asked_for() -> None:
    opts = HandlerOptions(queue="q", num_cpus=0.5, memory=10**8, runtime_env={"env_vars": {}})
    assert opts.ray_options() == {"num_cpus": 0.5, "memory": 10**8, "runtime_env": {"env_vars": {}}}


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (lambda: Send("", b"x"), "queue name"),
        (lambda: Send("q", b""), "non-empty body"),
        (lambda: Send("q", b"x", delay=1, activate_at=2), "not both"),
        (lambda: Reschedule(), "exactly one"),
        (lambda: Reschedule(1, at=2), "exactly one"),
        (lambda: Reschedule(-1), ">= 0"),
        (lambda: Retry(-1), ">= 0"),
    ],
)
def test_outcomes_check_their_fields(make, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        make()


def test_a_decorated_function_still_calls_and_knows_its_options() -> None:
    assert isinstance(funcs.send, Handler)
    assert funcs.send.name == "send"
    assert funcs.send.options.queue == "mail"
    assert funcs.send(msg(b"hi")) == Send("report", b"hi")


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
def test_a_handler_travels_by_reference_with_its_options(dumps) -> None:
    changed = funcs.send.with_options(batch_size=3, backoff=Backoff(base=5))
    data = dumps(changed)
    assert b"tests.unit.handlers.funcs:send" in data
    back = pickle.loads(data)
    assert back.fn is funcs.send.fn
    assert back.options == changed.options


def test_a_plain_function_travels_by_reference_too() -> None:
    h = load_handler("tests.unit.handlers.funcs:plain", queue="q", max_concurrency=2)
    back = pickle.loads(cloudpickle.dumps(h))
    assert back.fn is funcs.plain
    assert back.options == h.options


def test_load_handler_finds_decorated_and_plain_functions() -> None:
    assert load_handler("tests.unit.handlers.funcs:send").options.queue == "mail"
    assert load_handler("tests.unit.handlers.funcs:send", queue="other").options.queue == "other"
    plain = load_handler("tests.unit.handlers.funcs:plain", queue="q", batch=True)
    assert plain.fn is funcs.plain
    assert plain.options.batch


@pytest.mark.parametrize(
    ("ref", "error", "text"),
    [
        ("tests.unit.handlers.funcs", ValueError, "module:function"),
        ("tests.unit.handlers.funcs:nothing", ValueError, "has no 'nothing'"),
        ("tests.unit.handlers.funcs:NOT_CALLABLE", ValueError, "not callable"),
        ("tests.unit.handlers.funcs:plain", ValueError, "give the queue"),
        ("tests.unit.handlers.nowhere:f", ImportError, "nowhere"),
    ],
)
def test_load_handler_says_what_is_wrong(ref: str, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        load_handler(ref)


def test_message_body_helpers() -> None:
    m = msg(b'{"to": "ann"}')
    assert m.text == '{"to": "ann"}'
    assert m.json() == {"to": "ann"}


# ------------------------------------------------------------------ inside a task


def test_a_task_gives_each_message_its_own_outcome() -> None:
    h = load_handler("tests.unit.handlers.funcs:plain", queue="q")
    outcomes = run_task(h, [msg(b"a"), msg(b"boom"), msg(b"c")])
    assert outcomes[0] is None
    assert outcomes[2] is None
    assert isinstance(outcomes[1], Failure)
    assert outcomes[1].error == "ValueError: boom"
    assert "funcs.py" in outcomes[1].trace


def test_an_async_handler_runs_its_messages_concurrently_in_one_task() -> None:
    started = time.perf_counter()
    outcomes = run_task(funcs.wait_a_little, [msg(mid=str(i)) for i in range(10)])
    assert outcomes == [None] * 10
    assert time.perf_counter() - started < 1.5  # 10 x 0.2 s one after another would be 2 s


def test_an_async_handler_runs_one_fifo_group_in_order_and_groups_side_by_side() -> None:
    events: list[tuple[str, str]] = []

    async def record(message: Job) -> None:
        events.append(("start", message.id))
        await asyncio.sleep(0.05 if message.id.endswith("1") else 0.01)
        events.append(("end", message.id))

    h = Handler(record, HandlerOptions(queue="q.fifo"))
    taken = [
        Job(id=f"{g}{i}", body=b"x", attributes={}, receive_count=1, queue="q", group=g)
        for g in ("g", "h")
        for i in (1, 2, 3)
    ]
    assert run_task(h, taken) == [None] * 6
    for g in ("g", "h"):
        mine = [e for e in events if e[1].startswith(g)]
        assert mine == [(kind, f"{g}{i}") for i in (1, 2, 3) for kind in ("start", "end")]
    assert events[:2] == [("start", "g1"), ("start", "h1")]  # the groups overlap


def test_a_batch_handler_is_called_once_with_the_list() -> None:
    calls: list[list[str]] = []

    def bulk(messages: list[Job]) -> dict[str, object]:
        calls.append([m.id for m in messages])
        return {"2": Retry(1)}

    h = Handler(bulk, HandlerOptions(queue="q", batch=True))
    assert run_task(h, [msg(mid="1"), msg(mid="2")]) == [None, Retry(1)]
    assert calls == [["1", "2"]]


def test_a_batch_handler_that_raises_fails_the_whole_batch() -> None:
    def bulk(messages: list[Job]) -> None:
        raise RuntimeError("database down")

    h = Handler(bulk, HandlerOptions(queue="q", batch=True))
    outcomes = run_task(h, [msg(mid="1"), msg(mid="2")])
    assert [o.error for o in outcomes] == ["RuntimeError: database down"] * 2
