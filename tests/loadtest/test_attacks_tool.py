"""loadtest/attacks.py, short: every attack runs against a real ``evq serve`` while a
well-behaved client goes on; each attack gets a clear answer (a 4xx, a close, or a connection
held back at a bounded cost), the client fails nothing and the server stays up (the figures —
p99 against a quiet server, memory — are the full run's, loadtest/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def test_every_attack_is_answered_and_the_others_are_served(tmp_path: Path) -> None:
    out = tmp_path / "attacks.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "loadtest" / "attacks.py"),
            "--seconds",
            "2",
            "--scale",
            "0.04",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=360,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())["attacks"]
    assert set(report) == {
        "slowloris_headers",
        "slowloris_body",
        "slowloris_sqs",
        "oversized_headers",
        "smuggling",
        "connection_flood",
        "pipeline_no_read",
        "websocket_no_read",
    }
    for name, result in report.items():
        assert result["server_alive"], name
        assert result["attacked"]["failures"] == 0, (name, result["attacked"])
        assert result["attacked"]["cycles"] > 0, name
        # memory: bounded by what each attack may make the gateway hold (far below this)
        assert result["gateway_rss_mib_peak"] - result["gateway_rss_mib_before"] < 200, name
    # Smuggling attempts are refused outright, never served as two requests (the fast path
    # answers them); past --refuse-after of them (20) the attacking address is refused at
    # accept (429), and past 100 refusals the kernel drops its connections unanswered.
    refused = "HTTP/1.1 429 Too Many Requests"
    reset = "reset after <1 s"  # refused, its request arriving after the 429 went out
    dropped = "dropped (no answer to connect)"  # refused 100 times: the kernel drops its SYNs
    # A connection caught as its address is silenced: CI saw one of 128 unanswered after 5 s
    # (most likely its SYN came before the socket filter and its ACK after, so the client
    # holds a connection the server never accepted); it waits as a dropped one would.
    caught = "still open"
    smuggling = report["smuggling"]["answers"]
    assert set(smuggling) <= {"HTTP/1.1 400 Bad Request", refused, reset, dropped, caught}, (
        smuggling
    )
    assert smuggling.get(caught, 0) <= 2, smuggling
    assert smuggling["HTTP/1.1 400 Bad Request"] >= 20
    assert smuggling[refused] > 0
    # Both oversized heads are aiohttp's to refuse (one header too long, too many of them)
    oversized = report["oversized_headers"]["answers"]
    assert set(oversized) <= {"HTTP/1.0 400 Bad Request", refused, reset, dropped, caught}, (
        oversized
    )
    assert oversized.get(caught, 0) <= 2, oversized
    assert oversized[refused] > 0
    assert all(a.startswith("held back") for a in report["pipeline_no_read"]["answers"])
