"""A process's CPU time, resident memory, open descriptors and command line, the processes
of a session, and the machine's busy CPU time, as the load tools account them: read from
``/proc`` (Linux), nothing cached.

Each per-process reading returns None when the process is gone (or its entry cannot be
read), so a caller summing over a session of processes that come and go decides what a
missing one counts as. ``loadtest/cpu_per_put.py``, ``loadtest/watch_swarm.py``,
``loadtest/overload*.py`` and ``loadtest/served.py`` read processes only through here.

Imported as a sibling module (``python loadtest/<tool>.py`` puts ``loadtest/`` first on
``sys.path``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

__all__ = [
    "CLK_TCK",
    "PAGE_SIZE",
    "cmdline",
    "cpu_seconds",
    "fd_count",
    "machine_busy_seconds",
    "memory_bytes",
    "rss_bytes",
    "session_pids",
    "total_cpu_seconds",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` (all its threads), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def total_cpu_seconds(pids: Iterable[int]) -> float:
    """The CPU seconds of ``pids`` together; a process that is gone counts 0."""
    total = 0.0
    for pid in pids:
        cpu = cpu_seconds(pid)
        if cpu is not None:
            total += cpu
    return total


def rss_bytes(pid: int) -> int | None:
    """The resident set size of ``pid`` in bytes (``statm``), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def fd_count(pid: int) -> int | None:
    """How many descriptors ``pid`` has open, or None if it is gone (or not ours to see)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def cmdline(pid: int) -> str | None:
    """The command line of ``pid``, each argument followed by a space ("" for a zombie or a
    kernel thread), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` (one that ends while they are listed is left out)."""
    pids = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError):
            if entry.isdigit() and os.getsid(int(entry)) == sid:
                pids.append(int(entry))
    return pids


def machine_busy_seconds() -> float:
    """CPU seconds the machine's cores have been busy since boot (all users; neither idle,
    iowait nor steal)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    steal = fields[7] if len(fields) > 7 else 0
    return (sum(fields[:8]) - idle - steal) / CLK_TCK


def memory_bytes() -> dict[str, int]:
    """The machine's memory from ``/proc/meminfo``: ``total`` and ``available`` (what can be
    used without swapping: free, and caches the kernel can drop), in bytes."""
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            name, _, value = line.partition(":")
            fields[name] = int(value.split()[0]) * 1024  # kB
    return {"total": fields["MemTotal"], "available": fields["MemAvailable"]}
