"""Producers and consumers on one SQS queue, through boto3, with the truth kept beside them.

People build autoscaling on ``ApproximateNumberOfMessages*``, so these must be right: at a
quiet point (every thread paused, every delay that was short come due) they must equal what
the clients know the queue holds, exactly; while the threads run they must stay within what
can be true at all. The threads' randomness is seeded (``Load.seed``, shown on failure).

The truth is a state per message id, written after each call returns:

- a send records ``visible``, ``soon`` (a short delay, with when it is due at the latest) or
  ``delayed`` (a delay longer than the test): only if no receive recorded the id first;
- a receive records ``inflight`` (under a visibility timeout longer than the test) with its
  handle;
- a delete records ``deleted``; a release (visibility 0) records ``visible`` unless another
  receive of the message recorded a newer handle meanwhile.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.sqs_clients.scenarios import counts

__all__ = ["Load", "Truth"]

Sqs = Any
SHORT_DELAY_S = 1
LONG_DELAY_S = 900
VISIBILITY_S = 600


class Truth:
    """What the queue holds, as the clients know it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state: dict[str, str] = {}
        self.due: dict[str, float] = {}  # soon → when it is due at the latest (monotonic)
        self.handle: dict[str, str] = {}  # inflight → the handle of its newest receive
        self.attempted = 0  # messages whose send began
        self.confirmed = 0  # messages whose send answered
        self.delete_attempts = 0  # deletes begun
        self.kept_long = 0  # delayed sends answered (they stay delayed)

    def sending(self, n: int) -> None:
        with self.lock:
            self.attempted += n

    def sent(self, ids: list[tuple[str, int]]) -> None:
        """Sends answered: (id, delay)."""
        now = time.monotonic()
        with self.lock:
            self.confirmed += len(ids)
            for mid, delay in ids:
                if delay >= LONG_DELAY_S:
                    self.kept_long += 1
                if mid in self.state:
                    continue  # received (and maybe deleted) before the send's reply came
                if delay == 0:
                    self.state[mid] = "visible"
                elif delay >= LONG_DELAY_S:
                    self.state[mid] = "delayed"
                else:
                    self.state[mid] = "soon"
                    self.due[mid] = now + delay

    def received(self, messages: list[dict[str, Any]]) -> None:
        with self.lock:
            for m in messages:
                self.state[m["MessageId"]] = "inflight"
                self.handle[m["MessageId"]] = m["ReceiptHandle"]

    def deleting(self, n: int) -> None:
        with self.lock:
            self.delete_attempts += n

    def deleted(self, ids: list[str]) -> None:
        with self.lock:
            for mid in ids:
                self.state[mid] = "deleted"

    def released(self, messages: list[dict[str, Any]]) -> None:
        with self.lock:
            for m in messages:
                if self.handle.get(m["MessageId"]) == m["ReceiptHandle"]:
                    self.state[m["MessageId"]] = "visible"

    def last_due(self) -> float:
        with self.lock:
            soon = [self.due[m] for m, s in self.state.items() if s == "soon"]
        return max(soon, default=0.0)

    def expected(self) -> list[int]:
        """[visible, in flight, delayed] at a quiet point, short delays come due."""
        with self.lock:
            n = Counter(self.state.values())
        return [n["visible"] + n["soon"], n["inflight"], n["delayed"]]


class Load:
    """``producers`` and ``consumers`` threads on ``url``, each with a client of its own."""

    def __init__(
        self, client: Callable[[], Sqs], url: str, *, producers: int, consumers: int, seed: int
    ) -> None:
        self.url, self.seed = url, seed
        self.truth = Truth()
        self.errors: list[BaseException] = []
        self._pausing = threading.Event()
        self.producing = threading.Event()  # clear: the producers idle, the queue drains
        self.producing.set()
        self._stopping = threading.Event()
        roles = [self._produce] * producers + [self._consume] * consumers
        self._barrier = threading.Barrier(len(roles) + 1)
        self._threads = [
            threading.Thread(
                target=self._run,
                args=(role, client(), random.Random(seed * 1000 + i)),
                name=f"sqs-load-{i}",
                daemon=True,
            )
            for i, role in enumerate(roles)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Every thread paused (between two calls) for the block."""
        self._pausing.set()
        self._wait()
        try:
            yield
        finally:
            self._pausing.clear()
            self._wait()

    def _wait(self) -> None:
        try:
            self._barrier.wait(timeout=60)
        except threading.BrokenBarrierError:
            self.check_errors()  # a thread failed: its error, not the barrier's
            raise

    def stop(self) -> None:
        self._stopping.set()
        for t in self._threads:
            t.join(timeout=60)

    def check_errors(self) -> None:
        if self.errors:
            raise AssertionError(f"a load thread failed (seed {self.seed})") from self.errors[0]

    def _run(
        self, role: Callable[[Sqs, random.Random], None], sqs: Sqs, rng: random.Random
    ) -> None:
        try:
            while not self._stopping.is_set():
                if self._pausing.is_set():
                    self._barrier.wait(timeout=60)  # arrived
                    self._barrier.wait(timeout=60)  # released
                    continue
                role(sqs, rng)
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            self.errors.append(exc)
            self._barrier.abort()
        finally:
            sqs.close()

    def _produce(self, sqs: Sqs, rng: random.Random) -> None:
        time.sleep(rng.uniform(0, 0.01))
        if not self.producing.is_set():
            return
        n = rng.randint(1, 10)
        delays = [rng.choices([0, SHORT_DELAY_S, LONG_DELAY_S], [6, 2, 1])[0] for _ in range(n)]
        self.truth.sending(n)
        if n == 1:
            reply = sqs.send_message(QueueUrl=self.url, MessageBody="m", DelaySeconds=delays[0])
            self.truth.sent([(reply["MessageId"], delays[0])])
            return
        entries = [
            {"Id": str(i), "MessageBody": f"m{i}", "DelaySeconds": d} for i, d in enumerate(delays)
        ]
        reply = sqs.send_message_batch(QueueUrl=self.url, Entries=entries)
        assert not reply.get("Failed"), reply["Failed"]
        self.truth.sent([(e["MessageId"], delays[int(e["Id"])]) for e in reply["Successful"]])

    def _consume(self, sqs: Sqs, rng: random.Random) -> None:
        got = sqs.receive_message(
            QueueUrl=self.url,
            MaxNumberOfMessages=rng.randint(1, 10),
            VisibilityTimeout=VISIBILITY_S,
        ).get("Messages", [])
        self.truth.received(got)
        if not got:
            time.sleep(0.02)
            return
        fate: dict[str, list[dict[str, Any]]] = {"delete": [], "release": [], "keep": []}
        for m in got:
            fate[rng.choices(list(fate), [7, 2, 1])[0]].append(m)
        self._delete(sqs, rng, fate["delete"])
        self._release(sqs, fate["release"])

    def _delete(self, sqs: Sqs, rng: random.Random, messages: list[dict[str, Any]]) -> None:
        if not messages:
            return
        self.truth.deleting(len(messages))
        if len(messages) == 1 or rng.random() < 0.5:
            for m in messages:
                sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])
        else:
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ]
            reply = sqs.delete_message_batch(QueueUrl=self.url, Entries=entries)
            assert not reply.get("Failed"), reply["Failed"]
        self.truth.deleted([m["MessageId"] for m in messages])

    def _release(self, sqs: Sqs, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            sqs.change_message_visibility(
                QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
            )
        self.truth.released(messages)

    def check_bounds(self, sqs: Sqs) -> list[int]:
        """One look at the counters while the threads run: never negative, never more than
        was sent, and never less than what cannot have left."""
        with self.truth.lock:
            floor_total = self.truth.confirmed
            floor_delayed = self.truth.kept_long
        got = counts(sqs, self.url)
        with self.truth.lock:
            ceiling = self.truth.attempted
            floor_total -= self.truth.delete_attempts
        assert min(got) >= 0, (got, self.seed)
        assert sum(got) <= ceiling, (got, ceiling, self.seed)
        assert sum(got) >= floor_total, (got, floor_total, self.seed)
        assert got[2] >= floor_delayed, (got, floor_delayed, self.seed)
        return got
