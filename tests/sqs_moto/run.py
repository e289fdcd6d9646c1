"""Run moto's own SQS test suite against a real ``evq serve`` (or against moto, the baseline).

moto's tests have a server mode (``TEST_SERVER_MODE=true``): every boto3 client they make is
pointed at ``TEST_SERVER_MODE_ENDPOINT`` instead of moto's in-process mock. This script
fetches the sdist of the moto version installed here (the wheel has no tests), extracts the
two SQS test files and the parts of moto's ``tests`` tree they import into a work directory,
starts a server, runs pytest there and writes a JSON report: test id → outcome and reason.

    .venv/bin/python tests/sqs_moto/run.py                  # against a fresh evq serve
    .venv/bin/python tests/sqs_moto/run.py --against-moto   # moto's own server: the baseline
    .venv/bin/python tests/sqs_moto/run.py --endpoint http://localhost:8700  # a running server
    .venv/bin/python tests/sqs_moto/run.py --baseline ~/.cache/evq/sqs-moto/work-moto/report.json

Exit status: 0 every test passed or was skipped, 1 some failed, 2 the run could not be done or
was cut short by ``--timeout``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PLUGIN = HERE / "evq_moto_plugin.py"

# The test files run, as paths inside the sdist's tree.
TEST_FILES = ("tests/test_sqs/test_sqs.py", "tests/test_sqs/test_sqs_message_attributes.py")
# moto's suite hard-codes "http://localhost:5000" in server mode (queue URL assertions).
DEFAULT_PORT = 5000
# The account in the servers' queue URLs and ARNs, which the STS stub answers: the one
# moto's tests hard-code (moto.core.DEFAULT_ACCOUNT_ID), given to the evq started here with
# --sqs-account-id; a running server (--endpoint) has evq's default unless told otherwise.
MOTO_ACCOUNT = "123456789012"
ACCOUNTS = {"evq": MOTO_ACCOUNT, "moto": MOTO_ACCOUNT, "endpoint": "000000000000"}
# Modules the suite imports that evq's dev extra may lack: import name → pip requirement.
TEST_DEPENDENCIES = {"freezegun": "freezegun", "pytest_timeout": "pytest-timeout"}
# What Ray needs in a server subprocess here (as tests/integration/server.py sets it).
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}
PYTEST_INI = """\
[pytest]
# Written by tests/sqs_moto/run.py: the markers of moto's own configuration, nothing else.
markers =
    network: requires network connection
    requires_docker: requires running docker
    aws_verified: Verified against AWS, and should be able to run against AWS
    requires_clean_slate: requires a clean slate, so no parallel testing
asyncio_default_fixture_loop_scope = function
"""


class RunError(Exception):
    """The run could not be set up (download, extraction, server start)."""


def log(message: str) -> None:
    """Print a progress line at once."""
    print(message, flush=True)


def default_base_dir() -> Path:
    """Where the sdist and the work directories live unless told: the user's cache."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "evq" / "sqs-moto"


# --- moto's tests ---------------------------------------------------------------------------


def ensure_test_dependencies() -> None:
    """pip-install the suite's test-only dependencies that this interpreter lacks."""
    missing = [req for mod, req in TEST_DEPENDENCIES.items() if not importlib.util.find_spec(mod)]
    if not missing:
        return
    log(f"installing test-only dependencies of moto's SQS tests: {', '.join(missing)}")
    command = [sys.executable, "-m", "pip", "install", "-q", *missing]
    if subprocess.run(command, timeout=600).returncode != 0:
        raise RunError(f"could not install {', '.join(missing)}")


def fetch_sdist(version: str, cache_dir: Path) -> Path:
    """The moto sdist of ``version`` in ``cache_dir``, downloaded with pip unless present."""
    sdist = cache_dir / f"moto-{version}.tar.gz"
    if sdist.exists():
        log(f"using cached {sdist}")
        return sdist
    cache_dir.mkdir(parents=True, exist_ok=True)
    log(f"downloading the moto {version} sdist into {cache_dir}")
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:"]
    command += ["--no-deps", "--dest", str(cache_dir), f"moto=={version}"]
    result = subprocess.run(command, timeout=600)
    if result.returncode != 0 or not sdist.exists():
        raise RunError(f"pip download of moto=={version} failed (exit {result.returncode})")
    return sdist


def _imported_modules(source: bytes, path: str) -> set[str]:
    """Dotted names of what ``path`` imports (``from M import a`` gives M, M.a: either may
    be a module), relative imports resolved against the file's package."""
    package = path.removesuffix(".py").replace("/", ".").rsplit(".", 1)[0]
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            modules.add(base)
            modules.update(f"{base}.{alias.name}" for alias in node.names)
    return modules


def _support_files(path: str) -> list[str]:
    """The ``__init__.py`` and ``conftest.py`` of every package a test file sits in."""
    parts = path.split("/")[:-1]
    return [
        "/".join([*parts[:depth], name])
        for depth in range(1, len(parts) + 1)
        for name in ("__init__.py", "conftest.py")
    ]


def read_test_tree(sdist: Path, roots: tuple[str, ...]) -> dict[str, bytes]:
    """The files of moto's ``tests`` tree that ``roots`` need: the roots, their packages'
    ``__init__.py`` and ``conftest.py``, and whatever they import from ``tests``, transitively.

    Raises:
        RunError: a root is not in the sdist.
    """
    with tarfile.open(sdist) as tar:
        prefix = tar.getnames()[0].split("/")[0] + "/"
        members = {name.removeprefix(prefix): name for name in tar.getnames()}
        files: dict[str, bytes] = {}
        wanted = list(roots)
        while wanted:
            path = wanted.pop()
            if path in files or path not in members:
                if path in roots and path not in members:
                    raise RunError(f"{path} is not in {sdist.name}")
                continue
            extracted = tar.extractfile(members[path])
            assert extracted is not None, path
            files[path] = extracted.read()
            wanted += _support_files(path)
            for module in _imported_modules(files[path], path):
                if module == "tests" or module.startswith("tests."):
                    stem = module.replace(".", "/")
                    wanted += [f"{stem}.py", f"{stem}/__init__.py"]
    return files


def prepare_work_dir(work_dir: Path, files: dict[str, bytes]) -> None:
    """Lay the test files, the plugin and a pytest.ini out in ``work_dir``, replacing what an
    earlier run left there (only the entries this script makes are removed)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work_dir / "tests", ignore_errors=True)
    for name in ("results.jsonl", "collected.json", "pytest.log", "evq-serve.log"):
        (work_dir / name).unlink(missing_ok=True)
    for path, data in files.items():
        target = work_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    shutil.copy(PLUGIN, work_dir / PLUGIN.name)
    (work_dir / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")


# --- the server -----------------------------------------------------------------------------


def port_is_free(port: int) -> bool:
    """Whether 127.0.0.1:``port`` can be bound right now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def choose_port(wanted: int) -> int:
    """``wanted`` if free, else any free port (with a warning: some tests will then fail)."""
    if port_is_free(wanted):
        return wanted
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log(
        f"warning: port {wanted} is taken, using {port}; the tests that expect queue URLs "
        f"on localhost:{DEFAULT_PORT} will fail"
    )
    return port


def _ready(url: str) -> bool:
    """Whether ``GET url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid``: the server and the Ray processes it started."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
    return pids


def stop_process(proc: subprocess.Popen[bytes], grace: float, what: str) -> None:
    """SIGTERM ``proc`` (started with ``start_new_session``), wait ``grace`` seconds, then
    SIGKILL whatever is left of its session (its own children only, nothing else)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log(f"{what} did not stop within {grace:.0f} s of SIGTERM: SIGKILL")
    for _ in range(50):
        left = _session_pids(proc.pid)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@contextlib.contextmanager
def evq_server(port: int, log_path: Path, ready_timeout: float, account: str) -> Iterator[str]:
    """A fresh ``evq serve`` on 127.0.0.1:``port`` over a temporary data directory, its SQS
    account ``account``; yields its URL once ``/readyz`` answers 200, stops it at the end.

    Raises:
        RunError: it exited or was not ready in time.
    """
    evq = Path(sys.executable).with_name("evq")
    if not evq.exists():
        raise RunError(f"{evq} not found: run with the project's .venv/bin/python")
    with tempfile.TemporaryDirectory(prefix="evq-sqs-moto-") as data, log_path.open("ab") as out:
        command = [str(evq), "serve", "--data", data, "--host", "127.0.0.1", "--port", str(port)]
        command += ["--sqs-account-id", account]
        log(f"starting {' '.join(command)} (log: {log_path})")
        env = {**os.environ, **RAY_ENV, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            started = time.monotonic()
            while not _ready(f"http://127.0.0.1:{port}/readyz"):
                if proc.poll() is not None:
                    raise RunError(f"evq serve exited with {proc.returncode}; see {log_path}")
                if time.monotonic() - started > ready_timeout:
                    raise RunError(f"evq serve not ready within {ready_timeout:.0f} s")
                time.sleep(0.25)
            log(f"evq serve ready after {time.monotonic() - started:.1f} s")
            yield f"http://localhost:{port}"
        finally:
            log("stopping evq serve")
            stop_process(proc, grace=60, what="evq serve")


@contextlib.contextmanager
def moto_server(port: int) -> Iterator[str]:
    """moto's ThreadedMotoServer on 127.0.0.1:``port`` in this process; yields its URL."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    log(f"starting moto's ThreadedMotoServer on 127.0.0.1:{port}")
    server.start()
    try:
        yield f"http://localhost:{port}"
    finally:
        server.stop()


# --- pytest ---------------------------------------------------------------------------------


def pytest_command(args: argparse.Namespace, work_dir: Path) -> list[str]:
    """The pytest command line, run in ``work_dir`` with its own pytest.ini."""
    command = [sys.executable, "-m", "pytest", "-c", str(work_dir / "pytest.ini")]
    command += ["--rootdir", str(work_dir), "-o", "addopts=", "-p", "no:cacheprovider"]
    command += ["-p", PLUGIN.stem, f"--timeout={args.test_timeout:g}", "--timeout-method=signal"]
    command += ["-v", "--tb=short", "-rN", *TEST_FILES]
    if args.k:
        command += ["-k", args.k]
    return command


def pytest_env(endpoint: str, account: str, target: str, work_dir: Path) -> dict[str, str]:
    """The tests' environment: server mode at ``endpoint``, fake credentials, us-east-1, no
    AWS configuration of the user's, and the plugin's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
    env.update(
        TEST_SERVER_MODE="true",
        TEST_SERVER_MODE_ENDPOINT=endpoint,
        MOTO_TEST_ALLOW_AWS_REQUEST="false",
        # moto's own state reset between tests; other servers have no such API (the
        # plugin deletes each test's queues instead).
        MOTO_CALL_RESET_API="true" if target == "moto" else "false",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE=str(work_dir / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(work_dir / "no-aws-credentials"),
        NO_PROXY="localhost,127.0.0.1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(work_dir), env.get("PYTHONPATH")])),
        EVQ_MOTO_ACCOUNT_ID=account,
        EVQ_MOTO_RESULTS=str(work_dir / "results.jsonl"),
        EVQ_MOTO_COLLECTED=str(work_dir / "collected.json"),
    )
    return env


def _read_results(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines of ``path`` past ``offset``, and the offset after them."""
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    lines = data[:end].decode("utf-8").splitlines()
    return [json.loads(line) for line in lines if line], offset + end


def _collected_count(work_dir: Path) -> int | None:
    """How many tests pytest collected, once it has said so."""
    with contextlib.suppress(OSError, ValueError):
        return len(json.loads((work_dir / "collected.json").read_text(encoding="utf-8")))
    return None


def run_pytest(
    command: list[str], env: dict[str, str], work_dir: Path, deadline: float
) -> tuple[dict[str, dict[str, Any]], bool]:
    """Run pytest until it ends or ``deadline`` passes, printing each test's outcome as it
    lands; returns the results by test id and whether the run was cut short."""
    results: dict[str, dict[str, Any]] = {}
    offset = 0
    timed_out = False
    with (work_dir / "pytest.log").open("wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=work_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while True:
                finished = proc.poll() is not None
                fresh, offset = _read_results(work_dir / "results.jsonl", offset)
                for record in fresh:
                    test_id = record.pop("id")
                    results[test_id] = record
                    _print_progress(test_id, record, len(results), _collected_count(work_dir))
                if finished:
                    break
                if time.monotonic() > deadline:
                    log("the run's --timeout has passed: stopping pytest")
                    timed_out = True
                    break
                time.sleep(0.5)
        finally:
            stop_process(proc, grace=10, what="pytest")
    return results, timed_out


def _print_progress(test_id: str, record: dict[str, Any], done: int, total: int | None) -> None:
    """One line per finished test, and its reason when it did not pass."""
    width = len(str(total or done))
    count = f"[{done:>{width}}/{total if total is not None else '?'}]"
    log(f"{count} {record['outcome'].upper():7} {test_id}  ({record['duration']:.1f} s)")
    if record["outcome"] in ("failed", "error"):
        log(f"{' ' * len(count)} -> {_one_line(record.get('reason', ''))}")


def _one_line(text: str, width: int = 200) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


# --- the report -----------------------------------------------------------------------------


def build_report(
    target: str,
    endpoint: str,
    moto_version: str,
    results: dict[str, dict[str, Any]],
    collected: list[str],
    timed_out: bool,
) -> dict[str, Any]:
    """The JSON report: what ran where, the counts, and each test's record (tests collected
    but never finished, after a timeout, are ``not run``)."""
    tests = {test_id: results.get(test_id, {"outcome": "not run"}) for test_id in collected}
    tests.update({test_id: r for test_id, r in results.items() if test_id not in tests})
    return {
        "target": target,
        "endpoint": endpoint,
        "moto_version": moto_version,
        "test_files": list(TEST_FILES),
        "timed_out": timed_out,
        "counts": dict(Counter(record["outcome"] for record in tests.values())),
        "tests": tests,
    }


def print_summary(report: dict[str, Any], baseline: dict[str, Any] | None) -> None:
    """Counts, the failures with their reasons, and the regressions against a baseline."""
    counts = report["counts"]
    tests = report["tests"]
    log("")
    target = f"{report['target']} ({report['endpoint']})"
    log(f"moto {report['moto_version']} SQS tests against {target}")
    shown = ["passed", "failed", "error", "skipped"]
    shown += [k for k in counts if k not in shown]
    log("  " + ", ".join(f"{counts.get(k, 0)} {k}" for k in shown))
    failures = {k: v for k, v in tests.items() if v["outcome"] in ("failed", "error")}
    if failures:
        log(f"\nfailures ({len(failures)}):")
        for test_id, record in sorted(failures.items()):
            where = f" [{record['where']}]" if record.get("where") else ""
            log(f"  {test_id}{where}\n      {_one_line(record.get('reason', ''))}")
    if baseline is not None:
        passed_there = {k for k, v in baseline["tests"].items() if v["outcome"] == "passed"}
        regressions = sorted(
            k for k in passed_there if tests.get(k, {}).get("outcome") not in ("passed", None)
        )
        log(
            f"\nagainst the baseline ({baseline['target']}: {len(passed_there)} passed): "
            f"{len(regressions)} pass there and not here"
        )
        for test_id in regressions:
            log(f"  {tests[test_id]['outcome']:7} {test_id}")
    if report["timed_out"]:
        log("\nthe run was cut short by --timeout")


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        description="Run moto's SQS test suite (server mode) against evq, or against moto.",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--endpoint", help="use a running SQS server at this URL")
    where.add_argument(
        "--against-moto", action="store_true", help="run moto's ThreadedMotoServer (baseline)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="port of the server started here (default 5000: the suite expects it)",
    )
    parser.add_argument(
        "--account-id",
        help=f"the SQS account of the server, which the STS stub answers (default "
        f"{MOTO_ACCOUNT}, given to the evq started here; 000000000000 with --endpoint)",
    )
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds for the whole run (default 1800)"
    )
    parser.add_argument(
        "--test-timeout", type=float, default=90, help="seconds per test (default 90)"
    )
    parser.add_argument("-k", help="only tests matching this pytest -k expression")
    parser.add_argument(
        "--cache-dir", type=Path, help="where the sdist is kept (default ~/.cache/evq/sqs-moto)"
    )
    parser.add_argument(
        "--work-dir", type=Path, help="where the tests run (default <cache-dir>/work-<target>)"
    )
    parser.add_argument("--report", type=Path, help="JSON report (default <work-dir>/report.json)")
    parser.add_argument(
        "--baseline", type=Path, help="a report of an earlier run: list what passed there only"
    )
    return parser.parse_args(argv)


@contextlib.contextmanager
def target_server(
    args: argparse.Namespace, target: str, work_dir: Path, account: str
) -> Iterator[str]:
    """The endpoint the tests use: a given one, moto's server, or a fresh evq serve."""
    if target == "endpoint":
        yield args.endpoint.rstrip("/")
    elif target == "moto":
        with moto_server(choose_port(args.port)) as url:
            yield url
    else:
        log_path = work_dir / "evq-serve.log"
        with evq_server(choose_port(args.port), log_path, 180, account) as url:
            yield url


def main(argv: list[str] | None = None) -> int:
    """Fetch the tests, start the server, run pytest, report; returns the exit status."""
    args = parse_args(argv)
    deadline = time.monotonic() + args.timeout
    target = "moto" if args.against_moto else "endpoint" if args.endpoint else "evq"
    cache_dir = args.cache_dir or default_base_dir()
    work_dir = (args.work_dir or cache_dir / f"work-{target}").resolve()
    report_path = args.report or work_dir / "report.json"
    baseline = json.loads(args.baseline.read_text(encoding="utf-8")) if args.baseline else None
    account = args.account_id or ACCOUNTS[target]
    moto_version = importlib.metadata.version("moto")
    try:
        ensure_test_dependencies()
        sdist = fetch_sdist(moto_version, cache_dir)
        files = read_test_tree(sdist, TEST_FILES)
        prepare_work_dir(work_dir, files)
        log(f"work dir {work_dir}: {len(files)} files from moto's tests tree")
        with target_server(args, target, work_dir, account) as endpoint:
            command = pytest_command(args, work_dir)
            log(f"running pytest against {endpoint} (output: {work_dir / 'pytest.log'})")
            env = pytest_env(endpoint, account, target, work_dir)
            results, timed_out = run_pytest(command, env, work_dir, deadline)
    except (RunError, OSError, subprocess.TimeoutExpired) as e:
        log(f"error: {e}")
        return 2
    collected_file = work_dir / "collected.json"
    collected = json.loads(collected_file.read_text()) if collected_file.exists() else []
    if not collected and not results:
        log(f"error: pytest ran no test; see {work_dir / 'pytest.log'}")
        return 2
    report = build_report(target, endpoint, moto_version, results, collected, timed_out)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print_summary(report, baseline)
    log(f"\nreport: {report_path}\npytest output: {work_dir / 'pytest.log'}")
    if timed_out:
        return 2
    return 1 if any(k in report["counts"] for k in ("failed", "error")) else 0


if __name__ == "__main__":
    sys.exit(main())
