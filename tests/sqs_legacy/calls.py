"""SQS calls through boto3/botocore 1.34.50 (the query protocol), run in .venv-sqs-legacy.

    python calls.py ENDPOINT KEY SECRET REGION SCENARIO QUEUE

Prints one JSON document: the botocore version, the protocol spoken, and what each call
answered (response metadata left out). A call that raises ends the script with its
traceback on stderr and a non-zero exit: botocore's parser failing on a reply is the bug
this finds.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import boto3
import botocore


def clean(reply: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in reply.items() if k != "ResponseMetadata"}


def empties(sqs: Any, queue: str) -> dict[str, Any]:
    """Every action's empty case: AWS sends the result element even when it is empty."""
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    out: dict[str, Any] = {"url": url}
    out["receive_empty"] = clean(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10))
    out["list_queues_no_match"] = clean(sqs.list_queues(QueueNamePrefix=f"{queue}-none"))
    out["list_queue_tags_none"] = clean(sqs.list_queue_tags(QueueUrl=url))
    out["dead_letter_sources_none"] = clean(sqs.list_dead_letter_source_queues(QueueUrl=url))
    out["get_queue_attributes_none"] = clean(sqs.get_queue_attributes(QueueUrl=url))
    sent = sqs.send_message(QueueUrl=url, MessageBody="hello")
    out["send"] = sorted(clean(sent))
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    out["receive_one"] = [m["Body"] for m in got.get("Messages", [])]
    handle = got["Messages"][0]["ReceiptHandle"]
    out["delete"] = clean(sqs.delete_message(QueueUrl=url, ReceiptHandle=handle))
    out["receive_after_delete"] = clean(sqs.receive_message(QueueUrl=url))
    out["purge"] = clean(sqs.purge_queue(QueueUrl=url))
    out["delete_queue"] = clean(sqs.delete_queue(QueueUrl=url))
    return out


SCENARIOS = {"empties": empties}


def main() -> None:
    endpoint, key, secret, region, scenario, queue = sys.argv[1:7]
    sqs = boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    )
    out = {
        "botocore": botocore.__version__,
        "protocol": sqs.meta.service_model.protocol,
        **SCENARIOS[scenario](sqs, queue),
    }
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
