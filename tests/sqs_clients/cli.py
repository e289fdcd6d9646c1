"""The SQS scenarios of ``scenarios.py`` as a user types them into the AWS CLI (v1).

Each scenario takes a :class:`Cli` (one ``aws`` executable: the current one speaks the JSON
protocol, awscli 1.32.50 in ``.venv-sqs-legacy`` the query protocol), a boto3 client ``sqs``
for the set-up that is not the point (queues the CLI is not asked to make, messages it is
not asked to send, waiting for a state), and a name prefix of its own. It returns what the
user saw: the CLI's JSON output (``None`` when it printed nothing, as it does for an empty
reply), or the error it printed (``{"error": code, "message": …}``). Each command runs the
CLI's own driver in a process that stays (``cli_host.py``, started with the CLI's Python and
environment: what a command does and prints is what ``aws …`` does and prints, without a
new interpreter and its imports per command); :meth:`Cli.run` and :meth:`Cli.version` run
the ``aws`` executable itself. Every call is bounded by a timeout. A message made invisible
for 0 s (a release) stands for a visibility timeout that ran out, so that nothing here
sleeps.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.sqs_clients.scenarios import arn_of, counts

__all__ = ["SCENARIOS", "Cli", "CliError", "cli_env"]

Sqs = Any
Observations = dict[str, Any]

# "An error occurred (Code) when calling the Op operation (reached max retries: 0): message"
_ERROR = re.compile(
    r"An error occurred \((?P<code>[^)]+)\) when calling the (?P<operation>\w+) operation"
    r"(?: \(reached max retries: \d+\))?: (?P<message>.*)"
)


class CliError(Exception):
    """``aws`` exited with an error it printed: the code and message of the service."""

    def __init__(self, code: str, message: str, returncode: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.returncode = code, message, returncode


def cli_env(key: str, secret: str, region: str, home: Path) -> dict[str, str]:
    """An environment that gives the CLI these credentials and nothing of the machine's:
    no AWS variables but ours, config and credentials files that do not exist, one attempt
    per call (errors show as they are)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        HOME=str(home),
        AWS_ACCESS_KEY_ID=key,
        AWS_SECRET_ACCESS_KEY=secret,
        AWS_DEFAULT_REGION=region,
        AWS_CONFIG_FILE=str(home / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "no-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_RETRY_MODE="standard",
        AWS_MAX_ATTEMPTS="1",
        AWS_PAGER="",
    )
    return env


class Cli:
    """One ``aws`` executable pointed at an endpoint: ``cli("list-queues", …)`` runs
    ``aws … sqs list-queues …`` and answers its JSON output."""

    def __init__(
        self,
        path: Path,
        endpoint: str,
        region: str,
        env: dict[str, str],
        *,
        protocol: str,
        timeout: float = 60,
    ) -> None:
        self.path, self.endpoint, self.region, self.env = path, endpoint, region, env
        self.protocol = protocol  # what its botocore speaks to SQS: "json" or "query"
        self.timeout = timeout
        self._host: subprocess.Popen[str] | None = None

    def _args(self, args: tuple[str, ...]) -> list[str]:
        options = ["--endpoint-url", self.endpoint, "--region", self.region, "--output", "json"]
        return [*options, "sqs", *args]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``aws --endpoint-url … --region … --output json sqs ARGS`` as it ran."""
        return subprocess.run(
            [str(self.path), *self._args(args)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=self.timeout,
            check=False,
        )

    def hosted(self, *args: str) -> subprocess.CompletedProcess[str]:
        """What :meth:`run` gives, from the CLI's driver in the process that stays."""
        host = self._host
        if host is None or host.poll() is not None:
            python = self.path.parent / "python"
            script = Path(__file__).with_name("cli_host.py")
            host = self._host = subprocess.Popen(
                [str(python), str(script)],
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        assert host.stdin is not None
        assert host.stdout is not None
        host.stdin.write(json.dumps(self._args(args)) + "\n")
        host.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(host.stdout, selectors.EVENT_READ)
            if not sel.select(self.timeout):
                host.kill()
                raise subprocess.TimeoutExpired(["aws", *args], self.timeout)
        line = host.stdout.readline()
        assert line, f"the CLI host exited with {host.wait()}"
        doc = json.loads(line)
        return subprocess.CompletedProcess(["aws", *args], doc["rc"], doc["out"], doc["err"])

    def close(self) -> None:
        """Stop the process that runs the commands."""
        host, self._host = self._host, None
        if host is not None:
            try:
                host.communicate(timeout=10)  # closes its stdin: it ends; reads its stdout
            except subprocess.TimeoutExpired:
                host.kill()
                host.communicate()

    def __call__(self, *args: str) -> Any:
        """The output, decoded (None: it printed nothing).

        Raises:
            CliError: the service's error, as the CLI printed it.
            AssertionError: the CLI failed otherwise (its stderr).
        """
        done = self.hosted(*args)
        if done.returncode != 0:
            found = _ERROR.search(done.stderr)
            assert found, f"aws {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
            raise CliError(found["code"], found["message"].strip(), done.returncode)
        return json.loads(done.stdout) if done.stdout.strip() else None

    def error_of(self, *args: str) -> dict[str, Any]:
        """The error a command fails with (or what it printed)."""
        try:
            return {"answered": self(*args)}
        except CliError as exc:
            return {"error": exc.code, "message": exc.message, "exit": exc.returncode}

    def version(self) -> str:
        """``aws --version``: "aws-cli/1.x Python/… botocore/1.y"."""
        done = subprocess.run(
            [str(self.path), "--version"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=self.timeout,
            check=True,
        )
        return (done.stdout or done.stderr).strip()


def _attributes(**values: str) -> str:
    return json.dumps(values)


def _bodies(reply: Any) -> list[str]:
    return [m["Body"] for m in (reply or {}).get("Messages", [])]


def _cli_counts(aws: Cli, url: str) -> list[int]:
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attrs = aws("get-queue-attributes", "--queue-url", url, "--attribute-names", *names)
    return [int(attrs["Attributes"][n]) for n in names]


def _until(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """``check()`` until it is truthy (its last answer at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


# ------------------------------------------------------------------ scenarios


def empties(aws: Cli, sqs: Sqs, prefix: str) -> Observations:
    """Every empty answer as the CLI prints it, then one message's whole life."""
    url = aws("create-queue", "--queue-name", prefix)["QueueUrl"]
    out: Observations = {
        "receive_empty": aws(
            "receive-message", "--queue-url", url, "--max-number-of-messages", "10"
        ),
        "list_queues_no_match": aws("list-queues", "--queue-name-prefix", f"{prefix}-none"),
        "list_queue_tags_none": aws("list-queue-tags", "--queue-url", url),
        "dead_letter_sources_none": aws("list-dead-letter-source-queues", "--queue-url", url),
        "get_queue_attributes_none": aws("get-queue-attributes", "--queue-url", url),
        "move_tasks_none": aws("list-message-move-tasks", "--source-arn", arn_of(sqs, url)),
    }
    sent = aws("send-message", "--queue-url", url, "--message-body", "hello")
    out["send"] = sorted(sent)
    got = aws("receive-message", "--queue-url", url, "--wait-time-seconds", "1")
    out["receive_one"] = _bodies(got)
    out["same_id"] = got["Messages"][0]["MessageId"] == sent["MessageId"]
    handle = got["Messages"][0]["ReceiptHandle"]
    out["delete"] = aws("delete-message", "--queue-url", url, "--receipt-handle", handle)
    out["receive_after_delete"] = aws("receive-message", "--queue-url", url)
    out["delete_queue"] = aws("delete-queue", "--queue-url", url)
    return out


def purge_twice(aws: Cli, sqs: Sqs, prefix: str) -> Observations:
    url = sqs.create_queue(QueueName=prefix)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x")
    return {
        "first": aws("purge-queue", "--queue-url", url),
        "second": aws.error_of("purge-queue", "--queue-url", url),
        "counts": counts(sqs, url),
    }


def old_handles(aws: Cli, sqs: Sqs, prefix: str) -> Observations:
    """The receipt handle of an earlier receive, after the message was received again:
    it acts on a standard queue, and is refused on a FIFO queue."""
    url = sqs.create_queue(QueueName=prefix)["QueueUrl"]
    fifo = sqs.create_queue(
        QueueName=f"{prefix}.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="one")
    sqs.send_message(QueueUrl=fifo, MessageBody="f", MessageGroupId="g")
    handles: dict[str, list[str]] = {url: [], fifo: []}
    for queue in (url, fifo):  # received, released, received again
        for _ in range(2):
            [m] = aws("receive-message", "--queue-url", queue, "--visibility-timeout", "60")[
                "Messages"
            ]
            handles[queue].append(m["ReceiptHandle"])
            if len(handles[queue]) == 1:
                sqs.change_message_visibility(
                    QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
                )
    (first, _), (old, new) = handles[url], handles[fifo]
    change = ["change-message-visibility", "--visibility-timeout", "0", "--receipt-handle"]
    out: Observations = {"handles_differ": len({*handles[url], *handles[fifo]}) == 4}
    out["change_with_old_handle"] = aws(*change, first, "--queue-url", url)
    again = aws("receive-message", "--queue-url", url, "--visibility-timeout", "60")
    out["visible_again_after_old_handle"] = _bodies(again)
    out["delete_with_old_handle"] = aws(
        "delete-message", "--queue-url", url, "--receipt-handle", first
    )
    out["counts_after_delete"] = counts(sqs, url)
    out["fifo_change_with_old_handle"] = aws.error_of(*change, old, "--queue-url", fifo)
    out["fifo_delete_with_old_handle"] = aws.error_of(
        "delete-message", "--queue-url", fifo, "--receipt-handle", old
    )
    out["fifo_delete_with_new_handle"] = aws(
        "delete-message", "--queue-url", fifo, "--receipt-handle", new
    )
    out["fifo_counts"] = counts(sqs, fifo)
    return out


def dead_letter(aws: Cli, sqs: Sqs, prefix: str) -> Observations:
    """A message dead-lettered keeps its id, body, attributes and SentTimestamp."""
    dlq = sqs.create_queue(QueueName=f"{prefix}-dlq")["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn_of(sqs, dlq), "maxReceiveCount": 1})
    url = aws(
        "create-queue",
        "--queue-name",
        prefix,
        "--attributes",
        _attributes(RedrivePolicy=policy, VisibilityTimeout="30"),
    )["QueueUrl"]
    attributes = {
        "colour": {"DataType": "String", "StringValue": "blue"},
        "size": {"DataType": "Number", "StringValue": "42"},
        "blob": {"DataType": "Binary", "BinaryValue": "bin"},  # CLI v1: the bytes of the text
    }
    sent = aws(
        "send-message",
        "--queue-url",
        url,
        "--message-body",
        "to the dlq",
        "--message-attributes",
        json.dumps(attributes),
    )
    everything = ["--attribute-names", "All", "--message-attribute-names", "All"]
    [first] = aws("receive-message", "--queue-url", url, *everything)["Messages"]
    aws(  # its only receive ends: to the dead-letter queue
        "change-message-visibility",
        "--queue-url",
        url,
        "--receipt-handle",
        first["ReceiptHandle"],
        "--visibility-timeout",
        "0",
    )
    [dead] = aws("receive-message", "--queue-url", dlq, "--wait-time-seconds", "10", *everything)[
        "Messages"
    ]
    return {
        "same_id": dead["MessageId"] == sent["MessageId"] == first["MessageId"],
        "same_body": dead["Body"] == first["Body"] == "to the dlq",
        "attributes": dead.get("MessageAttributes"),
        "same_attributes": dead.get("MessageAttributes") == first.get("MessageAttributes"),
        "same_md5": dead.get("MD5OfMessageAttributes") == sent.get("MD5OfMessageAttributes"),
        "same_sent_timestamp": dead["Attributes"]["SentTimestamp"]
        == first["Attributes"]["SentTimestamp"],
        "source_arn": dead["Attributes"].get("DeadLetterQueueSourceArn") == arn_of(sqs, url),
        "receive_count": dead["Attributes"]["ApproximateReceiveCount"],
    }


def fifo_runs(aws: Cli, sqs: Sqs, prefix: str) -> Observations:
    """A FIFO receive hands out a run of one group, in order; the group stays locked."""
    url = aws(
        "create-queue",
        "--queue-name",
        f"{prefix}.fifo",
        "--attributes",
        _attributes(FifoQueue="true", ContentBasedDeduplication="true"),
    )["QueueUrl"]
    entries = [
        {"Id": body, "MessageBody": body, "MessageGroupId": group}
        for body, group in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("a3", "A"), ("b2", "B")]
    ]
    sent = aws("send-message-batch", "--queue-url", url, "--entries", json.dumps(entries))

    def receive(n: int = 10) -> list[dict[str, Any]]:
        reply = aws("receive-message", "--queue-url", url, "--max-number-of-messages", str(n))
        return list((reply or {}).get("Messages", []))

    def delete(handle: str) -> None:
        aws("delete-message", "--queue-url", url, "--receipt-handle", handle)

    first, rest, locked = receive(2), receive(), receive()
    handles = {m["Body"]: m["ReceiptHandle"] for m in first + rest}
    delete(handles["a2"])
    still_locked = receive()
    delete(handles["a1"])
    after = receive()
    return {
        "sent": sorted(e["Id"] for e in sent["Successful"]),
        "first": [m["Body"] for m in first],
        "rest": [m["Body"] for m in rest],
        "locked": [m["Body"] for m in locked],
        "still_locked": [m["Body"] for m in still_locked],
        "after": [m["Body"] for m in after],
    }


def errors(aws: Cli, sqs: Sqs, prefix: str) -> Observations:
    """Error codes as the CLI prints them; a batch's entries fail one by one."""
    url = sqs.create_queue(QueueName=prefix)["QueueUrl"]
    entries = [
        {"Id": "fine", "MessageBody": "x"},
        {"Id": "late", "MessageBody": "y", "DelaySeconds": 901},
    ]
    batch = aws("send-message-batch", "--queue-url", url, "--entries", json.dumps(entries))
    return {
        "empty_batch": aws.error_of("send-message-batch", "--queue-url", url, "--entries", "[]"),
        "empty_delete_batch": aws.error_of(
            "delete-message-batch", "--queue-url", url, "--entries", "[]"
        ),
        "batch_successful": [e["Id"] for e in batch.get("Successful", [])],
        "batch_failed": [(e["Id"], e["Code"], e["SenderFault"]) for e in batch.get("Failed", [])],
        "counts": counts(sqs, url),
        "no_queue": aws.error_of("get-queue-url", "--queue-name", f"{prefix}-missing"),
        "bad_handle": aws.error_of(
            "delete-message", "--queue-url", url, "--receipt-handle", "garbage"
        ),
    }


def move_task(aws: Cli, sqs: Sqs, prefix: str) -> Observations:
    """Dead letters redriven back where they came from; a slow task cancelled midway."""
    dlq = sqs.create_queue(QueueName=f"{prefix}-dlq")["QueueUrl"]
    dlq_arn = arn_of(sqs, dlq)
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
    url = sqs.create_queue(QueueName=prefix, Attributes={"RedrivePolicy": policy})["QueueUrl"]
    url_arn = arn_of(sqs, url)
    entries = [{"Id": f"m{i}", "MessageBody": f"m{i}"} for i in range(3)]
    sent = [
        e["MessageId"] for e in sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]
    ]
    taken = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    sqs.change_message_visibility_batch(  # their only receive ends: to the dead-letter queue
        QueueUrl=url,
        Entries=[
            {"Id": m["MessageId"], "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
            for m in taken
        ],
    )
    out: Observations = {"dead": _until(lambda: counts(sqs, dlq) == [3, 0, 0])}
    out["not_a_dlq"] = aws.error_of("start-message-move-task", "--source-arn", url_arn)
    out["bad_handle"] = aws.error_of("cancel-message-move-task", "--task-handle", "foobared")
    handle = aws("start-message-move-task", "--source-arn", dlq_arn)["TaskHandle"]
    out["handle_is_text"] = isinstance(handle, str) and len(handle) > 0

    def settled() -> dict[str, Any] | None:
        [task] = aws("list-message-move-tasks", "--source-arn", dlq_arn)["Results"]
        return None if task["Status"] in ("RUNNING", "CANCELLING") else task

    task = _until(settled)
    out["task"] = {k: task.get(k) for k in ("Status", "ApproximateNumberOfMessagesMoved")}
    out["task_keys"] = sorted(task)
    back = aws("receive-message", "--queue-url", url, "--max-number-of-messages", "10")
    out["back_ids_match"] = sorted(m["MessageId"] for m in back["Messages"]) == sorted(sent)
    out["dlq_counts"] = counts(sqs, dlq)
    # A slow task to an explicit destination, cancelled while it runs.
    entries = [{"Id": f"x{i}", "MessageBody": f"x{i}"} for i in range(5)]
    sqs.send_message_batch(QueueUrl=dlq, Entries=entries)  # straight in: no source
    start = ["start-message-move-task", "--source-arn", dlq_arn, "--destination-arn", url_arn]
    slow = aws(*start, "--max-number-of-messages-per-second", "1")["TaskHandle"]
    answer = aws("cancel-message-move-task", "--task-handle", slow)
    cancelled = _until(settled)
    moved = cancelled["ApproximateNumberOfMessagesMoved"]
    out["cancelled"] = {
        "answer_keys": sorted(answer),
        "moved_at_cancel_at_most_final": answer["ApproximateNumberOfMessagesMoved"] <= moved,
        "status": cancelled["Status"],
        "handle_listed": "TaskHandle" in cancelled,
        "again": aws.error_of("cancel-message-move-task", "--task-handle", slow).get("error"),
        "moved_plus_left": moved + counts(sqs, dlq)[0],
        "moved_arrived": counts(sqs, url)[0] == moved,
    }
    return out


def permissions(aws: Cli, sqs: Sqs, prefix: str) -> Observations:
    """AddPermission and RemovePermission in the queue's Policy; an empty Policy removes it."""
    url = sqs.create_queue(QueueName=prefix)["QueueUrl"]
    add = ["add-permission", "--queue-url", url, "--aws-account-ids", "111122223333"]
    out: Observations = {"add": aws(*add, "--label", "senders", "--actions", "SendMessage")}

    def policy() -> Any:
        reply = aws("get-queue-attributes", "--queue-url", url, "--attribute-names", "Policy")
        return (reply or {}).get("Attributes", {}).get("Policy")

    statements = json.loads(policy())["Statement"]
    out["statement_ids"] = [s["Sid"] for s in statements]
    out["actions"] = statements[0]["Action"]
    out["same_label_again"] = aws.error_of(
        *add, "--label", "senders", "--actions", "SendMessage"
    ).get("error")
    out["remove"] = aws("remove-permission", "--queue-url", url, "--label", "senders")
    out["policy_after_remove"] = policy()
    out["remove_unknown"] = aws.error_of(
        "remove-permission", "--queue-url", url, "--label", "nope"
    ).get("error")
    aws(*add, "--label", "again", "--actions", "ReceiveMessage", "SendMessage")
    out["two_actions"] = sorted(json.loads(policy())["Statement"][0]["Action"])
    out["set_empty"] = aws("set-queue-attributes", "--queue-url", url, "--attributes", "Policy=")
    out["policy_after_empty"] = policy()
    return out


def paging(aws: Cli, sqs: Sqs, prefix: str) -> Observations:
    """list-dead-letter-source-queues and list-queues page by page, as the CLI pages them:
    ``--max-results`` is one request (the server's NextToken shown), ``--page-size`` many
    (all shown), ``--max-items`` cuts the output (the CLI's own NextToken shown)."""
    dlq = sqs.create_queue(QueueName=f"{prefix}-dlq")["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn_of(sqs, dlq), "maxReceiveCount": 3})
    for i in range(3):
        sqs.create_queue(QueueName=f"{prefix}-src{i}", Attributes={"RedrivePolicy": policy})
    sources = ["list-dead-letter-source-queues", "--queue-url", dlq]
    page1 = aws(*sources, "--max-results", "2")
    page2 = aws(*sources, "--max-results", "2", "--next-token", page1["NextToken"])
    whole = aws(*sources, "--page-size", "1")
    cut = aws(*sources, "--max-items", "2")
    rest = aws(*sources, "--max-items", "2", "--starting-token", cut["NextToken"])
    listing = ["list-queues", "--queue-name-prefix", f"{prefix}-src"]
    lists = aws(*listing, "--max-results", "2")
    lists2 = aws(*listing, "--max-results", "2", "--next-token", lists["NextToken"])

    def names(reply: dict[str, Any], key: str = "queueUrls") -> list[str]:
        return [u.rsplit("/", 1)[1] for u in reply.get(key, [])]

    return {
        "sources_page1": names(page1),
        "sources_page2": names(page2),
        "sources_page2_token": "NextToken" in page2,
        "sources_page_size_1": names(whole),
        "sources_page_size_1_token": "NextToken" in whole,
        "sources_max_items": names(cut),
        "sources_starting_token": names(rest),
        "sources_starting_token_token": "NextToken" in rest,
        "list_page1": names(lists, "QueueUrls"),
        "list_page2": names(lists2, "QueueUrls"),
        "list_page2_token": "NextToken" in lists2,
    }


def counters(aws: Cli, sqs: Sqs, prefix: str) -> Observations:
    """The three approximate counts as get-queue-attributes shows them."""
    url = sqs.create_queue(QueueName=prefix)["QueueUrl"]
    out: Observations = {"empty": _cli_counts(aws, url)}
    entries = [{"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(5)]
    entries += [{"Id": f"d{i}", "MessageBody": "later", "DelaySeconds": 600} for i in range(2)]
    aws("send-message-batch", "--queue-url", url, "--entries", json.dumps(entries))
    aws("receive-message", "--queue-url", url, "--max-number-of-messages", "2")
    out["after_sends_and_receive"] = _cli_counts(aws, url)
    return out


SCENARIOS: dict[str, Callable[[Cli, Sqs, str], Observations]] = {
    f.__name__: f
    for f in (
        empties,
        old_handles,
        purge_twice,
        dead_letter,
        fifo_runs,
        errors,
        move_task,
        permissions,
        paging,
        counters,
    )
}
