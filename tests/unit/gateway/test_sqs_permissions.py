"""AddPermission and RemovePermission: statements of the queue's ``Policy`` attribute, built
as AWS builds them (its recorded answers: the document, and the errors), in both protocols,
durable across a restart."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gateway.app import AppOptions
from tests.unit.gateway.sqs_support import REGION, SqsServer, client_of, running, unique

ACCOUNT = "123456789012"
LABEL = "crossaccountpermission"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqsServer]:
    options = AppOptions(sqs_account_id=ACCOUNT)
    with running(tmp_path_factory.mktemp("sqs"), options=options) as s:
        yield s


def policy_of(sqs: Any, url: str) -> dict[str, Any] | None:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])
    text = attributes.get("Attributes", {}).get("Policy")
    return None if text is None else json.loads(text)


def statement(name: str, sid: str, accounts: list[str], actions: list[str]) -> dict[str, Any]:
    principals = [f"arn:aws:iam::{a}:root" for a in accounts]
    return {
        "Sid": sid,
        "Effect": "Allow",
        "Principal": {"AWS": principals[0] if len(principals) == 1 else principals},
        "Action": actions[0] if len(actions) == 1 else actions,
        "Resource": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}",
    }


def error(call: Any, **kwargs: Any) -> tuple[int, str, str]:
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    response = info.value.response
    return (
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Code"],
        response["Error"]["Message"],
    )


def test_permissions_make_the_policy_and_leave_it_as_sqs_does(sqs: Any) -> None:
    name = unique()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.add_permission(
        QueueUrl=url,
        AWSAccountIds=["668614515564", ACCOUNT],
        Actions=["ReceiveMessage"],
        Label=LABEL,
    )
    assert policy_of(sqs, url) == {
        "Version": "2008-10-17",
        "Id": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}/SQSDefaultPolicy",
        "Statement": [statement(name, LABEL, ["668614515564", ACCOUNT], ["SQS:ReceiveMessage"])],
    }
    sqs.remove_permission(QueueUrl=url, Label=LABEL)
    assert policy_of(sqs, url) is None  # the last statement takes the policy with it
    sqs.add_permission(
        QueueUrl=url, AWSAccountIds=[ACCOUNT], Actions=["ReceiveMessage"], Label=LABEL
    )
    assert error(
        sqs.add_permission,
        QueueUrl=url,
        AWSAccountIds=["668614515564"],
        Actions=["ReceiveMessage"],
        Label=LABEL,
    ) == (
        400,
        "InvalidParameterValue",
        f"Value {LABEL} for parameter Label is invalid. Reason: Already exists.",
    )
    second = f"{LABEL}2"
    sqs.add_permission(
        QueueUrl=url, AWSAccountIds=[ACCOUNT], Actions=["SendMessage", "*"], Label=second
    )
    assert policy_of(sqs, url)["Statement"] == [  # type: ignore[index]
        statement(name, LABEL, [ACCOUNT], ["SQS:ReceiveMessage"]),
        statement(name, second, [ACCOUNT], ["SQS:SendMessage", "SQS:*"]),
    ]
    sqs.remove_permission(QueueUrl=url, Label=LABEL)
    assert policy_of(sqs, url)["Statement"] == [  # type: ignore[index]
        statement(name, second, [ACCOUNT], ["SQS:SendMessage", "SQS:*"])
    ]
    assert error(sqs.remove_permission, QueueUrl=url, Label=LABEL) == (  # a policy, not it
        400,
        "InvalidParameterValue",
        f"Value {LABEL} for parameter Label is invalid. Reason: can't find label.",
    )
    sqs.remove_permission(QueueUrl=url, Label=second)
    assert policy_of(sqs, url) is None
    assert error(sqs.remove_permission, QueueUrl=url, Label=second) == (  # no policy at all
        400,
        "InvalidParameterValue",
        f"Value {second} for parameter Label is invalid. "
        "Reason: can't find label on existing policy.",
    )


def test_add_permission_errors(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=unique())["QueueUrl"]
    grant = {"QueueUrl": url, "Label": "test-2", "AWSAccountIds": ["111111111111"]}
    assert error(sqs.add_permission, **grant, Actions=["RemovePermission"]) == (
        400,
        "InvalidParameterValue",
        "Value SQS:RemovePermission for parameter ActionName is invalid. Reason: Only the queue "
        "owner is allowed to invoke this action.",
    )
    assert error(sqs.add_permission, **grant, Actions=["Juggle"]) == (
        400,
        "InvalidParameterValue",
        "Value SQS:Juggle for parameter ActionName is invalid. Reason: Please refer to the "
        "appropriate WSDL for a list of valid actions.",
    )
    assert error(sqs.add_permission, **grant, Actions=[]) == (
        400,
        "MissingParameter",
        "The request must contain the parameter Actions.",
    )
    no_accounts = {**grant, "AWSAccountIds": []}
    assert error(sqs.add_permission, **no_accounts, Actions=["ReceiveMessage"]) == (
        400,
        "InvalidParameterValue",
        "Value [] for parameter PrincipalId is invalid. Reason: Unable to verify.",
    )
    eight = [
        "ChangeMessageVisibility",
        "DeleteMessage",
        "GetQueueAttributes",
        "GetQueueUrl",
        "ListDeadLetterSourceQueues",
        "PurgeQueue",
        "ReceiveMessage",
        "SendMessage",
    ]
    assert error(sqs.add_permission, **grant, Actions=eight) == (
        403,
        "OverLimit",
        "8 Actions were found, maximum allowed is 7.",
    )
    with pytest.raises(sqs.exceptions.OverLimit):
        sqs.add_permission(**grant, Actions=eight)
    assert policy_of(sqs, url) is None  # nothing of the refused ones went in
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.add_permission(**{**grant, "QueueUrl": f"{url}-gone"}, Actions=["SendMessage"])
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.remove_permission(QueueUrl=f"{url}-gone", Label="test-2")


def test_a_permission_joins_a_policy_set_as_an_attribute(sqs: Any) -> None:
    name = unique()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    own = {"Sid": "mine", "Effect": "Deny", "Principal": "*", "Action": "sqs:*", "Resource": "*"}
    document = {"Version": "2012-10-17", "Id": "custom", "Statement": [own]}
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(document)})
    sqs.add_permission(QueueUrl=url, AWSAccountIds=[ACCOUNT], Actions=["SendMessage"], Label="x")
    added = statement(name, "x", [ACCOUNT], ["SQS:SendMessage"])
    assert policy_of(sqs, url) == {**document, "Statement": [own, added]}
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": ""})
    assert policy_of(sqs, url) is None


def test_permissions_in_the_query_protocol(sqs: Any, server: SqsServer) -> None:
    name = unique()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    fields = [
        ("Action", "AddPermission"),
        ("QueueUrl", url),
        ("Label", "q"),
        ("AWSAccountId.1", "111111111111"),
        ("AWSAccountId.2", "222222222222"),
        ("ActionName.1", "SendMessage"),
    ]
    request = urllib.request.Request(server.url + "/", data=urllib.parse.urlencode(fields).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        assert b"<AddPermissionResponse" in response.read()
    expected = statement(name, "q", ["111111111111", "222222222222"], ["SQS:SendMessage"])
    assert policy_of(sqs, url)["Statement"] == [expected]  # type: ignore[index]


def test_permissions_survive_a_restart(tmp_path: Path) -> None:
    options = AppOptions(sqs_account_id=ACCOUNT)
    with running(tmp_path, options=options) as server, client_of(server) as sqs:
        url = sqs.create_queue(QueueName="kept")["QueueUrl"]
        sqs.add_permission(QueueUrl=url, AWSAccountIds=[ACCOUNT], Actions=["*"], Label="all")
        before = policy_of(sqs, url)
    with running(tmp_path, options=options) as server, client_of(server) as sqs:
        url = sqs.get_queue_url(QueueName="kept")["QueueUrl"]
        assert policy_of(sqs, url) == before
        sqs.remove_permission(QueueUrl=url, Label="all")
        assert policy_of(sqs, url) is None
