"""loadtest/procstat.py, the one reading of /proc that loadtest/cpu_per_put.py,
loadtest/watch_swarm.py, loadtest/overload*.py and loadtest/served.py share: a live process
reads as psutil reads it, a session's processes are found, a process that is gone reads None
(and counts 0 in a total), and no tool reads /proc by itself."""

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
    memory, machine = procstat.memory_bytes(), psutil.virtual_memory()
    assert memory["total"] == machine.total
    assert memory["available"] == pytest.approx(machine.available, rel=0.05)


@pytest.mark.integration  # a subprocess
def test_a_session_is_its_leader_and_the_leaders_children(session: tuple[int, int]) -> None:
    leader, child = session
    assert sorted(procstat.session_pids(leader)) == sorted([leader, child])
    assert os.getpid() not in procstat.session_pids(leader)
    assert os.getpid() in procstat.session_pids(os.getsid(0))


@pytest.mark.integration  # a subprocess
def test_a_command_line_is_its_arguments_each_followed_by_a_space(
    session: tuple[int, int],
) -> None:
    _, child = session
    code = "import os, sys; print(os.getpid(), flush=True); sys.stdin.read()"
    assert procstat.cmdline(child) == f"{sys.executable} -c {code} "
    assert procstat.cmdline(child) == "".join(a + " " for a in psutil.Process(child).cmdline())


@pytest.mark.integration  # a subprocess
def test_a_process_that_is_gone_reads_none_and_counts_nothing() -> None:
    pid = _gone_pid()
    assert procstat.cpu_seconds(pid) is None
    assert procstat.rss_bytes(pid) is None
    assert procstat.fd_count(pid) is None
    assert procstat.cmdline(pid) is None
    assert procstat.session_pids(pid) == []
    mine = procstat.cpu_seconds(os.getpid())
    assert mine is not None
    assert procstat.total_cpu_seconds([pid, os.getpid()]) == pytest.approx(mine, abs=0.05)


def test_the_machine_busy_time_only_grows() -> None:
    first = procstat.machine_busy_seconds()
    sum(range(200_000))
    assert 0 < first <= procstat.machine_busy_seconds()


def _on_proc(text: str) -> bool:
    return text.rstrip("/") == "/proc" or "/proc/" in text


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstrings' nodes in ``tree`` (they may name /proc: they read nothing)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _reads_proc(path: Path) -> list[str]:
    """Where ``path`` reads a process by itself: a string naming /proc (or a file in it)
    outside a docstring, or psutil's readings."""
    found = []
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _on_proc(node.value) and id(node) not in docstrings:
                found.append(f"{path.name}:{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value for v in node.values if isinstance(v, ast.Constant) and type(v.value) is str
            )
            if _on_proc(text):
                found.append(f"{path.name}:{node.lineno}: an f-string on /proc")
        elif isinstance(node, ast.Attribute) and node.attr in (
            "cpu_times",
            "memory_info",
            "num_fds",
            "virtual_memory",
        ):
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    return found


def test_the_tools_read_processes_only_through_procstat() -> None:
    tools = [LOADTEST / "cpu_per_put.py", LOADTEST / "watch_swarm.py", LOADTEST / "served.py"]
    tools += sorted(LOADTEST.glob("overload*.py")) + sorted(LOADTEST.glob("bench_depth*.py"))
    tools += sorted((LOADTEST / "swarm").glob("*.py"))
    assert {"overload.py", "overload_sample.py", "overload_soak.py"} <= {p.name for p in tools}
    assert [hit for path in tools for hit in _reads_proc(path)] == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ('open(f"/proc/{pid}/statm")', True),
        ('os.listdir("/proc")', True),
        ('Path("/proc/")', True),
        ("p.memory_info()", True),
        ('"""Reads ``/proc/PID/fd``."""\nx = "/process"', False),
        ('def f():\n    """From /proc/stat."""\n    return "/proc/stat"', True),
    ],
    ids=["f-string", "listing", "path", "psutil", "docstring", "docstring-and-read"],
)
def test_the_check_finds_a_reading_of_proc_but_not_a_mention(
    tmp_path: Path, source: str, found: bool
) -> None:
    module = tmp_path / "tool.py"
    module.write_text(source + "\n")
    assert bool(_reads_proc(module)) is found
