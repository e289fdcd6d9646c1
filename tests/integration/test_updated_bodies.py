"""Bodies an update changed (issue 33; runs.py, ``Patches``) through a real ``evq serve``:
an update of a spilled message's body leaves it in its run, its new body read back from
the update's record in the log; a message updated in flight goes back into its run with
the others when it is released; every command sees the new bodies, through a graceful
restart and a SIGKILL (replayed from the log)."""

from __future__ import annotations

import time

import pytest

from evq.client import Client, NewMessage
from tests.integration.conftest import Names, ServerFactory
from tests.integration.test_spilled_attributes import spilled

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_updated_bodies_stay_spilled_through_restarts_and_kills(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "1")
    q = names("edited")
    with Client(server.url, retries=0, timeout=20) as c:
        c.create_queue(q)
        # 500 due each at its own time in 1-2 h (a spread run), then 300 ready (a run)
        later = [
            r.id
            for r in c.put(q, [NewMessage(body=f"d{i}", delay=3600 + 7 * i) for i in range(500)])
        ]
        ready = [r.id for r in c.put(q, [f"r{i}" for i in range(300)])]
        assert spilled(server.url, q) == 800
        for i in range(0, 500, 10):  # an operator edits 50 deferred jobs, 20 ready ones
            view = c.update_message(q, later[i], body=f"edited d{i}")
            assert view.body == f"edited d{i}".encode()
        for i in range(0, 300, 15):
            c.update_message(q, ready[i], body=f"edited r{i}")
        assert spilled(server.url, q) == 800  # no message objects for them
        m = c.get_message(q, later[40])
        assert (m.state, m.body) == ("delayed", b"edited d40")
        delayed = list(c.browse_all(q, "delayed", limit=100))
        assert [x.body for x in delayed[:3]] == [b"edited d0", b"d1", b"d2"]
        # a consumer takes 100 ready ones, edits 5 while it holds them, and gives all back
        taken = c.take(q, 100, visibility_timeout=600)
        assert [t.body for t in taken[:2]] == [b"edited r0", b"r1"]
        for t in taken[50:55]:
            c.update_message(q, t, body=b"progress " + t.body)
        assert {r.status for r in c.release(q, *taken, delay=1800)} == {"ok"}
        assert spilled(server.url, q) == 800  # back in their run, the edited ones too

    def bodies(c: Client) -> dict[str, bytes]:
        return {x.id: x.body for s in ("ready", "delayed") for x in c.browse_all(q, s, limit=200)}

    want = {mid: f"d{i}".encode() for i, mid in enumerate(later)}
    want |= {mid: f"r{i}".encode() for i, mid in enumerate(ready)}
    want |= {later[i]: f"edited d{i}".encode() for i in range(0, 500, 10)}
    want |= {ready[i]: f"edited r{i}".encode() for i in range(0, 300, 15)}
    for i in range(50, 55):
        want[ready[i]] = b"progress " + want[ready[i]]
    with Client(server.url, retries=0, timeout=20) as c:
        assert bodies(c) == want

    assert server.stop() == 0  # graceful: the snapshot says where each changed body is
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        assert spilled(server.url, q) == 800
        assert bodies(c) == want
        c.update_message(q, later[1], body=b"after the restart")
        want[later[1]] = b"after the restart"

    server.kill()  # SIGKILL: the update since the snapshot is replayed from the log
    server.start()
    with Client(server.url, retries=0, timeout=20) as c:
        assert spilled(server.url, q) == 800
        assert bodies(c) == want
        for mid in later[:20]:  # run now: taken with their bodies
            c.update_message(q, mid, delay=0)
        got: list[tuple[str, bytes]] = []
        deadline = time.monotonic() + 30
        while len(got) < 20 + 200 and time.monotonic() < deadline:
            batch = c.take(q, 100, visibility_timeout=600)
            got += [(t.id, t.body) for t in batch]
            c.ack(q, *batch)
        assert dict(got) == {mid: want[mid] for mid, _ in got}
        assert {mid for mid, _ in got} >= set(later[:20])
