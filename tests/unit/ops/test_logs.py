"""The logger never blocks the server in drop mode, counts and reports what it drops, and
loses nothing in block mode; formats are parseable."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from gateway import logs


class GatedStream(io.StringIO):
    """A sink that blocks every write until the gate opens (a stuck log collector)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def write(self, s: str) -> int:
        self.gate.wait(30)
        return super().write(s)


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


@pytest.mark.usefixtures("restore_logging")
def test_drop_mode_never_blocks_and_reports_the_drops() -> None:
    stream = GatedStream()
    handler = logs.setup_logging("INFO", "json", mode="drop", capacity=10, stream=stream)
    before = logs.dropped()
    log = logging.getLogger("evq.test")
    for i in range(500):  # the sink is stuck: this must still return
        log.info("record %d", i, extra={"queue": "q"})
    assert logs.dropped() - before >= 480
    stream.gate.set()
    for _ in range(500):
        if handler.queue.empty():
            break
        threading.Event().wait(0.01)
    log.info("after")
    handler.close()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    reported = sum(d["dropped"] for d in lines if d["msg"].startswith("dropped "))
    assert reported == logs.dropped() - before
    assert lines[-1]["msg"] == "after"
    assert all(d.get("queue") == "q" for d in lines if d["msg"].startswith("record"))


@pytest.mark.usefixtures("restore_logging")
def test_block_mode_loses_nothing() -> None:
    stream = GatedStream()
    handler = logs.setup_logging("INFO", "kv", mode="block", capacity=5, stream=stream)
    before = logs.dropped()
    log = logging.getLogger("evq.test")
    done = threading.Event()

    def produce() -> None:
        for i in range(50):
            log.info("n=%d", i)
        done.set()

    t = threading.Thread(target=produce)
    t.start()
    assert not done.wait(0.3)  # it waits for the stuck sink instead of dropping
    stream.gate.set()
    t.join(10)
    handler.close()
    lines = stream.getvalue().splitlines()
    assert len([line for line in lines if "msg=n=" in line or 'msg="n=' in line]) == 50
    assert logs.dropped() == before
    assert lines[0].startswith("ts=")
    assert " level=info logger=evq.test " in lines[0]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="format"):
        logs.setup_logging(fmt="xml")
    with pytest.raises(ValueError, match="mode"):
        logs.setup_logging(mode="maybe")
