"""The mixed workload of the chaos campaign (``loadtest/chaos.py``): :class:`Workload`
starts its threads (producers, consumers, the FIFO and dead-letter queues, a key writer,
watchers, one probe per shard), stops them, reads the keys' final versions and drains the
queues at the end. The loops are in ``chaos_workers.py``; the recorded operations, the
:class:`History` they record into (a :class:`chaos_check.Rec` per operation) and the
workload's constants (queue names, lease, ``max_receives``, FIFO groups, keys, the clients'
retries) in ``chaos_ops.py``.

Imported as a sibling module (``python loadtest/chaos.py`` puts ``loadtest/`` first on
``sys.path``).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from chaos_check import Rec
from chaos_ops import (
    DLQ,
    FIFO,
    MAX_RECEIVES,
    QUEUE_KEYS,
    SRC,
    STD,
    USER_KEYS,
    VT,
    History,
    now_ms,
)
from chaos_workers import Workers

from actors.log.shard_recovery import placement
from evq.client import Client

__all__ = ["Workload"]

# How long the drain may take a queue (acks of a thousand at a time: ~10 s for 200,000 left
# by a long campaign whose consumers fell behind).
DRAIN_S = 600.0


class Workload(Workers):
    """The threads of the mixed workload (see ``loadtest/chaos.py``'s doc)."""

    def __init__(self, url: str, history: History, seed: int, shards: int) -> None:
        super().__init__(url, history)
        self.seed = seed
        self.threads: list[threading.Thread] = []
        self.probe_queues = _probe_queues(shards)
        self.errors: list[str] = []

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
            # daemon: a campaign stopped by a signal must not wait for a stuck client
            t = threading.Thread(
                target=self._guard, args=(name, target, rng), name=name, daemon=True
            )
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

    def watchers_caught_up(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(not t.is_alive() for t in self.threads if t.name.startswith("watch")):
                return True
            time.sleep(0.2)
        return False

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
        """Take (and ack, or release) until the queue is empty three times in a row.

        Raises:
            RuntimeError: it was not empty after ``DRAIN_S``: what is left would count as
                lost, so the run stops here instead (its history says how far it got).
        """
        taken, empty = 0, 0
        deadline = time.monotonic() + DRAIN_S
        while empty < 3:
            if time.monotonic() > deadline:
                stats = c.get_queue(q).stats
                raise RuntimeError(
                    f"{q} not drained in {DRAIN_S:.0f} s: {taken} taken, {stats.total} left"
                )
            got = self._take(c, "drain", q, 1000, wait=0.5)
            if q == SRC:  # released one by one until its messages move to the dead letters
                for m in got:
                    self._end(c, "drain", q, "release", m)
            elif got:
                self._ack_all(c, "drain", q, got)
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
