"""A client-id queue that spills (issue 33; runs.py and idindex.py) through a real ``evq
serve``: a put's messages are held in one run, their ids packed and indexed, no object a
message; every command finds each message by its id; a put again is a duplicate (or a
conflict); a graceful restart, a SIGKILL (replayed from the log) and a compaction keep
every id; the drain hands out every message once, in order."""

from __future__ import annotations

import pytest

from actors.errors import Conflict
from evq.client import Client, NewMessage
from tests.integration.conftest import Names, ServerFactory
from tests.integration.test_spilled_attributes import spilled

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def order(i: int) -> str:
    return f"order-{i:05d}-é"  # not ASCII: ids are packed as UTF-8


def test_a_client_id_queue_holds_its_ids_in_runs_through_restarts_and_kills(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "1")
    q = names("orders")
    n = 500
    ids = [order(i) for i in range(n)]
    with Client(server.url, retries=0, timeout=20) as c:
        c.create_queue(q, id_mode="client")
        put = c.put(q, [NewMessage(body=f"b{i}", id=mid) for i, mid in enumerate(ids)])
        assert [(r.id, r.status) for r in put] == [(mid, "created") for mid in ids]
        assert spilled(server.url, q) == n  # no message objects
        m = c.get_message(q, ids[321])
        assert (m.id, m.state, m.body) == (ids[321], "ready", b"b321")
        again = c.put(q, [NewMessage(body="b7", id=ids[7]), NewMessage(body="new", id="x-1")])
        assert [r.status for r in again] == ["duplicate", "created"]
        with pytest.raises(Conflict):
            c.put(q, [NewMessage(body="another body", id=ids[8])])
        assert [x.id for x in c.browse_all(q, "ready", limit=64)] == [*ids, "x-1"]
        taken = c.take(q, 5, visibility_timeout=600)
        assert [t.id for t in taken] == ids[:5]
        c.ack(q, *taken)
        c.update_message(q, ids[200], body=b"changed")  # stays in its run (a patch)
        c.delete_message(q, ids[201])
        c.reschedule(q, ids[202], delay=3600)  # back into its run (a scattered return run)
        assert spilled(server.url, q) == n - 5 - 1
        failed = c.take(q, 20, visibility_timeout=600)
        assert [t.id for t in failed] == ids[5:25]
        assert spilled(server.url, q) == n - 5 - 1 - 20
        c.release(q, *failed, delay=3600)  # given back: a return run, no objects
        assert spilled(server.url, q) == n - 5 - 1
        assert c.put(q, [NewMessage(body="b6", id=ids[6])])[0].status == "duplicate"

    assert server.stop() == 0  # graceful: the snapshot holds the packed ids
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        assert spilled(server.url, q) == n - 5 - 1
        m = c.get_message(q, ids[10])
        assert (m.state, m.receive_count, m.body) == ("delayed", 1, b"b10")
        assert c.get_message(q, ids[400]).body == b"b400"
        assert c.get_message(q, ids[200]).body == b"changed"
        assert c.put(q, [NewMessage(body="b9", id=ids[9])])[0].status == "duplicate"
        assert c.put(q, [NewMessage(body="b0", id=ids[0])])[0].status == "created"  # acked

    server.kill()  # SIGKILL: the put since the snapshot is replayed from the log
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        assert c.get_message(q, ids[499]).state == "ready"
        seen: list[str] = []
        while True:
            got = c.take(q, 100, visibility_timeout=600)
            if not got:
                break
            seen += [t.id for t in got]
            c.ack(q, *got)
        assert seen == [*ids[25:201], *ids[203:], "x-1", ids[0]]
        assert c.get_message(q, ids[202]).state == "delayed"
        assert [c.get_message(q, mid).receive_count for mid in ids[5:25]] == [1] * 20
