"""Every process's records name its shard or handler, and the queue a record is about; the
lines a Ray driver forwards keep one format (tests/unit/ops/test_logs.py: drop and block)."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from actors import logsetup


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def written(handler: logsetup.NonBlockingHandler, stream: io.StringIO) -> list[str]:
    """The lines written once the writer has caught up."""
    for _ in range(500):
        if handler.queue.empty():
            break
        threading.Event().wait(0.01)
    handler.close()
    return stream.getvalue().splitlines()


@pytest.mark.usefixtures("restore_logging")
def test_a_shards_records_name_the_shard_and_the_queue_they_are_about() -> None:
    stream = io.StringIO()
    handler = logsetup.setup_logging("INFO", "json", stream=stream, fields={"shard": 3})
    log = logging.getLogger("evq.test")
    log.info("queue %s: snapshot failed: %s", "jobs", "disk full")
    log.info("shard %d: recovering", 3)
    log.info("queue %s: given", "x", extra={"queue": "explicit"})
    record = logging.LogRecord("evq.test", logging.INFO, "", 0, "private", None, None)
    record._ray_timestamp_ns = 1  # type: ignore[attr-defined]  # as Ray's record factory
    log.handle(record)
    docs = [json.loads(line) for line in written(handler, stream)]
    assert [d["shard"] for d in docs] == [3, 3, 3, 3]
    assert [d.get("queue") for d in docs] == ["jobs", None, "explicit", None]
    assert docs[0]["msg"] == "queue jobs: snapshot failed: disk full"
    assert "_ray_timestamp_ns" not in docs[3]


@pytest.mark.usefixtures("restore_logging")
def test_text_names_the_fields_before_the_logger() -> None:
    stream = io.StringIO()
    handler = logsetup.setup_logging("INFO", "text", stream=stream, fields={"shard": 1})
    logging.getLogger("actors.shard").warning("shard %d/%d: recovering", 1, 2)
    (line,) = written(handler, stream)
    assert line.endswith(" WARNING shard=1 actors.shard: shard 1/2: recovering")


BATCH = {
    "pid": 4242,
    "actor_name": "ShardActor",
    "lines": [
        '{"ts": 1.0, "level": "info", "logger": "actors.shard", "msg": "m", "shard": 0}',
        "ts=1.000 level=info logger=actors.shard msg=m shard=0",
        "Traceback (most recent call last):",
    ],
}


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        (
            "json",
            [
                BATCH["lines"][0],
                json.dumps(
                    {"level": "info", "logger": "ray.worker", "msg": BATCH["lines"][1]}
                    | {"pid": 4242, "actor": "ShardActor"}
                ),
                json.dumps(
                    {"level": "info", "logger": "ray.worker", "msg": BATCH["lines"][2]}
                    | {"pid": 4242, "actor": "ShardActor"}
                ),
            ],
        ),
        ("kv", [None, BATCH["lines"][1], None]),
        ("text", [f"(ShardActor pid=4242) {line}" for line in BATCH["lines"]]),
    ],
)
def test_forwarded_lines_in_the_format_stay_as_they_are_the_others_are_wrapped(
    fmt: str, expected: list[str | None]
) -> None:
    stream = io.StringIO()
    handler = logsetup.NonBlockingHandler(stream)
    handler.setFormatter(
        {
            "json": logsetup.JsonFormatter(),
            "kv": logsetup.KeyValueFormatter(),
            "text": logsetup.TextFormatter(),
        }[fmt]
    )
    for record in logsetup.worker_records(BATCH):
        handler.handle(record)
    lines = written(handler, stream)
    for line, want in zip(lines, expected, strict=True):
        if fmt == "json":
            doc, wanted = json.loads(line), json.loads(want or "")
            doc.pop("ts")
            wanted.pop("ts", None)
            assert doc == wanted, line
        elif want is not None:
            assert line == want
        else:
            assert line.startswith("ts=")
            assert " logger=ray.worker " in line
            assert " pid=4242 " in line


def test_bad_settings_are_refused_before_anything_is_set_up() -> None:
    with pytest.raises(ValueError, match="format"):
        logsetup.LogConfig(format="xml").check()
    with pytest.raises(ValueError, match="mode"):
        logsetup.LogConfig(mode="later").check()


def test_the_shared_logging_reaches_nothing_of_the_gateway_nor_ray_until_a_driver_asks() -> None:
    """Shards and handlers import it: it must not pull the gateway in (no upward import),
    nor Ray (only forward_ray_output, in a Ray driver, does)."""
    from tests.unit.test_layering import ROOT, _closure

    assert not [k for k in _closure(ROOT / "actors" / "logsetup.py") if "gateway" in k]
    probe = "import sys, actors.logsetup; print('ray' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"
