"""The SQS account id (``sqs_account_id``): in every queue URL and ARN the server answers,
and the only account whose queue URLs and ARNs it takes."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from botocore.exceptions import ClientError

from gateway import sqs as sqs_api
from gateway.app import AppOptions
from tests.unit.gateway.sqs_support import REGION, SqsServer, running, unique

ACCOUNT = "123456789012"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqsServer]:
    options = AppOptions(sqs_account_id=ACCOUNT)
    with running(tmp_path_factory.mktemp("sqs"), options=options) as s:
        yield s


def test_queue_urls_and_arns_carry_the_configured_account(sqs: Any, server: SqsServer) -> None:
    name, dlq = unique(), unique("dlq")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert url == f"{server.url}/{ACCOUNT}/{name}"
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert sqs.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=ACCOUNT)["QueueUrl"] == url
    assert url in sqs.list_queues(QueueNamePrefix=name)["QueueUrls"]
    [arn] = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"
    ].values()
    assert arn == f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"
    dlq_url = sqs.create_queue(QueueName=dlq)["QueueUrl"]
    policy = (
        f'{{"deadLetterTargetArn": "arn:aws:sqs:{REGION}:{ACCOUNT}:{dlq}", "maxReceiveCount": 2}}'
    )
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": policy})
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == [url]
    sqs.send_message(QueueUrl=url, MessageBody="m")
    [message] = sqs.receive_message(QueueUrl=url, AttributeNames=["SenderId"])["Messages"]
    assert message["Attributes"]["SenderId"] == ACCOUNT


def test_urls_and_arns_of_another_account_name_no_queue(sqs: Any, server: SqsServer) -> None:
    name = unique()
    sqs.create_queue(QueueName=name)
    for call, kwargs in [
        (sqs.get_queue_attributes, {"QueueUrl": f"{server.url}/000000000000/{name}"}),
        (sqs.get_queue_url, {"QueueName": name, "QueueOwnerAWSAccountId": "000000000000"}),
    ]:
        with pytest.raises(sqs.exceptions.QueueDoesNotExist):
            call(**kwargs)
    other_arn = f"arn:aws:sqs:{REGION}:000000000000:{name}"
    other = json.dumps({"deadLetterTargetArn": other_arn, "maxReceiveCount": 2})
    with pytest.raises(ClientError) as info:
        sqs.create_queue(QueueName=unique(), Attributes={"RedrivePolicy": other})
    assert info.value.response["Error"]["Code"] == "InvalidParameterValue"


def test_a_request_posted_to_a_queue_url_of_the_account_reaches_the_queue(
    sqs: Any, server: SqsServer
) -> None:
    name = unique()
    sqs.create_queue(QueueName=name)
    form = urllib.parse.urlencode({"Action": "SendMessage", "MessageBody": "hi"}).encode()
    request = urllib.request.Request(f"{server.url}/{ACCOUNT}/{name}", data=form)
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    url = f"{server.url}/{ACCOUNT}/{name}"
    assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "hi"


@pytest.mark.parametrize("account", ["", "12345", "1234567890123", "abcdefghijkl"])
def test_an_account_of_other_than_12_digits_is_refused(account: str) -> None:
    with pytest.raises(ValueError, match="12 digits"):
        sqs_api.setup(web.Application(), account_id=account)
