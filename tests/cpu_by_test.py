"""A pytest plugin that measures the CPU each test costs the machine, everything it started
included (servers, Ray's processes, load tools, JVMs), for finding what makes the suite long:
the suite keeps both cores busy, so its time is its CPU, and ``--durations`` (wall time,
which a test waiting on a timer also spends) points at the wrong tests.

Each pytest process (every xdist worker, or the one process) moves itself into a cgroup of
its own under cgroup v1's ``cpuacct`` hierarchy; every process it starts from then on is
counted there, whatever session or process group it makes. A test's CPU is the cgroup's
``cpuacct.usage`` after its teardown minus before its setup (a module's shared server's
start counts to the module's first test, its idle time to the tests it idles through).
Needs root and ``/sys/fs/cgroup/cpuacct``; without them it says so and measures nothing.

    .venv/bin/python -m pytest -p tests.cpu_by_test -n 3 --dist loadfile   # writes cpu-by-test/
    .venv/bin/python tests/cpu_by_test.py cpu-by-test                       # the tables

One JSON line per test in ``cpu-by-test/<worker>.jsonl``: ``test``, ``cpu_s``, ``wall_s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path("/sys/fs/cgroup/cpuacct")
OUT = Path(os.environ.get("EVQ_CPU_BY_TEST_DIR", "cpu-by-test"))


class _Meter:
    def __init__(self, worker: str) -> None:
        self.group = ROOT / f"evq-tests-{os.getpid()}-{worker}"
        self.group.mkdir(exist_ok=True)
        (self.group / "cgroup.procs").write_text(str(os.getpid()))
        OUT.mkdir(exist_ok=True)
        self.out = (OUT / f"{worker}.jsonl").open("a")

    def usage_s(self) -> float:
        return int((self.group / "cpuacct.usage").read_text()) / 1e9


_meter: _Meter | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _meter
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if worker == "main" and config.getoption("numprocesses", None):
        return  # the xdist controller runs no test
    try:
        _meter = _Meter(worker)
    except OSError as exc:
        print(f"cpu_by_test: no cgroup to count in ({exc}); nothing measured", file=sys.stderr)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _meter is None:
        return
    _meter.out.close()
    (ROOT / "cgroup.procs").write_text(str(os.getpid()))
    with contextlib.suppress(OSError):  # a process of the tests outlives them: left
        _meter.group.rmdir()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if _meter is None:
        yield
        return
    cpu, wall = _meter.usage_s(), time.monotonic()
    yield
    doc = {
        "test": item.nodeid,
        "cpu_s": round(_meter.usage_s() - cpu, 3),
        "wall_s": round(time.monotonic() - wall, 3),
    }
    _meter.out.write(json.dumps(doc) + "\n")
    _meter.out.flush()


def _tables(directory: Path, top: int = 40) -> None:
    rows: list[dict[str, Any]] = []
    for path in directory.glob("*.jsonl"):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    total = sum(r["cpu_s"] for r in rows)
    print(f"{len(rows)} tests, {total:.0f} CPU-s in all\n")
    by_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        m = by_module[r["test"].split("::")[0]]
        m[0] += r["cpu_s"]
        m[1] += r["wall_s"]
        m[2] += 1
    print("| module | tests | CPU, s | share | wall, s |\n|---|---|---|---|---|")
    for name, (cpu, wall, n) in sorted(by_module.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name} | {n} | {cpu:.1f} | {100 * cpu / total:.1f} % | {wall:.1f} |")
    print("\n| test | CPU, s | wall, s |\n|---|---|---|")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]:
        print(f"| {r['test']} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} |")


if __name__ == "__main__":
    _tables(Path(sys.argv[1] if len(sys.argv) > 1 else OUT))
