"""What loadtest/bench_depth.py does to the server and reads from it and the machine.

The fill: producer processes (``Filler``, kept across the depths), each running asyncio
producers over keep-alive connections of the lean HTTP client of ``overload_load``
(``Conn``), every put a request of up to ``batch`` messages of ``size`` random base64
characters. The messages put are counted in a value the processes share, so the tool can
show progress; an event the tool sets stops them (the memory guard) after the put in flight.

``Api``: one synchronous keep-alive connection (``http.client``) for the stats, the timed
takes and their releases (``take_latencies``).

The churn (``--churn``): ``Acker``, a few threads, each with its own ``Api``, taking the
oldest messages of the queues and acking them (``take_and_ack``) until each queue has acked
its half (``churn_acks``).

Readings: the RSS of the server's session (through ``procstat``), the data directory's
bytes on disk, the machine, the commit and the command (``run_info``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.client
import json
import multiprocessing
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import procstat
from overload_load import Conn
from procstat import rss_bytes
from served import ROOT, cmdline, session_pids

__all__ = [
    "Acker",
    "Api",
    "Filler",
    "batches",
    "churn_acks",
    "disk_bytes",
    "fill_part",
    "plan",
    "put_body",
    "random_bodies",
    "run_info",
    "session_rss",
    "settled_rss",
    "share",
    "take_latencies",
]

GIB = 2**30
PUT_TIMEOUT_S = 120.0  # one put of 1000 messages; past it the depth is unknown: stop
REFUSED_FOR_S = 60.0  # answered 429/503 this long in a row: the server takes no more

# ------------------------------------------------------------------ what to put


def share(depth: int, queues: int, index: int) -> int:
    """The messages queue ``index`` of ``queues`` holds when they hold ``depth`` together."""
    return depth // queues + (1 if index < depth % queues else 0)


def plan(start: int, end: int, queues: int, batch: int) -> list[tuple[int, int]]:
    """The puts taking every queue from its share of ``start`` to its share of ``end``:
    (queue index, messages), at most ``batch`` each, round robin over the queues."""
    return batches([share(end, queues, i) - share(start, queues, i) for i in range(queues)], batch)


def batches(counts: list[int], batch: int) -> list[tuple[int, int]]:
    """``counts[i]`` messages for queue i as (queue index, messages) of at most ``batch``
    each, round robin over the queues, so every queue moves at the same pace."""
    left = list(counts)
    out: list[tuple[int, int]] = []
    while any(left):
        for index, n in enumerate(left):
            if n:
                out.append((index, min(n, batch)))
                left[index] -= out[-1][1]
    return out


def churn_acks(depth: int, queues: int, keep_first: bool = False) -> list[int]:
    """The messages the churn acks of each queue: half its share of ``depth``, rounded down;
    with ``keep_first``, none of the first queue's and all of every other's (two queues:
    half of all, the kept half an old backlog the others' dead records surround)."""
    if keep_first:
        return [0, *(share(depth, queues, i) for i in range(1, queues))]
    return [share(depth, queues, i) // 2 for i in range(queues)]


def random_bodies(n: int, size: int) -> list[bytes]:
    """``n`` bodies of ``size`` random base64 characters each: random, because the log
    compresses records (zstd), and equal bodies would shrink to almost nothing on disk,
    base64 of random bytes only to ~75 %."""
    text = base64.b64encode(os.urandom(n * size))
    return [text[i * size : (i + 1) * size] for i in range(n)]


def put_body(
    n: int,
    size: int,
    timing: tuple[float, float] | None = None,
    attrs: bool = False,
    kinds: frozenset[str] = frozenset(),
) -> bytes:
    """A put's JSON body: ``n`` messages of :func:`random_bodies`. ``timing`` (lo, hi)
    delays them, in seconds: all by ``lo`` when ``lo == hi`` (the put's messages ready at
    one time), else each by its own, drawn evenly from lo to hi. ``attrs``: each message
    carries two attributes, as an SQS sender's would (:func:`attributes`). ``kinds``:
    ``fifo`` gives each message a group among :data:`GROUPS`, ``client_ids`` an id of the
    client's (random: 16 hex digits, 64 bits)."""
    bodies = random_bodies(n, size)
    if timing is None and not attrs and not kinds:
        return b'{"messages":[{"body":"' + b'"},{"body":"'.join(bodies) + b'"}]}'
    items = [b'{"body":"%s"' % b for b in bodies]
    if "fifo" in kinds:
        items = [b'%s,"group":"g%03d"' % (item, random.randrange(GROUPS)) for item in items]
    if "client_ids" in kinds:
        ids = os.urandom(8 * n).hex().encode()
        items = [
            b'%s,"id":"%s"' % (item, ids[16 * i : 16 * i + 16]) for i, item in enumerate(items)
        ]
    if timing is not None:
        lo, hi = timing
        delays = [lo] * n if lo == hi else [random.uniform(lo, hi) for _ in range(n)]
        items = [b'%s,"delay":%.3f' % (item, d) for item, d in zip(items, delays, strict=True)]
    if attrs:
        items = [b'%s,"attributes":%s' % (item, attributes()) for item in items]
    return b'{"messages":[' + b"},".join(items) + b"}]}"


GROUPS = 1000  # a FIFO queue's message groups (--fifo)


def attributes() -> bytes:
    """Two attributes as JSON, as an SQS sender sets them: a tenant among 1,000 and a
    trace id of 16 random hex digits (62 bytes in all, encoded)."""
    return b'{"tenant":"t%03d","trace":"%s"}' % (
        random.randrange(1000),
        os.urandom(8).hex().encode(),
    )


def _put_request(queue: str, n: int, size: int) -> bytes:
    body = put_body(
        n,
        size,
        _shared.get("timing"),
        _shared.get("attrs", False),
        _shared.get("kinds", frozenset()),
    )
    head = (
        f"POST /v1/queues/{queue}/messages HTTP/1.1\r\nHost: evq\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# ------------------------------------------------------------------ producer processes

_shared: dict[str, Any] = {}  # in a producer process: the count and the stop event


def _init(
    counter: Any,
    stop: Any,
    timing: tuple[float, float] | None = None,
    attrs: bool = False,
    kinds: frozenset[str] = frozenset(),
) -> None:
    _shared.update(counter=counter, stop=stop, timing=timing, attrs=attrs, kinds=kinds)


def fill_part(
    port: int, names: list[str], puts: list[tuple[int, int]], producers: int, size: int
) -> tuple[int, float]:
    """In a producer process: ``puts`` by ``producers`` connections at once; (messages put,
    CPU seconds this process spent). Raises: RuntimeError (an answer not 2xx), TimeoutError,
    ConnectionError."""
    cpu = time.process_time()
    done = asyncio.run(_fill(port, names, puts, producers, size))
    return done, time.process_time() - cpu


async def _fill(
    port: int, names: list[str], puts: list[tuple[int, int]], producers: int, size: int
) -> int:
    todo = iter(puts)  # shared by the producers: each takes the next put when it is free
    jobs = [_producer(port, names, todo, size) for _ in range(producers)]
    return sum(await asyncio.gather(*jobs))


async def _producer(port: int, names: list[str], todo: Iterator[tuple[int, int]], size: int) -> int:
    conn: Conn | None = None
    done = 0
    try:
        for index, n in todo:
            if _shared["stop"].is_set():
                break
            conn = await _put(conn, port, _put_request(names[index], n, size), n)
            done += n
            with _shared["counter"].get_lock():
                _shared["counter"].value += n
    finally:
        if conn is not None and conn.transport is not None:
            conn.transport.close()
    return done


async def _put(conn: Conn | None, port: int, raw: bytes, n: int) -> Conn:
    """One put, again while the server answers 429 or 503 (nothing was put then); the
    connection it went on."""
    refused_since = None
    while True:
        if conn is None or conn.closed:
            _, conn = await asyncio.get_running_loop().create_connection(Conn, "127.0.0.1", port)
        status, _, body = await asyncio.wait_for(conn.request(raw), PUT_TIMEOUT_S)
        if 200 <= status < 300:
            if body.count(b'"created"') != n:
                raise RuntimeError(f"a put of {n} messages answered {body[:300]!r}")
            return conn
        if status not in (429, 503):
            raise RuntimeError(f"a put answered {status}: {body[:300]!r}")
        now = time.monotonic()
        refused_since = refused_since or now
        if now - refused_since > REFUSED_FOR_S:
            raise RuntimeError(
                f"the server has refused puts ({status}) for {REFUSED_FOR_S:.0f} s: {body[:200]!r}"
                " (429: its shard memory budget, evq serve --shard-memory-mb, default half the"
                " RAM over the shards, is reached)"
            )
        await asyncio.sleep(0.5)


class Filler:
    """``procs`` producer processes with ``producers`` producers in all, kept across fills."""

    def __init__(
        self,
        procs: int,
        producers: int,
        size: int,
        timing: tuple[float, float] | None = None,
        attrs: bool = False,
        kinds: frozenset[str] = frozenset(),
    ) -> None:
        ctx = multiprocessing.get_context("spawn")  # the tool's threads stay out of them
        self.counter = ctx.Value("q", 0)
        self.stop = ctx.Event()
        self.procs, self.producers, self.size = procs, producers, size
        self.pool = ProcessPoolExecutor(
            procs,
            mp_context=ctx,
            initializer=_init,
            initargs=(self.counter, self.stop, timing, attrs, kinds),
        )
        for future in [self.pool.submit(os.getpid) for _ in range(procs)]:
            future.result()  # started and imported before the first fill is timed

    @property
    def put(self) -> int:
        """Messages put since the last ``start``."""
        return int(self.counter.value)

    def start(self, port: int, names: list[str], puts: list[tuple[int, int]]) -> list[Future]:
        """Share ``puts`` out among the processes; their futures answer fill_part's pairs."""
        self.stop.clear()
        with self.counter.get_lock():
            self.counter.value = 0
        futures = []
        for p in range(self.procs):
            producers = self.producers // self.procs + int(p < self.producers % self.procs)
            args = (port, names, puts[p :: self.procs], producers, self.size)
            futures.append(self.pool.submit(fill_part, *args))
        return futures

    def close(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------ the tool's own client


class Api:
    """One keep-alive connection to the native API, one request at a time."""

    def __init__(self, port: int, timeout: float = 60.0) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def call(self, method: str, path: str, doc: Any = None) -> tuple[int, Any, float]:
        """(status, the answer decoded, seconds from sending to the answer's last byte)."""
        body = None if doc is None else json.dumps(doc).encode()
        headers = {} if body is None else {"Content-Type": "application/json"}
        started = time.perf_counter()
        try:
            self.conn.request(method, path, body=body, headers=headers)
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()  # the next call connects again
            raise
        seconds = time.perf_counter() - started
        return response.status, json.loads(raw) if raw else None, seconds

    def stats(self, name: str) -> dict[str, Any] | None:
        """A queue's stats, or None when the server does not answer them (yet)."""
        try:
            status, doc, _ = self.call("GET", f"/v1/queues/{name}")
        except (OSError, http.client.HTTPException, ValueError):
            return None
        return doc["stats"] if status == 200 else None

    def close(self) -> None:
        self.conn.close()


def take_latencies(api: Api, names: list[str], takes: int, take_max: int) -> dict[str, Any]:
    """``takes`` takes of up to ``take_max`` messages, round robin over the queues, one at a
    time, each followed at once by a release of what it took (the depth stays): the takes'
    latencies (ms) and the messages each took on average.

    Raises: RuntimeError (an answer not 200, a release not ok)."""
    ms: list[float] = []
    taken = 0
    for i in range(takes):
        name = names[i % len(names)]
        status, doc, seconds = api.call("POST", f"/v1/queues/{name}/take", {"max": take_max})
        if status != 200:
            raise RuntimeError(f"a take answered {status}: {doc}")
        ms.append(1000 * seconds)
        taken += len(doc["messages"])
        _settle(api, name, "release", doc["messages"])
    cuts = statistics.quantiles(ms, n=100, method="inclusive")  # needs 2 takes or more
    return {
        "takes": takes,
        "take_max": take_max,
        "p50_ms": round(cuts[49], 3),
        "p99_ms": round(cuts[98], 3),
        "max_ms": round(max(ms), 3),
        "messages_per_take": round(taken / takes, 1),
    }


def _settle(
    api: Api,
    name: str,
    verb: str,
    messages: list[dict[str, Any]],
    delay: float | None = None,
    jitter: float = 0.0,
) -> None:
    """Release or ack (``verb``) the messages a take answered, all of them or raise
    (``delay``: a release's, in seconds; ``jitter``: each message's delay more by its own
    time, drawn evenly from 0..jitter s, to the millisecond)."""
    if not messages:
        return
    items = [{"id": m["id"], "lease": m["lease"]} for m in messages]
    if delay is not None:
        items = [{**item, "delay": round(delay + random.uniform(0, jitter), 3)} for item in items]
    status, doc, _ = api.call("POST", f"/v1/queues/{name}/{verb}", {"items": items})
    if status != 200 or any(r["status"] != "ok" for r in doc["results"]):
        raise RuntimeError(f"a {verb} answered {status}: {str(doc)[:300]}")


# ------------------------------------------------------------------ the churn's consumers

CHURN_LEASE_S = 600  # a taken batch is acked long before; no message comes back meanwhile
DRY_TAKES = 10  # takes in a row that found nothing (each waiting 1 s): the queue ran dry


def take_and_ack(
    api: Api, name: str, n: int, backoff: float | None = None, jitter: float = 0.0
) -> int:
    """Take ``n`` messages of queue ``name``, its oldest, and ack them, as a consumer done
    with them does; the messages acked (``n``). With ``backoff`` (seconds), release each
    instead, due again that much later, as a consumer that failed and retries later does.

    Raises: RuntimeError (an answer not 200, an ack not ok, the queue dry)."""
    left, dry = n, 0
    while left > 0:
        ask = {"max": left, "visibility_timeout": CHURN_LEASE_S, "wait": 1}
        status, doc, _ = api.call("POST", f"/v1/queues/{name}/take", ask)
        if status != 200:
            raise RuntimeError(f"a take answered {status}: {doc}")
        messages = doc["messages"]
        dry = 0 if messages else dry + 1
        if dry >= DRY_TAKES:
            raise RuntimeError(f"{name} gave nothing for {DRY_TAKES} takes, {left} still to ack")
        if backoff is None:
            _settle(api, name, "ack", messages)
        else:
            _settle(api, name, "release", messages, delay=backoff, jitter=jitter)
        left -= len(messages)
    return n


class Acker:
    """``clients`` threads taking and acking batches of the queues until none is left; a
    failed batch stops the others (after the batch in flight). ``acked`` counts as they go.
    With ``backoff`` (seconds) they release each message that much later instead (and up to
    ``jitter`` s more, each message its own)."""

    def __init__(
        self,
        port: int,
        names: list[str],
        clients: int,
        backoff: float | None = None,
        jitter: float = 0.0,
    ) -> None:
        self.port, self.names, self.clients, self.backoff = port, names, clients, backoff
        self.jitter = jitter
        self.acked = 0
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(clients, thread_name_prefix="acker")

    def start(self, work: list[tuple[int, int]]) -> list[Future]:
        """Share ``work`` (queue index, messages) out among the clients, each taking the
        next batch when it is free; their futures answer the messages each acked."""
        todo = iter(work)
        return [self._pool.submit(self._client, todo) for _ in range(self.clients)]

    def _client(self, todo: Iterator[tuple[int, int]]) -> int:
        api, done = Api(self.port), 0
        try:
            while not self.stop.is_set():
                with self._lock:
                    index, n = next(todo, (-1, 0))
                if n == 0:
                    return done
                done += take_and_ack(api, self.names[index], n, self.backoff, self.jitter)
                with self._lock:
                    self.acked += n
        except BaseException:
            self.stop.set()
            raise
        finally:
            api.close()
        return done

    def close(self) -> None:
        self.stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------ readings


def session_rss(pid: int) -> dict[str, int]:
    """RSS (bytes) of the server's session: ``total``, the ``gateway`` (the evq serve
    process), ``workers`` (Ray's workers: the shards), ``ray`` (Ray's own); ``processes``."""
    groups = {"gateway": 0, "workers": 0, "ray": 0}
    pids = session_pids(pid)
    for p in pids:
        rss = rss_bytes(p)
        if rss is not None:
            group = "gateway" if p == pid else "ray"
            groups["workers" if cmdline(p).startswith("ray::") else group] += rss
    return {"total": sum(groups.values()), **groups, "processes": len(pids)}


def settled_rss(pid: int, settle: float) -> dict[str, int]:
    """``session_rss`` after ``settle`` s: the median of five readings 0.2 s apart."""
    time.sleep(settle)
    readings = []
    for _ in range(5):
        readings.append(session_rss(pid))
        time.sleep(0.2)
    middle = statistics.median_low(r["total"] for r in readings)
    return next(r for r in readings if r["total"] == middle)


def disk_bytes(path: Path, skip: tuple[str, ...] = ()) -> int:
    """Bytes the files under ``path`` take on disk (st_blocks, as du counts them), but for
    the folders of ``path`` named in ``skip`` (``archive``: the live log and snapshots alone)."""
    total = 0
    for folder, folders, files in os.walk(path):
        if folder == str(path):
            folders[:] = [f for f in folders if f not in skip]
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # pruned while we walked
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def run_info(args: argparse.Namespace) -> dict[str, Any]:
    """The machine, the commit and the exact command."""

    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    machine = {
        "cpus": os.cpu_count(),
        "mem_total_gib": round(procstat.memory_bytes()["total"] / GIB, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    return {
        "machine": machine,
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "command": shlex.join([sys.executable, *sys.argv]),
        "args": vars(args),
    }
