"""The history checker of the chaos campaign (``loadtest/chaos.py``): pure, no I/O.

The workload records every operation it made as a :class:`Rec` — when it was sent (``t0``)
and answered (``t1``, wall-clock ms, the clock the server uses too), what it asked, what came
back, or the error. A put's body is a token (``w3-17``; ``w3-17+p`` once patched) that names
the put however many times it was sent, so a delivery can be tied to the put even when the
put's answer was lost. :func:`check` states the guarantees and proves each one over the
whole history; a violation comes with the message's whole story.

The checks are *sound*: where the server's moment of an operation is only known to lie
between ``t0`` and ``t1``, a check takes the bound that favours the server, so a violation
is a real one. An operation whose answer was an error may or may not have happened: it is
treated as either, whichever excuses the server.

Guarantees (the names are the report's keys):

- ``lost``: every put answered ``created``/``duplicate`` is delivered at least once (the
  workload drains every queue at the end), in its queue or, past ``max_receives``, in the
  dead-letter queue.
- ``delivered_after_ack``: a message whose ack was answered ``ok`` is never delivered again
  (by a take of its queue sent after that answer; ids are unique within a queue).
- ``duplicated``: a put with an idempotency key makes one message, however often it is sent.
- ``fifo_order``: within a FIFO group, message ``n`` is handed out only when every earlier
  message of the group is done (an ack was sent for it, or it came in the same take).
- ``fifo_shared``: a FIFO group is never reserved by two takes at once.
- ``early``: a message is never handed out before its activation time (the put's delay, a
  release's or reschedule's delay).
- ``dead_letter``: a message of a queue with ``max_receives`` R is delivered from it at most
  R times (receive counts 1..R, each once), and dead-lettered exactly once.
- ``watch``: a watcher's versions of a key only grow, and every watcher ends at the key's
  final version; an acknowledged write of a key is never lost (its final version is at least
  the last acknowledged one).
- ``attributes``: a message is handed out with the attributes its put gave it (the workload
  gives each its token, ``tok``), wherever its index and body were held (runs spill them to
  the log) and whatever happened since (a patch of its body, a dead letter's provenance).
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import msgspec

__all__ = [
    "GUARANTEES",
    "Delivery",
    "Rec",
    "Report",
    "by_fault",
    "check",
    "token_of",
    "unavailability",
]

PATCH_MARK = "+p"


class Delivery(msgspec.Struct, frozen=True):
    """One message a take handed out."""

    id: str
    body: str
    rc: int  # receive count
    lease: str
    exp: int  # lease expiry, ms
    group: str | None = None
    attr: str | None = None  # its attribute ``tok``, as handed out (None: none)


class Rec(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One operation of the workload (or a fault, or the final state of a key)."""

    op: str  # put take ack release resched patch set watch get fault
    w: str = ""  # the worker
    t0: int = 0
    t1: int = 0
    q: str = ""
    err: str | None = None  # the error's code when it failed (it may have happened)
    # put: one item per message
    toks: list[str] = []
    keys: list[str | None] = []
    delays: list[int] = []  # ms
    groups: list[str | None] = []
    seqs: list[int] = []
    ids: list[str] = []  # answered ids (empty when it failed)
    # take
    got: list[Delivery] = []
    # ack/release/resched/patch: one message
    id: str = ""
    lease: str = ""
    delay: int = 0  # ms
    res: str = ""  # ok stale_lease not_found
    # keys and watches
    key: str = ""
    version: int = 0
    # faults
    kind: str = ""
    target: str = ""


def token_of(body: str) -> str:
    return body[: -len(PATCH_MARK)] if body.endswith(PATCH_MARK) else body


class Report(msgspec.Struct):
    """What :func:`check` found: counts, and each violation with its story."""

    operations: int
    acknowledged_puts: int
    deliveries: int
    counts: dict[str, int]  # guarantee → violations
    violations: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return not self.violations


class _Index:
    """The history, indexed: puts by token, deliveries by token and id, what ended a lease."""

    def __init__(self, recs: list[Rec]) -> None:
        self.puts_ok: dict[str, Rec] = {}  # token → the first put answered for it
        self.put_of: dict[str, tuple[Rec, int]] = {}  # token → (first put sent, index)
        self.key_of: dict[str, str | None] = {}
        self.takes: list[tuple[Rec, int, Delivery]] = []  # (take, position, delivery)
        # (queue, id) → acks sent: ids are unique within a queue only (two queues of a shard
        # may hand out the same one), so an ack in one queue says nothing of another's.
        self.acks: dict[tuple[str, str], list[Rec]] = defaultdict(list)
        self.ends: dict[str, list[Rec]] = defaultdict(list)  # lease → ack/release/resched
        self.delays_after: dict[str, list[Rec]] = defaultdict(list)  # id → ok delays
        self.operations = 0
        for r in recs:
            if r.op not in ("fault", "get", "probe"):
                self.operations += 1
                self._add(r)
        self.ids_of: dict[tuple[str, str], set[str]] = defaultdict(set)  # (queue, token)
        self.delivered: dict[str, list[tuple[Rec, int, Delivery]]] = defaultdict(list)
        self.by_id: dict[tuple[str, str], list[tuple[Rec, int, Delivery]]] = defaultdict(list)
        for take, i, d in self.takes:
            tok = token_of(d.body)
            self.ids_of[(take.q, tok)].add(d.id)
            self.delivered[tok].append((take, i, d))
            self.by_id[(take.q, d.id)].append((take, i, d))

    def _add(self, r: Rec) -> None:
        if r.op == "put":
            for i, tok in enumerate(r.toks):
                self.put_of.setdefault(tok, (r, i))
                self.key_of.setdefault(tok, r.keys[i] if r.keys else None)
                if r.err is None:
                    self.puts_ok.setdefault(tok, r)
        elif r.op == "take" and r.err is None:
            self.takes.extend((r, i, d) for i, d in enumerate(r.got))
        elif r.op in ("ack", "release", "resched"):
            self.ends[r.lease].append(r)
            if r.op == "ack":
                self.acks[(r.q, r.id)].append(r)
            elif r.err is None and r.res == "ok" and r.delay > 0:
                self.delays_after[r.id].append(r)


def check(
    history: Iterable[Rec],
    *,
    dead_letter: dict[str, tuple[str, int]] | None = None,
    fifo: Iterable[str] = (),
    story_limit: int = 40,
) -> Report:
    """Check ``history`` (every record of a run, drain included).

    ``dead_letter``: queue → (its dead-letter queue, max_receives); ``fifo``: the FIFO queues.
    """
    recs = sorted(history, key=lambda r: (r.t1, r.t0))
    dead_letter = dead_letter or {}
    v = _Violations(recs, story_limit)
    ix = _Index(recs)
    _check_lost(v, ix)
    _check_after_ack(v, ix)
    _check_duplicated(v, ix, {dlq for dlq, _ in dead_letter.values()})
    _check_early(v, ix)
    _check_fifo(v, set(fifo), ix)
    _check_dead_letter(v, dead_letter, ix)
    _check_watches(v, recs)
    _check_attributes(v, ix)
    counts = dict.fromkeys(GUARANTEES, 0)
    for found in v.found:
        counts[found["guarantee"]] += 1
    return Report(
        operations=ix.operations,
        acknowledged_puts=len(ix.puts_ok),
        deliveries=len(ix.takes),
        counts=counts,
        violations=v.found,
    )


def _check_attributes(v: _Violations, ix: _Index) -> None:
    for take, _, d in ix.takes:
        tok = token_of(d.body)
        if d.attr != tok:
            v.add("attributes", tok, f"handed out by {take.w} at {take.t1} with tok={d.attr!r}")


def _check_lost(v: _Violations, ix: _Index) -> None:
    for tok, put in ix.puts_ok.items():
        if not ix.delivered.get(tok):
            v.add("lost", tok, f"put answered at {put.t1} into {put.q}, never delivered")


def _check_after_ack(v: _Violations, ix: _Index) -> None:
    for (q, mid), sent in ix.acks.items():
        oks = [a.t1 for a in sent if a.err is None and a.res == "ok"]
        if not oks:
            continue
        first_ok = min(oks)
        for take, _, d in ix.by_id.get((q, mid), []):
            if take.t0 > first_ok:
                v.add(
                    "delivered_after_ack",
                    token_of(d.body),
                    f"{q}/{mid} acked ok at {first_ok}, delivered again by a take sent at "
                    f"{take.t0}",
                )


def _check_duplicated(v: _Violations, ix: _Index, dlqs: set[str]) -> None:
    """An idempotent put makes one message in its queue."""
    for (q, tok), ids in ix.ids_of.items():
        if q not in dlqs and ix.key_of.get(tok) is not None and len(ids) > 1:
            v.add("duplicated", tok, f"an idempotent put became {len(ids)} messages in {q}: {ids}")


def _check_early(v: _Violations, ix: _Index) -> None:
    """Not before the put's delay, nor before an ok release's or reschedule's."""
    for tok, deliveries in ix.delivered.items():
        first = ix.put_of.get(tok)
        if first is None:
            continue
        put, i = first
        delay = put.delays[i] if put.delays else 0
        for take, _, d in deliveries:
            if take.q == put.q and delay and take.t1 < put.t0 + delay:
                v.add(
                    "early",
                    tok,
                    f"put at {put.t0} with delay {delay} ms, handed out by a take answered "
                    f"at {take.t1}",
                )
            for later in ix.delays_after.get(d.id, []):
                if later.lease != d.lease and later.t0 <= take.t1 < later.t0 + later.delay:
                    v.add(
                        "early",
                        tok,
                        f"{later.op} at {later.t0} with delay {later.delay} ms, handed out "
                        f"again by a take answered at {take.t1}",
                    )


GUARANTEES = (
    "lost",
    "delivered_after_ack",
    "duplicated",
    "fifo_order",
    "fifo_shared",
    "early",
    "dead_letter",
    "watch",
    "attributes",
)


STORIES = 50  # violations told with their records' story, at most


class _Violations:
    def __init__(self, recs: list[Rec], story_limit: int) -> None:
        self.recs = recs
        self.story_limit = story_limit
        self.found: list[dict[str, Any]] = []

    def add(self, guarantee: str, subject: str, what: str) -> None:
        # A story reads every record: only the first violations get one (a run with
        # thousands of them would take hours to tell; their counts are what matter).
        story = self.story(subject) if len(self.found) < STORIES else []
        self.found.append(
            {"guarantee": guarantee, "subject": subject, "what": what, "story": story}
        )

    def story(self, subject: str) -> list[dict[str, Any]]:
        """Every record that names ``subject`` (a token, a message id or a key), in order;
        the ids the token became are followed too."""
        ids = {subject}
        for r in self.recs:
            if r.op == "put" and subject in r.toks and r.ids:
                ids.add(r.ids[r.toks.index(subject)])
            for d in r.got:
                if token_of(d.body) == subject:
                    ids.add(d.id)
        told = []
        for r in self.recs:
            if (
                subject in r.toks
                or r.id in ids
                or r.key == subject
                or any(d.id in ids for d in r.got)
            ):
                doc = {
                    k: val
                    for k, val in msgspec.structs.asdict(r).items()
                    if val not in ([], "", 0, None)
                }
                if r.got:
                    doc["got"] = [msgspec.structs.asdict(d) for d in r.got if d.id in ids]
                if r.toks:
                    keep = [i for i, t in enumerate(r.toks) if t == subject]
                    for name in ("toks", "keys", "delays", "groups", "seqs", "ids"):
                        values = getattr(r, name)
                        if values:
                            doc[name] = [values[i] for i in keep if i < len(values)]
                told.append(doc)
        return told[-self.story_limit :]


def _check_fifo(v: _Violations, fifo: set[str], ix: _Index) -> None:
    """Order within a group, and one holder of a group at a time."""
    groups: dict[tuple[str, str], list[tuple[Rec, int, Delivery]]] = defaultdict(list)
    for take, i, d in ix.takes:
        if take.q in fifo and d.group is not None:
            groups[(take.q, d.group)].append((take, i, d))
    for (q, group), held in groups.items():
        _fifo_order(v, f"{q}/{group}", held, ix)
        _fifo_exclusive(v, f"{q}/{group}", held, ix)


def _fifo_order(
    v: _Violations, name: str, held: list[tuple[Rec, int, Delivery]], ix: _Index
) -> None:
    """When seq s is handed out, every earlier seq handed out must be done: an ack (not
    refused as stale) sent before the take was answered, or earlier in the same take."""
    seq_of: dict[str, int] = {}
    done: dict[str, int] = {}  # token → the earliest moment an ack of it may have landed
    for _, _, d in held:
        tok = token_of(d.body)
        first = ix.put_of.get(tok)
        if first is not None and first[0].seqs:
            seq_of[tok] = first[0].seqs[first[1]]
        for end in ix.ends.get(d.lease, []):
            if end.op == "ack" and end.res != "stale_lease":
                done[tok] = min(done.get(tok, end.t0), end.t0)
    # Sorted by seq, with, for each prefix, the K latest "done" moments (never done: inf)
    # of its tokens: K = one more than a take's size, so that tokens of the take itself
    # (which may be undone when it is answered) cannot hide one that counts. Linear in the
    # group's deliveries (a long run's FIFO groups hold tens of thousands: pairwise was hours).
    k = 1 + max((len(take.got) for take, _, _ in held), default=0)
    order = sorted(seq_of.items(), key=lambda item: item[1])
    seqs = [s2 for _, s2 in order]
    inf = float("inf")
    tops: list[list[tuple[float, str, int]]] = [[]]  # tops[j]: of the first j tokens
    top: list[tuple[float, str, int]] = []
    for tok, s2 in order:
        at = done.get(tok)
        top = sorted([*top, (inf if at is None else at, tok, s2)], reverse=True)[:k]
        tops.append(top)
    for take, i, d in held:
        s = seq_of.get(token_of(d.body))
        if s is None:
            continue
        same_take = {token_of(x.body) for x in take.got[:i]}
        for at, tok, s2 in tops[bisect.bisect_left(seqs, s)]:
            if at <= take.t1:
                break  # sorted: none after it is later
            if tok not in same_take:
                v.add(
                    "fifo_order",
                    token_of(d.body),
                    f"{name}: seq {s} handed out at {take.t1} while seq {s2} ({tok}) was not done",
                )
                break


def _fifo_exclusive(
    v: _Violations, name: str, held: list[tuple[Rec, int, Delivery]], ix: _Index
) -> None:
    """Holdings (from a take's answer to the earliest end of its lease: expiry, or an ack or
    release sent) of different takes must not overlap."""
    spans = []
    for take, _, d in held:
        end = d.exp
        for e in ix.ends.get(d.lease, []):
            if e.res != "stale_lease":
                end = min(end, e.t0)
        spans.append((take.t1, end, take, d))
    spans.sort(key=lambda s: s[0])
    held_until, holder, holding = -1, None, None
    for start, end, take, d in spans:
        if take is not holder and start < held_until:
            assert holding is not None
            v.add(
                "fifo_shared",
                token_of(d.body),
                f"{name}: handed out at {start} while {holding.id} was held until {held_until}",
            )
        if end > held_until:
            held_until, holder, holding = end, take, d


def _check_dead_letter(v: _Violations, dead_letter: dict[str, tuple[str, int]], ix: _Index) -> None:
    for src, (dlq, max_receives) in dead_letter.items():
        _dead_letters_of(v, src, dlq, max_receives, ix)


def _dead_letters_of(v: _Violations, src: str, dlq: str, max_receives: int, ix: _Index) -> None:
    """At most ``max_receives`` deliveries from ``src``, then one copy in ``dlq``."""
    rcs: dict[str, list[int]] = defaultdict(list)
    copies: dict[str, int] = defaultdict(int)  # first receives in dlq: a copy keeps the id
    for take, _, d in ix.takes:
        tok = token_of(d.body)
        if take.q == src:
            rcs[tok].append(d.rc)
        elif take.q == dlq:
            copies[tok] += d.rc == 1
    for tok, counts in rcs.items():
        if max(counts) > max_receives or len(counts) != len(set(counts)):
            v.add("dead_letter", tok, f"delivered from {src} with receive counts {sorted(counts)}")
    for tok, n in copies.items():
        if n > 1:
            v.add("dead_letter", tok, f"dead-lettered {n} times")
    for tok, put in ix.puts_ok.items():
        if put.q == src and tok not in copies:
            v.add("dead_letter", tok, f"never acked in {src}, but never reached {dlq}")


def _check_watches(v: _Violations, recs: list[Rec]) -> None:
    final: dict[str, int] = {}
    acked: dict[str, int] = {}
    seen: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in recs:
        if r.op == "get" and r.err is None:
            final[r.key] = r.version
        elif r.op == "set" and r.err is None:
            acked[r.key] = max(acked.get(r.key, 0), r.version)
        elif r.op == "watch" and r.err is None:
            seen[(r.w, r.key)].append(r.version)
    for key, version in acked.items():
        if key in final and final[key] < version:
            v.add("watch", key, f"version {version} was acknowledged, the final is {final[key]}")
    for (w, key), versions in seen.items():
        back = next(((a, b) for a, b in itertools.pairwise(versions) if b <= a), None)
        if back is not None:
            v.add("watch", key, f"watcher {w} saw version {back[1]} after {back[0]}")
        if key in final and versions[-1] != final[key]:
            v.add("watch", key, f"watcher {w} ended at version {versions[-1]}, not {final[key]}")
    watched = {k for _, k in seen}
    for key, version in final.items():
        if version > 0 and key not in watched:
            v.add("watch", key, "no watcher saw this key change")


def unavailability(recs: Iterable[Rec]) -> dict[str, dict[str, float]]:
    """Per fault kind: how many, and p50/p99/max ms from each fault until the queues it hit
    answer again. ``probe`` records are a put and a take on one shard's probe queue
    (``target``: the shard); a fault's ``target`` is a shard, or ``all``. A fault's gap is
    the time from its start (``t0``) to the first answer of a probe sent after its end
    (``t1``: a pause ends with SIGCONT) on the shard it hit — on every shard for ``all``,
    the slowest of them. A fault followed by the next one before its queues answered again
    is counted as ``overlapped`` and left out of the figures (its gap is the two faults')."""
    recs = sorted(recs, key=lambda r: r.t0)
    probes: dict[str, list[Rec]] = defaultdict(list)
    for r in recs:
        if r.op == "probe" and r.err is None:
            probes[r.target].append(r)
    faults = [r for r in recs if r.op == "fault"]
    gaps: dict[str, list[int]] = defaultdict(list)
    overlapped: dict[str, int] = defaultdict(int)
    for i, fault in enumerate(faults):
        shards = list(probes) if fault.target == "all" else [fault.target]
        firsts = []
        for shard in shards:
            after = [p.t1 for p in probes.get(shard, []) if p.t0 >= fault.t1]
            if after:
                firsts.append(min(after))
        if not firsts or len(firsts) < len(shards):
            continue
        if i + 1 < len(faults) and faults[i + 1].t0 < max(firsts):
            overlapped[fault.kind] += 1
        else:
            gaps[fault.kind].append(max(firsts) - fault.t0)
    out: dict[str, dict[str, float]] = {}
    for kind in sorted(set(gaps) | set(overlapped)):
        values = sorted(gaps.get(kind, []))
        out[kind] = {"faults": len(values) + overlapped[kind], "overlapped": overlapped[kind]}
        if values:
            out[kind].update(
                p50_ms=statistics.median(values),
                p99_ms=values[min(len(values) - 1, int(len(values) * 0.99))],
                max_ms=values[-1],
            )
    return out


def by_fault(
    recs: Iterable[Rec], violations: Iterable[dict[str, Any]] = ()
) -> dict[str, dict[str, int]]:
    """Per fault kind: its faults, and what happened in their windows. A fault's window runs
    from it to the next fault (the last one's to the end of the history, the drain included;
    what came before the first fault is under ``none``). In it: the workload's operations
    (as :func:`check` counts them), the messages whose put was answered there
    (``acknowledged_puts``), and per guarantee the violations (from :func:`check`) whose
    story begins there."""
    recs = sorted(recs, key=lambda r: r.t0)
    faults = [r for r in recs if r.op == "fault"]
    starts = [f.t0 for f in faults]

    def row(t: int) -> dict[str, int]:
        i = bisect.bisect_right(starts, t) - 1
        return out[faults[i].kind if i >= 0 else "none"]

    out: dict[str, dict[str, int]] = defaultdict(
        lambda: {
            "faults": 0,
            "operations": 0,
            "acknowledged_puts": 0,
            **dict.fromkeys(GUARANTEES, 0),
        }
    )
    for fault in faults:
        out[fault.kind]["faults"] += 1
    seen: set[str] = set()
    for r in recs:
        if r.op in ("fault", "get", "probe"):
            continue
        counts = row(r.t0)
        counts["operations"] += 1
        if r.op == "put" and r.err is None:
            fresh = [t for t in r.toks if t not in seen]
            seen.update(fresh)
            counts["acknowledged_puts"] += len(fresh)
    for found in violations:
        times = [step["t0"] for step in found["story"] if "t0" in step]
        out_row = row(min(times)) if times else out["none"]
        out_row[found["guarantee"]] += 1
    return dict(out)
