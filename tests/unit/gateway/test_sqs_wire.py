"""The pure parts of the SQS API: MD5s, receipt handles, query folding, XML, SigV4.

The MD5 of message attributes is checked against moto's SQS model (an independent
implementation of the same AWS algorithm) over random attributes; signatures are made by
botocore's own SigV4 signer and checked by ours.
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import time
import xml.etree.ElementTree as ET
from typing import Any

import msgspec
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given
from hypothesis import strategies as st
from moto.sqs.models import Message as MotoMessage
from multidict import CIMultiDict

from gateway.sqs import render
from gateway.sqs.addresses import name_of_arn, name_of_url
from gateway.sqs.errors import SqsError
from gateway.sqs.md5 import md5_of_attributes, md5_of_body
from gateway.sqs.message_attrs import parse_attributes
from gateway.sqs.queue_attrs import changes_for
from gateway.sqs.receipts import Receipt, decode_receipt, encode_receipt, receipt_key
from gateway.sqs.sigv4 import verify
from gateway.sqs.wire import Params, parse_json, parse_query

NS = {"sqs": render.XML_NS}

# ---------------------------------------------------------------- MD5

names = st.from_regex(r"[A-Za-z0-9_-]([A-Za-z0-9_.-]{0,20}[A-Za-z0-9_-])?", fullmatch=True).filter(
    lambda n: ".." not in n and not n.lower().startswith(("aws.", "amazon.", "evq."))
)
texts = st.text(
    st.characters(blacklist_categories=("Cs",), min_codepoint=0x20, max_codepoint=0x2FFFF),
    min_size=1,
    max_size=30,
)
values = st.one_of(
    st.tuples(st.sampled_from(["String", "String.custom"]), texts),
    st.tuples(st.sampled_from(["Number", "Number.int"]), st.integers().map(str)),
    st.tuples(st.sampled_from(["Binary", "Binary.gz"]), st.binary(min_size=1, max_size=30)),
)


@given(st.dictionaries(names, values, min_size=1, max_size=10))
def test_attribute_md5_is_the_one_moto_computes(attributes: dict[str, Any]) -> None:
    moto = MotoMessage("id", "body")
    moto.message_attributes = {
        name: {"DataType": t, ("BinaryValue" if isinstance(v, bytes) else "StringValue"): v}
        for name, (t, v) in attributes.items()
    }
    assert md5_of_attributes(attributes) == moto.attribute_md5


def test_attribute_md5_by_hand() -> None:
    def field(b: bytes) -> bytes:
        return len(b).to_bytes(4, "big") + b

    raw = (
        field(b"a") + field(b"Binary") + b"\x02" + field(b"\x00\xff")
        + field(b"b") + field(b"Number") + b"\x01" + field(b"12")
    )  # fmt: skip
    attributes = {"b": ("Number", "12"), "a": ("Binary", b"\x00\xff")}
    assert md5_of_attributes(attributes) == hashlib.md5(raw).hexdigest()
    assert md5_of_attributes({}) is None


@given(texts)
def test_body_md5_is_the_md5_of_the_utf8_bytes(body: str) -> None:
    assert (
        md5_of_body(body)
        == hashlib.md5(body.encode()).hexdigest()
        == MotoMessage("i", body).body_md5
    )


def test_attributes_are_checked_as_sqs_checks_them() -> None:
    ok = parse_attributes({"n": {"DataType": "Number", "StringValue": "-1.5e3"}})
    assert ok == {"n": ("Number", "-1.5e3")}
    binary = parse_attributes({"b": {"DataType": "Binary", "BinaryValue": "AAE="}})
    assert binary == {"b": ("Binary", b"\x00\x01")}
    bad = [
        {"AWS.x": {"DataType": "String", "StringValue": "v"}},
        {".x": {"DataType": "String", "StringValue": "v"}},
        {"a..b": {"DataType": "String", "StringValue": "v"}},
        {"evq.other": {"DataType": "String", "StringValue": "v"}},
        {"x": {"DataType": "Text", "StringValue": "v"}},
        {"x": {"DataType": "String", "StringValue": ""}},
        {"x": {"DataType": "String"}},
        {"x": {"StringValue": "v"}},
        {"x": {"DataType": "Number", "StringValue": "twelve"}},
        {"x": {"DataType": "Binary", "BinaryValue": "not base64!"}},
        {f"k{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)},
    ]
    for attributes in bad:
        with pytest.raises(SqsError) as info:
            parse_attributes(attributes)
        assert info.value.query_code == "InvalidParameterValue", attributes
    with pytest.raises(SqsError) as info:
        parse_attributes({"x": {"DataType": "String", "StringValue": "\x00"}})
    assert info.value.query_code == "InvalidMessageContents"


# ---------------------------------------------------------------- receipt handles

queue_names = st.from_regex(r"[A-Za-z0-9_-]{1,80}(\.fifo)?", fullmatch=True)


KEY = receipt_key("a cluster secret of some length")


@given(queue_names, st.text(min_size=1, max_size=64), st.text(min_size=1, max_size=64))
def test_receipt_handles_round_trip_signed(queue: str, mid: str, lease: str) -> None:
    handle = encode_receipt(queue, mid, lease, KEY)
    receipt = decode_receipt(handle, queue, KEY)
    assert (receipt.queue, receipt.id, receipt.lease, receipt.signed) == (queue, mid, lease, True)


def test_a_handle_signed_under_another_key_reads_but_is_not_signed() -> None:
    handle = encode_receipt("q", "1", "2", receipt_key("another cluster's secret"))
    assert decode_receipt(handle, "q", KEY) == Receipt("q", "1", "2", signed=False)
    assert decode_receipt(handle, "q").signed is False  # no key: nothing is signed


def test_a_tampered_handle_is_not_signed() -> None:
    handle = encode_receipt("q", "1", "2", KEY)
    text = handle[len("evq2.") :]
    raw = msgspec.msgpack.decode(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    raw[2] = "3"  # another lease, the same MAC
    forged = "evq2." + base64.urlsafe_b64encode(msgspec.msgpack.encode(raw)).decode().rstrip("=")
    assert decode_receipt(forged, "q", KEY) == Receipt("q", "1", "3", signed=False)


def test_handles_from_before_the_mac_still_read_unsigned() -> None:
    raw = msgspec.msgpack.encode(["q", "7", "99"])
    handle = "evq1." + base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert decode_receipt(handle, "q", KEY) == Receipt("q", "7", "99", signed=False)


@given(
    st.text(max_size=300)
    | st.binary(max_size=100).map(lambda b: "evq1." + base64.b64encode(b).decode())
    | st.binary(max_size=100).map(lambda b: "evq2." + base64.b64encode(b).decode())
)
def test_garbage_receipt_handles_are_invalid_and_never_crash(handle: str) -> None:
    with pytest.raises(SqsError) as info:
        decode_receipt(handle, None, KEY)
    assert info.value.query_code == "ReceiptHandleIsInvalid"


def test_a_receipt_handle_of_another_queue_is_invalid() -> None:
    handle = encode_receipt("a", "1", "2", KEY)
    with pytest.raises(SqsError, match="is not valid for this queue"):
        decode_receipt(handle, "b", KEY)


# ---------------------------------------------------------------- requests


def test_query_forms_fold_into_the_json_shape() -> None:
    call = parse_query(
        [
            ("Action", "SendMessageBatch"),
            ("Version", "2012-11-05"),
            ("QueueUrl", "http://h/000000000000/q"),
            ("SendMessageBatchRequestEntry.2.Id", "b"),
            ("SendMessageBatchRequestEntry.2.MessageBody", "two"),
            ("SendMessageBatchRequestEntry.1.Id", "a"),
            ("SendMessageBatchRequestEntry.1.MessageBody", "one"),
            ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Name", "color"),
            ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType", "String"),
            ("SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue", "red"),
        ]
    )
    assert call.protocol == "query"
    assert call.action == "SendMessageBatch"
    assert call.params == {
        "QueueUrl": "http://h/000000000000/q",
        "Entries": [
            {
                "Id": "a",
                "MessageBody": "one",
                "MessageAttributes": {"color": {"DataType": "String", "StringValue": "red"}},
            },
            {"Id": "b", "MessageBody": "two"},
        ],
    }
    attrs = parse_query(
        [
            ("Action", "CreateQueue"),
            ("QueueName", "q"),
            ("Attribute.1.Name", "VisibilityTimeout"),
            ("Attribute.1.Value", "5"),
            ("Tag.1.Key", "team"),
            ("Tag.1.Value", "x"),
            ("AttributeName.2", "B"),
            ("AttributeName.1", "A"),
        ]
    ).params
    assert attrs == {
        "QueueName": "q",
        "Attributes": {"VisibilityTimeout": "5"},
        "Tags": {"team": "x"},
        "AttributeNames": ["A", "B"],
    }


@pytest.mark.parametrize(
    ("pairs", "code"),
    [
        ([("QueueName", "q")], "MissingAction"),
        ([("Action", "Send Message")], "InvalidAction"),
        ([("Action", "ListQueues"), ("AttributeName.x", "A")], "MalformedQueryString"),
        ([("Action", "ListQueues"), ("AttributeName.0", "A")], "MalformedQueryString"),
        ([("Action", "ListQueues"), ("A", "1"), ("A.B", "2")], "MalformedQueryString"),
        # one index written twice, "1" and "01" (found by loadtest/fuzz.py)
        (
            [
                ("Action", "SendMessage"),
                ("MessageAttribute.1.Name", "a"),
                ("MessageAttribute.01.Name", "b"),
            ],
            "MalformedQueryString",
        ),
        # a map entry's name with parts of its own (found by loadtest/fuzz.py)
        (
            [("Action", "SendMessage"), ("MessageAttribute.1.Name.1.X", "a")],
            "MalformedQueryString",
        ),
    ],
)
def test_malformed_query_forms_are_refused(pairs: list[tuple[str, str]], code: str) -> None:
    with pytest.raises(SqsError) as info:
        parse_query(pairs)
    assert info.value.query_code == code


def test_json_requests_need_an_sqs_target_and_an_object() -> None:
    assert parse_json("AmazonSQS.ListQueues", b"").params == {}
    with pytest.raises(SqsError, match="Unknown operation"):
        parse_json("AmazonS3.ListBuckets", b"{}")
    # a string that is not UTF-8: msgspec raises UnicodeDecodeError, which was a 500
    # (found by loadtest/fuzz.py, tests/data/fuzz/sqs_json/)
    for body in (b"[1]", b"{", b"\xff", b'{"QueueUrl": "\xa0x"}'):
        with pytest.raises(SqsError) as info:
            parse_json("AmazonSQS.ListQueues", body)
        assert info.value.query_code == "SerializationException"


@pytest.mark.parametrize("query", [True, False])
def test_params_read_numbers_from_strings_and_json_numbers(query: bool) -> None:
    p = Params({"A": "7" if query else 7, "B": "x", "C": True}, query=query)
    assert p.number("A", 0, 10) == 7
    assert p.number("Z", 0, 10) is None
    with pytest.raises(SqsError, match="between 0 and 5"):
        p.number("A", 0, 5)
    with pytest.raises(SqsError):
        p.number("B", 0, 5)
    with pytest.raises(SqsError):
        p.number("C", 0, 5)  # a boolean is not a number
    with pytest.raises(SqsError) as info:
        p.number("Z", 0, 5, required=True)
    assert info.value.query_code == "MissingParameter"


def test_queue_urls_and_arns_name_queues() -> None:
    account = "000000000000"
    assert name_of_url("http://any.host:1/000000000000/q-1.fifo", account) == "q-1.fifo"
    assert name_of_url("/000000000000/q", account) == "q"
    assert name_of_url("q-2", account) == "q-2"  # a bare name, as SQS accepts it
    assert name_of_url("http://h/123456789012/q", "123456789012") == "q"
    for url in [
        "http://whatever-incorrect-queue-address",  # AWS: no such queue
        "http://h/000000000000",
        "http://h/000000000000/q/more",
        "http://h/123456789012/q",  # another account
        "http://h/000000000000/bad name",
        "bad name",
        "http://h/000000000000/__evq-keys-00",  # the server's own
        "__evq-keys-00",
    ]:
        with pytest.raises(SqsError) as info:
            name_of_url(url, account)
        assert info.value.query_code == "AWS.SimpleQueueService.NonExistentQueue", url
    assert name_of_arn("arn:aws:sqs:eu-west-1:000000000000:dlq", account) == "dlq"
    for arn in ("arn:aws:sns:eu-west-1:000000000000:dlq", "arn:aws:sqs:eu-west-1:1:dlq"):
        with pytest.raises(SqsError):
            name_of_arn(arn, account)


def test_queue_attributes_map_onto_settings_with_sqs_ranges() -> None:
    changes = changes_for(
        {
            "VisibilityTimeout": "5",
            "DelaySeconds": "900",
            "MaximumMessageSize": "2048",
            "RedrivePolicy": '{"deadLetterTargetArn": "arn:aws:sqs:r:000000000000:d", '
            '"maxReceiveCount": "3"}',
            "ReceiveMessageWaitTimeSeconds": "20",
            "evq.DeduplicationWindowSeconds": "3600",
        },
        fifo=False,
        creating=True,
        account="000000000000",
    )
    assert changes.fields == {
        "visibility_timeout_ms": 5000,
        "delay_ms": 900_000,
        "max_message_bytes": 2048,
        "dead_letter_queue": "d",
        "max_receives": 3,
        "idempotency_window_ms": 3_600_000,
    }
    assert changes.meta == {"sqs.attr:ReceiveMessageWaitTimeSeconds": "20"}
    assert changes.dead_letter_queue == "d"
    for name, value, code in [
        ("DelaySeconds", "901", "InvalidAttributeValue"),
        ("MaximumMessageSize", str(2 * 1024 * 1024), "InvalidAttributeValue"),
        ("VisibilityTimeout", "-1", "InvalidAttributeValue"),
        ("RedrivePolicy", "{}", "InvalidParameterValue"),
        ("ContentBasedDeduplication", "true", "InvalidAttributeName"),  # standard queue
        ("QueueArn", "x", "InvalidAttributeName"),
        ("Colour", "x", "InvalidAttributeName"),
    ]:
        with pytest.raises(SqsError) as info:
            changes_for({name: value}, fifo=False, creating=True, account="000000000000")
        assert info.value.query_code == code, name
    big = changes_for(
        {"evq.MaximumMessageSize": str(8 * 1024 * 1024)},
        fifo=False,
        creating=True,
        account="000000000000",
    )
    assert big.fields == {"max_message_bytes": 8 * 1024 * 1024}


# ---------------------------------------------------------------- responses


def test_xml_results_flatten_lists_and_maps_as_sqs_does() -> None:
    result = {
        "Messages": [
            {
                "MessageId": "1",
                "Body": "a < b & \r\n",
                "Attributes": {"ApproximateReceiveCount": "2"},
                "MessageAttributes": {"c": {"DataType": "String", "StringValue": "red"}},
            }
        ]
    }
    root = ET.fromstring(render.xml_result("ReceiveMessage", result, "rid"))
    assert root.tag == f"{{{render.XML_NS}}}ReceiveMessageResponse"
    message = root.find("sqs:ReceiveMessageResult/sqs:Message", NS)
    assert message is not None
    assert message.findtext("sqs:Body", namespaces=NS) == "a < b & \r\n"  # CR survives
    assert message.findtext("sqs:Attribute/sqs:Name", namespaces=NS) == "ApproximateReceiveCount"
    assert message.findtext("sqs:Attribute/sqs:Value", namespaces=NS) == "2"
    assert (
        message.findtext("sqs:MessageAttribute/sqs:Value/sqs:StringValue", namespaces=NS) == "red"
    )
    assert root.findtext("sqs:ResponseMetadata/sqs:RequestId", namespaces=NS) == "rid"
    batch = ET.fromstring(
        render.xml_result("DeleteMessageBatch", {"Successful": [{"Id": "a"}], "Failed": []}, "r")
    )
    path = "sqs:DeleteMessageBatchResult/sqs:DeleteMessageBatchResultEntry/sqs:Id"
    assert batch.findtext(path, namespaces=NS) == "a"
    empty = ET.fromstring(render.xml_result("DeleteMessage", {}, "r"))
    assert [child.tag.split("}")[1] for child in empty] == ["ResponseMetadata"]


def test_actions_with_an_output_shape_send_their_result_element_even_when_empty() -> None:
    from botocore.session import get_session

    model = get_session().get_service_model("sqs")
    with_output = {op for op in model.operation_names if model.operation_model(op).output_shape}
    assert with_output == render.WITH_RESULT  # the SQS model and evq agree on which have one
    for action in model.operation_names:
        root = ET.fromstring(render.xml_result(action, {}, "r"))
        children = [child.tag.split("}")[1] for child in root]
        if action in with_output:
            assert children == [f"{action}Result", "ResponseMetadata"], action
        else:
            assert children == ["ResponseMetadata"], action


def test_errors_carry_both_codes() -> None:
    error = SqsError("QueueDoesNotExist", "gone")
    body, headers = render.json_error(error)
    assert headers == {"x-amzn-query-error": "AWS.SimpleQueueService.NonExistentQueue;Sender"}
    assert b'"__type":"com.amazonaws.sqs#QueueDoesNotExist"' in body
    root = ET.fromstring(render.xml_error(error, "rid"))
    assert (
        root.findtext("sqs:Error/sqs:Code", namespaces=NS)
        == "AWS.SimpleQueueService.NonExistentQueue"
    )
    assert root.findtext("sqs:Error/sqs:Type", namespaces=NS) == "Sender"
    assert root.findtext("sqs:RequestId", namespaces=NS) == "rid"


# ---------------------------------------------------------------- SigV4

KEYS = {"AKIDEVQ": "s3cret"}


def signed(
    body: bytes = b'{"QueueName": "q"}',
    *,
    key: str = "AKIDEVQ",
    secret: str = "s3cret",
    url: str = "http://127.0.0.1:8700/",
) -> tuple[str, CIMultiDict[str], int]:
    """A request signed by botocore now: its raw path and headers as a server receives
    them, and the time it was signed at (ms)."""
    request = AWSRequest(
        method="POST",
        url=url,
        data=body,
        headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.X"},
    )
    SigV4Auth(Credentials(key, secret), "sqs", "eu-west-1").add_auth(request)
    prepared = request.prepare()
    headers = CIMultiDict(prepared.headers.items())
    host = url.split("/")[2]
    headers["Host"] = host
    path = prepared.url.split(host, 1)[1]
    stamp = time.strptime(headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
    return path, headers, calendar.timegm(stamp) * 1000


def check(
    path: str, headers: CIMultiDict[str], now_ms: int, body: bytes = b'{"QueueName": "q"}'
) -> str:
    sig = verify(method="POST", raw_path=path, headers=headers, body=body, keys=KEYS, now_ms=now_ms)
    return sig.region


def test_a_request_botocore_signed_verifies() -> None:
    path, headers, at = signed()
    assert check(path, headers, at) == "eu-west-1"
    assert check(path, headers, at + 4 * 60 * 1000) == "eu-west-1"  # within the skew
    path, headers, at = signed(url="http://127.0.0.1:8700/000000000000/q?Action=X&b=1%202")
    assert check(path, headers, at) == "eu-west-1"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ("body", "SignatureDoesNotMatch"),
        ("secret", "SignatureDoesNotMatch"),
        ("key", "InvalidClientTokenId"),
        ("old", "SignatureDoesNotMatch"),
        ("future", "SignatureDoesNotMatch"),
        ("header", "SignatureDoesNotMatch"),
        ("unsigned", "MissingAuthenticationToken"),
        ("garbled", "IncompleteSignature"),
    ],
)
def test_bad_signatures_are_refused(change: str, code: str) -> None:
    body = b'{"QueueName": "q"}'
    kwargs: dict[str, Any] = {"secret": {"secret": "wrong"}, "key": {"key": "AKIDOTHER"}}.get(
        change, {}
    )
    path, headers, now = signed(**kwargs)
    if change == "body":
        body = b'{"QueueName": "r"}'
    elif change == "header":
        headers["X-Amz-Target"] = "AmazonSQS.DeleteQueue"
    elif change == "unsigned":
        del headers["Authorization"]
    elif change == "garbled":
        headers["Authorization"] = "AWS4-HMAC-SHA256 Credential=AKIDEVQ"
    elif change == "old":
        now += 6 * 60 * 1000  # the server's clock is six minutes on
    elif change == "future":
        now -= 6 * 60 * 1000
    with pytest.raises(SqsError) as info:
        check(path, headers, now, body)
    assert info.value.query_code == code
    assert info.value.status in (400, 403)
    if change == "old":
        assert "Signature expired" in info.value.message
