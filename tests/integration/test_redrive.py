"""Native redrive through ``evq serve`` (issue 36): a dead-letter queue's messages go back to
the queues they came from, or to one queue, all or those selected, at a rate, as a task under
/v1/tasks that can be listed and cancelled; through the API, the Python client and the CLI.
Nothing is lost or doubled, cancelled or not."""

from __future__ import annotations

import time
from typing import Any

from evq.client import Client
from tests.integration.conftest import Names
from tests.integration.server import Server, eventually, request
from tests.integration.test_cli import evq


def dead_letters(c: Client, names: Names, counts: dict[str, int]) -> tuple[str, dict[str, str]]:
    """A dead-letter queue holding ``counts[label]`` letters from a source queue each:
    (its name, label → source name). Each body is ``label-n``."""
    dlq = names("dlq")
    c.create_queue(dlq)
    sources = {}
    for label, count in counts.items():
        source = sources[label] = names(label)
        c.create_queue(source, max_receives=1, dead_letter_queue=dlq)
        c.put(source, [f"{label}-{n}".encode() for n in range(count)])
        taken = c.take(source, 1000)
        assert len(taken) == count
        c.release(source, *taken)  # the last receive: each goes to the DLQ
    total = sum(counts.values())
    eventually(lambda: c.get_queue(dlq).stats.ready == total, timeout=30, what="dead letters")  # type: ignore[union-attr]
    return dlq, sources


def bodies(c: Client, queue: str) -> list[bytes]:
    return sorted(m.body for m in c.take(queue, 1000))


def finished(c: Client, task_id: str, timeout: float = 60) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        task = c.task(task_id)
        return task if task["state"] != "running" else None

    return eventually(ended, timeout=timeout, what=f"task {task_id} to end")  # type: ignore[no-any-return]


def test_a_dead_letter_queue_goes_back_to_its_sources_at_its_rate_as_a_task(
    server: Server, names: Names
) -> None:
    with Client(server.url, retries=0, timeout=30) as c:
        dlq, sources = dead_letters(c, names, {"a": 30, "b": 20})
        c.pause(dlq)  # an operator's redrive moves a paused queue's messages all the same
        started = time.monotonic()
        task_id = c.redrive(dlq, rate=25)
        listed = [t for t in c.tasks() if t["id"] == task_id]
        assert [(t["kind"], t["queue"], t["to"], t["rate"]) for t in listed] == [
            ("redrive", dlq, None, 25)
        ]
        task = finished(c, task_id)
        elapsed = time.monotonic() - started
        assert (task["state"], task["done"], task["total"]) == ("done", 50, 50), task
        assert elapsed >= 1.5, elapsed  # 50 messages at 25 a second: two seconds
        assert bodies(c, sources["a"]) == sorted(f"a-{n}".encode() for n in range(30))
        assert bodies(c, sources["b"]) == sorted(f"b-{n}".encode() for n in range(20))
        assert c.get_queue(dlq).stats.total == 0  # type: ignore[union-attr]


def test_the_cli_redrives_selected_letters_to_one_queue_and_follows_the_task(
    server: Server, names: Names
) -> None:
    with Client(server.url, retries=0, timeout=30) as c:
        dlq, _ = dead_letters(c, names, {"s": 10})
        other = names("other")
        c.create_queue(other)
        page = c.browse(dlq, state="ready", limit=3)
        picked = [m.id for m in page.messages]
        args = [arg for mid in picked for arg in ("--id", mid)]
        r = evq(server.url, "redrive", dlq, "--to", other, *args, "--id", "no-such-id", "--wait")
        assert r.code == 0, r
        assert "done" in r.out, r
        assert "1 skipped" in r.out, r
        assert bodies(c, other) == sorted(m.body for m in page.messages)
        assert c.get_queue(dlq).stats.ready == 7  # type: ignore[union-attr]
        r = evq(server.url, "--json", "tasks")
        mine = [t for t in r.docs()[0]["tasks"] if t.get("queue") == dlq]
        assert [(t["selected"], t["skipped"], t["done"]) for t in mine] == [(4, 1, 4)]


def test_a_cancelled_redrive_stops_and_loses_or_doubles_nothing(
    server: Server, names: Names
) -> None:
    with Client(server.url, retries=0, timeout=30) as c:
        dlq, sources = dead_letters(c, names, {"c": 40})
        task_id = c.redrive(dlq, rate=10)
        eventually(lambda: c.task(task_id)["done"] >= 5, timeout=30, what="some moved")
        assert c.cancel_task(task_id)["state"] == "running"
        task = finished(c, task_id)
        assert task["state"] == "cancelled", task
        back, left = bodies(c, sources["c"]), bodies(c, dlq)
        assert 5 <= len(back) < 40
        assert sorted(back + left) == sorted(f"c-{n}".encode() for n in range(40))


def test_redrive_answers_errors_in_the_api_s_model(server: Server, names: Names) -> None:
    with Client(server.url, retries=0, timeout=30) as c:
        dlq, _ = dead_letters(c, names, {"e": 20})
        url = f"{server.url}/v1/queues/{dlq}/redrive"
        missing = names("missing")
        cases = [
            (f"{server.url}/v1/queues/{missing}/redrive", {}, 404, "QueueNotFound"),
            (url, {"to": missing}, 404, "QueueNotFound"),
            (url, {"to": dlq}, 400, "BadRequest"),
            (url, {"rate": 0}, 400, "BadRequest"),
            (url, {"rate": 501}, 400, "BadRequest"),
            (url, {"ids": []}, 400, "BadRequest"),
            (url, {"speed": 3}, 400, "BadRequest"),
        ]
        for where, doc, status, code in cases:
            got = request("POST", where, doc)
            assert (got[0], got[1]["error"]["code"]) == (status, code), (doc, got)
        status, doc = request("POST", url, {"rate": 1})
        assert status == 202, doc
        again = request("POST", url, {})
        assert (again[0], again[1]["error"]["code"]) == (409, "Conflict")
        c.cancel_task(doc["task"])
        assert finished(c, doc["task"])["state"] == "cancelled"
        assert c.get_queue(dlq).stats.total >= 18  # type: ignore[union-attr]
