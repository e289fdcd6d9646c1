"""Bodies an update changed, held by their put's run (runs.py ``Patches``): the cases a
review found, beside the model test's walks (test_model.py) and the shard and server
tests (tests/fault/test_spill.py, tests/integration/test_updated_bodies.py)."""

from __future__ import annotations

from actors.core import commands as c
from actors.core.decide import execute
from actors.core.runs import Contents
from actors.core.snapshot import decode_snapshot, encode_snapshot, restore, snapshot
from tests.unit.core.test_fifo_runs import fifo, put
from tests.unit.core.test_runs import Shell


def test_a_run_held_in_memory_keeps_its_patches_in_memory() -> None:
    """A snapshot written before a put was durable holds its bodies, and the restored run
    is never placed: a patch placed in the log while its run is not would be before no
    place the body floor counts, and its segment could go."""
    sh = Shell()
    execute(sh.state, c.Put([c.NewMessage(body=b"m%d" % i) for i in range(5)]), sh.now, sh.ids)
    sh.state = sh.spilling(restore(decode_snapshot(encode_snapshot(snapshot(sh.state)))))
    [run] = sh.state.by_id
    assert run.place is None
    ids = [str(run.id + i) for i in range(5)]
    assert sh.run(c.Update(id=ids[2], body=b"new")).body == b"new"  # placed by the Shell
    assert run.patches is not None
    assert run.patches.held == {2: b"new"}
    assert not list(run.patches.places())
    assert [d.body for d in sh.run(c.Take(max=5))] == [b"m0", b"m1", b"new", b"m3", b"m4"]


def test_an_update_placed_after_a_move_of_its_run_is_not_placed() -> None:
    """U1 changes a body, a compaction moves the run (the patch goes: the move wrote the
    body), U2 changes it to the same bytes (b"x": one object in CPython), then U1's record
    is durable: it must not be placed, or the patch would read a record before the run's
    new place, which the floor lets go."""
    sh = Shell()
    ids = sh.put(3)
    [run] = sh.state.by_id
    execute(sh.state, c.Update(id=ids[1], body=b"x"), sh.now, sh.ids)
    [u1] = sh.state.unpatched
    sh.state.unpatched.clear()
    moved, _ = execute(sh.state, c.MoveBodies([int(ids[0])]), sh.now, sh.ids)
    sh._placed(moved)
    assert run.patches is None
    execute(sh.state, c.Update(id=ids[1], body=b"x"), sh.now, sh.ids)
    [u2] = sh.state.unpatched
    sh.state.unpatched.clear()
    sh.state.place_patch(*u1, ("gone", 0, 0, 0, 0))  # the older record: ignored
    sh.log[99] = Contents([b"x"], None)
    sh.state.place_patch(*u2, ("log", 99, 0, 0, 0))
    assert run.patches is not None
    assert [place for _, place in run.patches.places()] == [("log", 99, 0, 0, 0)]
    assert sh.run(c.Peek(ids[1])).body == b"x"


def test_the_patches_of_messages_gone_go_with_them() -> None:
    sh = Shell()
    ids = sh.put(20)
    taken = sh.run(c.Take(max=10))
    for d in taken:  # a consumer writes its progress into each body
        sh.run(c.Update(id=d.id, lease=d.lease, body=b"done " + d.body))
    [run] = sh.state.by_id
    assert len(run.patches or ()) == 10
    sh.run(c.Ack([c.LeaseRef(d.id, d.lease) for d in taken]))
    assert len(run.patches or ()) == 0  # never read again: not read at each take either
    sh.run(c.Update(id=ids[15], body=b"edited"))  # spilled: kept
    sh.run(c.Delete(ids[15], None))
    assert len(run.patches or ()) == 0
    assert [d.id for d in sh.run(c.Take(max=20))] == [i for i in ids[10:] if i != ids[15]]


def test_a_restored_fifo_run_shares_its_groups_names() -> None:
    sh = fifo()
    put(sh, 100)
    again = restore(decode_snapshot(encode_snapshot(snapshot(sh.state))))
    [run] = again.by_id
    names = run.gnames or []
    assert all(name is again.groups[name].name for name in names)


def test_a_restored_state_drops_the_patches_of_messages_gone_as_the_live_one_does() -> None:
    sh = Shell()
    ids = sh.put(5)
    sh.run(c.Update(id=ids[3], body=b"edited"))
    live = sh.state
    sh.state = again = sh.spilling(restore(decode_snapshot(encode_snapshot(snapshot(live)))))
    sh.run(c.Delete(ids[3], None))
    assert len(again.by_id[0].patches or ()) == 0
