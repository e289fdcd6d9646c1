"""What the simulated clients send: the mix of message sizes, batch sizes, delays and
attributes, and the queues they use.

Not a locustfile itself: the locustfiles beside it import it (Locust puts their folder on
``sys.path``). Pure: it does not import Locust (whose import patches the standard library
for gevent), so tests/loadtest checks it in an ordinary process. Everything random comes
from a ``random.Random`` per user, seeded from ``EVQ_LOADTEST_SEED`` and the user's number,
so a run's mix can be repeated.

The mix (per message unless said):

- size 1 B to 1 MiB, log-uniform within buckets: 40 % up to 64 B, 35 % up to 1 KiB, 20 % up to
  16 KiB, 4.5 % up to 256 KiB, 0.45 % below 1 MiB and 0.05 % exactly 1 MiB (1 B is 6.6 %);
- per request 1 message (60 %), 2-10 (30 %), 11-100 (9 %), 101-1000 (1 %), cut so that a
  request carries at most 1 MiB of bodies (a 1 MiB message travels alone);
- no delay (85 %), a retry-like delay of 1-60 s (10 %), a schedule 5-60 min ahead (5 %);
- 20 % carry 1-3 attributes, 10 % an idempotency key.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import string
from typing import Any

__all__ = [
    "BODY_LIMIT",
    "QUEUES",
    "batch_label",
    "new_messages",
    "pick_queue",
    "user_random",
]

MIB = 1024 * 1024
BODY_LIMIT = MIB  # bodies per request, at most
QUEUE_COUNT = int(os.environ.get("EVQ_LOADTEST_QUEUES", "16"))
QUEUE_PREFIX = os.environ.get("EVQ_LOADTEST_PREFIX", "lt")
QUEUES = [f"{QUEUE_PREFIX}-{i}" for i in range(QUEUE_COUNT)]
SEED = int(os.environ.get("EVQ_LOADTEST_SEED", "20261122"))

# (low, high) bytes and weight: log-uniform inside each bucket.
SIZE_BUCKETS = [((1, 64), 40.0), ((65, 1024), 35.0), ((1025, 16 * 1024), 20.0)]
SIZE_BUCKETS += [((16 * 1024 + 1, 256 * 1024), 4.5), ((256 * 1024 + 1, MIB - 1), 0.45)]
SIZE_BUCKETS += [((MIB, MIB), 0.05)]  # the largest message, exactly
BATCH_BUCKETS = [((1, 1), 60.0), ((2, 10), 30.0), ((11, 100), 9.0), ((101, 1000), 1.0)]

_users = itertools.count()
# One random megabyte per process; bodies are slices of it (cheap, still incompressible).
_rng = random.Random(SEED)
_BLOCK = "".join(_rng.choices(string.ascii_letters + string.digits, k=MIB + 1024))


def user_random() -> random.Random:
    """A generator for one simulated user (seeded: a run's mix can be repeated)."""
    return random.Random(f"{SEED}-{os.getpid()}-{next(_users)}")


def _bucket(rng: random.Random, buckets: list[tuple[tuple[int, int], float]]) -> tuple[int, int]:
    ranges, weights = zip(*buckets, strict=True)
    return rng.choices(ranges, weights)[0]


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return min(high, max(low, int(math.exp(rng.uniform(math.log(low), math.log(high + 1))))))


def message_size(rng: random.Random) -> int:
    """Bytes of one message body."""
    return _log_uniform(rng, *_bucket(rng, SIZE_BUCKETS))


def batch_size(rng: random.Random) -> int:
    """Messages in one put request (before the byte cap)."""
    return _log_uniform(rng, *_bucket(rng, BATCH_BUCKETS))


def batch_label(n: int) -> str:
    """The request's name in Locust's statistics, by batch size."""
    for low, high in (r for r, _ in BATCH_BUCKETS):
        if n <= high:
            return f"{low}" if low == high else f"{low}-{high}"
    return "1000+"


def delay_s(rng: random.Random) -> float:
    """Seconds before the message becomes ready."""
    roll = rng.random()
    if roll < 0.85:
        return 0.0
    if roll < 0.95:
        return rng.uniform(1, 60)
    return rng.uniform(300, 3600)


def body(rng: random.Random, size: int) -> str:
    """An ASCII body of ``size`` bytes."""
    start = rng.randrange(len(_BLOCK) - size + 1)
    return _BLOCK[start : start + size]


def new_messages(
    rng: random.Random, *, limit: int = 1000, body_limit: int = BODY_LIMIT
) -> list[dict[str, Any]]:
    """One request's messages in the native API's shape (``delay`` in seconds)."""
    wanted = min(limit, batch_size(rng))
    messages: list[dict[str, Any]] = []
    total = 0
    for _ in range(wanted):
        size = min(message_size(rng), body_limit)
        if messages and total + size > body_limit:
            break
        total += size
        message: dict[str, Any] = {"body": body(rng, size)}
        delay = delay_s(rng)
        if delay:
            message["delay"] = round(delay, 3)
        if rng.random() < 0.2:
            message["attributes"] = {
                f"a{i}": rng.choice(["billing", "email", "resize", "42", "eu-west"])
                for i in range(rng.randint(1, 3))
            }
        if rng.random() < 0.1:
            message["idempotency_key"] = f"k-{rng.getrandbits(64):016x}"
        messages.append(message)
    return messages


def pick_queue(rng: random.Random) -> str:
    """A queue, a few of them hotter than the rest (Zipf-like)."""
    weights = [1.0 / (i + 1) for i in range(len(QUEUES))]
    return rng.choices(QUEUES, weights)[0]
