"""loadtest/floor_server.py, the floor a durable HTTP put has in Python here: a real process
on 127.0.0.1 answers the native API's hot paths the way the harness's HTTP adapter calls them,
and a put's reply comes only once its body is in the log file (read back from the disk's
file, not the process)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_puts_are_in_the_log_when_answered_and_the_other_paths_answer(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "loadtest" / "floor_server.py"),
            str(port),
            "--dir",
            str(tmp_path),
        ]
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/healthz")
                break
            except OSError:
                assert time.monotonic() < deadline, "the floor server did not start"
                time.sleep(0.1)
        health = conn.getresponse()
        assert (health.status, json.loads(health.read())) == (200, {"status": "ok"})
        conn.request("PUT", "/v1/queues/q", body=b"{}")
        created = conn.getresponse()
        assert (created.status, created.read()) == (201, b"{}")
        [log] = list(tmp_path.glob("*/log"))
        for i in range(3):
            body = json.dumps({"messages": [{"body": f"m{i}"}]}).encode()
            conn.request("POST", "/v1/queues/q/messages", body=body)
            put = conn.getresponse()
            assert put.status == 201
            assert json.loads(put.read()) == {"results": [{"id": "1", "status": "created"}]}
            assert log.read_bytes().endswith(body)  # written before the reply
        conn.request("POST", "/v1/queues/q/take", body=b'{"max": 1}')
        take = conn.getresponse()
        assert (take.status, json.loads(take.read())) == (200, {"messages": []})
        conn.request("POST", "/v1/queues/q/ack", body=b'{"items": []}')
        ack = conn.getresponse()
        assert (ack.status, json.loads(ack.read())) == (200, {"results": []})
        assert log.read_bytes().count(b'"messages"') == 3  # only the puts go in
        conn.close()
    finally:
        server.terminate()
        assert server.wait(10) == 0
    assert list(tmp_path.iterdir()) == []  # its log went with it
