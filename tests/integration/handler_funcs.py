"""Handlers the integration tests run on Ray (imported by the Ray workers: the module must
stay importable from the repository root, the tests' working directory).

Each message body is JSON naming a ``log`` file; handlers append one line per event to it
(``O_APPEND`` writes of one line are atomic), and the tests read what happened from there.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from evq.handlers import Job, Reschedule, Send


def note(path: str, *fields: Any) -> None:
    """Append one line of space-separated fields to ``path``."""
    line = " ".join(str(f) for f in fields) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def lines(path: str) -> list[list[str]]:
    """The lines written so far, split into fields."""
    try:
        with open(path) as f:
            return [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def body(message: Job) -> dict[str, Any]:
    return message.json()  # type: ignore[no-any-return]


def record(message: Job) -> None:
    """Note the delivery; ack."""
    note(body(message)["log"], "handled", message.id, message.receive_count, time.time())


def always_fail(message: Job) -> None:
    """Note the attempt, then raise: retried with backoff until dead-lettered."""
    note(body(message)["log"], "attempt", message.id, message.receive_count, time.time())
    raise RuntimeError("the mail server refused it")


def die_once(message: Job) -> None:
    """On the first delivery, note this worker's pid and hang (the test kills it)."""
    doc = body(message)
    if message.receive_count == 1:
        note(doc["log"], "pid", message.id, os.getpid(), time.time())
        time.sleep(120)
    note(doc["log"], "handled", message.id, message.receive_count, time.time())


def forward(message: Job) -> Send:
    """Cascade into the queue the body names."""
    doc = body(message)
    note(doc["log"], "forward", message.id, message.receive_count, time.time())
    return Send(doc["next"], message.body)


def tick(message: Job) -> Reschedule:
    """Periodic work: note the run, come back in ``every`` seconds."""
    doc = body(message)
    note(doc["log"], "tick", message.id, message.receive_count, time.time())
    return Reschedule(doc["every"])


def nap(message: Job) -> None:
    """Sleep ``sleep`` seconds between a start and a done note."""
    doc = body(message)
    note(doc["log"], "start", message.id, message.receive_count, time.time())
    time.sleep(doc.get("sleep", 0.5))
    note(doc["log"], "done", message.id, message.receive_count, time.time())


class CrashAfterPut:
    """A source that kills its own process right after the first cascade put is durable
    (and before the ack), once: ``marker`` remembers that it happened."""

    def __init__(self, inner: Any, marker: str) -> None:
        self.inner = inner
        self.marker = marker

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put(self, queue: str, puts: Any) -> list[str]:
        statuses: list[str] = await self.inner.put(queue, puts)
        if _first_time(self.marker, *statuses):
            os.kill(os.getpid(), signal.SIGKILL)
        return statuses


def _first_time(marker: str, *fields: Any) -> bool:
    """True once: the first call writes ``marker``."""
    if os.path.exists(marker):
        return False
    note(marker, "crashed", os.getpid(), time.time(), *fields)
    return True
