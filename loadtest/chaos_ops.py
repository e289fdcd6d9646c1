"""The recorded operations of the chaos campaign's workload (``loadtest/chaos_workload.py``):
each a client call wrapped in a :class:`chaos_check.Rec` (when it was sent and answered,
what it returned or which error) appended to the run's :class:`History`; the workload's
constants (queue names, lease, ``max_receives``, FIFO groups, keys, the clients' retries).

Imported as a sibling module (``python loadtest/chaos.py`` puts ``loadtest/`` first on
``sys.path``).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from chaos_check import Delivery, Rec
from served import ROOT

sys.path.insert(0, str(ROOT))

from actors.errors import QueueError
from evq.client import Client
from evq.client_wire import NewMessage, RetryPolicy

__all__ = [
    "DLQ",
    "FIFO",
    "GROUPS",
    "MAX_RECEIVES",
    "QUEUE_KEYS",
    "RETRIES",
    "SRC",
    "STD",
    "USER_KEYS",
    "VT",
    "History",
    "Ops",
    "now_ms",
]

VT = 2.0  # the queues' lease, s
STD, FIFO, SRC, DLQ = "chaos-std", "chaos.fifo", "chaos-dl-src", "chaos-dlq"
MAX_RECEIVES = 3
GROUPS = 4
USER_KEYS = [f"chaos:k{i}" for i in range(4)]
QUEUE_KEYS = [f"queue:{q}" for q in (STD, FIFO)]
RETRIES = RetryPolicy(retries=6, backoff=0.05, max_backoff=1.0)


def now_ms() -> int:
    return int(time.time() * 1000)


class History:
    """Every record of the run, appended by many threads."""

    def __init__(self) -> None:
        self.recs: list[Rec] = []
        self._lock = threading.Lock()

    def add(self, rec: Rec) -> None:
        with self._lock:
            self.recs.append(rec)


def _code(exc: Exception) -> str:
    return getattr(exc, "code", None) or type(exc).__name__


def _delivery(m: Any) -> Delivery:
    return Delivery(
        id=m.id,
        body=m.body.decode(),
        rc=m.receive_count,
        lease=m.lease or "",
        exp=int((m.lease_expires_at or 0) * 1000),
        group=m.group,
        attr=(m.attributes or {}).get("tok"),
    )


class Ops:
    """The recorded operations on one server: put, take, end a lease (ack, release,
    reschedule), patch; each appends its record to ``history``."""

    def __init__(self, url: str, history: History) -> None:
        self.url = url
        self.history = history

    def client(self, retries: RetryPolicy = RETRIES, timeout: float = 10.0) -> Client:
        return Client(self.url, retries=retries, timeout=timeout)

    def _put(
        self,
        c: Client,
        w: str,
        q: str,
        toks: list[str],
        keys: list[str | None],
        delays: list[int],
        *,
        auto_key: bool,
        groups: list[str | None] | None = None,
        seqs: list[int] | None = None,
    ) -> Rec:
        groups = groups or [None] * len(toks)
        items = [
            NewMessage(
                body=t.encode(),
                idempotency_key=k,
                delay=d / 1000 if d else None,
                group=g,
                attributes={"tok": t},  # checked on every delivery (chaos_check)
            )
            for t, k, d, g in zip(toks, keys, delays, groups, strict=True)
        ]
        rec = Rec(op="put", w=w, q=q, toks=toks, keys=keys, delays=delays, groups=groups)
        rec.seqs = seqs or []
        rec.t0 = now_ms()
        try:
            results = c.put(q, items, auto_key=auto_key)
            rec.ids = [r.id for r in results]
        except QueueError as exc:
            rec.err = _code(exc)
        rec.t1 = now_ms()
        self.history.add(rec)
        return rec

    def _take(self, c: Client, w: str, q: str, most: int, wait: float = 1.0) -> list[Any]:
        rec = Rec(op="take", w=w, q=q, t0=now_ms())
        got: list[Any] = []
        try:
            got = c.take(q, most, wait=wait)
            rec.got = [_delivery(m) for m in got]
        except QueueError as exc:
            rec.err = _code(exc)
        rec.t1 = now_ms()
        self.history.add(rec)
        return got

    def _end(self, c: Client, w: str, q: str, op: str, m: Any, delay: int = 0) -> str:
        """ack, release or resched (a reschedule ends the lease) one message: its result."""
        rec = Rec(op=op, w=w, q=q, id=m.id, lease=m.lease or "", delay=delay, t0=now_ms())
        try:
            if op == "ack":
                rec.res = c.ack(q, m)[0].status
            elif op == "release":
                rec.res = c.release(q, m, delay=delay / 1000 if delay else None)[0].status
            else:
                c.reschedule(q, m, delay=delay / 1000)
                rec.res = "ok"
        except QueueError as exc:
            rec.err = _code(exc)
            if rec.err == "StaleLease":
                rec.err, rec.res = None, "stale_lease"
        rec.t1 = now_ms()
        self.history.add(rec)
        return rec.res

    def _release_all(self, c: Client, w: str, q: str, msgs: list[Any], delay: int) -> None:
        """Release a whole take at once, due ``delay`` ms later (a consumer backing off: in
        the server, a return run). One record a message, as :meth:`_end` writes them."""
        recs = [
            Rec(op="release", w=w, q=q, id=m.id, lease=m.lease or "", delay=delay, t0=now_ms())
            for m in msgs
        ]
        try:
            results = c.release(q, *msgs, delay=delay / 1000 if delay else None)
            for rec, result in zip(recs, results, strict=True):
                rec.res = result.status
        except QueueError as exc:
            for rec in recs:
                rec.err = _code(exc)
                if rec.err == "StaleLease":
                    rec.err, rec.res = None, "stale_lease"
        t1 = now_ms()
        for rec in recs:
            rec.t1 = t1
            self.history.add(rec)

    def _ack_all(self, c: Client, w: str, q: str, msgs: list[Any]) -> None:
        """Ack a whole take at once (the drain). One record a message, as :meth:`_end`
        writes them."""
        recs = [Rec(op="ack", w=w, q=q, id=m.id, lease=m.lease or "", t0=now_ms()) for m in msgs]
        try:
            results = c.ack(q, *msgs)
            for rec, result in zip(recs, results, strict=True):
                rec.res = result.status
        except QueueError as exc:
            for rec in recs:
                rec.err = _code(exc)
        t1 = now_ms()
        for rec in recs:
            rec.t1 = t1
            self.history.add(rec)

    def _patch(self, c: Client, w: str, q: str, m: Any) -> bool:
        rec = Rec(op="patch", w=w, q=q, id=m.id, lease=m.lease or "", t0=now_ms())
        try:
            c.update_message(q, m, body=(m.body.decode() + "+p").encode())
            rec.res = "ok"
        except QueueError as exc:
            rec.err = _code(exc)
        rec.t1 = now_ms()
        self.history.add(rec)
        return rec.res == "ok"
