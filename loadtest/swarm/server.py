"""The server under test: ``evq serve`` started by the tool (:func:`serve_process`), the
pids of its main process and gateway workers (:func:`server_processes`), and what those
hold (:func:`rss`, :func:`fds`, read through ``procstat``)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterable
from pathlib import Path

import psutil
from procstat import fd_count, rss_bytes
from served import EvqServe

__all__ = ["fds", "rss", "serve_process", "server_processes"]


def serve_process(args: argparse.Namespace, workdir: Path) -> EvqServe:
    """``evq serve`` started by the tool: own session, fresh data dir, SIGTERM at the end."""
    extra = ["--workers", str(args.workers)]
    if args.max_watchers:
        extra += ["--max-watchers", str(args.max_watchers)]
    if args.shards:
        extra += ["--shards", str(args.shards)]
    extra += args.serve_arg
    return EvqServe(workdir / "data", workdir / "evq-serve.log", extra, port=args.port or None)


def server_processes(port: int, main_pid: int | None) -> list[int]:
    """The pids of the evq main process and its gateway workers (children running
    gateway.workers)."""
    if main_pid is None:
        listeners = {
            c.pid
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
        }
        if not listeners:
            raise SystemExit(f"no process listens on port {port}; name it with --server-pid")
        mains = [p for p in listeners if psutil.Process(p).ppid() not in listeners]
        main_pid = mains[0]
    main = psutil.Process(main_pid)
    workers = [
        c for c in main.children() if "gateway.workers" in " ".join(_cmdline(c)) and c.is_running()
    ]
    return [main.pid, *(w.pid for w in workers)]


def _cmdline(p: psutil.Process) -> list[str]:
    with contextlib.suppress(psutil.Error):
        return p.cmdline()
    return []


def rss(pids: Iterable[int]) -> list[int]:
    """The RSS of each of ``pids`` in bytes; 0 for one that is gone."""
    return [rss_bytes(pid) or 0 for pid in pids]


def fds(pid: int) -> int:
    """The descriptors ``pid`` has open; -1 when it is gone."""
    n = fd_count(pid)
    return -1 if n is None else n
