"""The SQS query protocol through the SDK that speaks it: boto3/botocore 1.34.50, in a
virtualenv of its own (``.venv-sqs-legacy``, made by ``make test`` from
tests/sqs_legacy/requirements.txt), against a real ``evq serve`` with SigV4 keys.

The client runs tests/sqs_legacy/calls.py there and prints what each call answered;
botocore's XML parser raising on a reply fails the script and the test.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import ServerFactory
from tests.integration.server import ROOT, Server, server_env
from tests.unit.gateway.sqs_support import unique

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KEY, SECRET = "AKIDEVQLEGACY", "evq/legacy+secret"
REGION = "us-east-1"
LEGACY_PYTHON = ROOT / ".venv-sqs-legacy" / "bin" / "python"
CALLS = Path(__file__).resolve().parents[1] / "sqs_legacy" / "calls.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("evq-sqs-legacy")
    factory = ServerFactory(root)
    server = Server(root / "data", "--no-ray", env=server_env(EVQ_SQS_KEYS=f"{KEY}:{SECRET}"))
    factory.servers.append(server)
    try:
        server.start()
        yield server
    finally:
        factory.close()


def legacy(server: Server, scenario: str) -> dict:
    """Run ``scenario`` of calls.py with the legacy SDK; its JSON output."""
    assert LEGACY_PYTHON.exists(), f"{LEGACY_PYTHON} is missing: `make test` creates it"
    queue = unique(scenario)
    done = subprocess.run(
        [str(LEGACY_PYTHON), str(CALLS), server.url, KEY, SECRET, REGION, scenario, queue],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout)
    assert out["botocore"] == "1.34.50"
    assert out["protocol"] == "query"
    return out


def test_every_empty_result_parses_in_the_query_protocol_sdk(server: Server) -> None:
    out = legacy(server, "empties")
    assert out["receive_empty"] == {}
    assert out["list_queues_no_match"] == {}
    assert out["list_queue_tags_none"] == {}
    assert out["dead_letter_sources_none"] == {}
    assert out["get_queue_attributes_none"] == {}
    assert out["send"] == ["MD5OfMessageBody", "MessageId"]
    assert out["receive_one"] == ["hello"]
    assert out["receive_after_delete"] == {}
    assert out["delete"] == {}
    assert out["purge"] == {}
    assert out["delete_queue"] == {}
