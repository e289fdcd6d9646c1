"""The chaos campaign's history checker (loadtest/chaos_check.py): each guarantee is caught
when a history breaks it, with the message's story; histories a correct queue could have
written (a model of one, driven by hypothesis) pass, including the ambiguous cases where an
operation's answer was lost."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

from chaos_check import GUARANTEES, Delivery, Rec, by_fault, check, token_of, unavailability

Q, FIFO, SRC, DLQ = "q", "f.fifo", "src", "dlq"


def put(
    t: int,
    tok: str,
    mid: str,
    *,
    q: str = Q,
    key: str | None = None,
    delay: int = 0,
    group: str | None = None,
    seq: int | None = None,
    err: str | None = None,
) -> Rec:
    return Rec(
        op="put",
        w="p",
        q=q,
        t0=t,
        t1=t + 1,
        toks=[tok],
        keys=[key],
        delays=[delay],
        groups=[group],
        seqs=[] if seq is None else [seq],
        ids=[] if err else [mid],
        err=err,
    )


def take(t: int, *ds: Delivery, q: str = Q, dt: int = 1) -> Rec:
    return Rec(op="take", w="c", q=q, t0=t, t1=t + dt, got=list(ds))


def d(
    mid: str,
    tok: str,
    lease: str,
    *,
    rc: int = 1,
    exp: int = 10**9,
    group: str | None = None,
    attr: str | None = "",
) -> Delivery:
    """A delivery, with the attribute its put gave it unless ``attr`` says otherwise."""
    tag = token_of(tok) if attr == "" else attr
    return Delivery(id=mid, body=tok, rc=rc, lease=lease, exp=exp, group=group, attr=tag)


def end(
    op: str,
    t: int,
    mid: str,
    lease: str,
    *,
    q: str = Q,
    res: str = "ok",
    delay: int = 0,
    err: str | None = None,
) -> Rec:
    return Rec(
        op=op, w="c", q=q, t0=t, t1=t + 1, id=mid, lease=lease, res=res, delay=delay, err=err
    )


def only(report, guarantee: str) -> list[dict]:  # type: ignore[no-untyped-def]
    assert set(k for k, n in report.counts.items() if n) == {guarantee}, report.violations
    return [v for v in report.violations if v["guarantee"] == guarantee]


def test_a_clean_history_passes() -> None:
    report = check([put(0, "a", "m1"), take(5, d("m1", "a", "L1")), end("ack", 7, "m1", "L1")])
    assert report.ok
    assert report.acknowledged_puts == 1
    assert report.deliveries == 1


def test_a_lost_put_is_found_with_its_story() -> None:
    report = check([put(0, "a", "m1"), put(2, "b", "m2"), take(5, d("m2", "b", "L"))])
    [found] = only(report, "lost")
    assert found["subject"] == "a"
    assert [r["op"] for r in found["story"]] == ["put"]
    # a put whose answer was an error may not have happened: not lost
    assert check([put(0, "a", "m1", err="Unavailable")]).ok


def test_a_delivery_after_an_ok_ack_is_found_but_not_one_sent_before_it() -> None:
    base = [put(0, "a", "m1"), take(5, d("m1", "a", "L1")), end("ack", 10, "m1", "L1")]
    [found] = only(check([*base, take(20, d("m1", "a", "L2", rc=2))]), "delivered_after_ack")
    assert [r["op"] for r in found["story"]] == ["put", "take", "ack", "take"]
    # a take sent before the ack was answered may have been processed before it
    assert check([*base, take(9, d("m1", "a", "L2", rc=2), dt=3)]).ok
    # an ack refused as stale acked nothing
    stale = [
        put(0, "a", "m1"),
        take(5, d("m1", "a", "L1")),
        end("ack", 10, "m1", "L1", res="stale_lease"),
    ]
    assert check([*stale, take(20, d("m1", "a", "L2", rc=2))]).ok


def test_an_ack_in_one_queue_says_nothing_of_the_same_id_in_another() -> None:
    """Ids are unique within a queue: two queues of a shard may hand out the same one (the
    campaign during resizes found it, and took it for a delivery after an ack)."""
    history = [
        put(0, "a", "m1"),
        put(1, "b", "m1", q="other"),
        take(5, d("m1", "a", "L1")),
        end("ack", 10, "m1", "L1"),
        take(20, d("m1", "b", "L2"), q="other"),
    ]
    assert check(history).ok


def test_an_idempotent_put_that_made_two_messages_is_found() -> None:
    recs = [
        put(0, "a", "m1", key="k"),
        put(3, "a", "m2", key="k"),
        take(5, d("m1", "a", "L1"), d("m2", "a", "L2")),
    ]
    only(check(recs), "duplicated")
    # without a key, a resent put may make two messages
    recs = [put(0, "a", "m1"), put(3, "a", "m2"), take(5, d("m1", "a", "L1"), d("m2", "a", "L2"))]
    assert check(recs).ok


def test_a_message_handed_out_before_its_delay_or_a_release_delay_is_found() -> None:
    only(check([put(0, "a", "m1", delay=1000), take(400, d("m1", "a", "L"))]), "early")
    assert check([put(0, "a", "m1", delay=1000), take(999, d("m1", "a", "L"))]).ok
    base = [
        put(0, "a", "m1"),
        take(5, d("m1", "a", "L1")),
        end("release", 10, "m1", "L1", delay=500),
    ]
    only(check([*base, take(300, d("m1", "a", "L2", rc=2))]), "early")
    assert check([*base, take(600, d("m1", "a", "L2", rc=2))]).ok


def fifo_puts() -> list[Rec]:
    return [put(i, f"s{i}", f"m{i}", q=FIFO, key=f"k{i}", group="g", seq=i) for i in range(3)]


def test_fifo_order_and_one_holder_per_group_are_checked() -> None:
    ok = [
        *fifo_puts(),
        take(10, d("m0", "s0", "L0", group="g"), d("m1", "s1", "L1", group="g"), q=FIFO),
        end("ack", 12, "m0", "L0", q=FIFO),
        end("ack", 13, "m1", "L1", q=FIFO),
        take(20, d("m2", "s2", "L2", group="g"), q=FIFO),
        end("ack", 22, "m2", "L2", q=FIFO),
    ]
    assert check(ok, fifo=[FIFO]).ok
    # seq 1 handed out while seq 0 is held (not acked, lease not expired)
    bad = [
        *fifo_puts(),
        take(10, d("m0", "s0", "L0", group="g"), q=FIFO),
        take(20, d("m1", "s1", "L1", group="g"), q=FIFO),
        end("ack", 30, "m0", "L0", q=FIFO),
        end("ack", 31, "m1", "L1", q=FIFO),
        take(40, d("m2", "s2", "L2", group="g"), q=FIFO),
        end("ack", 41, "m2", "L2", q=FIFO),
    ]
    report = check(bad, fifo=[FIFO])
    assert report.counts["fifo_order"] == 1
    assert report.counts["fifo_shared"] == 1
    # an ack whose answer was lost may have landed: the next one may follow it
    lost_answer = [
        *fifo_puts(),
        take(10, d("m0", "s0", "L0", group="g"), q=FIFO),
        end("ack", 12, "m0", "L0", q=FIFO, res="", err="Unavailable"),
        take(20, d("m1", "s1", "L1", group="g"), q=FIFO),
        end("ack", 21, "m1", "L1", q=FIFO),
        take(30, d("m2", "s2", "L2", group="g"), q=FIFO),
        end("ack", 31, "m2", "L2", q=FIFO),
    ]
    assert check(lost_answer, fifo=[FIFO]).ok
    # a lease that expired frees the group; seq 0 comes again first
    expired = [
        *fifo_puts(),
        take(10, d("m0", "s0", "L0", group="g", exp=15), q=FIFO),
        take(16, d("m0", "s0", "L0b", group="g", rc=2), q=FIFO),
        end("ack", 18, "m0", "L0b", q=FIFO),
        take(20, d("m1", "s1", "L1", group="g"), q=FIFO),
        end("ack", 21, "m1", "L1", q=FIFO),
        take(30, d("m2", "s2", "L2", group="g"), q=FIFO),
        end("ack", 31, "m2", "L2", q=FIFO),
    ]
    assert check(expired, fifo=[FIFO]).ok


def test_dead_lettering_is_checked() -> None:
    dl = {SRC: (DLQ, 2)}
    puts = [put(0, "a", "m1", q=SRC, key="ka")]
    good = [
        *puts,
        take(5, d("m1", "a", "L1", rc=1), q=SRC),
        end("release", 6, "m1", "L1", q=SRC),
        take(8, d("m1", "a", "L2", rc=2), q=SRC),
        end("release", 9, "m1", "L2", q=SRC),
        take(12, d("m1", "a", "L3"), q=DLQ),
        end("ack", 13, "m1", "L3", q=DLQ),
    ]
    assert check(good, dead_letter=dl).ok
    over = [*good, take(10, d("m1", "a", "L9", rc=3), q=SRC)]
    assert only(check(over, dead_letter=dl), "dead_letter")
    assert check([*good, take(14, d("m1", "a", "L4", rc=2), q=DLQ)], dead_letter=dl).ok
    twice = [*good, take(14, d("m1", "a", "L4"), q=DLQ)]  # a copy keeps the id
    assert only(check(twice, dead_letter=dl), "dead_letter")
    never = good[:5]
    assert only(check(never, dead_letter=dl), "dead_letter")


def test_a_message_handed_out_without_its_attributes_or_with_anothers_is_found() -> None:
    recs = [
        put(0, "w1-1", "m1"),
        put(1, "w1-2", "m2"),
        put(2, "w1-3", "m3"),
        take(10, d("m1", "w1-1", "L1"), d("m2", "w1-2+p", "L2"), d("m3", "w1-3", "L3", attr=None)),
        take(20, d("m1", "w1-1", "L4", attr="w1-2")),
    ]
    report = check(recs)
    assert report.counts["attributes"] == 2
    assert {x["subject"] for x in report.violations} == {"w1-3", "w1-1"}


def test_watches_are_checked() -> None:
    sets = [Rec(op="set", key="k", version=v, t0=v, t1=v + 1) for v in (1, 2, 3)]
    final = Rec(op="get", key="k", version=3, t0=10, t1=11)
    seen = [Rec(op="watch", w="w1", key="k", version=v, t0=v, t1=v + 1) for v in (1, 3)]
    assert check([*sets, final, *seen]).ok
    back = [*seen, Rec(op="watch", w="w1", key="k", version=2, t0=5, t1=6)]
    assert only(check([*sets, final, *back]), "watch")
    short = [Rec(op="watch", w="w2", key="k", version=2, t0=2, t1=3)]
    assert only(check([*sets, final, *seen, *short]), "watch")
    lost = [*sets, Rec(op="get", key="k", version=2, t0=10, t1=11)]
    assert only(
        check([*lost, *seen[:1], Rec(op="watch", w="w1", key="k", version=2, t0=4, t1=5)]), "watch"
    )


def test_unavailability_is_per_kind_from_the_fault_to_the_first_probe_after_it() -> None:
    recs = [
        Rec(op="fault", kind="shard_kill", target="0", t0=1000, t1=1000),
        Rec(op="probe", target="0", t0=900, t1=1500, err="Unavailable"),
        Rec(op="probe", target="1", t0=1001, t1=1010),
        Rec(op="probe", target="0", t0=1600, t1=1700),
        Rec(op="fault", kind="server_kill", target="all", t0=2000, t1=2000),
        Rec(op="probe", target="0", t0=2100, t1=2500),
        Rec(op="probe", target="1", t0=2100, t1=2900),
    ]
    gaps = unavailability(recs)
    assert gaps["shard_kill"]["p50_ms"] == 700  # shard 1's probe does not count
    assert gaps["server_kill"]["max_ms"] == 900  # the slowest shard
    # a fault that comes before the queues answered again: both gaps would be the sum
    early = Rec(op="fault", kind="conn_drop", target="0", t0=1200, t1=1200)
    gaps = unavailability([*recs, early])
    assert gaps["shard_kill"] == {"faults": 1, "overlapped": 1}
    assert gaps["conn_drop"]["p50_ms"] == 500


def test_the_workload_and_violations_are_counted_in_the_window_of_the_fault_before_them() -> None:
    recs = [
        put(0, "a", "m1"),
        Rec(op="fault", kind="shard_kill", target="0", t0=1000, t1=1000),
        put(1100, "b", "m2"),
        put(1200, "c", "m3", err="Unavailable"),  # not acknowledged
        put(1300, "b", "m2"),  # sent again: still one acknowledged message
        Rec(op="probe", target="0", t0=1400, t1=1410),  # not the workload's
        Rec(op="fault", kind="pause", target="1", t0=2000, t1=2500),
        take(2600, d("m1", "a", "L1"), d("m2", "b", "L2")),
        put(2700, "e", "m5"),  # never delivered: lost, in the pause's window
        Rec(op="fault", kind="shard_kill", target="1", t0=3000, t1=3000),
        end("ack", 3100, "m1", "L1"),
    ]
    report = check(recs)
    rows = by_fault(recs, report.violations)
    assert rows["none"]["operations"] == 1
    assert rows["none"]["acknowledged_puts"] == 1
    assert rows["shard_kill"]["faults"] == 2
    assert rows["shard_kill"]["operations"] == 4  # three puts, one ack
    assert rows["shard_kill"]["acknowledged_puts"] == 1
    assert rows["pause"] == {**rows["pause"], "faults": 1, "operations": 2, "lost": 1}
    assert rows["shard_kill"]["lost"] == rows["none"]["lost"] == 0
    assert sum(r["operations"] for r in rows.values()) == report.operations
    assert sum(r["acknowledged_puts"] for r in rows.values()) == report.acknowledged_puts


# ------------------------------------------------------------------ a model of a correct queue


@st.composite
def runs(draw: st.DrawFn) -> list[Rec]:
    """A history a correct standard queue could write: a clock, puts (some delayed, some
    with lost answers), takes of ready messages, acks/releases (some answers lost), lease
    expiries, and a final drain."""
    t = 0
    ready: dict[str, tuple[str, int]] = {}  # id → (token, activation)
    held: dict[str, tuple[str, str, int]] = {}  # id → (token, lease, expiry)
    rc: dict[str, int] = {}
    recs: list[Rec] = []
    n = 0
    for step in draw(
        st.lists(st.sampled_from(["put", "take", "ack", "release", "tick"]), max_size=40)
    ):
        t += draw(st.integers(1, 50))
        for mid, (tok, _lease, exp) in list(held.items()):
            if exp <= t:
                del held[mid]
                ready[mid] = (tok, exp)
        if step == "put":
            n += 1
            delay = draw(st.sampled_from([0, 0, 30, 200]))
            lost_answer = draw(st.booleans()) and draw(st.booleans())
            recs.append(
                put(
                    t,
                    f"t{n}",
                    f"m{n}",
                    delay=delay,
                    key=f"k{n}",
                    err="Unavailable" if lost_answer else None,
                )
            )
            ready[f"m{n}"] = (f"t{n}", t + delay)
        elif step == "take":
            due = [m for m, (_, at) in ready.items() if at <= t]
            got = []
            for mid in due[: draw(st.integers(1, 5))]:
                tok, _ = ready.pop(mid)
                rc[mid] = rc.get(mid, 0) + 1
                lease = f"{mid}.{rc[mid]}"
                held[mid] = (tok, lease, t + draw(st.integers(5, 100)))
                got.append(d(mid, tok, lease, rc=rc[mid], exp=held[mid][2]))
            recs.append(take(t, *got))
        elif step in ("ack", "release") and held:
            mid = draw(st.sampled_from(sorted(held)))
            tok, lease, _ = held.pop(mid)
            delay = draw(st.sampled_from([0, 40])) if step == "release" else 0
            lost_answer = draw(st.booleans()) and draw(st.booleans())
            recs.append(
                end(
                    step,
                    t,
                    mid,
                    lease,
                    delay=delay,
                    res="" if lost_answer else "ok",
                    err="Unavailable" if lost_answer else None,
                )
            )
            if step == "release":
                ready[mid] = (tok, t + delay)
    t += 1000  # the drain: everything left is taken and acked
    for mid, (tok, _, _) in held.items():
        ready[mid] = (tok, t)
    for mid, (tok, _) in sorted(ready.items()):
        rc[mid] = rc.get(mid, 0) + 1
        recs.append(take(t, d(mid, tok, f"{mid}.{rc[mid]}", rc=rc[mid])))
        recs.append(end("ack", t + 2, mid, f"{mid}.{rc[mid]}"))
        t += 5
    return recs


@settings(max_examples=200, deadline=None)
@given(runs())
def test_histories_of_a_correct_queue_pass(recs: list[Rec]) -> None:
    report = check(recs)
    assert report.ok, report.violations


@settings(max_examples=100, deadline=None)
@given(runs(), st.data())
def test_dropping_the_deliveries_of_an_acknowledged_put_is_caught(
    recs: list[Rec], data: st.DataObject
) -> None:
    answered = [r.toks[0] for r in recs if r.op == "put" and r.err is None]
    if not answered:
        return
    victim = data.draw(st.sampled_from(answered))
    cut = [
        msgspec.structs.replace(r, got=[x for x in r.got if x.body != victim]) for r in recs
    ]  # the victim's deliveries are gone, the rest of their takes stay
    report = check(cut)
    assert report.counts["lost"] == 1, report.violations
    assert report.violations[0]["subject"] == victim


def test_the_table_per_fault_kind_adds_up_the_runs(tmp_path: Path) -> None:
    import chaos

    for name, kill_ops, lost in (("r1", 10, 0), ("r2", 5, 1)):
        (tmp_path / name).mkdir()
        rows = {
            "shard_kill": {"faults": 2, "operations": kill_ops, "acknowledged_puts": 4}
            | dict.fromkeys(GUARANTEES, 0)
            | {"lost": lost},
            "none": {"faults": 0, "operations": 1, "acknowledged_puts": 1}
            | dict.fromkeys(GUARANTEES, 0)
            | {"early": 1},
        }
        (tmp_path / name / "recheck.json").write_text(json.dumps({"by_fault": rows}))
    lines = chaos.table([tmp_path / "r1", tmp_path / "r2"]).splitlines()
    assert lines[2] == "| shard_kill | r1, r2 | 4 | 15 | 8 | 1 | 0 | 0 | 0 |"
    assert lines[3] == "| none | r1, r2 | 0 | 2 | 2 | 0 | 0 | 0 | 2 |"
