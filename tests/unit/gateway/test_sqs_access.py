"""One permission model for both faces: callers of the tokens file with SQS key pairs get
their queue globs and rate limit on the SQS API, as their bearer tokens do on the native one.

Every configuration the server can be in is tried here: callers with tokens only, with keys
only, with both, and none, on loopback and off it (the server's ``sqs_open``)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from actors.errors import BadRequest
from gateway.app import AppOptions
from gateway.auth import Token, load_tokens
from tests.unit.gateway.sqs_support import SqsServer, client_of, running, unique

ADMIN = Token(
    name="ops",
    token="ops-token-0123456789",
    queues={"*": "admin"},
    sqs_access_key="AKIAOPS",
    sqs_secret_key="ops-secret-0123456789",
)
WRITER = Token(
    name="orders-worker",
    queues={"orders-*": "write", "*": "read"},
    sqs_access_key="AKIAWORKER",
    sqs_secret_key="worker-secret-0123456789",
)
READER = Token(
    name="auditor",
    queues={"orders-*": "read"},
    sqs_access_key="AKIAREADER",
    sqs_secret_key="reader-secret-0123456789",
)
SLOW = Token(
    name="slow",
    token="slow-token-0123456789",
    queues={"*": "admin"},
    rate=0.2,
    burst=3,
    sqs_access_key="AKIASLOW",
    sqs_secret_key="slow-secret-0123456789",
)
NATIVE_ONLY = Token(name="native", token="native-token-0123456789", queues={"*": "admin"})
DLQ_ADMIN = Token(
    name="dlq-admin",
    queues={"orders-*": "admin", "*": "read"},
    sqs_access_key="AKIADLQ",
    sqs_secret_key="dlq-secret-0123456789",
)
CALLERS = [ADMIN, WRITER, READER, SLOW, NATIVE_ONLY, DLQ_ADMIN]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqsServer]:
    options = AppOptions(tokens=CALLERS, sqs_open=False)
    with running(tmp_path_factory.mktemp("sqs-access"), options=options) as s:
        yield s


def sqs_as(server: SqsServer, caller: Token) -> Any:
    return client_of(
        server,
        aws_access_key_id=caller.sqs_access_key,
        aws_secret_access_key=caller.sqs_secret_key,
    )


def refused(call: Any, **kwargs: Any) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    response = info.value.response
    return (
        response["Error"]["Code"],
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Message"],
    )


def test_each_caller_reaches_what_its_globs_allow(server: SqsServer) -> None:
    orders, other = unique("orders"), unique("billing")
    with sqs_as(server, ADMIN) as admin, sqs_as(server, WRITER) as writer:
        orders_url = admin.create_queue(QueueName=orders)["QueueUrl"]
        other_url = admin.create_queue(QueueName=other)["QueueUrl"]
        writer.send_message(QueueUrl=orders_url, MessageBody="job")
        [job] = writer.receive_message(QueueUrl=orders_url)["Messages"]
        writer.delete_message(QueueUrl=orders_url, ReceiptHandle=job["ReceiptHandle"])
        code, status, message = refused(writer.send_message, QueueUrl=other_url, MessageBody="x")
        assert (code, status) == ("AccessDenied", 403)
        assert "orders-worker" in message
        assert "sqs:SendMessage" in message
        assert f":{other}" in message
        assert refused(writer.purge_queue, QueueUrl=orders_url)[:2] == ("AccessDenied", 403)
        assert refused(writer.create_queue, QueueName=unique("orders"))[0] == "AccessDenied"
        writer.get_queue_attributes(QueueUrl=other_url)  # read on everything
    with sqs_as(server, READER) as reader:
        assert reader.get_queue_url(QueueName=orders)["QueueUrl"] == orders_url
        assert refused(reader.send_message, QueueUrl=orders_url, MessageBody="x")[0] == (
            "AccessDenied"
        )
        assert refused(reader.get_queue_url, QueueName=other)[0] == "AccessDenied"
        listed = reader.list_queues().get("QueueUrls", [])
        assert orders_url in listed
        assert other_url not in listed  # it lists only what it may read


def test_a_move_task_needs_write_where_it_moves_to(server: SqsServer) -> None:
    with sqs_as(server, ADMIN) as admin:
        dlq = admin.create_queue(QueueName=unique("orders-dlq"))["QueueUrl"]
        back_to = admin.create_queue(QueueName=unique("orders-retry"))["QueueUrl"]
        arns = [
            admin.get_queue_attributes(QueueUrl=u, AttributeNames=["QueueArn"])["Attributes"][
                "QueueArn"
            ]
            for u in (dlq, back_to)
        ]
        policy = f'{{"deadLetterTargetArn":"{arns[0]}","maxReceiveCount":2}}'
        admin.create_queue(QueueName=unique("billing"), Attributes={"RedrivePolicy": policy})
    with sqs_as(server, WRITER) as writer:  # no admin on the dead-letter queue
        assert refused(writer.start_message_move_task, SourceArn=arns[0])[0] == "AccessDenied"
    with sqs_as(server, DLQ_ADMIN) as dlq_admin:
        # back to where the dead letters came from (billing-…): it may only read there
        assert refused(dlq_admin.start_message_move_task, SourceArn=arns[0])[0] == "AccessDenied"
        handle = dlq_admin.start_message_move_task(SourceArn=arns[0], DestinationArn=arns[1])
        assert handle["TaskHandle"]


def test_the_rate_limit_is_one_bucket_for_both_faces(server: SqsServer) -> None:
    with sqs_as(server, SLOW) as slow:
        slow.list_queues()
        slow.list_queues()
        request = urllib.request.Request(
            server.url + "/v1/queues", headers={"Authorization": f"Bearer {SLOW.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:  # the third of the burst
            assert resp.status == 200
        with pytest.raises(ClientError) as info:
            slow.list_queues()
        response = info.value.response
        assert response["Error"]["Code"] == "RequestThrottled"
        assert int(response["ResponseMetadata"]["HTTPHeaders"]["retry-after"]) >= 1
        with pytest.raises(urllib.error.HTTPError) as native:
            urllib.request.urlopen(request, timeout=10)
        assert native.value.code == 429
        native.value.close()


def test_keys_the_server_does_not_know_and_unsigned_requests_are_refused(
    server: SqsServer,
) -> None:
    with client_of(server) as anyone:  # signs with a key nobody configured
        assert refused(anyone.list_queues)[:2] == ("InvalidClientTokenId", 403)
    stranger = Token(
        name="x", queues={"*": "admin"}, sqs_access_key="AKIAOPS", sqs_secret_key="wrong" * 4
    )
    with sqs_as(server, stranger) as wrong:
        assert refused(wrong.list_queues)[:2] == ("SignatureDoesNotMatch", 403)


@pytest.mark.parametrize(
    ("callers", "sqs_open", "signed", "plain"),
    [
        pytest.param([], True, "ok", "ok", id="neither-loopback"),
        pytest.param([], False, "InvalidClientTokenId", "InvalidClientTokenId", id="neither-off"),
        pytest.param([NATIVE_ONLY], True, "ok", "ok", id="tokens-only-loopback"),
        pytest.param(
            [NATIVE_ONLY], False, "InvalidClientTokenId", "InvalidClientTokenId", id="tokens-off"
        ),
        pytest.param([ADMIN], True, "ok", "InvalidClientTokenId", id="keys-loopback"),
        pytest.param([ADMIN], False, "ok", "InvalidClientTokenId", id="keys-off"),
        pytest.param([ADMIN, NATIVE_ONLY], True, "ok", "InvalidClientTokenId", id="both-loopback"),
        pytest.param([ADMIN, NATIVE_ONLY], False, "ok", "InvalidClientTokenId", id="both-off"),
    ],
)
def test_who_gets_in_for_every_configuration(
    tmp_path: Path, callers: list[Token], sqs_open: bool, signed: str, plain: str
) -> None:
    """``signed``: a request signed with ADMIN's key pair; ``plain``: signed with a key the
    server never heard of (what "no credentials" means to an SDK)."""
    options = AppOptions(tokens=callers, sqs_open=sqs_open)
    with running(tmp_path, options=options) as server:
        for caller, expected in ((ADMIN, signed), (None, plain)):
            client = sqs_as(server, caller) if caller is not None else client_of(server)
            with client as sqs:
                try:
                    sqs.list_queues()
                    got = "ok"
                except ClientError as exc:
                    got = exc.response["Error"]["Code"]
            assert got == expected, (caller, got)
        if callers:  # with callers, the native API needs a bearer token, on loopback too
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(server.url + "/v1/queues", timeout=10)
            assert info.value.code == 401
            info.value.close()


def test_tokens_documents_with_sqs_keys_are_checked() -> None:
    doc = """
        [[token]]
        name = "both"
        token = "bearer-0123456789abcdef"
        sqs_access_key = "AKIABOTH"
        sqs_secret_key = "secret-0123456789abcdef"
        [token.queues]
        "*" = "write"
        [[token]]
        name = "keys-only"
        sqs_access_key = "AKIAKEYS"
        sqs_secret_key = "secret-0123456789abcdef"
    """
    both, keys_only = load_tokens(doc, toml=True)
    assert (both.sqs_access_key, keys_only.token) == ("AKIABOTH", None)
    bad = [
        '[[token]]\nname = "nothing"\n',
        '[[token]]\nname = "half"\nsqs_access_key = "AKIAHALF"\n',
        '[[token]]\nname = "short"\nsqs_access_key = "AKIAS"\nsqs_secret_key = "short"\n',
        '[[token]]\nname = "odd"\nsqs_access_key = "AKIA/x"\nsqs_secret_key = "' + "s" * 20 + '"\n',
        doc.replace("AKIAKEYS", "AKIABOTH"),  # one key pair, two callers
    ]
    for text in bad:
        with pytest.raises(BadRequest):
            load_tokens(text, toml=True)
