"""SigV4 on the SQS API: with keys configured, boto3 signed with them gets in; a wrong secret,
an unknown key, an unsigned request or a request dated too far from the server's clock gets
SQS's error (403) — in the JSON and the query protocol. Without keys, any credentials pass
(every other SQS test module runs that way)."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from actors.clock import SystemClock
from gateway.app import AppOptions, app_options
from gateway.settings import ServerSettings
from tests.unit.gateway.sqs_support import (
    REGION,
    SqsServer,
    client_of,
    error_code,
    native,
    running,
    unique,
)

KEY, SECRET = "AKIDEVQTEST", "evq-secret"
NS = {"q": "http://queue.amazonaws.com/doc/2012-11-05/"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqsServer]:
    with running(tmp_path_factory.mktemp("sqs"), keys={KEY: SECRET}) as s:
        yield s


def signed_client(server: SqsServer, key: str = KEY, secret: str = SECRET) -> Any:
    return client_of(server, aws_access_key_id=key, aws_secret_access_key=secret)


def test_requests_signed_with_a_configured_key_pass(server: SqsServer) -> None:
    with signed_client(server) as sqs:
        url = sqs.create_queue(QueueName=unique())["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="signed")
        [message] = sqs.receive_message(QueueUrl=url)["Messages"]
        assert message["Body"] == "signed"
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
        assert arn["QueueArn"].startswith(f"arn:aws:sqs:{REGION}:")  # the signature's region


@pytest.mark.parametrize(
    ("key", "secret", "code"),
    [
        (KEY, "wrong-secret", "SignatureDoesNotMatch"),
        ("AKIDUNKNOWN", SECRET, "InvalidClientTokenId"),
    ],
)
def test_bad_credentials_are_refused(server: SqsServer, key: str, secret: str, code: str) -> None:
    with signed_client(server, key, secret) as sqs, pytest.raises(ClientError) as info:
        sqs.list_queues()
    assert error_code(info.value)[1] == code
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def raw(server: SqsServer, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(server.url + "/", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def test_unsigned_requests_are_refused_in_both_protocols(server: SqsServer) -> None:
    status, body = raw(
        server,
        b"{}",
        {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"},
    )
    assert status == 403
    assert b"MissingAuthenticationToken" in body
    status, body = raw(
        server, b"Action=ListQueues", {"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert status == 403
    code = ET.fromstring(body).findtext("q:Error/q:Code", namespaces=NS)
    assert code == "MissingAuthenticationToken"


def test_signed_query_requests_pass_and_tampered_ones_do_not(server: SqsServer) -> None:
    name = unique()
    form = urllib.parse.urlencode({"Action": "CreateQueue", "QueueName": name}).encode()
    request = AWSRequest(
        method="POST",
        url=server.url + "/",
        data=form,
        headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
    )
    SigV4Auth(Credentials(KEY, SECRET), "sqs", REGION).add_auth(request)
    headers = dict(request.headers.items())
    status, body = raw(server, form, headers)
    assert status == 200, body
    assert (
        ET.fromstring(body).findtext("q:CreateQueueResult/q:QueueUrl", namespaces=NS).endswith(name)
    )  # type: ignore[union-attr]
    tampered = form.replace(name.encode(), b"someone-else")
    status, body = raw(server, tampered, headers)
    assert status == 403
    assert ET.fromstring(body).findtext("q:Error/q:Code", namespaces=NS) == "SignatureDoesNotMatch"


class AheadClock(SystemClock):
    """The server's clock, ten minutes fast."""

    def now_ms(self) -> int:
        return super().now_ms() + 10 * 60 * 1000


def test_requests_dated_too_far_from_the_server_clock_are_refused(tmp_path: Path) -> None:
    with (
        running(tmp_path / "data", keys={KEY: SECRET}, clock=AheadClock()) as skewed,
        signed_client(skewed) as sqs,
        pytest.raises(ClientError) as info,
    ):
        sqs.list_queues()
    assert error_code(info.value)[1] == "SignatureDoesNotMatch"
    assert "Signature expired" in info.value.response["Error"]["Message"]


def test_off_loopback_without_keys_the_sqs_api_refuses_everyone(tmp_path: Path) -> None:
    with running(tmp_path / "data", options=AppOptions(sqs_open=False)) as closed:
        with client_of(closed) as sqs, pytest.raises(ClientError) as info:
            sqs.create_queue(QueueName=unique())
        assert error_code(info.value)[1] == "InvalidClientTokenId"
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert "EVQ_SQS_KEYS" in str(info.value)
        # The native API is not touched by this, and nothing was created.
        assert native(closed, "GET", "/v1/queues")["queues"] == []
    # With keys, off loopback: signed requests pass, others do not.
    options = AppOptions(sqs_open=False)
    with running(tmp_path / "keyed", keys={KEY: SECRET}, options=options) as keyed:
        with signed_client(keyed) as sqs:
            assert sqs.create_queue(QueueName=unique())["QueueUrl"]
        with client_of(keyed) as anyone, pytest.raises(ClientError):
            anyone.list_queues()


@pytest.mark.parametrize(("host", "open_"), [("127.0.0.1", True), ("0.0.0.0", False)])
def test_the_server_opens_sqs_without_keys_on_loopback_only(host: str, open_: bool) -> None:
    settings = ServerSettings(host=host)
    assert app_options(settings).sqs_open is open_
