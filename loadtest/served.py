"""``evq serve`` as the load tools start it: a session of its own on 127.0.0.1, a fresh data
directory, its output in a log file, SIGTERM at the end and SIGKILL for whatever of its
session (Ray's processes) is left.

The tools import this as a sibling module (``python loadtest/<tool>.py`` puts ``loadtest/``
first on ``sys.path``). It reads processes (a session's pids, a command line) through
``procstat``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import procstat
from ports import free_port as free_port  # the tools import it from here too
from procstat import session_pids  # the tools import it from here too

ROOT = Path(__file__).resolve().parent.parent

# Ray on loopback, without token auth or usage reports (as the tests run it).
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


BENCH = ROOT.parent / "shared" / "bench"  # the shared harness and its load generator


def put_load(lg_python: str, adapter: str, target: str, queue: str, args: Sequence[str]) -> dict:
    """One measured run of the shared load generator (``loadgen.py``, the adapter from
    ``loadtest/``) putting 100-B messages through ``target`` into ``queue``, with ``args``
    (producers, processes, duration, ``--opt``s); answers puts/s, p50 and p99 in ms."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [lg_python, str(BENCH / "loadgen.py"), "--adapter", adapter, "--target", target]
        cmd += ["--queue", queue, "--size", "100", "--warmup", "2", "--runs", "1"]
        cmd += ["--record-group", queue, "--name", queue, *args]
        env = {
            **os.environ,
            "PYTHONPATH": str(Path(__file__).resolve().parent),
            "ANCHORS_RESULTS_DIR": out,
            "ANCHORS_QUIET_MAX_WAIT": "0",
        }
        subprocess.run(cmd, cwd=BENCH, env=env, check=True, stdout=subprocess.DEVNULL, timeout=300)
        with open(os.path.join(out, f"{queue}.jsonl")) as f:
            run = [json.loads(line) for line in f if line.strip()][-1]["runs"][0]
    return {
        "puts_per_s": round(run["put_s"]),
        "p50_ms": round(run["put_p50_ms"], 2),
        "p99_ms": round(run["put_p99_ms"], 2),
    }


def get_json(url: str, timeout: float = 5) -> Any:
    """GET a JSON document; None when it does not answer 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read() or b"null") if r.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def cmdline(pid: int) -> str:
    """A process's command line ("" when it is gone)."""
    return procstat.cmdline(pid) or ""


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` until none is left (5 s at most)."""
    for _ in range(50):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


class EvqServe:
    """``evq serve --data DATA`` on 127.0.0.1 with ``extra`` arguments, in its own session
    (``python``: the interpreter of evq's virtualenv, for a tool that runs in another one)."""

    def __init__(
        self,
        data: Path,
        log_path: Path,
        extra: Sequence[str] = (),
        port: int | None = None,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
        python: str = sys.executable,
        scheme: str = "http",
    ) -> None:
        self.port = port or free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.command = [python, "-m", "evq", "serve", "--data", str(data)]
        self.command += ["--host", "127.0.0.1", "--port", str(self.port), *extra]
        env = {**os.environ, **RAY_ENV, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(
            self.command,
            cwd=cwd,  # another tree's evq: its directory, and PYTHONPATH in env
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float) -> None:
        """Wait for ``/readyz``. Raises: RuntimeError (it exited, or was too slow)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"evq serve exited with {self.proc.returncode}")
            if get_json(f"{self.url}/readyz", timeout=2) is not None:
                return
            time.sleep(0.3)
        raise RuntimeError(f"evq serve was not ready within {timeout} s")

    def stop(self, timeout: float = 60.0) -> dict[str, Any]:
        """SIGTERM and wait up to ``timeout`` s, then SIGKILL what is left of the session.

        Returns ``exit_code`` (None: it had to be killed), ``stop_seconds`` and
        ``killed_left`` (processes of its session still there after the wait)."""
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.monotonic() - started
        left = 0
        for attempt in range(100):
            pids = [p for p in session_pids(self.proc.pid) if p != self.proc.pid]
            if self.proc.poll() is None:
                pids.append(self.proc.pid)
            if not pids:
                break
            if attempt == 0:
                left = len(pids)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._log.close()
        return {"exit_code": code, "stop_seconds": round(seconds, 2), "killed_left": left}
