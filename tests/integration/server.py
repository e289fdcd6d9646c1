"""A real ``evq serve`` in a subprocess, for integration tests.

Each server runs in its own session (process group), so stopping it — gracefully with
SIGTERM, or brutally with SIGKILL of the whole group — also stops every Ray process it
started, and nothing else on the machine (never ``ray stop``: it kills every Ray process of
the user).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVQ = [sys.executable, "-m", "gateway.cli"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(**extra: str) -> dict[str, str]:
    """The environment for a server subprocess (Ray without token auth, on loopback)."""
    env = dict(os.environ)
    env.update(
        RAY_AUTH_MODE="disabled",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class Server:
    """One ``evq serve`` process: start, wait until ready, stop."""

    def __init__(
        self,
        data: Path,
        *args: str,
        port: int | None = None,
        log: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data = data
        self.port = port or free_port()
        self.args = list(args)
        self.log_path = log or data.parent / f"evq-serve-{self.port}.log"
        self.env = env or server_env()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, ready_timeout: float = 120.0) -> Server:
        """Start the server and wait until ``/readyz`` answers 200.

        Raises:
            RuntimeError: it exited or did not get ready in time (the log is in the message).
        """
        command = [*EVQ, "serve", "--data", str(self.data), "--port", str(self.port), *self.args]
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"evq serve exited with {self.proc.returncode}:\n{self.log()}")
            if self.ready():
                return self
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"evq serve was not ready within {ready_timeout}s:\n{self.log()}")

    def ready(self) -> bool:
        """Whether /readyz answers 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def log(self) -> str:
        """The server's output so far (last 200 lines)."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-200:])
        return ""

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait for a graceful exit, then make sure the whole group is gone."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        self._reap_group()
        return int(self.proc.returncode)

    def kill(self) -> None:
        """SIGKILL the server and every process of its group (its Ray runtime)."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._reap_group()

    def _reap_group(self) -> None:
        """Ray's processes outlive a graceful driver for a moment; never let them linger."""
        assert self.proc is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self._log.close()


def request(
    method: str, url: str, doc: object | None = None, timeout: float = 30
) -> tuple[int, dict]:
    """A JSON request with the standard library: (status, decoded body or {})."""
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else {})
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else {})


@contextlib.contextmanager
def running(data: Path, *args: str) -> Iterator[Server]:
    """A started server, stopped gracefully at the end (killed if that fails)."""
    server = Server(data, *args).start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            try:
                server.stop()
            except Exception:
                server.kill()
