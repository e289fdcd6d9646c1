"""A pytest plugin for running moto's SQS tests in server mode against any SQS endpoint.

``run.py`` copies this file into its work directory and loads it with
``-p evq_moto_plugin``. It does three things, configured by environment variables:

- **STS stub.** moto's ``account_id`` fixture asks STS ``GetCallerIdentity`` for the
  account. SQS servers other than moto have no STS, so that one call is answered on the
  client side (botocore never sends it) with ``EVQ_MOTO_ACCOUNT_ID``. Every other call goes
  to the server untouched.
- **Clean slate.** moto resets its whole in-memory state between tests (``/moto-api/reset``);
  other servers do not have that API. Instead, the queues a test created (seen in the
  ``CreateQueue`` replies) are deleted after it, so a fixed queue name in one test does not
  meet the queue of an earlier test. Queues the test did not create are never touched.
- **Results.** Each test's outcome is appended as one JSON line to ``EVQ_MOTO_RESULTS``
  (so a run cut short by a timeout still leaves what it did), and the collected test ids are
  written to ``EVQ_MOTO_COLLECTED``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.client
import botocore.session
import pytest
from botocore.exceptions import BotoCoreError, ClientError

ACCOUNT_ID = os.environ.get("EVQ_MOTO_ACCOUNT_ID", "123456789012")
RESULTS = os.environ.get("EVQ_MOTO_RESULTS")
COLLECTED = os.environ.get("EVQ_MOTO_COLLECTED")

# Longest failure reason / details kept per test, in characters.
MAX_REASON = 800
MAX_DETAILS = 6000

_real_make_api_call = botocore.client.BaseClient._make_api_call
# (endpoint URL, queue URL) of the queues created by the running test.
_created_queues: list[tuple[str, str]] = []
# One outcome record per test id being run, filled phase by phase.
_records: dict[str, dict[str, Any]] = {}


def _caller_identity() -> dict[str, Any]:
    """The ``GetCallerIdentity`` answer of the stub, shaped as botocore parses it."""
    return {
        "UserId": "AKIAIOSFODNN7EXAMPLE",
        "Account": ACCOUNT_ID,
        "Arn": f"arn:aws:sts::{ACCOUNT_ID}:user/moto",
        "ResponseMetadata": {"HTTPStatusCode": 200, "HTTPHeaders": {}, "RetryAttempts": 0},
    }


def _make_api_call(
    self: botocore.client.BaseClient, operation_name: str, api_params: dict[str, Any]
) -> dict[str, Any]:
    """botocore's ``_make_api_call``, with STS ``GetCallerIdentity`` answered locally and
    the queue URLs of ``CreateQueue`` replies noted for the clean-up after the test."""
    __tracebackhide__ = True  # keep this frame out of failure reports
    service = self.meta.service_model.service_name
    if service == "sts" and operation_name == "GetCallerIdentity":
        return _caller_identity()
    response: dict[str, Any] = _real_make_api_call(self, operation_name, api_params)
    if service == "sqs" and operation_name == "CreateQueue" and "QueueUrl" in response:
        _created_queues.append((self.meta.endpoint_url, response["QueueUrl"]))
    return response


def pytest_configure(config: pytest.Config) -> None:
    """Install the botocore patch for the whole session."""
    botocore.client.BaseClient._make_api_call = _make_api_call  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    """Take the botocore patch out again."""
    botocore.client.BaseClient._make_api_call = _real_make_api_call  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _delete_created_queues() -> Iterator[None]:
    """After each test, delete the queues it created (errors ignored: most are gone)."""
    _created_queues.clear()
    yield
    clients: dict[str, Any] = {}
    session = botocore.session.get_session()
    for endpoint, queue_url in dict.fromkeys(_created_queues):
        if endpoint not in clients:
            clients[endpoint] = session.create_client(
                "sqs",
                region_name="us-east-1",
                endpoint_url=endpoint,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
        with contextlib.suppress(ClientError, BotoCoreError):
            clients[endpoint].delete_queue(QueueUrl=queue_url)
    for client in clients.values():
        client.close()
    _created_queues.clear()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Write the ids of the collected tests (the run's denominator)."""
    if COLLECTED:
        ids = [item.nodeid for item in session.items]
        Path(COLLECTED).write_text(json.dumps(ids), encoding="utf-8")


def _failure_site(longrepr: Any) -> tuple[str, str]:
    """The deepest ``file:line`` of a moto test file in a failure's traceback, and the
    source line there (the one pytest marks with ``>``)."""
    entries = getattr(getattr(longrepr, "reprtraceback", None), "reprentries", [])
    for entry in reversed(entries):
        location = getattr(entry, "reprfileloc", None)
        if location is None or "tests/" not in location.path.replace(os.sep, "/"):
            continue
        # The source line that failed: marked with ">" in long tracebacks, the first line
        # (before the carets and the "E" lines) in short ones.
        source = [
            line.removeprefix(">").strip()
            for line in getattr(entry, "lines", [])
            if not line.startswith("E") and line.strip().strip("^~")
        ]
        marked = [line for line in getattr(entry, "lines", []) if line.startswith(">")]
        statement = marked[0][1:].strip() if marked else (source[0] if source else "")
        return f"{Path(location.path).name}:{location.lineno}", statement
    return "", ""


def _reason(report: pytest.TestReport) -> dict[str, str]:
    """What to keep of a report that did not pass: the short reason, where, and details."""
    longrepr = report.longrepr
    if longrepr is None:
        return {}
    if isinstance(longrepr, tuple):  # a skip: (path, line, "Skipped: why")
        return {"reason": str(longrepr[2])[:MAX_REASON]}
    crash = getattr(longrepr, "reprcrash", None)
    reason = crash.message if crash is not None else str(longrepr).strip().splitlines()[-1]
    where, statement = _failure_site(longrepr)
    record = {"reason": reason[:MAX_REASON], "details": str(longrepr)[-MAX_DETAILS:]}
    if where:
        record["where"] = where
        record["statement"] = statement
    return record


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Fold one phase (setup, call, teardown) into the test's outcome.

    A failed call is ``failed``; a failed setup or teardown is ``error`` (unless the call
    already failed); a skip in setup or call is ``skipped``; else ``passed``.
    """
    record = _records.setdefault(report.nodeid, {"outcome": "passed", "duration": 0.0})
    record["duration"] += report.duration
    if report.failed:
        if record["outcome"] != "failed":
            record["outcome"] = "failed" if report.when == "call" else "error"
            record.update(_reason(report))
    elif report.skipped and record["outcome"] == "passed":
        record["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        record.update(_reason(report))


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Append the finished test's outcome to the results file."""
    record = _records.pop(nodeid, None)
    if record is None or not RESULTS:
        return
    record["duration"] = round(record["duration"], 3)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps({"id": nodeid, **record}) + "\n")
