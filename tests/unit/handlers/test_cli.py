"""`evq handle` refuses what cannot work before it starts Ray: exit 2 for usage errors,
1 when the server or queue cannot be used (a real closed port on 127.0.0.1)."""

from __future__ import annotations

import io
import socket
import subprocess
import sys

import pytest

from evq.cli.main import main


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["handle", *argv], stdout=out, stderr=err)
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["tests.unit.handlers.funcs"], "module:function"),
        (["tests.unit.handlers.funcs:nothing"], "has no 'nothing'"),
        (["tests.unit.handlers.nowhere:send"], "No module named 'tests.unit.handlers.nowhere'"),
        (["tests.unit.handlers.funcs:plain"], "give the queue it handles"),
        (["tests.unit.handlers.funcs:send", "--batch-size", "0"], "batch_size must be 1..1000"),
        (["tests.unit.handlers.funcs:send", "--backoff-jitter", "2"], "jitter must be between"),
    ],
)
def test_usage_errors_exit_2_with_the_reason(argv: list[str], text: str) -> None:
    code, err = run(*argv)
    assert code == 2
    assert text in err


def test_bad_option_values_are_refused_by_the_parser() -> None:
    code, err = run("tests.unit.handlers.funcs:send", "--num-cpus", "-1")
    assert code == 2
    assert "must be >= 0" in err


def test_an_unreachable_server_over_http_exits_1() -> None:
    server = f"http://127.0.0.1:{closed_port()}"
    code, err = run("tests.unit.handlers.funcs:send", "--server", server, "--transport", "http")
    assert code == 1
    assert "queue mail: Unavailable: cannot connect" in err


def test_the_cli_and_the_handler_api_do_not_load_ray_until_a_handler_runs() -> None:
    probe = "import sys, evq.cli.main, evq.handlers; print('ray' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"


def test_log_options_are_checked_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    code, err = run("tests.unit.handlers.funcs:send", "--log-format", "xml")
    assert code == 2
    assert "invalid choice: 'xml'" in err
    monkeypatch.setenv("EVQ_LOG_MODE", "later")
    code, err = run("tests.unit.handlers.funcs:send")
    assert code == 2
    assert "log mode must be drop or block, not 'later'" in err
