"""The ``evq`` command line as a user runs it: a subprocess talking to a real server."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import pytest

from evq.client import Client
from tests.integration.conftest import Names
from tests.integration.server import EVQ, ROOT, Server, eventually, free_port, server_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Result:
    """One finished ``evq`` run."""

    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        self.code = done.returncode
        self.out = done.stdout
        self.err = done.stderr

    def docs(self) -> list[Any]:
        """stdout as JSON lines."""
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    def __repr__(self) -> str:
        return f"Result(code={self.code}, out={self.out!r}, err={self.err!r})"


def evq(
    url: str | None, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> Result:
    """Run ``evq [--server url] args…``."""
    command = [*EVQ, *(["--server", url] if url else []), *args]
    done = subprocess.run(
        command,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env or server_env(),
        timeout=60,
    )
    return Result(done)


def test_create_put_take_ack_release(server: Server, names: Names) -> None:
    url, name = server.url, names()
    r = evq(url, "create", name, "--visibility-timeout", "60", "--max-receives", "5")
    assert (r.code, r.out.strip()) == (0, f"created queue {name}"), r
    r = evq(url, "create", name, "--visibility-timeout", "60")
    assert (r.code, r.out.strip()) == (0, f"queue {name} exists with these settings"), r
    r = evq(url, "--json", "create", name)
    assert (r.code, r.docs()[0]["created"]) == (0, False), r
    assert r.docs()[0]["settings"]["max_receives"] == 5

    r = evq(url, "put", name, "first", "second")
    assert r.code == 0, r
    put_lines = [line.split() for line in r.out.splitlines()]
    assert [status for _id, status in put_lines] == ["created", "created"]
    r = evq(url, "--json", "put", name, "--delay", "0", "third")
    assert r.code == 0, r
    [third] = r.docs()[0]["results"]
    assert third["status"] == "created"

    # take for people: a table of id, lease, receives and body
    r = evq(url, "take", name, "-n", "2")
    assert r.code == 0, r
    header, *rows = r.out.splitlines()
    assert header.split() == ["ID", "LEASE", "RECEIVES", "BODY"]
    cells = [row.split() for row in rows]
    assert [(c[0], c[2], c[3]) for c in cells] == [
        (put_lines[0][0], "1", "first"),
        (put_lines[1][0], "1", "second"),
    ]
    first_id, first_lease = cells[0][:2]

    # take for programs: JSON lines
    r = evq(url, "--json", "take", name, "-n", "5", "--visibility-timeout", "30")
    assert r.code == 0, r
    [doc] = r.docs()
    assert (doc["id"], doc["body"], doc["receive_count"]) == (third["id"], "third", 1)
    r = evq(url, "--json", "take", name, "--wait", "0.2")
    assert (r.code, r.out, r.err.strip()) == (0, "", ""), r
    r = evq(url, "take", name)
    assert (r.code, r.out, r.err.strip()) == (0, "", "no messages"), r

    r = evq(url, "ack", name, first_id, first_lease)
    assert (r.code, r.out.split()) == (0, [first_id, "ok"]), r
    r = evq(url, "ack", name, first_id, first_lease)
    assert r.code == 1, r
    assert "MessageNotFound" in r.err

    r = evq(url, "release", name, doc["id"], doc["lease"], "--delay", "30")
    assert (r.code, r.out.split()) == (0, [doc["id"], "ok"]), r
    r = evq(url, "--json", "release", name, doc["id"], doc["lease"])
    assert r.code == 1, r
    assert r.docs()[0]["results"][0]["status"] == "stale_lease"
    assert "StaleLease" in r.err

    with Client(url, retries=0) as c:
        stats = c.get_queue(name).stats
        assert stats is not None
        assert (stats.reserved, stats.delayed, stats.acked) == (1, 1, 1)
        assert c.get_message(name, doc["id"]).state == "delayed"


def test_peek_touch_and_release_on_a_real_server(server: Server, names: Names) -> None:
    url, name = server.url, names()
    assert evq(url, "create", name).code == 0
    r = evq(url, "--json", "put", name, "a", "b", "c")
    ids = [x["id"] for x in r.docs()[0]["results"]]

    r = evq(url, "peek", name, "-n", "2")
    assert r.code == 0, r
    assert [line.split()[0] for line in r.out.splitlines()[1:]] == ids[:2]
    after = r.err.split("--after ")[1].strip()
    r = evq(url, "--json", "peek", name, "--after", after)
    assert [m["id"] for m in r.docs()[0]["messages"]] == ids[2:]

    r = evq(url, "--json", "take", name, "--visibility-timeout", "5")
    [taken] = r.docs()
    r = evq(url, "touch", name, taken["id"], taken["lease"], "--visibility-timeout", "300")
    assert (r.code, r.out.split()[:2]) == (0, [taken["id"], "ok"]), r
    r = evq(url, "--json", "peek", name, "--state", "reserved")
    [shown] = r.docs()[0]["messages"]
    assert shown["lease_expires_at"] > taken["lease_expires_at"] + 290

    r = evq(url, "release", name, taken["id"], taken["lease"], "--delay", "60")
    assert r.code == 0, r
    r = evq(url, "--json", "peek", name, "--state", "delayed", "--all")
    assert [d["id"] for d in r.docs()] == [taken["id"]]
    r = evq(url, "--json", "peek", name, "--all")
    assert [d["id"] for d in r.docs()] == ids[1:]


def test_put_from_stdin(server: Server, names: Names) -> None:
    name = names()
    assert evq(server.url, "create", name).code == 0
    r = evq(server.url, "--json", "put", name, stdin="one\ntwo\n\nthree é\r\n")
    assert r.code == 0, r
    results = r.docs()[0]["results"]
    assert [x["status"] for x in results] == ["created"] * 3  # the empty line is skipped
    with Client(server.url, retries=0) as c:
        taken = c.take(name, 10)
    assert [m.body for m in taken] == [b"one", b"two", "three é".encode()]
    assert [m.id for m in taken] == [x["id"] for x in results]

    # Many lines go in batches of at most 1000 messages.
    lines = "".join(f"line {i}\n" for i in range(2500))
    r = evq(server.url, "--json", "put", name, stdin=lines)
    assert r.code == 0, r
    assert len(r.docs()[0]["results"]) == 2500
    r = evq(server.url, "put", name)  # nothing on stdin
    assert (r.code, r.out) == (0, ""), r
    assert "no message given" in r.err


def test_stats_queues_purge_delete(server: Server, names: Names) -> None:
    url, name, other = server.url, names(), names("other")
    assert evq(url, "create", name, "--retention", "7200").code == 0
    assert evq(url, "create", other, "--fifo").code == 1  # not named .fifo: BadRequest
    fifo = names(fifo=True)
    assert evq(url, "create", fifo, "--fifo").code == 0
    assert evq(url, "put", name, "a", "b", "c").code == 0

    r = evq(url, "stats", name)
    assert r.code == 0, r
    lines = r.out.splitlines()
    assert lines[0] == f"queue {name}"
    fields = dict(line.split(None, 1) for line in lines[1:] if line.startswith("  "))
    assert fields["ready"].strip() == "3"
    assert fields["retention"].strip() == "7200"
    r = evq(url, "--json", "stats", name)
    assert r.code == 0, r
    doc = r.docs()[0]
    assert (doc["name"], doc["stats"]["ready"], doc["settings"]["retention"]) == (name, 3, 7200)

    r = evq(url, "queues")
    assert (r.code, {name, fifo} <= set(r.out.split())) == (0, True), r
    r = evq(url, "--json", "queues")
    assert {name, fifo} <= set(r.docs()[0]["queues"]), r

    r = evq(url, "purge", name)
    assert (r.code, r.out.strip()) == (0, f"purged 3 messages from {name}"), r
    r = evq(url, "--json", "purge", name)
    assert (r.code, r.docs()) == (0, [{"purged": 0}]), r

    r = evq(url, "delete-queue", name)
    assert (r.code, r.out.strip()) == (0, f"deleted queue {name}"), r
    r = evq(url, "queues")
    assert name not in r.out.split()


def test_the_idempotency_window_is_set_at_creation_and_changed_live(
    server: Server, names: Names
) -> None:
    url, name = server.url, names()
    assert evq(url, "create", name, "--idempotency-window", "60").code == 0
    with Client(url) as c:
        assert c.get_queue(name).settings.idempotency_window == 60
    first = evq(url, "put", name, "once", "--key", "k-1")
    again = evq(url, "put", name, "once", "--key", "k-1")
    assert (first.out.split()[1], again.out.split()[1]) == ("created", "duplicate"), again
    assert first.out.split()[0] == again.out.split()[0]  # the first put's id

    r = evq(url, "configure", name, "--idempotency-window", "1")
    assert (r.code, r.out.strip()) == (0, f"{name}: idempotency_window 1.0"), r
    # a key is remembered for the queue's window, now 1 s: then the same key is a new put
    r = evq(url, "put", name, "twice", "--key", "k-2")
    assert (r.code, r.out.split()[1]) == (0, "created"), r
    time.sleep(1.2)
    eventually(
        lambda: evq(url, "put", name, "twice", "--key", "k-2").out.split()[1] == "created",
        timeout=30,
    )
    with Client(url) as c:
        assert c.get_queue(name).stats.ready == 3  # once, twice, and twice again
    r = evq(url, "configure", name, "--idempotency-window", "-1")
    assert r.code == 2, r
    assert "seconds must be >= 0" in r.err, r


def test_api_errors_exit_1_with_the_code_on_stderr(server: Server, names: Names) -> None:
    url, name, missing = server.url, names(), names("missing")
    cases = [
        (("stats", missing), "QueueNotFound", 404),
        (("put", missing, "x"), "QueueNotFound", 404),
        (("take", missing), "QueueNotFound", 404),
        (("purge", missing), "QueueNotFound", 404),
        (("delete-queue", missing), "QueueNotFound", 404),
        (("create", "bad name!"), "BadRequest", 400),
        (("create", name, "--visibility-timeout", "99"), "QueueExists", 409),
    ]
    assert evq(url, "create", name).code == 0
    for args, code, status in cases:
        r = evq(url, *args)
        assert r.code == 1, (args, r)
        assert r.out == "", (args, r)
        assert f"{code}: " in r.err, (args, r)
        assert f"(HTTP {status})" in r.err, (args, r)
        assert r.err.startswith(f"evq {args[0]}: "), (args, r)
    r = evq(url, "ack", name, "12345", "lease")
    assert (r.code, "MessageNotFound" in r.err) == (1, True), r


def test_usage_errors_exit_2_and_no_server_exits_1(server: Server, names: Names) -> None:
    r = evq(server.url, "take", names(), "-n", "0")
    assert (r.code, "must be >= 1" in r.err) == (2, True), r
    r = evq(server.url, "frobnicate")
    assert r.code == 2, r
    r = evq(server.url, "create", names(), "--dead-letter-queue", "x")
    assert (r.code, "--max-receives" in r.err) == (2, True), r
    r = evq(f"http://127.0.0.1:{free_port()}", "queues")  # nobody listens there
    assert (r.code, "Unavailable" in r.err) == (1, True), r


def test_server_from_environment(server: Server, names: Names) -> None:
    name = names()
    env = {**server_env(), "EVQ_SERVER": server.url}
    env.pop("EVQ_TOKEN", None)
    assert os.environ.get("EVQ_SERVER") != server.url
    r = evq(None, "create", name, env=env)
    assert (r.code, r.out.strip()) == (0, f"created queue {name}"), r


def test_set_get_and_watch_keys(server: Server) -> None:
    url = server.url
    r = evq(url, "--json", "set", "app:cli-watch", '{"n": 1}')
    assert (r.code, r.docs()[0]["version"]) == (0, 1), r
    r = evq(url, "--json", "get", "app:cli-watch")
    assert r.docs() == [{"key": "app:cli-watch", "version": 1, "value": {"n": 1}}], r
    # `evq watch` prints the state, then each change (resubscribing one-shot watches).
    watcher = subprocess.Popen(
        [*EVQ, "--server", url, "--json", "watch", "app:cli-watch", "--timeout", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=server_env(),
    )
    try:
        assert watcher.stdout is not None
        first = json.loads(watcher.stdout.readline())
        assert (first["version"], first["value"]) == (1, {"n": 1})
        assert evq(url, "set", "app:cli-watch", "[2]").code == 0
        second = json.loads(watcher.stdout.readline())
        assert (second["version"], second["value"]) == (2, [2])
        r = evq(url, "--json", "watch", "queue:no-such-queue", "--once")
        assert r.code == 0, r
        assert r.docs()[0]["value"] is None
    finally:
        watcher.terminate()
        watcher.communicate(timeout=10)
