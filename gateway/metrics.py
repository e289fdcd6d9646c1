"""``GET /metrics`` in Prometheus text format (prometheus-client).

Gateway figures are kept here as requests pass (requests by route and status, latency
histograms, watchers, batch sizes toward the shards, dropped log records). Queue figures live
in the shards: a scrape asks every shard for its queues' figures (one call per shard) and
renders them — messages by state, puts, takes, acks, releases, dead letters, oldest ready
age, receive counts, time to durable, time in queue (put to ack), log bytes and commits,
snapshot age, recovery time — and every shard for its log's writes (commits, records, bytes,
segments held) and its last recovery's duration.
With several gateway processes, each answers for its own requests and watchers and for every
queue (the queue figures are the same from any process).

A feature with figures of its own registers them with :func:`register_gauge` when it is
installed (the watches register their watchers and upstream keys): this module imports no
feature to read its state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from actors.metrics import Histogram as PlainHistogram
from actors.metrics import QueueMetrics
from actors.status import ShardStatus
from gateway import limits, logs, native

__all__ = ["GAUGES", "METRICS", "GatewayMetrics", "LiveGauge", "install", "register_gauge"]

_LONG_LIVED = ("/v1/ws", "/v1/watch/{key}")
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class GatewayMetrics:
    """The registry of one gateway process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "evq_http_requests",
            "HTTP requests answered, by route, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "evq_http_request_duration_seconds",
            "Time to answer a request (not WebSockets and long polls), by route",
            ["route", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._queues: list[QueueMetrics] = []
        self._shards: list[ShardStatus] = []
        self._app: web.Application | None = None
        self.registry.register(_Live(self))

    def observe(self, route: str, method: str, status: int, seconds: float | None) -> None:
        """One answered request (labels resolved once per route, method and status)."""
        key = (route, method, status)
        children = self._children.get(key)
        if children is None:
            children = (
                self.requests.labels(route, method, str(status)),
                self.latency.labels(route, method),
            )
            self._children[key] = children
        children[0].inc()
        if seconds is not None:
            children[1].observe(seconds)

    def render(
        self, app: web.Application, queues: list[QueueMetrics], shards: list[ShardStatus]
    ) -> bytes:
        self._app, self._queues, self._shards = app, queues, shards
        return generate_latest(self.registry)


class _Live(Collector):
    """Figures read at scrape time."""

    def __init__(self, owner: GatewayMetrics) -> None:
        self.owner = owner

    def collect(self) -> Iterator[Metric]:
        app = self.owner._app
        if app is None:
            return
        yield from _registered_families(app)
        yield from _gateway_families(app)
        yield from _queue_families(self.owner._queues)
        yield from _shard_families(self.owner._shards)


# What a registered gauge's ``read()`` gives: its value, or its value for each tuple of
# label values (in the order of the gauge's ``labels``).
Reading = float | Mapping[tuple[str, ...], float]


class LiveGauge(NamedTuple):
    """A gauge a feature registered, read at scrape time."""

    name: str
    text: str
    read: Callable[[], Reading]
    labels: tuple[str, ...] = ()


# The gauges features registered on an app, in the order they did (a list of LiveGauge).
GAUGES = web.AppKey("metric_gauges", list)


def register_gauge(
    app: web.Application,
    name: str,
    text: str,
    read: Callable[[], Reading],
    labels: Sequence[str] = (),
) -> None:
    """Export a gauge of ``app``'s: ``read()`` gives its value at each scrape, or, with
    ``labels``, a mapping of label values to values (registered before or after
    :func:`install`)."""
    app.setdefault(GAUGES, []).append(LiveGauge(name, text, read, tuple(labels)))


def _registered_families(app: web.Application) -> Iterator[Metric]:
    for gauge in app.get(GAUGES, ()):
        reading = gauge.read()
        if not isinstance(reading, Mapping):
            yield GaugeMetricFamily(gauge.name, gauge.text, value=reading)
            continue
        g = GaugeMetricFamily(gauge.name, gauge.text, labels=list(gauge.labels))
        for values, value in reading.items():
            g.add_metric(list(values), value)
        yield g


def _gateway_families(app: web.Application) -> Iterator[Metric]:
    stats = app[native.BATCHERS].stats
    yield CounterMetricFamily(
        "evq_shard_calls", "Calls from this gateway toward the shards", value=stats.calls
    )
    h = HistogramMetricFamily(
        "evq_shard_call_commands", "Commands per call toward the shards (batch sizes)"
    )
    buckets, running = [], 0
    for bound, n in zip(stats.BUCKETS, stats.sizes, strict=True):
        running += n
        buckets.append((str(bound), running))
    buckets.append(("+Inf", stats.calls))
    h.add_metric([], buckets, sum_value=stats.commands)
    yield h
    refusals = app.get(limits.PENALTIES)
    if refusals is not None:  # gateway/penalty.py
        penalties = refusals.penalties
        offences = CounterMetricFamily(
            "evq_http_offences",
            "Requests that failed as HTTP (malformed, too slow), counted against their sender",
            labels=["reason"],
        )
        for reason, n in sorted(penalties.offences.items()):
            offences.add_metric([reason], n)
        yield offences
        yield CounterMetricFamily(
            "evq_refused_connections",
            "Connections refused at accept: their address sent too many requests failing as HTTP",
            value=penalties.refusals,
        )
        yield GaugeMetricFamily(
            "evq_refused_addresses",
            "Addresses whose connections are refused now",
            value=refusals.refusing(),
        )
    yield CounterMetricFamily(
        "evq_log_records_dropped",
        "Log records dropped because the sink was slow",
        value=logs.dropped(),
    )


_STATES = ("ready", "delayed", "reserved")
_TOTALS = {
    "enqueued": "evq_queue_puts",
    "taken": "evq_queue_takes",
    "acked": "evq_queue_acks",
    "released": "evq_queue_releases",
    "dead_lettered": "evq_queue_dead_letters",
    "expired": "evq_queue_expired",
    "purged": "evq_queue_purged",
}


def _queue_families(queues: list[QueueMetrics]) -> Iterator[Metric]:
    by_state = GaugeMetricFamily(
        "evq_queue_messages", "Messages in a queue by state", labels=["queue", "state"]
    )
    for q in queues:
        for state in _STATES:
            by_state.add_metric([q.queue, state], getattr(q, state))
    yield by_state
    for field, name in _TOTALS.items():
        c = CounterMetricFamily(name, f"Messages {field.replace('_', ' ')}", labels=["queue"])
        for q in queues:
            c.add_metric([q.queue], getattr(q, field))
        yield c
    simple = {
        "evq_queue_oldest_ready_age_seconds": ("oldest_ready_age_s", "Age of the oldest ready"),
        "evq_queue_log_bytes": ("log_bytes", "Log bytes written by this incarnation"),
        "evq_queue_log_segments": (
            "log_segments",
            "Group commits holding this queue's events, this incarnation",
        ),
        "evq_queue_snapshot_age_seconds": ("snapshot_age_s", "Time since the last snapshot"),
        "evq_queue_recovery_seconds": (
            "recovery_s",
            "How long the last recovery of the queue's shard took (its log read, before serving)",
        ),
        "evq_queue_spilled_messages": (
            "spilled",
            "Messages held in runs, a few bytes each, their bodies in the log (of those counted"
            " by evq_queue_messages; the others are objects in memory)",
        ),
        "evq_queue_paused": ("paused", "1 while the queue is paused: takes hand out nothing"),
    }
    for name, (field, text) in simple.items():
        g = GaugeMetricFamily(name, text, labels=["queue"])
        for q in queues:
            value = getattr(q, field)
            if value is not None:
                g.add_metric([q.queue], value)
        yield g
    yield _histogram(
        "evq_queue_receive_count", "Receive count of each delivery", queues, "receives"
    )
    yield _histogram(
        "evq_queue_time_to_durable_seconds",
        "From a command to its events being durable",
        queues,
        "durable",
    )
    yield _histogram(
        "evq_queue_time_in_queue_seconds",
        "From a message's put to its ack, for each message acked",
        queues,
        "in_queue",
    )


def _shard_families(shards: list[ShardStatus]) -> Iterator[Metric]:
    writes = [(str(s.index), s.writes) for s in shards if s.writes is not None]
    for name, field, text in (
        ("evq_shard_log_commits", "blocks", "Group commits (blocks) written to a shard's log"),
        ("evq_shard_log_records", "records", "Records written to a shard's log"),
        ("evq_shard_log_bytes", "bytes", "Bytes of records written to a shard's log"),
    ):
        c = CounterMetricFamily(name, text, labels=["shard"])
        for shard, w in writes:
            c.add_metric([shard], getattr(w, field))
        yield c
    g = GaugeMetricFamily(
        "evq_shard_log_segments", "Segments a shard's log holds (not yet pruned)", labels=["shard"]
    )
    for shard, w in writes:
        g.add_metric([shard], w.segments)
    yield g
    g = GaugeMetricFamily(
        "evq_shard_recovery_seconds",
        "How long a shard's last recovery took (snapshots and log read, before serving)",
        labels=["shard"],
    )
    for s in shards:
        if s.log is not None:
            g.add_metric([str(s.index)], s.log.duration_ms / 1000)
    yield g
    # Bad states of a shard's disk (actors/log/device.py): 1 while they last.
    for name, field, text in (
        (
            "evq_shard_log_failed",
            "log_failed",
            "1 when a shard's log failed (a failed fsync): it writes nothing until restarted",
        ),
        (
            "evq_shard_disk_full",
            "disk_full",
            "1 while a shard's disk is full: its puts are refused, takes and acks go on",
        ),
    ):
        g = GaugeMetricFamily(name, text, labels=["shard"])
        for s in shards:
            g.add_metric([str(s.index)], 1 if getattr(s, field, None) else 0)
        yield g


def _histogram(name: str, text: str, queues: list[QueueMetrics], field: str) -> Metric:
    h = HistogramMetricFamily(name, text, labels=["queue"])
    for q in queues:
        plain: PlainHistogram | None = getattr(q, field)
        if plain is None:
            continue  # a shard of an earlier version
        buckets, running = [], 0
        for bound, n in zip(plain.bounds, plain.counts, strict=False):
            running += n
            buckets.append((_bound(bound), running))
        buckets.append(("+Inf", plain.count))
        h.add_metric([q.queue], buckets, sum_value=plain.sum)
    return h


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


METRICS = web.AppKey("metrics", GatewayMetrics)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count every answer by route and status; time the short-lived ones."""
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        seconds = None if route in _LONG_LIVED else time.perf_counter() - started
        request.app[METRICS].observe(route, request.method, status, seconds)


async def metrics_page(request: web.Request) -> web.Response:
    directory = request.app[native.DIRECTORY]
    queues, shards = await asyncio.gather(directory.metrics(), directory.status(brief=True))
    body = request.app[METRICS].render(request.app, queues, shards)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def install(app: web.Application) -> Any:
    """Add ``/metrics`` to ``app``; return the middleware to put first."""
    app[METRICS] = GatewayMetrics()
    app.router.add_get("/metrics", metrics_page)
    return metrics_middleware
