"""The mixed workload of the chaos campaign (``loadtest/chaos.py``): :class:`Workload`'s
threads (producers, consumers, the FIFO and dead-letter queues, a key writer, watchers, one
probe per shard, the drain at the end), the :class:`History` they record into (a
:class:`chaos_check.Rec` per operation), and the workload's constants (queue names, lease,
``max_receives``, FIFO groups, keys, the clients' retries).

Imported as a sibling module (``python loadtest/chaos.py`` puts ``loadtest/`` first on
``sys.path``).
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
from chaos_check import Delivery, Rec
from served import ROOT

sys.path.insert(0, str(ROOT))

from actors.errors import QueueError
from actors.log.shard_recovery import placement
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
    "Workload",
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
    )


class Workload:
    """The threads of the mixed workload (see ``loadtest/chaos.py``'s doc)."""

    def __init__(self, url: str, history: History, seed: int, shards: int) -> None:
        self.url = url
        self.history = history
        self.seed = seed
        self.stop = threading.Event()  # the producers and consumers
        self.watching = threading.Event()  # the watchers (they stop last)
        self.probing = threading.Event()
        self.threads: list[threading.Thread] = []
        self.probe_queues = _probe_queues(shards)
        self.errors: list[str] = []
        self.finals: dict[str, int] = {}  # each key's final version, once the workload stopped
        self.probed_ok: dict[int, int] = {}  # shard → when its last good probe was sent, ms

    def client(self, retries: RetryPolicy = RETRIES, timeout: float = 10.0) -> Client:
        return Client(self.url, retries=retries, timeout=timeout)

    def setup(self) -> None:
        with self.client() as c:
            c.create_queue(STD, visibility_timeout=VT)
            c.create_queue(FIFO, visibility_timeout=VT, fifo=True)
            c.create_queue(DLQ, visibility_timeout=VT)
            c.create_queue(
                SRC, visibility_timeout=VT, max_receives=MAX_RECEIVES, dead_letter_queue=DLQ
            )
            for q in self.probe_queues.values():
                c.create_queue(q, visibility_timeout=VT)

    def start(self) -> None:
        plan: list[tuple[str, Callable[[str, random.Random], None]]] = [
            ("p0", self.producer),
            ("p1", self.producer),
            ("c0", self.consumer),
            ("c1", self.consumer),
            ("f0", self.fifo_producer),
            ("fc0", self.fifo_consumer),
            ("fc1", self.fifo_consumer),
            ("d0", self.dl_producer),
            ("dc0", self.dl_consumer),
            ("dq0", self.dlq_consumer),
            ("k0", self.key_writer),
        ]
        for i in range(2):
            for key in [*USER_KEYS, *QUEUE_KEYS]:
                plan.append((f"watch{i}:{key}", self._watcher(key)))
        for shard, q in self.probe_queues.items():
            plan.append((f"probe{shard}", self._prober(shard, q)))
        for n, (name, target) in enumerate(plan):
            rng = random.Random(f"{self.seed}:{n}")
            t = threading.Thread(target=self._guard, args=(name, target, rng), name=name)
            t.start()
            self.threads.append(t)

    def _guard(self, name: str, target: Callable[[str, random.Random], None], rng: Any) -> None:
        try:
            target(name, rng)
        except Exception as exc:  # a bug of the workload: the run is not valid
            self.errors.append(f"{name}: {exc!r}")
            raise

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            if not t.name.startswith(("watch", "probe")):
                t.join()

    def end(self) -> None:
        self.probing.set()
        self.watching.set()
        for t in self.threads:
            t.join()

    # -- producers

    def producer(self, w: str, rng: random.Random) -> None:
        n = 0
        with self.client() as c:
            retry: Rec | None = None
            while not self.stop.is_set():
                if retry is not None:
                    toks, keys, delays = retry.toks, retry.keys, retry.delays
                else:
                    size = rng.randint(1, 20)
                    toks = [f"{w}-{n + i}" for i in range(size)]
                    n += size
                    keyed = rng.random() < 0.5
                    keys = [f"key-{t}" if keyed else None for t in toks]
                    delay = rng.randint(200, 2000) if rng.random() < 0.2 else 0
                    delays = [delay] * size
                rec = self._put(c, w, STD, toks, keys, delays, auto_key=keys[0] is not None)
                retry = rec if rec.err and keys[0] is not None and rng.random() < 0.5 else None
                time.sleep(rng.uniform(0.02, 0.1))

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

    def fifo_producer(self, w: str, rng: random.Random) -> None:
        seq = [0] * GROUPS
        with self.client() as c:
            while not self.stop.is_set():
                g = rng.randrange(GROUPS)
                tok = f"{w}-g{g}-{seq[g]}"
                while not self.stop.is_set():
                    rec = self._put(
                        c, w, FIFO, [tok], [f"key-{tok}"], [0], auto_key=True,
                        groups=[f"g{g}"], seqs=[seq[g]],
                    )  # fmt: skip
                    if rec.err is None:
                        break
                    time.sleep(0.1)
                seq[g] += 1
                time.sleep(rng.uniform(0.01, 0.05))

    def dl_producer(self, w: str, rng: random.Random) -> None:
        n = 0
        with self.client() as c:
            while not self.stop.is_set():
                size = rng.randint(1, 5)
                toks = [f"{w}-{n + i}" for i in range(size)]
                n += size
                self._put(c, w, SRC, toks, [f"key-{t}" for t in toks], [0] * size, auto_key=True)
                time.sleep(rng.uniform(0.1, 0.3))

    # -- consumers

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

    def consumer(self, w: str, rng: random.Random) -> None:
        with self.client() as c:
            while not self.stop.is_set():
                for m in self._take(c, w, STD, rng.choice((1, 5, 50, 1000))):
                    r = rng.random()
                    if r < 0.6:
                        self._end(c, w, STD, "ack", m)
                    elif r < 0.7:
                        self._end(c, w, STD, "release", m, rng.randint(0, 1000))
                    elif r < 0.78:
                        self._end(c, w, STD, "resched", m, rng.randint(100, 800))
                    elif r < 0.86:
                        if not m.body.endswith(b"+p") and self._patch(c, w, STD, m):
                            m = msgspec.structs.replace(m, body=m.body + b"+p")
                        self._end(c, w, STD, "ack", m)
                    # else: dropped, its lease expires

    def fifo_consumer(self, w: str, rng: random.Random) -> None:
        with self.client() as c:
            while not self.stop.is_set():
                dropped: set[str | None] = set()
                for m in self._take(c, w, FIFO, rng.randint(1, 10)):
                    if m.group in dropped or rng.random() < 0.05:
                        dropped.add(m.group)  # the rest of the group's batch expires too
                        continue
                    self._end(c, w, FIFO, "ack", m)

    def dl_consumer(self, w: str, rng: random.Random) -> None:
        with self.client() as c:
            while not self.stop.is_set():
                for m in self._take(c, w, SRC, 10):
                    if rng.random() < 0.8:
                        self._end(c, w, SRC, "release", m)

    def dlq_consumer(self, w: str, rng: random.Random) -> None:
        with self.client() as c:
            while not self.stop.is_set():
                for m in self._take(c, w, DLQ, 100):
                    self._end(c, w, DLQ, "ack", m)

    # -- keys and watches

    def key_writer(self, w: str, rng: random.Random) -> None:
        n = 0
        with self.client() as c:
            while not self.stop.is_set():
                key = rng.choice(USER_KEYS)
                rec = Rec(op="set", w=w, key=key, t0=now_ms())
                try:
                    rec.version = c.set_key(key, n)
                except QueueError as exc:
                    rec.err = _code(exc)
                rec.t1 = now_ms()
                self.history.add(rec)
                n += 1
                time.sleep(rng.uniform(0.02, 0.1))

    def final_keys(self) -> dict[str, int]:
        """Each watched key's version now (after the workload stopped): a ``get`` record."""
        out = {}
        with self.client() as c:
            for key in [*USER_KEYS, *QUEUE_KEYS]:
                rec = Rec(op="get", key=key, t0=now_ms())
                rec.version = c.get_key(key).version
                rec.t1 = now_ms()
                self.history.add(rec)
                out[key] = rec.version
        self.finals.update(out)
        return out

    def _watcher(self, key: str) -> Callable[[str, random.Random], None]:
        def watch(w: str, rng: random.Random) -> None:
            version = 0
            with self.client() as c:
                while not self.watching.is_set():
                    final = self.finals.get(key)
                    if final is not None and version >= final:
                        return  # caught up with the key's final version
                    rec = Rec(op="watch", w=w, key=key, t0=now_ms())
                    try:
                        kv = c.watch(key, version, wait=1.0)
                    except QueueError as exc:
                        rec.err = _code(exc)
                        time.sleep(0.1)
                        continue
                    if kv is None:
                        continue  # no change within the wait: subscribe again
                    rec.version, rec.t1 = kv.version, now_ms()
                    self.history.add(rec)
                    version = kv.version

        return watch

    def watchers_caught_up(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(not t.is_alive() for t in self.threads if t.name.startswith("watch")):
                return True
            time.sleep(0.2)
        return False

    # -- probes

    def _prober(self, shard: int, q: str) -> Callable[[str, random.Random], None]:
        def probe(w: str, rng: random.Random) -> None:
            with self.client(RetryPolicy(retries=0), timeout=2.0) as c:
                while not self.probing.is_set():
                    rec = Rec(op="probe", w=w, q=q, target=str(shard), t0=now_ms())
                    try:
                        c.put(q, b"probe")
                        for m in c.take(q, 10):
                            c.ack(q, m)
                    except QueueError as exc:
                        rec.err = _code(exc)
                    rec.t1 = now_ms()
                    self.history.add(rec)
                    if rec.err is None:
                        self.probed_ok[shard] = rec.t0
                    time.sleep(0.1)

        return probe

    # -- the drain

    def drain(self) -> dict[str, int]:
        """Take what is left of every queue (the dead-letter source by releasing until its
        messages have moved), as takes and acks in the history."""
        time.sleep(VT + 2.5)  # leases and delays run out
        left = {}
        with self.client() as c:
            for q in (STD, FIFO, SRC, DLQ):
                left[q] = self._drain_queue(c, q)
        return left

    def _drain_queue(self, c: Client, q: str) -> int:
        taken, empty = 0, 0
        deadline = time.monotonic() + 120
        while empty < 3 and time.monotonic() < deadline:
            got = self._take(c, "drain", q, 1000, wait=0.5)
            for m in got:
                self._end(c, "drain", q, "release" if q == SRC else "ack", m)
            taken += len(got)
            stats = c.get_queue(q).stats
            empty = empty + 1 if not got and (stats is None or stats.total == 0) else 0
        return taken


def _probe_queues(shards: int, prefix: str = "chaos-probe") -> dict[int, str]:
    """A probe queue on each shard (or another queue per shard, named ``prefix-<n>``)."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < shards:
        name = f"{prefix}-{n}"
        found.setdefault(placement(name, shards), name)
        n += 1
    return found
