"""Per-queue counters a queue keeps while it runs, and the snapshot of them a shard hands to
the gateway for ``/metrics``. Plain data: no Prometheus here (the gateway renders it)."""

from __future__ import annotations

import bisect

import msgspec

__all__ = [
    "DURABLE_BUCKETS_S",
    "IN_QUEUE_BUCKETS_S",
    "RECEIVE_BUCKETS",
    "Histogram",
    "QueueCounters",
    "QueueMetrics",
]

DURABLE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RECEIVE_BUCKETS = (1, 2, 3, 5, 10, 25, 100)
# From a put to its ack: from work done at once to work deferred for days (retention: 4 d).
IN_QUEUE_BUCKETS_S = (0.01, 0.05, 0.25, 1, 5, 15, 60, 300, 900, 3600, 14400, 86400, 345600)


class Histogram(msgspec.Struct):
    """Counts per upper bound (the last slot is +Inf), their sum and count."""

    bounds: tuple[float, ...]
    counts: list[int]
    sum: float = 0.0
    count: int = 0

    @classmethod
    def of(cls, bounds: tuple[float, ...]) -> Histogram:
        """An empty histogram with these upper bounds."""
        return cls(bounds, [0] * (len(bounds) + 1))

    def observe(self, value: float) -> None:
        """Count one value."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


class QueueCounters:
    """What a running queue counts (since this incarnation started)."""

    __slots__ = ("durable", "in_queue", "receives", "released", "taken")

    def __init__(self) -> None:
        self.taken = 0
        self.released = 0
        self.receives = Histogram.of(RECEIVE_BUCKETS)  # receive count of each delivery
        self.durable = Histogram.of(DURABLE_BUCKETS_S)  # command → its events durable
        self.in_queue = Histogram.of(IN_QUEUE_BUCKETS_S)  # put → ack of each acked message


class QueueMetrics(msgspec.Struct, kw_only=True):
    """One queue's figures at one moment."""

    queue: str
    ready: int
    delayed: int
    reserved: int
    oldest_ready_age_s: float | None
    enqueued: int
    acked: int
    dead_lettered: int
    expired: int
    purged: int
    taken: int
    released: int
    receives: Histogram
    durable: Histogram
    log_bytes: int
    log_segments: int
    snapshot_age_s: float | None
    recovery_s: float  # the last recovery of the queue's shard (its log read before serving)
    # Appended with a default: a gateway and shards of different versions still agree.
    in_queue: Histogram | None = None
    spilled: int | None = None  # messages held in runs (actors/core/runs.py), not as objects
    paused: int | None = None  # 1: takes hand out nothing (POST /v1/queues/{name}/pause)
