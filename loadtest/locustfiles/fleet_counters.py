"""Message counters (put, taken, acked, released, bytes) summed over Locust's processes.

Each worker process counts locally and sends its counts with every report to the master,
which adds them up; at the end the master (or a lone process) writes the totals and the
run's length as JSON to ``EVQ_LOADTEST_SUMMARY`` (loadtest/smoke.py sets it).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from locust import events

__all__ = ["count"]

_local: Counter[str] = Counter()  # this process, since its last report to the master
_totals: Counter[str] = Counter()  # the master's sum (or a lone process's)
_clock: dict[str, float] = {}


def count(**amounts: int) -> None:
    """Add to the message counters (put, taken, acked, released, bytes_put, …)."""
    _local.update(amounts)


@events.report_to_master.add_listener
def _report(client_id: str, data: dict[str, Any], **_: Any) -> None:
    data["evq"] = dict(_local)
    _local.clear()


@events.worker_report.add_listener
def _collect(client_id: str, data: dict[str, Any], **_: Any) -> None:
    _totals.update(data.get("evq") or {})


@events.test_start.add_listener
def _started(environment: Any, **_: Any) -> None:
    _clock.setdefault("start", time.monotonic())


@events.test_stop.add_listener
def _stopped(environment: Any, **_: Any) -> None:
    _clock["stop"] = time.monotonic()


@events.quitting.add_listener
def _summary(environment: Any, **_: Any) -> None:
    """On the master (or a lone process): write the counters to ``EVQ_LOADTEST_SUMMARY``."""
    from locust.runners import WorkerRunner

    path = os.environ.get("EVQ_LOADTEST_SUMMARY")
    if not path or isinstance(environment.runner, WorkerRunner):
        return
    totals = _totals + _local
    seconds = _clock.get("stop", time.monotonic()) - _clock.get("start", time.monotonic())
    summary = {"seconds": round(seconds, 1), **dict(sorted(totals.items()))}
    Path(path).write_text(json.dumps(summary, indent=2) + "\n")
