"""loadtest/procstat.py, the one reading of /proc that loadtest/cpu_per_put.py and
loadtest/watch_swarm.py share: a live process reads as psutil reads it, a process that is
gone reads None (and counts 0 in a total), and neither tool reads /proc by itself."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

import procstat

LOADTEST = Path(procstat.__file__).parent


def _gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its /proc entry is gone
    return child.pid


def test_a_live_process_reads_as_psutil_reads_it() -> None:
    me, pid = psutil.Process(), os.getpid()
    sum(range(200_000))  # some CPU of our own
    times = me.cpu_times()
    cpu = procstat.cpu_seconds(pid)
    assert cpu is not None
    assert cpu == pytest.approx(times.user + times.system, abs=0.05)
    assert procstat.rss_bytes(pid) == pytest.approx(me.memory_info().rss, rel=0.05)
    assert procstat.fd_count(pid) == me.num_fds()


@pytest.mark.integration  # a subprocess
def test_a_process_that_is_gone_reads_none_and_counts_nothing() -> None:
    pid = _gone_pid()
    assert procstat.cpu_seconds(pid) is None
    assert procstat.rss_bytes(pid) is None
    assert procstat.fd_count(pid) is None
    mine = procstat.cpu_seconds(os.getpid())
    assert mine is not None
    assert procstat.total_cpu_seconds([pid, os.getpid()]) == pytest.approx(mine, abs=0.05)


def test_the_machine_busy_time_only_grows() -> None:
    first = procstat.machine_busy_seconds()
    sum(range(200_000))
    assert 0 < first <= procstat.machine_busy_seconds()


def _reads_proc(path: Path) -> list[str]:
    """Where ``path`` reads a process by itself: a "/proc/" string or psutil's readings."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "/proc/" in node.value:
                found.append(f"{path.name}:{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value for v in node.values if isinstance(v, ast.Constant) and type(v.value) is str
            )
            if "/proc/" in text:
                found.append(f"{path.name}:{node.lineno}: an f-string on /proc")
        elif isinstance(node, ast.Attribute) and node.attr in (
            "cpu_times",
            "memory_info",
            "num_fds",
        ):
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    return found


def test_the_tools_read_processes_only_through_procstat() -> None:
    tools = [LOADTEST / "cpu_per_put.py", LOADTEST / "watch_swarm.py"]
    tools += sorted((LOADTEST / "swarm").glob("*.py"))
    assert [hit for path in tools for hit in _reads_proc(path)] == []
