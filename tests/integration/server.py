"""A real ``evq serve`` in a subprocess, for integration tests.

Each server runs in its own session (``start_new_session``), so stopping it — gracefully
with SIGTERM, or brutally with SIGKILL — also stops every Ray process it started, and
nothing else on the machine (never ``ray stop``: it kills every Ray process of the user).
Ray puts each worker process (the shard actors) in a process group of its own, but they
stay in the server's session: :meth:`Server.kill` therefore kills the whole session, not
only the server's process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.conftest import free_port as free_port  # the tests import it from here too

ROOT = Path(__file__).resolve().parents[2]
EVQ = [sys.executable, "-m", "evq"]

# A shard actor's first words: "... actors.shard: shard 1/2: recovering 0 queue(s)".
_SHARD_LINE = re.compile(r"actors\.shard: shard (\d+)/\d+: recovering")


# What Ray needs here, in a server subprocess or in the test process: no token auth, on
# loopback, no usage reports.
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def server_env(**extra: str) -> dict[str, str]:
    """The environment for a server subprocess (Ray without token auth, on loopback)."""
    return {**os.environ, **RAY_ENV, "PYTHONUNBUFFERED": "1", **extra}


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (zombies included until their parent reaps them)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            if os.getsid(pid) == sid:
                pids.append(pid)
    return pids


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def kill_until_gone(pids: Callable[[], list[int]], attempts: int = 100) -> None:
    """SIGKILL the processes ``pids()`` names until it names none (or ``attempts`` runs out)."""
    for _ in range(attempts):
        left = pids()
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def cmdline(pid: int) -> str:
    """A process's command line ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class Server:
    """One ``evq serve`` process: start, wait until ready, stop; restartable."""

    def __init__(
        self,
        data: Path,
        *args: str,
        port: int | None = None,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        evq: list[str] | None = None,
        ca_bundle: Path | None = None,
    ) -> None:
        self.data = data
        # HTTPS (the caller gives --tls-cert/--tls-key): probes verify with this CA bundle
        self.ca_bundle = ca_bundle
        self.evq = evq or EVQ  # how to run `evq` (another virtualenv's python, say)
        self.host = host
        self.port = port or free_port()
        self.args = list(args)
        self.log_path = log or data.parent / f"evq-serve-{self.port}.log"
        self.env = env or server_env()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    @property
    def url(self) -> str:
        """Base URL of the server."""
        scheme = "https" if self.ca_bundle is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """The server's pid (also its session and process group id)."""
        assert self.proc is not None
        return self.proc.pid

    def start(self, *, ready_timeout: float = 120.0, wait_ready: bool = True) -> Server:
        """Start the server and wait until ``/readyz`` answers 200 (``/healthz`` only when
        not ``wait_ready``). A stopped server may be started again on the same port.

        Raises:
            RuntimeError: it exited or did not get ready in time (the log is in the message).
        """
        assert self.proc is None or self.proc.poll() is not None, "already running"
        command = [*self.evq, "serve", "--data", str(self.data), "--port", str(self.port)]
        command += self.args
        if self.host != "127.0.0.1":
            command += ["--host", self.host]
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        check = self.ready if wait_ready else self.healthy
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reap_session(0)
                raise RuntimeError(f"evq serve exited with {self.proc.returncode}:\n{self.log()}")
            if check():
                return self
            time.sleep(0.05 if not wait_ready else 0.2)
        self.kill()
        raise RuntimeError(f"evq serve was not ready within {ready_timeout}s:\n{self.log()}")

    def _probe(self, path: str) -> bool:
        try:
            context = None
            if self.ca_bundle is not None:
                context = ssl.create_default_context(cafile=str(self.ca_bundle))
            with urllib.request.urlopen(f"{self.url}{path}", timeout=2, context=context) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def ready(self) -> bool:
        """Whether /readyz answers 200."""
        return self._probe("/readyz")

    def healthy(self) -> bool:
        """Whether /healthz answers 200."""
        return self._probe("/healthz")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until /readyz answers 200.

        Raises:
            RuntimeError: it exited or was not ready in time.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"evq serve exited with {self.proc.returncode}:\n{self.log()}")
            if self.ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"evq serve was not ready within {timeout}s:\n{self.log()}")

    def log(self, *, whole: bool = False, lines: int = 200) -> str:
        """The server's output since its last start (or all runs), last ``lines`` lines."""
        with contextlib.suppress(OSError):
            with self.log_path.open("rb") as f:
                if not whole:
                    f.seek(self._log_start)
                text = f.read().decode(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    def running(self) -> bool:
        """Whether the server process runs."""
        return self.proc is not None and self.proc.poll() is None

    def pids(self) -> list[int]:
        """Every live process of the server's session (server, Ray, shard actors)."""
        return [p for p in session_pids(self.pid) if _alive(p)]

    def shard_logs(self) -> dict[int, str]:
        """Live shard actor processes: pid → their own stderr so far.

        Ray forwards worker output to the server's log late (seconds, sometimes only at
        exit); the worker's own log file (its fd 2) is written at once.
        """
        logs = {}
        for pid in self.pids():
            if not cmdline(pid).startswith("ray::ShardActor"):
                continue
            with contextlib.suppress(OSError), open(os.readlink(f"/proc/{pid}/fd/2"), "rb") as f:
                logs[pid] = f.read().decode(errors="replace")
        return logs

    def shard_pids(self) -> dict[int, int]:
        """Live shard actor processes: shard index → pid (those that have started)."""
        found: dict[int, int] = {}
        for pid, text in self.shard_logs().items():
            for m in _SHARD_LINE.finditer(text):
                found[int(m.group(1))] = pid
        return found

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait for a graceful exit, then make sure the whole session is gone."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        self._reap_session(20)
        return int(self.proc.returncode)

    def kill(self) -> None:
        """SIGKILL the server and every process of its session (its Ray runtime)."""
        assert self.proc is not None
        self._signal_session(signal.SIGKILL)
        self.proc.wait(30)
        self._reap_session(0)

    def _signal_session(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        for pid in session_pids(self.proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _reap_session(self, grace: float) -> None:
        """Ray's processes outlive a graceful driver for a moment; never let them linger."""
        assert self.proc is not None
        deadline = time.monotonic() + grace
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        for _ in range(50):  # SIGKILL what is left until nothing of the session runs
            if not self.pids():
                break
            self._signal_session(signal.SIGKILL)
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            self._log.close()


def request(
    method: str,
    url: str,
    doc: object | None = None,
    timeout: float = 30,
    *,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, dict]:
    """A JSON request with the standard library: (status, decoded body or {})."""
    if data is None and doc is not None:
        data = json.dumps(doc).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
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
        elif server.proc is not None:
            server._reap_session(0)


def eventually(
    check: Callable[[], object],
    *,
    timeout: float,
    interval: float = 0.1,
    what: str | Callable[[], str] = "",
) -> object:
    """Call ``check`` until it returns something truthy (an AssertionError counts as not
    yet); fail after ``timeout`` s with the last answer and ``what`` (a callable is called
    then: e.g. a process's output so far)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = check()
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            shown = what() if callable(what) else what
            raise AssertionError(f"not within {timeout}s: {shown} (last: {last!r})")
        time.sleep(interval)


def sqs_client(server: Server) -> Any:
    """boto3's SQS client on a loopback server (any credentials), without retries."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "sqs",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=30),
    )
