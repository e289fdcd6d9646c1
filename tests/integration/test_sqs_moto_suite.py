"""moto's own SQS tests against a real ``evq serve``, a short version (tests/sqs_moto/run.py).

The whole suite is a documented command (tests/sqs_moto/README.md: 136 of the 150 tests that
pass against moto pass against evq; gateway/sqs/README.md explains each of the 14 others).
Here a selection of the tests that an SQS behaviour evq once lacked made fail runs on every
``make test``, so the harness keeps working and none of those behaviours comes back. The
script fetches the moto sdist with pip on a fresh machine (PyPI), then reuses it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

RUN = Path(__file__).resolve().parents[1] / "sqs_moto" / "run.py"
# Each passes against moto; each failed against evq before issue 18.
SELECTED = [
    "test_delete_message_using_old_receipt_handle",
    "test_change_message_visibility_on_old_message",
    "test_batch_change_message_visibility_on_old_message",
    "test_delete_message_batch_with_invalid_receipt_id",
    "test_add_permission_errors",
    "test_set_queue_attribute_empty_policy_removes_attr",
    "test_message_attributes_with_wildcards",
    "test_send_message_batch_errors",
    "test_fifo_send_message_batch",
    "test_get_queue_attributes",
    "test_delete_message_from_unknown_url",
    "test_create_fifo_queue_invalid_name",
]


def test_the_selected_moto_sqs_tests_pass_against_evq(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            str(RUN),
            "-k",
            " or ".join(SELECTED),
            "--report",
            str(report),
            "--timeout",
            "500",
        ],
        capture_output=True,
        text=True,
        timeout=560,
    )
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    outcomes = json.loads(report.read_text())
    tests = outcomes["tests"]
    failed = {t: o for t, o in tests.items() if o["outcome"] not in ("passed", "skipped")}
    assert not failed, json.dumps(failed, indent=1)[:4000]
    ran = {t.split("::")[-1].split("[")[0] for t in tests}
    assert set(SELECTED) <= ran, set(SELECTED) - ran  # every one found and run (-k matches
    # names that start with one of them too)
    assert done.returncode == 0, done.stdout[-3000:]
