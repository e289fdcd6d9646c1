"""The SQS API of a real ``evq serve`` (Ray, two shards) with SigV4 keys configured
(``EVQ_SQS_KEYS``), used by the clients SQS users have: boto3, the AWS CLI (v1) and a
Celery worker on Celery's SQS transport (kombu, its own pycurl HTTP client), including a
task that fails and is retried. The native API sees the same queues.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from evq.client import Client
from tests.integration.conftest import SHARDS, ServerFactory
from tests.integration.server import Server, server_env
from tests.unit.gateway.sqs_support import expected_md5, unique

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KEY, SECRET = "AKIDEVQINTEGRATION", "evq/secret+key"
REGION = "eu-central-1"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("evq-sqs")
    factory = ServerFactory(root)
    env = server_env(EVQ_SQS_KEYS=f"{KEY}:{SECRET}")
    server = Server(root / "data", "--shards", str(SHARDS), env=env)
    factory.servers.append(server)
    try:
        server.start()
        yield server
    finally:
        factory.close()


def client(server: Server, key: str = KEY, secret: str = SECRET) -> Any:
    return boto3.session.Session().client(
        "sqs",
        endpoint_url=server.url,
        region_name=REGION,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=30),
    )


@pytest.fixture
def sqs(server: Server) -> Iterator[Any]:
    c = client(server)
    try:
        yield c
    finally:
        c.close()


def test_boto3_end_to_end(sqs: Any) -> None:
    dlq = sqs.create_queue(QueueName=unique("e2e-dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    assert dlq_arn.startswith(f"arn:aws:sqs:{REGION}:")
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
    url = sqs.create_queue(
        QueueName=unique("e2e"), Attributes={"RedrivePolicy": redrive}, tags={"suite": "it"}
    )["QueueUrl"]
    attrs = {"kind": {"DataType": "String", "StringValue": "e2e"}}
    sent = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": f"m{i}", "MessageBody": f"body {i}", "MessageAttributes": attrs}
            for i in range(3)
        ],
    )
    assert len(sent["Successful"]) == 3
    assert {e["MD5OfMessageAttributes"] for e in sent["Successful"]} == {expected_md5(attrs)}
    got = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=2
    )["Messages"]
    assert sorted(m["Body"] for m in got) == ["body 0", "body 1", "body 2"]
    assert all(m["MD5OfMessageAttributes"] == expected_md5(attrs) for m in got)
    keep, *rest = got
    sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(rest)],
    )
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=keep["ReceiptHandle"], VisibilityTimeout=0
    )
    # One receive was its maxReceiveCount: it moves to the dead-letter queue on another shard.
    dead = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=10, AttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in dead] == [keep["Body"]]
    assert dead[0]["Attributes"]["DeadLetterQueueSourceArn"].endswith(url.rsplit("/", 1)[1])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"suite": "it"}
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]


def test_fifo_and_long_poll_on_the_real_server(sqs: Any) -> None:
    url = sqs.create_queue(
        QueueName=unique("e2e", fifo=True),
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    for body in ("first", "second", "first"):  # the second "first" is a duplicate
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="g")
    # one receive hands out the group's run, in order, as SQS does; the duplicate never comes
    run = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2)["Messages"]
    assert [m["Body"] for m in run] == ["first", "second"]
    for m in run:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    assert time.monotonic() - started >= 0.9


def test_the_native_api_and_sqs_share_queues(server: Server, sqs: Any) -> None:
    name = unique("shared")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    with Client(server.url, retries=0, timeout=20) as native:
        [put] = native.put(name, b"from native", attributes={"origin": "native"})
        [message] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
        assert (message["MessageId"], message["Body"]) == (put.id, "from native")
        assert message["MessageAttributes"]["origin"]["StringValue"] == "native"
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        sent = sqs.send_message(QueueUrl=url, MessageBody="from sqs")
        [taken] = native.take(name, wait=5)
        assert (taken.id, taken.body) == (sent["MessageId"], b"from sqs")
        native.ack(name, taken)


def test_wrong_credentials_are_refused(server: Server) -> None:
    bad = client(server, secret="not-the-secret")
    try:
        with pytest.raises(ClientError) as info:
            bad.list_queues()
    finally:
        bad.close()
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


# ---------------------------------------------------------------- AWS CLI


def cli_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AWS_ACCESS_KEY_ID=KEY,
        AWS_SECRET_ACCESS_KEY=SECRET,
        AWS_DEFAULT_REGION=REGION,
        AWS_CONFIG_FILE=str(tmp_path / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


def aws(server: Server, env: dict[str, str], *args: str) -> Any:
    done = subprocess.run(
        [str(BIN / "aws"), "--endpoint-url", server.url, "--output", "json", "sqs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def test_the_aws_cli_sends_receives_and_deletes(server: Server, tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    name = unique("cli")
    url = aws(server, env, "create-queue", "--queue-name", name)["QueueUrl"]
    assert url == f"{server.url}/000000000000/{name}"
    sent = aws(
        server,
        env,
        "send-message",
        "--queue-url",
        url,
        "--message-body",
        "hello from the cli",
        "--message-attributes",
        json.dumps({"via": {"DataType": "String", "StringValue": "aws-cli"}}),
    )
    received = aws(
        server,
        env,
        "receive-message",
        "--queue-url",
        url,
        "--attribute-names",
        "All",
        "--message-attribute-names",
        "All",
        "--wait-time-seconds",
        "2",
    )
    [message] = received["Messages"]
    assert message["MessageId"] == sent["MessageId"]
    assert message["Body"] == "hello from the cli"
    assert message["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"
    aws(
        server,
        env,
        "delete-message",
        "--queue-url",
        url,
        "--receipt-handle",
        message["ReceiptHandle"],
    )
    counts = aws(
        server,
        env,
        "get-queue-attributes",
        "--queue-url",
        url,
        "--attribute-names",
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
    )
    assert counts["Attributes"] == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }
    assert url in aws(server, env, "list-queues", "--queue-name-prefix", name)["QueueUrls"]


# ---------------------------------------------------------------- Celery

TASKS = textwrap.dedent(
    """
    import os
    from pathlib import Path

    from celery import Celery

    OUT = Path(os.environ["EVQ_TEST_OUT"])
    if os.environ.get("EVQ_TEST_HTTPS") == "1":
        # kombu's asynchronous SQS client (the worker's receives) verifies the server with
        # certifi's bundle only, whatever AWS_CA_BUNDLE says: point it at the private CA
        import kombu.asynchronous.aws.connection as kombu_aws

        kombu_aws.get_cert_path = lambda verify: os.environ["AWS_CA_BUNDLE"]
    app = Celery("evqtest", broker=os.environ["EVQ_TEST_BROKER"])
    app.conf.update(
        broker_transport_options={
            "region": os.environ["AWS_DEFAULT_REGION"],
            "wait_time_seconds": 1,
            "polling_interval": 0.1,
            "visibility_timeout": 60,
            "queue_name_prefix": os.environ["EVQ_TEST_PREFIX"],
            # https to the broker's host (its CA: AWS_CA_BUNDLE, which botocore reads)
            "is_secure": os.environ.get("EVQ_TEST_HTTPS") == "1",
        },
        task_default_queue="work",
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )


    def record(line):
        with OUT.open("a") as f:
            f.write(line + "\\n")


    @app.task(name="evqtest.add")
    def add(x, y):
        record(f"add {x + y}")
        return x + y


    @app.task(name="evqtest.flaky", bind=True, max_retries=3, default_retry_delay=1)
    def flaky(self, label):
        attempt = self.request.retries + 1
        record(f"flaky {label} attempt {attempt}")
        if attempt < 3:
            raise self.retry(exc=RuntimeError(f"failure {attempt}"))
        record(f"flaky {label} done")
    """
)


def test_a_celery_worker_runs_tasks_sent_through_evq(server: Server, tmp_path: Path) -> None:
    (tmp_path / "celery_tasks.py").write_text(TASKS)
    out = tmp_path / "out.txt"
    host = server.url.removeprefix("http://")
    env = cli_env(tmp_path)
    env.update(
        EVQ_TEST_OUT=str(out),
        EVQ_TEST_PREFIX=unique("celery") + "-",
        EVQ_TEST_BROKER=f"sqs://{KEY}:{urllib.parse.quote(SECRET, safe='')}@{host}",
        PYTHONPATH=str(tmp_path),
    )
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "celery_tasks",
            "worker",
            "--pool=solo",
            "--concurrency=1",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=INFO",
        ],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        producer = (
            "import celery_tasks as t; t.add.delay(2, 3); t.flaky.delay('job'); t.add.delay(4, 5)"
        )
        subprocess.run(
            [sys.executable, "-c", producer], cwd=tmp_path, env=env, check=True, timeout=60
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lines = out.read_text().splitlines() if out.exists() else []
            if "flaky job done" in lines and len([x for x in lines if x.startswith("add")]) == 2:
                break
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
            time.sleep(0.2)
        else:
            pytest.fail(f"tasks did not run: {lines}\n{(tmp_path / 'worker.log').read_text()}")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
        log.close()
    assert sorted(x for x in lines if x.startswith("add")) == ["add 5", "add 9"]
    assert [x for x in lines if x.startswith("flaky")] == [
        "flaky job attempt 1",
        "flaky job attempt 2",
        "flaky job attempt 3",
        "flaky job done",
    ]
    worker_log = (tmp_path / "worker.log").read_text()
    assert "Retry in 1s: RuntimeError('failure 1')" in worker_log
    assert "Traceback" not in worker_log


def test_every_remaining_action_and_behaviour_on_the_real_server(sqs: Any) -> None:
    """The actions the tests above do not use, and the behaviours the issue lists."""
    name = unique("all")
    url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "1"})["QueueUrl"]
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert url in sqs.list_queues(QueueNamePrefix=name)["QueueUrls"]
    # attributes and tags round-trip
    sqs.set_queue_attributes(
        QueueUrl=url, Attributes={"DelaySeconds": "0", "VisibilityTimeout": "1"}
    )
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "1"
    sqs.tag_queue(QueueUrl=url, Tags={"team": "ops", "tier": "1"})
    sqs.untag_queue(QueueUrl=url, TagKeys=["tier"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "ops"}
    # a per-message delay is honoured
    attributes = {"kind": {"DataType": "String", "StringValue": "delayed"}}
    sent = sqs.send_message(
        QueueUrl=url, MessageBody="later", DelaySeconds=2, MessageAttributes=attributes
    )
    assert sent["MD5OfMessageAttributes"] == expected_md5(attributes)
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []
    got = sqs.receive_message(
        QueueUrl=url,
        WaitTimeSeconds=5,
        MessageAttributeNames=["All"],
        AttributeNames=["ApproximateReceiveCount"],
    )["Messages"]
    assert [m["Body"] for m in got] == ["later"]
    assert got[0]["MessageAttributes"] == attributes
    first = got[0]["ReceiptHandle"]
    # visibility expiry: received again, receive count 2; on a standard queue the earlier
    # receive's handle still acts on the message, as on SQS
    time.sleep(1.5)
    again = sqs.receive_message(
        QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["ApproximateReceiveCount"]
    )["Messages"]
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    # batch visibility changes with the earlier handle, with a partial failure
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "ok", "ReceiptHandle": first, "VisibilityTimeout": 30},
            {"Id": "bad", "ReceiptHandle": "garbage", "VisibilityTimeout": 30},
        ],
    )
    assert [e["Id"] for e in changed["Successful"]] == ["ok"]
    assert [e["Id"] for e in changed["Failed"]] == ["bad"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first)  # the earlier handle deletes it
    counts = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=counts)["Attributes"]
    assert attrs == dict.fromkeys(counts, "0")
    # the current handle of a message already deleted: success, as on SQS
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again[0]["ReceiptHandle"])
    # purge, then delete the queue
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(5)]
    )
    sqs.purge_queue(QueueUrl=url)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
        "Attributes"
    ]
    assert attrs["ApproximateNumberOfMessages"] == "0"
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(ClientError) as gone:
        sqs.get_queue_url(QueueName=name)
    assert "NonExistentQueue" in gone.value.response["Error"]["Code"]
