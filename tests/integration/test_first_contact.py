"""What a new user meets first: the installs, the examples, the load test's locustfiles.

Two throwaway virtualenvs (tests/base_only.py) hold exactly what the extras bring: the base
install (the client and the command line's client commands: neither Ray nor PySpark) and
the ``server`` extra. The module's server is ``evq serve`` as the console script runs it
(``evq.cli.console``) in the server-only virtualenv; the examples run against it in the
base one, so an example (or the client under it) that needed more would fail here. Every
locustfile loads and drives that server for a few seconds, headless.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.base_only import distributions, make_venv
from tests.integration.server import ROOT, Server, free_port, server_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CONSOLE = ["-I", "-m", "evq.cli.console"]  # the `evq` console script's entry point


def run(python: Path | str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python args…`` from the checkout, with the test servers' environment."""
    return subprocess.run(
        [str(python), *args],
        cwd=ROOT,
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def base_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("venv") / "base")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``evq serve`` in a virtualenv with the server extra only."""
    python = make_venv(tmp_path_factory.mktemp("venv") / "server", ["server"])
    server = Server(tmp_path_factory.mktemp("evq") / "data", evq=[str(python), *CONSOLE])
    server.start()
    try:
        yield server
    finally:
        if server.running():
            server.stop(timeout=45)


# ------------------------------------------------------------------ installs


def test_the_base_install_brings_neither_ray_nor_pyspark(base_python: Path) -> None:
    base = distributions()
    assert not base & {"ray", "pyspark", "pyarrow", "pandas", "zstandard", "obstore"}, base
    assert {"ray", "zstandard"} <= distributions(["server"])
    assert {"pyspark", "zstandard"} <= distributions(["pipeline"])
    for module in ("ray", "pyspark"):
        assert run(base_python, "-I", "-c", f"import {module}").returncode == 1


def test_the_client_works_with_the_base_install_alone(base_python: Path) -> None:
    code = (
        "from evq.client import AsyncClient, Client, TransportError\n"
        f"with Client('http://127.0.0.1:{free_port()}', retries=0, timeout=5) as c:\n"
        "    try:\n"
        "        c.list_queues()\n"
        "    except TransportError as e:\n"
        "        print('unreachable:', e.code)\n"
    )
    done = run(base_python, "-I", "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "unreachable: Unavailable"


def test_evq_names_the_extra_a_command_needs(base_python: Path) -> None:
    assert run(base_python, *CONSOLE, "--help").returncode == 0
    closed = f"http://127.0.0.1:{free_port()}"
    done = run(base_python, *CONSOLE, "--server", closed, "stats", "jobs")
    assert (done.returncode, done.stderr.split(":")[:2]) == (1, ["evq stats", " Unavailable"])
    for argv, extra in [
        (["serve"], "server"),
        (["shards", "status"], "server"),
        (["pipeline", "stats", "--store", "/nowhere", "--out", "/tmp"], "pipeline"),
    ]:
        done = run(base_python, *CONSOLE, *argv)
        assert done.returncode == 2, done.stderr
        assert f"pip install 'evq[{extra}]'" in done.stderr
        assert "Traceback" not in done.stderr


# ------------------------------------------------------------------ examples


def example_runs(url: str) -> dict[str, tuple[list[str], str]]:
    """Each example's arguments against ``url``, and a line its output must hold."""
    return {
        "cascade.py": (
            ["--stages", "fc-in,fc-mid,fc-out", "--messages", "3", "--crash-once"],
            "3 seeded, 3 finished, 3 distinct",
        ),
        "periodic.py": (
            ["--queue", "fc-periodic", "--every", "0.3", "--rounds", "4"],
            "cleanup done (was due at",
        ),
    }


# Examples another test runs (they need more than a server).
RUN_ELSEWHERE = {"mailing.py": "tests/integration/test_handlers.py"}  # Ray handlers


def test_every_example_is_run_by_a_test() -> None:
    examples = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert examples == set(example_runs("")) | set(RUN_ELSEWHERE)
    for name, test in RUN_ELSEWHERE.items():
        assert f"examples/{name}" in (ROOT / test).read_text()


@pytest.mark.parametrize("name", sorted(example_runs("")))
def test_an_example_runs_against_a_real_server_with_the_base_install(
    name: str, server: Server, base_python: Path
) -> None:
    args, expected = example_runs(server.url)[name]
    done = run(base_python, "-I", f"examples/{name}", "--server", server.url, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert expected in done.stdout


# ------------------------------------------------------------------ locustfiles

LOCUSTFILES = ROOT / "loadtest" / "locustfiles"
HELPERS = {"mix.py", "fleet_counters.py"}  # modules the locustfiles import, no users


def test_the_locustfile_helpers_are_imported_by_the_locustfiles() -> None:
    files = {p.name for p in LOCUSTFILES.glob("*.py")}
    assert files >= HELPERS
    sources = "".join((LOCUSTFILES / f).read_text() for f in files - HELPERS)
    for helper in HELPERS:
        assert f"import {helper.removesuffix('.py')}\n" in sources


@pytest.mark.parametrize(
    "name", sorted({p.name for p in LOCUSTFILES.glob("*.py")} - HELPERS), ids=str
)
def test_a_locustfile_loads_and_drives_a_real_server(
    name: str, server: Server, tmp_path: Path
) -> None:
    locust = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILES / name)]
    listed = run(*locust, "--list")
    assert listed.returncode == 0, listed.stderr
    assert "Available Users:" in listed.stdout, listed.stdout
    prefix = tmp_path / "run"
    # The users' start (a boto3 client each, the queues created) is inside the run's time: on
    # a busy machine it once took the whole of 3 s (0 requests; CI, 2026-11-28).
    command = [*locust, "--headless", "-u", "2", "-r", "2", "-t", "6s", "--host", server.url]
    command += ["--csv", str(prefix), "--only-summary", "--loglevel", "WARNING"]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env=server_env(EVQ_LOADTEST_PREFIX=f"fc-{name[:-3]}", EVQ_LOADTEST_QUEUES="2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(f"{prefix}_stats.csv", newline="") as f:
        (total,) = [row for row in csv.DictReader(f) if row["Name"] == "Aggregated"]
    assert int(total["Request Count"]) > 0
    assert int(total["Failure Count"]) == 0
