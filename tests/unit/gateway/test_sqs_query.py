"""The query protocol on the wire: raw form POSTs (as the AWS CLI v1 and older SDKs send
them) against the real gateway, the XML replies parsed with xml.etree."""

from __future__ import annotations

import base64
import hashlib
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from typing import Any

from tests.unit.gateway.sqs_support import ACCOUNT, SqsServer, expected_md5, unique

NS = {"q": "http://queue.amazonaws.com/doc/2012-11-05/"}


def post(
    server: SqsServer, fields: list[tuple[str, str]], path: str = "/"
) -> tuple[int, ET.Element]:
    """A form POST; the status and the parsed XML reply."""
    data = urllib.parse.urlencode(fields).encode()
    request = urllib.request.Request(
        server.url + path,
        data=data,
        headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            status, body, kind = resp.status, resp.read(), resp.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        with exc:
            status, body, kind = exc.code, exc.read(), exc.headers["Content-Type"]
    assert kind.startswith("text/xml")
    return status, ET.fromstring(body)


def ok(server: SqsServer, action: str, *fields: tuple[str, str], path: str = "/") -> ET.Element:
    """A successful action: its <{Action}Result> (or the response, for empty results)."""
    status, root = post(server, [("Action", action), ("Version", "2012-11-05"), *fields], path)
    assert status == 200, ET.tostring(root)
    assert root.tag == f"{{{NS['q']}}}{action}Response"
    assert root.findtext("q:ResponseMetadata/q:RequestId", namespaces=NS)
    result = root.find(f"q:{action}Result", NS)
    return root if result is None else result


def text(element: ET.Element, path: str) -> str:
    value = element.findtext(path, namespaces=NS)
    assert value is not None, (path, ET.tostring(element))
    return value


def pairs(
    element: ET.Element, item: str, key: str = "Name", value: str = "Value"
) -> dict[str, Any]:
    return {
        text(e, f"q:{key}"): e.find(f"q:{value}", NS)
        if e.find(f"q:{value}/q:DataType", NS) is not None
        else text(e, f"q:{value}")
        for e in element.findall(f"q:{item}", NS)
    }


def test_the_aws_cli_v1_flow(server: SqsServer) -> None:
    name = unique("cli")
    created = ok(
        server,
        "CreateQueue",
        ("QueueName", name),
        ("Attribute.1.Name", "VisibilityTimeout"),
        ("Attribute.1.Value", "40"),
    )
    url = text(created, "q:QueueUrl")
    assert url == f"{server.url}/{ACCOUNT}/{name}"
    assert text(ok(server, "GetQueueUrl", ("QueueName", name)), "q:QueueUrl") == url
    listed = ok(server, "ListQueues", ("QueueNamePrefix", name))
    assert [e.text for e in listed.findall("q:QueueUrl", NS)] == [url]
    body = "line one\r\nline <two> & 'three'"
    sent = ok(
        server,
        "SendMessage",
        ("QueueUrl", url),
        ("MessageBody", body),
        ("MessageAttribute.1.Name", "color"),
        ("MessageAttribute.1.Value.DataType", "String"),
        ("MessageAttribute.1.Value.StringValue", "red"),
        ("MessageAttribute.2.Name", "raw"),
        ("MessageAttribute.2.Value.DataType", "Binary"),
        ("MessageAttribute.2.Value.BinaryValue", base64.b64encode(b"\x00\x01").decode()),
    )
    attributes = {
        "color": {"DataType": "String", "StringValue": "red"},
        "raw": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
    }
    assert text(sent, "q:MD5OfMessageBody") == hashlib.md5(body.encode()).hexdigest()
    assert text(sent, "q:MD5OfMessageAttributes") == expected_md5(attributes)
    message_id = text(sent, "q:MessageId")
    received = ok(
        server,
        "ReceiveMessage",
        ("QueueUrl", url),
        ("AttributeName.1", "All"),
        ("MessageAttributeName.1", "All"),
        ("MaxNumberOfMessages", "10"),
        ("WaitTimeSeconds", "1"),
    )
    [message] = received.findall("q:Message", NS)
    assert text(message, "q:MessageId") == message_id
    assert text(message, "q:Body") == body  # CR and markup survive the XML
    assert text(message, "q:MD5OfBody") == hashlib.md5(body.encode()).hexdigest()
    system = pairs(message, "Attribute")
    assert system["ApproximateReceiveCount"] == "1"
    assert int(system["SentTimestamp"]) > 1_600_000_000_000
    values = pairs(message, "MessageAttribute")
    assert text(values["color"], "q:StringValue") == "red"
    assert text(values["raw"], "q:BinaryValue") == base64.b64encode(b"\x00\x01").decode()
    assert text(message, "q:MD5OfMessageAttributes") == expected_md5(attributes)
    handle = text(message, "q:ReceiptHandle")
    deleted = ok(server, "DeleteMessage", ("QueueUrl", url), ("ReceiptHandle", handle))
    assert deleted.find("q:DeleteMessageResult", NS) is None  # SQS sends no result element
    attrs = pairs(
        ok(server, "GetQueueAttributes", ("QueueUrl", url), ("AttributeName.1", "All")),
        "Attribute",
    )
    assert attrs["VisibilityTimeout"] == "40"
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert attrs["QueueArn"].endswith(f":{ACCOUNT}:{name}")


def test_batches_and_visibility_in_xml(server: SqsServer) -> None:
    url = text(ok(server, "CreateQueue", ("QueueName", unique())), "q:QueueUrl")
    sent = ok(
        server,
        "SendMessageBatch",
        ("QueueUrl", url),
        ("SendMessageBatchRequestEntry.1.Id", "a"),
        ("SendMessageBatchRequestEntry.1.MessageBody", "first"),
        ("SendMessageBatchRequestEntry.2.Id", "b"),
        ("SendMessageBatchRequestEntry.2.MessageBody", "second"),
        ("SendMessageBatchRequestEntry.3.Id", "c"),
        ("SendMessageBatchRequestEntry.3.MessageBody", "third"),
        ("SendMessageBatchRequestEntry.3.DelaySeconds", "5000"),
    )
    assert [text(e, "q:Id") for e in sent.findall("q:SendMessageBatchResultEntry", NS)] == [
        "a",
        "b",
    ]
    [failure] = sent.findall("q:BatchResultErrorEntry", NS)
    assert (text(failure, "q:Id"), text(failure, "q:SenderFault")) == ("c", "true")
    assert text(failure, "q:Code") == "InvalidParameterValue"
    received = ok(server, "ReceiveMessage", ("QueueUrl", url), ("MaxNumberOfMessages", "10"))
    handles = [text(m, "q:ReceiptHandle") for m in received.findall("q:Message", NS)]
    assert len(handles) == 2
    changed = ok(
        server,
        "ChangeMessageVisibilityBatch",
        ("QueueUrl", url),
        ("ChangeMessageVisibilityBatchRequestEntry.1.Id", "x"),
        ("ChangeMessageVisibilityBatchRequestEntry.1.ReceiptHandle", handles[0]),
        ("ChangeMessageVisibilityBatchRequestEntry.1.VisibilityTimeout", "60"),
    )
    [entry] = changed.findall("q:ChangeMessageVisibilityBatchResultEntry", NS)
    assert text(entry, "q:Id") == "x"
    ok(
        server,
        "ChangeMessageVisibility",
        ("QueueUrl", url),
        ("ReceiptHandle", handles[1]),
        ("VisibilityTimeout", "0"),
    )
    deleted = ok(
        server,
        "DeleteMessageBatch",
        ("QueueUrl", url),
        ("DeleteMessageBatchRequestEntry.1.Id", "one"),
        ("DeleteMessageBatchRequestEntry.1.ReceiptHandle", handles[0]),
        ("DeleteMessageBatchRequestEntry.2.Id", "two"),
        ("DeleteMessageBatchRequestEntry.2.ReceiptHandle", handles[1]),  # released: still good
        ("DeleteMessageBatchRequestEntry.3.Id", "three"),
        ("DeleteMessageBatchRequestEntry.3.ReceiptHandle", "evq2.AAAA"),
    )
    assert [text(e, "q:Id") for e in deleted.findall("q:DeleteMessageBatchResultEntry", NS)] == [
        "one",
        "two",
    ]
    [bad] = deleted.findall("q:BatchResultErrorEntry", NS)
    assert (text(bad, "q:Id"), text(bad, "q:Code")) == ("three", "ReceiptHandleIsInvalid")


def test_requests_posted_to_the_queue_url_need_no_queue_url(server: SqsServer) -> None:
    name = unique()
    url = text(ok(server, "CreateQueue", ("QueueName", name)), "q:QueueUrl")
    path = f"/{ACCOUNT}/{name}"
    ok(server, "SendMessage", ("MessageBody", "via path"), path=path)
    received = ok(server, "ReceiveMessage", path=path)
    assert text(received, "q:Message/q:Body") == "via path"
    ok(
        server,
        "SetQueueAttributes",
        ("Attribute.1.Name", "DelaySeconds"),
        ("Attribute.1.Value", "3"),
        path=path,
    )
    ok(server, "TagQueue", ("Tag.1.Key", "team"), ("Tag.1.Value", "q"), path=path)
    tags = ok(server, "ListQueueTags", ("QueueUrl", url))
    assert pairs(tags, "Tag", key="Key") == {"team": "q"}
    got = ok(server, "GetQueueAttributes", ("AttributeName.1", "DelaySeconds"), path=path)
    assert pairs(got, "Attribute") == {"DelaySeconds": "3"}
    ok(server, "DeleteQueue", path=path)
    status, root = post(server, [("Action", "GetQueueUrl"), ("QueueName", name)])
    assert status == 400
    assert text(root, "q:Error/q:Code") == "AWS.SimpleQueueService.NonExistentQueue"
