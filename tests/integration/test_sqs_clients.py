"""The SQS face of a real ``evq serve`` through every client its users have.

- The SDKs: every scenario of tests/sqs_clients/scenarios.py through current boto3 (the
  JSON protocol, in this process) and through boto3/botocore 1.34.50 (the query protocol,
  the script run in ``.venv-sqs-legacy``), with the same expectations wherever AWS's answers
  are the same in both protocols.
- The AWS CLI: the same scenarios as a user types them (tests/sqs_clients/cli.py), through
  the current ``aws`` (JSON protocol) and awscli 1.32.50 (query protocol).
- Who gets in: callers with bearer tokens only, SQS keys only, both, neither (and bare
  ``EVQ_SQS_KEYS``), each on loopback and off it; a read-only caller; a caller's rate limit,
  one bucket for both APIs.
- The approximate counts under load: producers and consumers in threads against a
  Ray-backed server (production's shape); exact at quiet points, within bounds meanwhile.

One ``--no-ray`` server (SigV4 through its tokens file) serves the scenarios; the Ray-backed
one serves the load and one scenario. ``.venv-sqs-legacy`` is made by ``make test``
(tests/sqs_legacy/requirements.txt).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import botocore
import pytest
from botocore.exceptions import ClientError

from tests.integration.conftest import SHARDS, ServerFactory
from tests.integration.server import EVQ, ROOT, Server, free_port, request, server_env
from tests.sqs_clients import cli as cli_scenarios
from tests.sqs_clients import scenarios
from tests.sqs_clients.cli import Cli, cli_env
from tests.sqs_clients.load import Load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REGION = "eu-west-1"
LEGACY_VENV = ROOT / ".venv-sqs-legacy"
LEGACY_PYTHON = LEGACY_VENV / "bin" / "python"
SCENARIOS_SCRIPT = Path(scenarios.__file__)
_serial = itertools.count()


@dataclass(frozen=True)
class Caller:
    """One caller of a tokens file (gateway/auth.py)."""

    name: str
    queues: dict[str, str]
    token: str | None = None
    key: str | None = None
    secret: str | None = None
    rate: float | None = None
    burst: float | None = None

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "queues": self.queues}
        optional = {
            "token": self.token,
            "sqs_access_key": self.key,
            "sqs_secret_key": self.secret,
            "rate": self.rate,
            "burst": self.burst,
        }
        return doc | {k: v for k, v in optional.items() if v is not None}


OPS = Caller(
    "ops",
    {"*": "admin"},
    token="ops-bearer-0123456789",
    key="AKIAEVQOPS",
    secret="ops/secret+0123456789",
)
AUDITOR = Caller("auditor", {"*": "read"}, key="AKIAEVQAUDITOR", secret="auditor-secret-0123456789")
SLOW = Caller(
    "slow",
    {"*": "admin"},
    token="slow-bearer-0123456789",
    key="AKIAEVQSLOW",
    secret="slow-secret-0123456789",
    rate=0.05,  # one request per 20 s once the burst is spent
    burst=3,
)
NATIVE = Caller("native", {"*": "admin"}, token="native-bearer-0123456789")
SIGNER = Caller("signer", {"*": "admin"}, key=OPS.key, secret=OPS.secret)
FOREIGN = ("AKIAEVQNOBODY", "nobody-secret-0123456789")  # a key no server here knows


def tokens_toml(callers: list[Caller]) -> str:
    """The callers as a tokens file (TOML)."""
    lines = []
    for caller in callers:
        doc = caller.document()
        lines.append("[[token]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in doc.items() if k != "queues"]
        lines.append("[token.queues]")
        lines += [
            f"{json.dumps(glob)} = {json.dumps(level)}" for glob, level in doc["queues"].items()
        ]
    return "\n".join(lines) + "\n"


def tokens_json(callers: list[Caller]) -> str:
    """The callers as ``EVQ_TOKENS`` takes them."""
    return json.dumps({"token": [c.document() for c in callers]})


def boto3_client(server: Server, key: str | None, secret: str | None) -> Any:
    return scenarios.client(server.url, key or "", secret or "", REGION)


def start(factory: ServerFactory, *args: str, env: dict[str, str]) -> Server:
    data = factory.root / f"data-{next(_serial)}"
    server = Server(data, *args, env=env)
    factory.servers.append(server)
    return server.start()


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """Servers of this module, every one stopped at its end."""
    factory = ServerFactory(tmp_path_factory.mktemp("evq-sqs-clients"))
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="module")
def tokens_file(factory: ServerFactory) -> Path:
    path = factory.root / "tokens.toml"
    path.write_text(tokens_toml([OPS, AUDITOR, SLOW]))
    return path


@pytest.fixture(scope="module")
def server(factory: ServerFactory, tokens_file: Path) -> Server:
    """The scenarios' server: no Ray, SigV4 through the tokens file, on loopback."""
    return start(factory, "--no-ray", "--tokens-file", str(tokens_file), env=server_env())


@pytest.fixture(scope="module")
def ray_server(factory: ServerFactory, tokens_file: Path) -> Server:
    """A Ray-backed server (two shards), as production runs."""
    args = ("--shards", str(SHARDS), "--tokens-file", str(tokens_file))
    return start(factory, *args, env=server_env())


@pytest.fixture
def sqs(server: Server) -> Iterator[Any]:
    """Current boto3, as OPS (allowed everything)."""
    client = boto3_client(server, OPS.key, OPS.secret)
    try:
        yield client
    finally:
        client.close()


# ------------------------------------------------------------------ the SDKs

SDKS = ["boto3", "botocore-1.34.50"]


@dataclass
class Observed:
    """What one scenario saw through one SDK."""

    protocol: str
    prefix: str
    out: dict[str, Any]


def observe(
    server: Server, sdk: str, scenario: str, caller: Caller = OPS, prefix: str | None = None
) -> Observed:
    """Run ``scenario`` through ``sdk`` as ``caller``; its observations, as JSON has them."""
    prefix = prefix or f"{scenario.replace('_', '-')}-{next(_serial)}"
    if sdk == "boto3":
        client = boto3_client(server, caller.key, caller.secret)
        try:
            out = scenarios.SCENARIOS[scenario](client, prefix)
            protocol = client.meta.service_model.protocol
        finally:
            client.close()
        assert protocol == "json", botocore.__version__
        return Observed(protocol, prefix, json.loads(json.dumps(out, default=str)))
    assert LEGACY_PYTHON.exists(), f"{LEGACY_PYTHON} is missing: `make test` creates it"
    args = [server.url, caller.key or "", caller.secret or "", REGION, scenario, prefix]
    done = subprocess.run(
        [str(LEGACY_PYTHON), str(SCENARIOS_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout)
    assert (out.pop("botocore"), out.pop("protocol")) == ("1.34.50", "query")
    return Observed("query", prefix, out)


@pytest.fixture(params=SDKS)
def sdk(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def run(server: Server, sdk: str) -> Callable[[str], Observed]:
    return lambda scenario: observe(server, sdk, scenario)


def assert_expired(error: dict[str, Any]) -> None:
    """SQS's answer to the handle of an earlier receive of a FIFO message."""
    assert (error["error"], error["status"]) == ("InvalidParameterValue", 400), error
    assert re.fullmatch(
        r"Value \S+ for parameter ReceiptHandle is invalid\. "
        r"Reason: The receipt handle has expired\.",
        error["message"],
    ), error


def test_every_empty_answer_parses(run: Callable[[str], Observed]) -> None:
    seen = run("empties")
    json_protocol = seen.protocol == "json"
    assert seen.out == {
        "receive_empty": {},
        "list_queues_no_match": {},
        "list_queue_tags_none": {},
        # queueUrls is required in the JSON output; the query protocol's list has no members
        "dead_letter_sources_none": {"queueUrls": []} if json_protocol else {},
        "get_queue_attributes_none": {},
        "move_tasks_none": {"answered": {"Results": []} if json_protocol else {}},
        "send": ["MD5OfMessageBody", "MessageId"],
        "receive_one": ["hello"],
        "delete": {},
        "receive_after_delete": {},
        "purge": {},
        "delete_queue": {},
    }


def test_an_earlier_receipt_handle_acts_on_standard_queues_only(
    run: Callable[[str], Observed],
) -> None:
    out = run("old_handles").out
    assert_expired(out.pop("fifo_change_with_old_handle"))
    assert_expired(out.pop("fifo_delete_with_old_handle"))
    assert out == {
        "same_message": True,
        "handles_differ": True,
        "visible_again_after_old_handle": ["one"],
        "delete_with_old_handle": {},
        "counts_after_delete": [0, 0, 0],
        "batch_received_twice": ["b0", "b1", "b2"],
        "batch_change_with_old_handles": ["c0", "c1", "c2"],
        "batch_delete_with_old_handles": ["d0", "d1", "d2"],
        "counts_after_batch_delete": [0, 0, 0],
        "fifo_delete_with_new_handle": {},
    }


def test_a_second_purge_within_a_minute_is_refused(run: Callable[[str], Observed]) -> None:
    seen = run("purge_twice")
    assert seen.out == {
        "first": {},
        "second": {
            "error": "AWS.SimpleQueueService.PurgeQueueInProgress",
            "message": f"Only one PurgeQueue operation on {seen.prefix} is allowed every 60 "
            "seconds.",
            "status": 403,
        },
        "counts": [0, 0, 0],
    }


def test_a_dead_letter_keeps_its_id_body_attributes_and_time(
    run: Callable[[str], Observed],
) -> None:
    assert run("dead_letter").out == {
        "same_id": True,
        "same_body": True,
        "same_attributes": True,
        "same_md5": True,
        "same_sent_timestamp": True,
        "source_arn": True,
        "receive_count": "1",
    }


def test_a_fifo_receive_hands_out_a_run_of_one_group(run: Callable[[str], Observed]) -> None:
    assert run("fifo_runs").out == {
        "first": ["a1", "a2"],
        "rest": ["b1", "b2"],
        "locked": [],
        "still_locked": [],
        "after": ["a3"],
    }


def test_errors_have_sqs_codes_in_both_protocols(run: Callable[[str], Observed]) -> None:
    seen = run("errors")
    missing = "The specified queue does not exist."
    if seen.protocol == "query":  # as SQS words it there
        missing = "The specified queue does not exist for this wsdl version."
    assert seen.out == {
        "empty_batch": {
            "error": "AWS.SimpleQueueService.EmptyBatchRequest",
            "message": "There should be at least one SendMessageBatchRequestEntry in the request.",
            "status": 400,
        },
        "empty_delete_batch": {
            "error": "AWS.SimpleQueueService.EmptyBatchRequest",
            "message": "There should be at least one DeleteMessageBatchRequestEntry in the "
            "request.",
            "status": 400,
        },
        "batch_successful": ["fine"],
        "batch_failed": [["late", "InvalidParameterValue", True]],
        "no_queue": {
            "error": "AWS.SimpleQueueService.NonExistentQueue",
            "message": missing,
            "status": 400,
        },
        "bad_handle": {
            "error": "ReceiptHandleIsInvalid",
            "message": "The input receipt handle is invalid.",
            "status": 400,
        },
    }


MOVE_TASK = {
    "not_a_dlq": {
        "error": "InvalidParameterValue",
        "message": "Source queue must be configured as a Dead Letter Queue.",
    },
    "bad_handle": {
        "error": "InvalidParameterValue",
        "message": "Value for parameter TaskHandle is invalid.",
    },
    "handle_is_text": True,
    "task": {"Status": "COMPLETED", "ApproximateNumberOfMessagesMoved": 3},
    "task_keys": [
        "ApproximateNumberOfMessagesMoved",
        "ApproximateNumberOfMessagesToMove",
        "SourceArn",
        "StartedTimestamp",
        "Status",
    ],
    "back_ids_match": True,
    "dlq_counts": [0, 0, 0],
    "cancelled": {
        "answer_keys": ["ApproximateNumberOfMessagesMoved"],
        "moved_at_cancel_at_most_final": True,
        "status": "CANCELLED",
        "handle_listed": False,  # only a running task shows its handle
        "again": "InvalidParameterValue",  # evq's answer (AWS's is not recorded)
        "moved_plus_left": 5,
        "moved_arrived": True,
    },
}


def test_move_tasks_redrive_and_cancel(run: Callable[[str], Observed]) -> None:
    out = run("move_task").out
    for key in ("not_a_dlq", "bad_handle"):
        assert out[key].pop("status") == 400
    assert out == MOVE_TASK


PERMISSIONS = {
    "statement_ids": ["senders"],
    "actions": "SQS:SendMessage",
    "same_label_again": "InvalidParameterValue",
    "policy_after_remove": None,
    "remove_unknown": "InvalidParameterValue",
    "policy_after_empty": None,
}


def test_permissions_are_statements_of_the_policy(run: Callable[[str], Observed]) -> None:
    assert run("permissions").out == PERMISSIONS


def test_lists_page_with_max_results_and_next_token(run: Callable[[str], Observed]) -> None:
    seen = run("paging")
    p = seen.prefix
    assert seen.out == {
        "sources_page1": [f"{p}-src0", f"{p}-src1"],
        "sources_page2": [f"{p}-src2"],
        "sources_page2_token": False,
        "list_page1": [f"{p}-src0", f"{p}-src1"],
        "list_page2": [f"{p}-src2"],
    }


COUNTERS = {
    "empty": [0, 0, 0],
    "after_sends": [10, 0, 3],
    "after_receive": [6, 4, 3],
    "after_delete_and_release": [7, 2, 3],
}


def test_the_approximate_counts_follow_each_change(run: Callable[[str], Observed]) -> None:
    assert run("counters").out == COUNTERS


# ------------------------------------------------------------------ the AWS CLI

CLIS = {
    "aws-cli-current": (ROOT / ".venv" / "bin" / "aws", "json"),
    "aws-cli-1.32.50": (LEGACY_VENV / "bin" / "aws", "query"),
}


@pytest.fixture(scope="module", params=list(CLIS))
def aws(
    request: pytest.FixtureRequest, server: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cli]:
    """One AWS CLI, as OPS, with nothing of the machine's AWS configuration."""
    path, protocol = CLIS[request.param]
    assert path.exists(), f"{path} is missing: `make test` creates it"
    home = tmp_path_factory.mktemp("aws-home")
    env = cli_env(OPS.key or "", OPS.secret or "", REGION, home)
    cli = Cli(path, server.url, REGION, env, protocol=protocol)
    version = cli.version()
    if request.param == "aws-cli-1.32.50":
        assert version.startswith("aws-cli/1.32.50 ")
        assert "botocore/1.34.50" in version
    else:  # awscli 1.x brings a botocore of its own
        found = re.search(r" botocore/(\d+)\.(\d+)\.(\d+)", version)
        assert found, version
        assert tuple(map(int, found.groups())) > (1, 34, 50), version
    try:
        yield cli
    finally:
        cli.close()


def cli_observe(aws: Cli, sqs: Any, scenario: str) -> tuple[str, dict[str, Any]]:
    prefix = f"cli-{scenario.replace('_', '-')}-{next(_serial)}"
    out = cli_scenarios.SCENARIOS[scenario](aws, sqs, prefix)
    return prefix, json.loads(json.dumps(out, default=str))


def test_each_cli_speaks_its_protocol(aws: Cli) -> None:
    done = aws.run("--debug", "list-queues", "--queue-name-prefix", "nothing-by-this-name")
    assert done.returncode == 0, done.stderr[-4000:]
    if aws.protocol == "json":
        assert "'X-Amz-Target': 'AmazonSQS.ListQueues'" in done.stderr
    else:
        assert "'Action': 'ListQueues'" in done.stderr
        assert "<ListQueuesResponse" in done.stderr
    assert done.stdout == ""  # nothing listed: the CLI prints nothing


def cli_error(code: str, message: str) -> dict[str, Any]:
    return {"error": code, "message": message, "exit": 255}


def test_cli_empty_answers(aws: Cli, sqs: Any) -> None:
    _, out = cli_observe(aws, sqs, "empties")
    json_protocol = aws.protocol == "json"
    assert out == {
        "receive_empty": None,  # the CLI prints nothing for an empty reply
        "list_queues_no_match": None,
        "list_queue_tags_none": None,
        "dead_letter_sources_none": {"queueUrls": []} if json_protocol else None,
        "get_queue_attributes_none": None,
        "move_tasks_none": {"Results": []} if json_protocol else None,
        "send": ["MD5OfMessageBody", "MessageId"],
        "receive_one": ["hello"],
        "same_id": True,
        "delete": None,
        "receive_after_delete": None,
        "delete_queue": None,
    }


def test_cli_earlier_receipt_handles(aws: Cli, sqs: Any) -> None:
    _, out = cli_observe(aws, sqs, "old_handles")
    for key in ("fifo_change_with_old_handle", "fifo_delete_with_old_handle"):
        error = out.pop(key)
        assert error.pop("exit") == 255
        assert_expired(error | {"status": 400})
    assert out == {
        "handles_differ": True,
        "change_with_old_handle": None,
        "visible_again_after_old_handle": ["one"],
        "delete_with_old_handle": None,
        "counts_after_delete": [0, 0, 0],
        "fifo_delete_with_new_handle": None,
        "fifo_counts": [0, 0, 0],
    }


def test_cli_purge_twice(aws: Cli, sqs: Any) -> None:
    prefix, out = cli_observe(aws, sqs, "purge_twice")
    assert out == {
        "first": None,
        "second": cli_error(
            "AWS.SimpleQueueService.PurgeQueueInProgress",
            f"Only one PurgeQueue operation on {prefix} is allowed every 60 seconds.",
        ),
        "counts": [0, 0, 0],
    }


def test_cli_dead_letter_keeps_id_time_and_attributes(aws: Cli, sqs: Any) -> None:
    _, out = cli_observe(aws, sqs, "dead_letter")
    assert out == {
        "same_id": True,
        "same_body": True,
        # CLI v1 sends a blob's text as its bytes and prints blobs in base64
        "attributes": {
            "colour": {"StringValue": "blue", "DataType": "String"},
            "size": {"StringValue": "42", "DataType": "Number"},
            "blob": {"BinaryValue": "Ymlu", "DataType": "Binary"},
        },
        "same_attributes": True,
        "same_md5": True,
        "same_sent_timestamp": True,
        "source_arn": True,
        "receive_count": "1",
    }


def test_cli_fifo_runs(aws: Cli, sqs: Any) -> None:
    _, out = cli_observe(aws, sqs, "fifo_runs")
    assert out == {
        "sent": ["a1", "a2", "a3", "b1", "b2"],
        "first": ["a1", "a2"],
        "rest": ["b1", "b2"],
        "locked": [],
        "still_locked": [],
        "after": ["a3"],
    }


def test_cli_errors(aws: Cli, sqs: Any) -> None:
    _, out = cli_observe(aws, sqs, "errors")
    missing = "The specified queue does not exist."
    if aws.protocol == "query":
        missing = "The specified queue does not exist for this wsdl version."
    assert out == {
        "empty_batch": cli_error(
            "AWS.SimpleQueueService.EmptyBatchRequest",
            "There should be at least one SendMessageBatchRequestEntry in the request.",
        ),
        "empty_delete_batch": cli_error(
            "AWS.SimpleQueueService.EmptyBatchRequest",
            "There should be at least one DeleteMessageBatchRequestEntry in the request.",
        ),
        "batch_successful": ["fine"],
        "batch_failed": [["late", "InvalidParameterValue", True]],
        "counts": [1, 0, 0],
        "no_queue": cli_error("AWS.SimpleQueueService.NonExistentQueue", missing),
        "bad_handle": cli_error("ReceiptHandleIsInvalid", "The input receipt handle is invalid."),
    }


def test_cli_move_tasks(aws: Cli, sqs: Any) -> None:
    _, out = cli_observe(aws, sqs, "move_task")
    assert out.pop("dead") is True
    for key in ("not_a_dlq", "bad_handle"):
        assert out[key].pop("exit") == 255
    assert out == MOVE_TASK


def test_cli_permissions(aws: Cli, sqs: Any) -> None:
    _, out = cli_observe(aws, sqs, "permissions")
    assert out == PERMISSIONS | {
        "add": None,
        "remove": None,
        "two_actions": ["SQS:ReceiveMessage", "SQS:SendMessage"],
        "set_empty": None,
    }


def test_cli_paging(aws: Cli, sqs: Any) -> None:
    p, out = cli_observe(aws, sqs, "paging")
    assert out == {
        "sources_page1": [f"{p}-src0", f"{p}-src1"],  # --max-results: one request
        "sources_page2": [f"{p}-src2"],
        "sources_page2_token": False,
        "sources_page_size_1": [f"{p}-src0", f"{p}-src1", f"{p}-src2"],  # every page
        "sources_page_size_1_token": False,
        "sources_max_items": [f"{p}-src0", f"{p}-src1"],  # cut by the CLI
        "sources_starting_token": [f"{p}-src2"],
        "sources_starting_token_token": False,
        "list_page1": [f"{p}-src0", f"{p}-src1"],
        "list_page2": [f"{p}-src2"],
        "list_page2_token": False,
    }


def test_cli_counters(aws: Cli, sqs: Any) -> None:
    _, out = cli_observe(aws, sqs, "counters")
    assert out == {"empty": [0, 0, 0], "after_sends_and_receive": [3, 2, 2]}


# ------------------------------------------------------------------ who gets in


@dataclass(frozen=True)
class Configuration:
    """Where a server's callers come from."""

    tokens_file: list[Caller] | None = None  # --tokens-file (TOML)
    tokens_env: list[Caller] | None = None  # EVQ_TOKENS (JSON)
    sqs_keys: tuple[str, str] | None = None  # EVQ_SQS_KEYS

    def args_and_env(self, root: Path) -> tuple[list[str], dict[str, str]]:
        args, extra = ["--no-ray"], {}
        if self.tokens_file is not None:
            path = root / f"tokens-{next(_serial)}.toml"
            path.write_text(tokens_toml(self.tokens_file))
            args += ["--tokens-file", str(path)]
        if self.tokens_env is not None:
            extra["EVQ_TOKENS"] = tokens_json(self.tokens_env)
        if self.sqs_keys is not None:
            extra["EVQ_SQS_KEYS"] = ":".join(self.sqs_keys)
        return args, server_env(**extra)


CONFIGURATIONS = {
    "neither": Configuration(),
    "tokens-only": Configuration(tokens_env=[NATIVE]),
    "keys-only": Configuration(tokens_file=[SIGNER]),
    "both": Configuration(tokens_file=[OPS, AUDITOR, SLOW]),  # the scenarios' server's
    "bare-keys": Configuration(sqs_keys=(OPS.key or "", OPS.secret or "")),
}
OK, OPEN, SHUT = "ok", 200, 401
ICTI, MAT, SDNM = "InvalidClientTokenId", "MissingAuthenticationToken", "SignatureDoesNotMatch"

# (configuration, host) → what each request gets: SQS signed with OPS's key pair, with the
# wrong secret, with a key the server does not know, unsigned; the native API with OPS's
# bearer token, and with none. None: the server refuses to start (exit 2).
WHO_GETS_IN: dict[tuple[str, str], tuple[Any, ...] | None] = {
    ("neither", "127.0.0.1"): (OK, OK, OK, OK, OPEN, OPEN),
    ("neither", "0.0.0.0"): None,
    ("tokens-only", "127.0.0.1"): (OK, OK, OK, OK, SHUT, SHUT),
    ("tokens-only", "0.0.0.0"): (ICTI, ICTI, ICTI, ICTI, SHUT, SHUT),
    ("keys-only", "127.0.0.1"): (OK, SDNM, ICTI, MAT, SHUT, SHUT),
    ("keys-only", "0.0.0.0"): (OK, SDNM, ICTI, MAT, SHUT, SHUT),
    ("both", "127.0.0.1"): (OK, SDNM, ICTI, MAT, OPEN, SHUT),
    ("both", "0.0.0.0"): (OK, SDNM, ICTI, MAT, OPEN, SHUT),
    ("bare-keys", "127.0.0.1"): (OK, SDNM, ICTI, MAT, OPEN, OPEN),
    ("bare-keys", "0.0.0.0"): None,
}


def sqs_outcome(server: Server, key: str | None, secret: str | None) -> str:
    """ListQueues signed with ``key`` (None: unsigned, a bare form POST): "ok" or the code
    of the error (always a 403)."""
    status, code = _unsigned_list(server) if key is None else _signed_list(server, key, secret)
    assert status == (200 if code == OK else 403), (status, code)
    return code


def _unsigned_list(server: Server) -> tuple[int, str]:
    req = urllib.request.Request(
        server.url + "/",
        data=b"Action=ListQueues&Version=2012-11-05",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status, OK
    except urllib.error.HTTPError as exc:
        with exc:
            found = re.search(r"<Code>([^<]+)</Code>", exc.read().decode())
        return exc.code, found[1] if found else "?"


def _signed_list(server: Server, key: str, secret: str | None) -> tuple[int, str]:
    client = boto3_client(server, key, secret)
    try:
        client.list_queues()
        return 200, OK
    except ClientError as exc:
        return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]
    finally:
        client.close()


def native_outcome(server: Server, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, _ = request("GET", server.url + "/v1/queues", headers=headers, timeout=10)
    return status


@pytest.mark.parametrize(
    ("configuration", "host"), list(WHO_GETS_IN), ids=[f"{c}-{h}" for c, h in WHO_GETS_IN]
)
def test_who_gets_in(
    configuration: str, host: str, factory: ServerFactory, request: pytest.FixtureRequest
) -> None:
    expected = WHO_GETS_IN[configuration, host]
    args, env = CONFIGURATIONS[configuration].args_and_env(factory.root)
    args += ["--host", host]  # the server is reached on 127.0.0.1 either way
    if host == "0.0.0.0":
        args += ["--behind-tls-proxy"]  # plain HTTP off loopback is refused otherwise
    if expected is None:
        data = factory.root / f"data-{next(_serial)}"
        done = subprocess.run(
            [*EVQ, "serve", "--data", str(data), "--port", str(free_port()), *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert "no tokens configured: the API would be open to anyone on 0.0.0.0" in done.stderr
        return
    shared = (configuration, host) == ("both", "127.0.0.1")  # the scenarios' server
    server = request.getfixturevalue("server") if shared else start(factory, *args, env=env)
    got = (
        sqs_outcome(server, OPS.key, OPS.secret),
        sqs_outcome(server, OPS.key, "not-the-secret-0123456789"),
        sqs_outcome(server, *FOREIGN),
        sqs_outcome(server, None, None),
        native_outcome(server, OPS.token),
        native_outcome(server, None),
    )
    assert got == expected
    if configuration == "tokens-only" and host == "0.0.0.0":
        assert "the SQS API has no access keys" in server.log()  # said at start
    if not shared:
        server.stop()


@pytest.mark.parametrize("sdk_name", SDKS)
def test_a_reader_may_not_send(server: Server, sqs: Any, sdk_name: str) -> None:
    name = f"read-only-{next(_serial)}"
    sqs.create_queue(QueueName=name)
    seen = observe(server, sdk_name, "read_only", caller=AUDITOR, prefix=name)
    send = seen.out.pop("send")
    assert send == {
        "error": "AccessDenied",
        "message": f"User: auditor is not authorized to perform: sqs:SendMessage on resource: "
        f"arn:aws:sqs:{REGION}:000000000000:{name}",
        "status": 403,
    }
    assert seen.out == {
        "attributes_read": True,
        "listed": True,
        "receive": "AccessDenied",
        "purge": "AccessDenied",
    }


def test_a_callers_rate_is_one_bucket_for_both_apis(server: Server) -> None:
    slow = boto3_client(server, SLOW.key, SLOW.secret)
    try:
        slow.list_queues()
        slow.list_queues()
        assert native_outcome(server, SLOW.token) == 200  # the third of the burst
        with pytest.raises(ClientError) as info:
            slow.list_queues()
    finally:
        slow.close()
    response = info.value.response
    assert response["Error"]["Code"] == "RequestThrottled"
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert int(response["ResponseMetadata"]["HTTPHeaders"]["retry-after"]) >= 1
    req = urllib.request.Request(
        server.url + "/v1/queues", headers={"Authorization": f"Bearer {SLOW.token}"}
    )
    with pytest.raises(urllib.error.HTTPError) as native:
        urllib.request.urlopen(req, timeout=10)
    assert native.value.code == 429
    assert int(native.value.headers["Retry-After"]) >= 1
    native.value.close()
    assert native_outcome(server, OPS.token) == 200  # another caller's bucket is its own


# ------------------------------------------------------------------ on Ray, and under load


def test_the_approximate_counts_on_a_ray_backed_server(ray_server: Server, sdk: str) -> None:
    assert observe(ray_server, sdk, "counters").out == COUNTERS


def test_the_approximate_counts_under_load(ray_server: Server) -> None:
    admin = boto3_client(ray_server, OPS.key, OPS.secret)
    url = admin.create_queue(QueueName=f"load-{next(_serial)}")["QueueUrl"]
    seed = int(os.environ.get("EVQ_SEED") or time.time() % 100_000)  # shown on failure
    load = Load(
        lambda: boto3_client(ray_server, OPS.key, OPS.secret),
        url,
        producers=2,
        consumers=6,
        seed=seed,
    )
    assert scenarios.counts(admin, url) == [0, 0, 0]
    load.start()
    seen: list[list[int]] = []
    try:
        for producing in (True, True, False):  # then the queue drains
            if not producing:
                load.producing.clear()
            until = time.monotonic() + 3
            while time.monotonic() < until:
                seen.append(load.check_bounds(admin))
                load.check_errors()
            with load.quiet():
                time.sleep(max(0.0, load.truth.last_due() - time.monotonic()) + 0.3)
                expected = load.truth.expected()
                assert scenarios.counts(admin, url) == expected, f"seed {seed}"
                seen.append(expected)
    finally:
        load.stop()
        admin.close()
    load.check_errors()
    assert load.truth.confirmed > 200, load.truth.confirmed  # it was load
    assert max(s[1] for s in seen) > 0  # messages were in flight
    assert max(s[2] for s in seen) > 0  # and delayed
