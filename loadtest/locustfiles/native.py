"""Producers and consumers of evq's native API (``FastHttpUser``: Locust's lean HTTP client).

Run alone, e.g. 50 producers and 50 consumers for a minute against a local server::

    locust -f loadtest/locustfiles/native.py --headless -u 100 -r 20 -t 60s \\
        --host http://127.0.0.1:8700

Producers put batches (the mix of :mod:`mix`) and think 1-10 s between requests, as many
independent services each sending now and then. Consumers long-poll a take (mostly
``wait`` 20 s), "work" on what they got for a while, then ack it in one request; a few
release a message for a later retry or let its lease run out (so it is delivered again).
Queues are created on each process's first use (``PUT`` answers 200 when they exist).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

import fleet_counters
import gevent
import gevent.lock
import mix
from locust import FastHttpUser, between, constant, task

TAKE_MAX = [(1, 20.0), (10, 60.0), (100, 20.0)]  # messages per take, weight
VISIBILITY_S = 30
_created: set[str] = set()  # queues this process has made sure of
_creating = gevent.lock.Semaphore()  # the first user of a process creates, the others wait


def _ensure_queues(client: Any) -> None:
    with _creating:
        for queue in mix.QUEUES:
            if queue not in _created:
                _create(client, queue)


def _create(client: Any, queue: str) -> None:
    url = f"/v1/queues/{queue}"
    with client.put(url, json={}, name="create queue", catch_response=True) as r:
        if r.status_code in (200, 201):
            _created.add(queue)
            r.success()
        else:
            r.failure(f"create {queue}: {r.status_code} {(r.text or '')[:200]}")


class ProducerBase(FastHttpUser):
    """Puts batches of the mix into the queues."""

    abstract = True
    wait_time = between(1, 10)
    network_timeout = 60.0
    connection_timeout = 10.0

    def on_start(self) -> None:
        """Seed this user and make sure the queues exist."""
        self.rng: random.Random = mix.user_random()
        _ensure_queues(self.client)

    @task
    def put(self) -> None:
        """One put request of 1-1000 messages."""
        queue = mix.pick_queue(self.rng)
        messages = mix.new_messages(self.rng)
        name = f"put [{mix.batch_label(len(messages))}]"
        url = f"/v1/queues/{queue}/messages"
        with self.client.post(
            url, json={"messages": messages}, name=name, catch_response=True
        ) as r:
            if r.status_code != 200:
                r.failure(f"{r.status_code} {(r.text or '')[:200]}")
                return
            fleet_counters.count(put=len(messages), bytes_put=sum(len(m["body"]) for m in messages))
            r.success()


class ConsumerBase(FastHttpUser):
    """Takes, works, acks (or releases, or lets the lease expire)."""

    abstract = True
    wait_time = constant(0)  # a consumer's pace is its long poll and its work
    network_timeout = 60.0
    connection_timeout = 10.0
    work_mean_s: ClassVar[float] = 0.2  # per taken batch

    def on_start(self) -> None:
        """Seed this user and make sure the queues exist."""
        self.rng: random.Random = mix.user_random()
        _ensure_queues(self.client)

    @task
    def consume(self) -> None:
        """One take (long poll), the work, then ack/release."""
        queue = mix.pick_queue(self.rng)
        ranges, weights = zip(*TAKE_MAX, strict=True)
        wanted = self.rng.choices(ranges, weights)[0]
        wait = 20 if self.rng.random() < 0.8 else self.rng.choice([0, 1, 5])
        doc = {"max": wanted, "wait": wait, "visibility_timeout": VISIBILITY_S}
        with self.client.post(
            f"/v1/queues/{queue}/take", json=doc, name=f"take [wait {wait}]", catch_response=True
        ) as r:
            if r.status_code != 200:
                r.failure(f"{r.status_code} {(r.text or '')[:200]}")
                return
            messages = r.json()["messages"]
            r.success()
        if not messages:
            return
        fleet_counters.count(taken=len(messages), bytes_taken=sum(len(m["body"]) for m in messages))
        gevent.sleep(self.rng.expovariate(1 / self.work_mean_s))
        self._settle(queue, messages)

    def _settle(self, queue: str, messages: list[dict[str, Any]]) -> None:
        acks, releases = [], []
        for m in messages:
            roll = self.rng.random()
            item = {"id": m["id"], "lease": m["lease"]}
            if roll < 0.95:
                acks.append(item)
            elif roll < 0.99:
                releases.append({**item, "delay": self.rng.choice([1, 5, 30])})
            # else: the lease runs out and the message comes back by itself
        for verb, items in (("ack", acks), ("release", releases)):
            if not items:
                continue
            url = f"/v1/queues/{queue}/{verb}"
            with self.client.post(url, json={"items": items}, name=verb, catch_response=True) as r:
                if r.status_code != 200:
                    r.failure(f"{r.status_code} {(r.text or '')[:200]}")
                    continue
                ok = sum(1 for x in r.json()["results"] if x["status"] == "ok")
                fleet_counters.count(**{"acked" if verb == "ack" else "released": ok})
                r.success()


class NativeProducer(ProducerBase):
    """A producer of the native API."""


class NativeConsumer(ConsumerBase):
    """A consumer of the native API."""
