"""The worker loops of the chaos campaign's workload (``loadtest/chaos_workload.py``):
producers and consumers of the standard, FIFO and dead-letter queues, a key writer,
watchers, one prober per shard. Each runs until its event is set, through the recorded
operations of :class:`chaos_ops.Ops`.

Imported as a sibling module (``python loadtest/chaos.py`` puts ``loadtest/`` first on
``sys.path``).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import msgspec
from chaos_check import Rec
from chaos_ops import DLQ, FIFO, GROUPS, SRC, STD, USER_KEYS, History, Ops, _code, now_ms

from actors.errors import QueueError
from evq.client_wire import RetryPolicy

__all__ = ["Workers"]


class Workers(Ops):
    """The loops a workload's threads run (``(name, rng) -> None`` each)."""

    def __init__(self, url: str, history: History) -> None:
        super().__init__(url, history)
        self.stop = threading.Event()  # the producers and consumers
        self.watching = threading.Event()  # the watchers (they stop last)
        self.probing = threading.Event()
        self.finals: dict[str, int] = {}  # each key's final version, once the workload stopped
        self.probed_ok: dict[int, int] = {}  # shard → when its last good probe was sent, ms

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

    def consumer(self, w: str, rng: random.Random) -> None:
        with self.client() as c:
            while not self.stop.is_set():
                got = self._take(c, w, STD, rng.choice((1, 5, 50, 1000)))
                if len(got) > 1 and rng.random() < 0.1:  # backs off: all of it, one call
                    self._release_all(c, w, STD, got, rng.randint(1, 1000))
                    continue
                for m in got:
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
