"""The `evq` command line (evq/cli/main.py): parsing, output and exit codes, on a fake client."""

from __future__ import annotations

import io
import json
import sys
import types
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from actors.errors import QueueNotFound
from evq.cli import main as cli
from evq.client_wire import (
    ItemResult,
    KeyValue,
    Message,
    PutResult,
    QueueConfig,
    QueueInfo,
    QueueStats,
    TransportError,
)


class FakeClient:
    """Records calls; answers from canned values (or raises ``fail``)."""

    def __init__(self, **answers: Any) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.answers = answers
        self.fail: Exception | None = None
        self.closed = False

    def _record(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((name, args, kwargs))
        if self.fail is not None:
            raise self.fail
        return self.answers.get(name)

    def create_queue(self, name: str, **kw: Any) -> Any:
        return self._record("create_queue", name, **kw)

    def update_queue(self, name: str, **kw: Any) -> Any:
        return self._record("update_queue", name, **kw)

    def put(self, queue: str, messages: Any, **kw: Any) -> Any:
        self._record("put", queue, list(messages), **kw)
        return [PutResult(str(i), "created") for i, _ in enumerate(messages, 1)]

    def take(self, queue: str, max: int = 1, **kw: Any) -> Any:
        return self._record("take", queue, max, **kw)

    def ack(self, queue: str, *items: Any) -> Any:
        return self._record("ack", queue, *items)

    def release(self, queue: str, *items: Any, **kw: Any) -> Any:
        return self._record("release", queue, *items, **kw)

    def get_queue(self, name: str) -> Any:
        return self._record("get_queue", name)

    def list_queues(self) -> Any:
        return self._record("list_queues")

    def set_key(self, key: str, value: Any) -> Any:
        return self._record("set_key", key, value)

    def get_key(self, key: str) -> Any:
        return self._record("get_key", key)

    def watch_loop(self, key: str, **kw: Any) -> Iterator[KeyValue]:
        self._record("watch_loop", key, **kw)
        yield from self.answers["watch_loop"]

    def delete_queue(self, name: str) -> Any:
        return self._record("delete_queue", name)

    def purge(self, name: str) -> Any:
        return self._record("purge", name)

    def resize_shards(self, count: int) -> Any:
        return self._record("resize_shards", count)

    def restart_shards(self) -> Any:
        return self._record("restart_shards")

    def task(self, task_id: str) -> Any:
        self._record("task", task_id)
        return self.answers["task"].pop(0)

    def tasks(self) -> Any:
        return self._record("tasks")

    def cancel_task(self, task_id: str) -> Any:
        return self._record("cancel_task", task_id)

    def close(self) -> None:
        self.closed = True


def run(
    argv: list[str], client: FakeClient | None = None, stdin: Any = None
) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv, client=client, stdin=stdin, stdout=out, stderr=err)  # type: ignore[arg-type]
    return code, out.getvalue(), err.getvalue()


INFO = QueueInfo(
    name="jobs",
    settings=QueueConfig(visibility_timeout=30.0, max_receives=5, dead_letter_queue="dlq"),
    stats=QueueStats(ready=3, delayed=1, reserved=2, total=6, oldest_ready_age=1.5),
)
MESSAGES = [
    Message(id="101", body=b"hello", lease="L1", receive_count=1),
    Message(id="102", body=b"\xff\x00", lease="L2", receive_count=3),
]

# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["queues"], {"command": "queues", "json": False, "server": None}),
        (["--json", "--server", "http://h:1", "queues"], {"json": True, "server": "http://h:1"}),
        (["take", "q"], {"queue": "q", "n": 1, "wait": None, "visibility_timeout": None}),
        (["take", "q", "-n", "10", "--wait", "2.5"], {"n": 10, "wait": 2.5}),
        (["put", "q", "a", "b"], {"queue": "q", "bodies": ["a", "b"], "delay": None}),
        (["put", "q", "a", "--delay", "5", "b"], {"bodies": ["a", "b"], "delay": 5.0}),
        (["put", "q", "--at", "1700000000", "--", "-x"], {"bodies": ["-x"], "at": 1.7e9}),
        (["put", "q", "--id", "i", "--key", "k", "--group", "g"], {"id": "i", "key": "k"}),
        (["release", "q", "5", "L", "--delay", "60"], {"id": "5", "lease": "L", "delay": 60.0}),
        (["set", "k", '{"a": [1]}'], {"key": "k", "value": {"a": [1]}}),
        (["set", "k", "3"], {"value": 3}),
        (["watch", "k", "--once"], {"once": True, "version": 0, "timeout": 30.0}),
        (["create", "q", "--max-receives", "3", "--dead-letter-queue", "d"], {"max_receives": 3}),
        (["create", "q.fifo", "--fifo", "--client-ids"], {"fifo": True, "client_ids": True}),
        (["serve", "--data", "/tmp/d", "--port", "9000"], {"data": "/tmp/d", "port": 9000}),
    ],
)
def test_arguments_parse(argv: list[str], expected: dict[str, Any]) -> None:
    args = cli.parse_args(cli.build_parser(), argv)
    assert {k: getattr(args, k) for k in expected} == expected


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["take"],
        ["take", "q", "-n", "0"],
        ["take", "q", "--wait", "-1"],
        ["take", "q", "extra"],
        ["put", "q", "--delay", "1", "--at", "2"],
        ["put", "q", "--at", "yesterday"],
        ["put", "q", "a", "--bogus"],
        ["set", "k", "not json"],
        ["create", "q", "--dead-letter-queue", "d"],
        ["serve", "--port", "http"],
        ["shards", "resize"],
        ["shards", "resize", "0"],
        ["shards", "grow", "3"],
        ["shards", "restart", "2"],
        ["tasks", "--cancel"],
    ],
)
def test_usage_errors_exit_2_without_calling_the_server(argv: list[str]) -> None:
    client = FakeClient()
    code, _, err = run(argv, client)
    assert code == 2
    assert "usage" in err or "error" in err
    assert client.calls == []


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "take" in capsys.readouterr().out


def test_times_are_iso_8601_or_unix_seconds() -> None:
    assert cli.parse_time("1700000000.5") == 1700000000.5
    assert cli.parse_time("2023-11-14T22:13:20Z") == 1700000000.0
    assert cli.parse_time("2023-11-14T23:13:20+01:00") == 1700000000.0
    naive = datetime(2023, 11, 14, 22, 13, 20).timestamp()  # local time
    assert cli.parse_time("2023-11-14T22:13:20") == naive
    assert datetime.fromtimestamp(cli.parse_time("2024-01-01T00:00:00Z"), UTC).year == 2024


# ------------------------------------------------------------------ commands and output


def test_create_passes_the_settings() -> None:
    client = FakeClient(create_queue=QueueInfo(name="q", created=True))
    argv = ["create", "q", "--client-ids", "--visibility-timeout", "10", "--retention", "60"]
    argv += ["--max-receives", "3", "--dead-letter-queue", "d", "--delay", "2"]
    code, out, _ = run([*argv, "--idempotency-window", "30"], client)
    assert code == 0
    assert out == "created queue q\n"
    assert client.calls == [
        (
            "create_queue",
            ("q",),
            {
                "id_mode": "client",
                "visibility_timeout": 10.0,
                "max_receives": 3,
                "dead_letter_queue": "d",
                "retention": 60.0,
                "max_message_bytes": None,
                "fifo": None,
                "delay": 2.0,
                "idempotency_window": 30.0,
                "fair": None,
                "take_rate": None,
                "put_rate": None,
                "max_in_flight": None,
            },
        )
    ]


def test_create_makes_a_fair_queue_with_fair_and_limits() -> None:
    client = FakeClient(create_queue=QueueInfo(name="q", created=True))
    argv = ["create", "q", "--fair", "--take-rate", "50", "--max-in-flight", "7"]
    assert run(argv, client)[0] == 0
    kw = client.calls[0][2]
    assert (kw["fair"], kw["take_rate"], kw["put_rate"], kw["max_in_flight"]) == (True, 50, None, 7)


def test_configure_changes_only_the_settings_named_and_lifts_with_none() -> None:
    after = QueueInfo(name="q", settings=QueueConfig(take_rate=None, put_rate=20, fair=False))
    client = FakeClient(update_queue=after)
    argv = ["configure", "q", "--take-rate", "none", "--put-rate", "20", "--no-fair"]
    code, out, _ = run(argv, client)
    assert code == 0
    assert client.calls == [
        ("update_queue", ("q",), {"take_rate": None, "put_rate": 20, "fair": False})
    ]
    assert out == "q: take_rate None, put_rate 20, fair False\n"
    argv = ["--json", "configure", "q", "--fair", "--visibility-timeout", "5"]
    code, out, _ = run([*argv, "--idempotency-window", "60"], client)
    assert code == 0
    assert client.calls[-1][2] == {
        "visibility_timeout": 5.0,
        "idempotency_window": 60.0,
        "fair": True,
    }
    assert json.loads(out)["settings"]["put_rate"] == 20


def test_configure_without_a_setting_is_a_usage_error() -> None:
    client = FakeClient()
    code, _, err = run(["configure", "q"], client)
    assert code == 2
    assert "at least one setting" in err
    assert client.calls == []
    code, _, err = run(["configure", "q", "--take-rate", "-3"], client)
    assert code == 2
    assert client.calls == []


def test_create_of_an_existing_queue_says_so() -> None:
    client = FakeClient(create_queue=QueueInfo(name="q", created=False))
    assert run(["create", "q"], client)[1] == "queue q exists with these settings\n"
    code, out, _ = run(["--json", "create", "q"], client)
    assert code == 0
    doc = json.loads(out)
    assert (doc["name"], doc["created"], doc["settings"]["id_mode"]) == ("q", False, "server")


def test_put_sends_argument_bodies_with_options_and_prints_ids() -> None:
    client = FakeClient()
    code, out, _ = run(["put", "q", "a", "b", "--delay", "5", "--group", "g"], client)
    assert code == 0
    assert out.splitlines() == ["1  created", "2  created"]
    _, args, kwargs = client.calls[0]
    assert args == ("q", ["a", "b"])
    assert kwargs == {
        "delay": 5.0,
        "activate_at": None,
        "group": "g",
        "id": None,
        "idempotency_key": None,
    }


def test_put_reads_one_body_per_stdin_line_in_batches_of_1000() -> None:
    lines = b"".join(b"line %d\r\n" % i for i in range(1500)) + b"\n"  # one empty line
    client = FakeClient()
    code, out, _ = run(["--json", "put", "q"], client, stdin=io.BytesIO(lines))
    assert code == 0
    sizes = [len(args[1]) for _, args, _ in client.calls]
    assert sizes == [1000, 500]
    assert client.calls[0][1][1][0] == b"line 0"
    assert len(json.loads(out)["results"]) == 1500  # one document for the command


def test_put_with_an_id_or_key_takes_one_body() -> None:
    code, _, err = run(["put", "q", "a", "b", "--key", "k"], FakeClient())
    assert code == 2
    assert "one" in err
    code, _, _ = run(["put", "q", "a", "--key", "k"], FakeClient())
    assert code == 0


def test_put_without_bodies_says_so() -> None:
    code, out, err = run(["put", "q"], FakeClient(), stdin=io.BytesIO(b""))
    assert (code, out) == (0, "")
    assert "no message" in err


def test_take_prints_an_aligned_table() -> None:
    client = FakeClient(take=MESSAGES)
    code, out, _ = run(["take", "q", "-n", "2", "--wait", "1"], client)
    assert code == 0
    assert out.splitlines() == [
        "ID   LEASE  RECEIVES  BODY",
        "101  L1     1         hello",
        "102  L2     3         <2 bytes, binary>",
    ]
    assert client.calls == [("take", ("q", 2), {"wait": 1.0, "visibility_timeout": None})]


def test_take_in_json_prints_one_line_per_message_in_wire_shape() -> None:
    code, out, _ = run(["--json", "take", "q"], FakeClient(take=MESSAGES))
    assert code == 0
    docs = [json.loads(line) for line in out.splitlines()]
    assert [d["id"] for d in docs] == ["101", "102"]
    assert docs[0]["body"] == "hello"
    assert docs[1]["body_b64"] == "/wA="
    assert docs[1]["lease"] == "L2"


def test_take_of_nothing_prints_nothing_on_stdout() -> None:
    code, out, err = run(["take", "q"], FakeClient(take=[]))
    assert (code, out) == (0, "")
    assert "no messages" in err


def test_show_body_quotes_control_characters_and_truncates() -> None:
    assert cli.show_body(b"line\nbreak") == '"line\\nbreak"'
    assert cli.show_body(b"x" * 100, width=10) == "x" * 9 + "…"
    assert cli.show_body("żółw".encode()) == "żółw"


def test_ack_prints_the_result_and_exits_1_on_a_stale_lease() -> None:
    client = FakeClient(ack=[ItemResult("5", "ok")])
    assert run(["ack", "q", "5", "L"], client)[:2] == (0, "5  ok\n")
    assert client.calls == [("ack", ("q", ("5", "L")), {})]
    client = FakeClient(ack=[ItemResult("5", "stale_lease")])
    code, out, err = run(["--json", "ack", "q", "5", "L"], client)
    assert code == 1
    assert json.loads(out) == {
        "results": [{"id": "5", "status": "stale_lease", "lease_expires_at": None}]
    }
    assert "StaleLease" in err


def test_release_passes_the_delay() -> None:
    client = FakeClient(release=[ItemResult("5", "ok")])
    assert run(["release", "q", "5", "L", "--delay", "30"], client)[0] == 0
    assert client.calls == [
        ("release", ("q", ("5", "L")), {"delay": 30.0, "activate_at": None, "reason": None})
    ]


def test_release_passes_the_reason() -> None:
    client = FakeClient(release=[ItemResult("5", "ok")])
    assert run(["release", "q", "5", "L", "--reason", "smtp down"], client)[0] == 0
    assert client.calls[0][2]["reason"] == "smtp down"


def test_stats_prints_stats_and_settings() -> None:
    code, out, _ = run(["stats", "jobs"], FakeClient(get_queue=INFO))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "queue jobs"
    assert "  ready                3" in lines
    assert "  oldest_ready_age     1.5" in lines
    assert "  visibility_timeout   30" in lines
    assert "  dead_letter_queue    dlq" in lines
    code, out, _ = run(["--json", "stats", "jobs"], FakeClient(get_queue=INFO))
    assert code == 0
    doc = json.loads(out)
    assert (doc["stats"]["reserved"], doc["settings"]["max_receives"]) == (2, 5)


def test_queues_prints_one_name_per_line() -> None:
    client = FakeClient(list_queues=["a", "b"])
    assert run(["queues"], client)[1] == "a\nb\n"
    assert json.loads(run(["--json", "queues"], client)[1]) == {"queues": ["a", "b"]}


def test_keys_set_and_get() -> None:
    client = FakeClient(set_key=4, get_key=KeyValue("cfg", 4, {"on": True}))
    assert run(["set", "cfg", '{"on": true}'], client)[1] == "cfg version 4\n"
    assert client.calls[0] == ("set_key", ("cfg", {"on": True}), {})
    assert run(["get", "cfg"], client)[1] == 'cfg version 4: {"on": true}\n'
    assert json.loads(run(["--json", "get", "cfg"], client)[1]) == {
        "key": "cfg",
        "version": 4,
        "value": {"on": True},
    }


def test_watch_prints_each_state_and_once_stops_after_the_first() -> None:
    states = [KeyValue("k", 1, "a"), KeyValue("k", 2, "b")]
    client = FakeClient(watch_loop=states)
    code, out, _ = run(["watch", "k", "--version", "0", "--timeout", "5"], client)
    assert code == 0
    assert out.splitlines() == ['k version 1: "a"', 'k version 2: "b"']
    assert client.calls == [("watch_loop", ("k",), {"version": 0, "wait": 5.0})]
    code, out, _ = run(["--json", "watch", "k", "--once"], FakeClient(watch_loop=states))
    assert code == 0
    assert [json.loads(line)["version"] for line in out.splitlines()] == [1]


def test_delete_queue_and_purge() -> None:
    client = FakeClient(purge=1)
    assert run(["delete-queue", "q"], client)[1] == "deleted queue q\n"
    assert run(["purge", "q"], client)[1] == "purged 1 message from q\n"
    assert json.loads(run(["--json", "purge", "q"], client)[1]) == {"purged": 1}
    assert json.loads(run(["--json", "delete-queue", "q"], client)[1])["deleted"] is True


# ------------------------------------------------------------------ errors, client, serve


def test_an_api_error_exits_1_with_its_code_on_stderr() -> None:
    client = FakeClient()
    client.fail = QueueNotFound("no queue 'q'", status=404)
    code, out, err = run(["stats", "q"], client)
    assert (code, out) == (1, "")
    assert err == "evq stats: QueueNotFound: no queue 'q' (HTTP 404)\n"


def test_an_unreachable_server_exits_1() -> None:
    client = FakeClient()
    client.fail = TransportError("cannot connect to http://x", sent=False)
    code, _, err = run(["queues"], client)
    assert code == 1
    assert "Unavailable: cannot connect" in err


def test_the_server_url_comes_from_the_flag_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[tuple[str, Any]] = []

    class Recording(FakeClient):
        def __init__(self, url: str, token: str | None = None, ca_bundle: str | None = None):
            super().__init__(list_queues=[])
            made.append((url, token, ca_bundle))

    monkeypatch.setattr(cli, "Client", Recording)
    monkeypatch.setenv("EVQ_SERVER", "http://env:1")
    monkeypatch.setenv("EVQ_TOKEN", "tok")
    run(["queues"])
    run(["--server", "http://flag:2", "--token", "t2", "queues"])
    monkeypatch.delenv("EVQ_SERVER")
    monkeypatch.delenv("EVQ_TOKEN")
    run(["queues"])
    run(["--server", "https://flag:3", "--ca-bundle", "ca.pem", "queues"])
    assert made == [
        ("http://env:1", "tok", None),
        ("http://flag:2", "t2", None),
        (cli.DEFAULT_URL, None, None),
        ("https://flag:3", None, "ca.pem"),
    ]


def test_serve_without_the_server_module_says_not_available(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "gateway.server", None)
    code, _, err = run(["serve"])
    assert code == 2
    assert err == "evq serve: not available\n"


def test_serve_calls_the_server_main_with_the_parsed_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Any] = []
    fake = types.ModuleType("gateway.server")
    fake.main = lambda args: seen.append(args) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gateway.server", fake)
    assert run(["serve", "--store", "s3://b/p", "--port", "9000"])[0] == 0
    # Unset options stay None: the server merges flags over EVQ_* variables and its file.
    assert (seen[0].store, seen[0].port, seen[0].host, seen[0].data) == (
        "s3://b/p",
        9000,
        None,
        None,
    )


def test_serve_has_the_api_md_options_even_without_the_server_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "gateway.settings", None)
    args = cli.parse_args(cli.build_parser(), ["serve", "--data", "d", "--host", "0.0.0.0"])
    assert (args.data, args.store, args.host, args.port) == ("d", None, "0.0.0.0", None)


def _task(state: str, done: int, **extra: Any) -> dict[str, Any]:
    doc = {"id": "resize-1", "kind": "resize", "state": state, "done": done, "total": 3}
    return {**doc, "count": 4, "was": 1, **extra}


def test_shards_resize_starts_the_task_and_with_wait_follows_it_to_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli, "TASK_POLL_S", 0)
    client = FakeClient(resize_shards="resize-1")
    code, out, err = run(["shards", "resize", "4"], client)
    assert (code, out) == (0, "resize-1\n")
    assert "evq tasks resize-1" in err
    client = FakeClient(
        resize_shards="resize-1",
        task=[_task("running", 0), _task("running", 2), _task("done", 3)],
    )
    code, out, err = run(["shards", "resize", "4", "--wait"], client)
    assert code == 0
    assert out == "resize-1  resize  done  3/3  1 -> 4 shard(s)\n"
    assert err.splitlines() == [
        "resize-1: 0/3 queue(s) moved",
        "resize-1: 2/3 queue(s) moved",
        "resize-1: 3/3 queue(s) moved",
    ]
    failed = _task("failed", 1, error={"code": "Unavailable", "message": "shard 3 is down"})
    client = FakeClient(resize_shards="resize-1", task=[failed])
    code, out, _ = run(["--json", "shards", "resize", "4", "--wait"], client)
    assert code == 1
    assert json.loads(out)["error"]["code"] == "Unavailable"


def test_tasks_lists_shows_and_cancels() -> None:
    client = FakeClient(tasks=[_task("done", 3), _task("running", 1)])
    code, out, _ = run(["tasks"], client)
    assert code == 0
    assert out.splitlines() == [
        "resize-1  resize  done  3/3  1 -> 4 shard(s)",
        "resize-1  resize  running  1/3  1 -> 4 shard(s)",
    ]
    client = FakeClient(cancel_task=_task("running", 1))
    code, out, _ = run(["--json", "tasks", "resize-1", "--cancel"], client)
    assert code == 0
    assert client.calls == [("cancel_task", ("resize-1",), {})]
    assert json.loads(out)["state"] == "running"


def test_shards_restart_follows_the_rolling_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "TASK_POLL_S", 0)
    done = {"id": "restart-1", "kind": "restart", "state": "done", "done": 2, "total": 2}
    running = {**done, "state": "running", "done": 1}
    client = FakeClient(restart_shards="restart-1", task=[running, done])
    code, out, err = run(["shards", "restart", "--wait"], client)
    assert code == 0
    assert out == "restart-1  restart  done  2/2\n"
    assert err.splitlines()[-1] == "restart-1: 2/2 shard(s) restarted"
    assert client.calls[0] == ("restart_shards", (), {})
