"""The load generator of loadtest/overload.py: what runs in each forked load process.

A lean HTTP/1.1 client (``Conn``, ``Pool``, the requests ``post`` and ``put_request``), the
per-process counters (``Tally``) and load loop (``Load``: producers closed- or open-loop,
consumers taking and acking), reported once a second on a queue to the tool; the latency
buckets (``bucket``, ``quantile``) the tool folds those reports with. ``_load_main`` is the
processes' target."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from typing import Any

__all__ = [
    "KINDS",
    "Conn",
    "Load",
    "Pool",
    "Tally",
    "bucket",
    "bucket_ms",
    "post",
    "put_request",
    "quantile",
]

# What a shard's 429 says (actors/flow.py), not the gateway's own bounds' (gateway/limits.py).
OVER_BUDGET = b"over its memory budget"
KINDS = ("ok", "r429", "r429_no_retry_after", "r503", "other", "timeout", "conn_error")


# ------------------------------------------------------------------ latency histogram


def bucket(ms: float) -> int:
    """Log-spaced bucket (5 % wide) of a latency in ms."""
    return max(0, int(math.log(max(ms, 0.01) / 0.01) / math.log(1.05)))


def bucket_ms(index: int) -> float:
    return 0.01 * 1.05 ** (index + 0.5)


def quantile(hist: Counter[int], q: float) -> float | None:
    """The ``q`` quantile (ms) of a bucket histogram; None when it is empty."""
    total = sum(hist.values())
    if not total:
        return None
    rank, seen = q * total, 0
    for index in sorted(hist):
        seen += hist[index]
        if seen >= rank:
            return round(bucket_ms(index), 2)
    return None


# ------------------------------------------------------------------ a lean HTTP/1.1 client


class Conn(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.fut: asyncio.Future[tuple[int, bool, bytes]] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.fut is None:
            return
        head = bytes(self.buf[:end]).lower()
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line.startswith(b"content-length:"):
                length = int(line[15:])
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4 : end + 4 + length])
        del self.buf[: end + 4 + length]
        if b"\r\nconnection: close" in head:
            self.closed = True
        status = int(head[9:12])
        if not self.fut.done():
            self.fut.set_result((status, b"\r\nretry-after:" in head, body))

    async def request(self, raw: bytes) -> tuple[int, bool, bytes]:
        """Send ``raw``; the answer's status, whether it had Retry-After, its body."""
        assert self.transport is not None
        self.fut = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        try:
            return await self.fut
        finally:
            self.fut = None


def post(path: str, doc: Any) -> bytes:
    body = json.dumps(doc, separators=(",", ":")).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: evq\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def put_request(queue: str, batch: int, size: int) -> bytes:
    body = "x" * size
    return post(f"/v1/queues/{queue}/messages", {"messages": [{"body": body}] * batch})


class Pool:
    """Connections to the server: reused when idle, opened when none is, up to ``cap``."""

    def __init__(self, port: int, cap: int) -> None:
        self.port, self.cap = port, cap
        self.idle: list[Conn] = []
        self.open = 0

    async def get(self) -> Conn | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
            self.open -= 1
        if self.open >= self.cap:
            return None
        self.open += 1
        try:
            _, conn = await asyncio.get_running_loop().create_connection(
                Conn, "127.0.0.1", self.port
            )
        except OSError:
            self.open -= 1
            raise
        return conn

    def put_back(self, conn: Conn, reusable: bool) -> None:
        if reusable and not conn.closed:
            self.idle.append(conn)
            return
        self.open -= 1
        if conn.transport is not None:
            conn.transport.close()


# ------------------------------------------------------------------ load processes


class Tally:
    """Counts and latencies of one operation kind over the current second."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.hist: Counter[int] = Counter()
        self.messages = 0
        self.over_budget = 0  # of the 429s: a shard over its memory budget refused
        self.refusal: str | None = None  # the last answer that was not 2xx (its start)

    def report(self) -> dict[str, Any]:
        doc = {
            "kinds": dict(self.kinds),
            "hist": dict(self.hist),
            "messages": self.messages,
            "over_budget": self.over_budget,
            "refusal": self.refusal,
        }
        self.kinds, self.hist, self.messages, self.over_budget = Counter(), Counter(), 0, 0
        self.refusal = None
        return doc


class Load:
    """One load process: producers (closed loop, or open loop at a rate) and consumers."""

    def __init__(self, spec: dict[str, Any], out: Any) -> None:
        self.spec, self.out = spec, out
        self.tallies = {op: Tally() for op in ("put", "take", "ack")}
        self.not_sent = 0
        self.pool = Pool(spec["port"], spec.get("max_conns", 4000))
        self.timeout = spec["timeout"]
        self.until = spec["until"]
        self.queues = spec["queues"]

    async def call(self, op: str, raw: bytes, started: float) -> bytes | None:
        """One request: its answer's body when 2xx, None otherwise (counted either way)."""
        tally = self.tallies[op]
        try:
            conn = await self.pool.get()
        except OSError:
            tally.kinds["conn_error"] += 1
            return None
        if conn is None:
            self.not_sent += 1
            return None
        try:
            status, retry_after, body = await asyncio.wait_for(conn.request(raw), self.timeout)
        except TimeoutError:
            tally.kinds["timeout"] += 1
            self.pool.put_back(conn, False)
            return None
        except ConnectionError:
            tally.kinds["conn_error"] += 1
            self.pool.put_back(conn, False)
            return None
        self.pool.put_back(conn, True)
        tally.hist[bucket(1000 * (time.monotonic() - started))] += 1
        tally.kinds[_kind(status, retry_after)] += 1
        if 200 <= status < 300:
            return body
        if status == 429 and OVER_BUDGET in body:
            tally.over_budget += 1
        tally.refusal = f"{status} {body[:400].decode(errors='replace')}"
        return None

    async def put(self, raw: bytes, batch: int, started: float) -> None:
        if await self.call("put", raw, started) is not None:
            self.tallies["put"].messages += batch

    async def closed_producer(self, index: int) -> None:
        spec = self.spec
        raw = put_request(self.queues[index % len(self.queues)], spec["batch"], spec["size"])
        while time.monotonic() < self.until:
            await self.put(raw, spec["batch"], time.monotonic())

    async def open_producer(self) -> None:
        """Sends on schedule whatever the answers: ``rate`` requests/s."""
        spec = self.spec
        raws = [put_request(q, spec["batch"], spec["size"]) for q in self.queues]
        start, sent, tasks = time.monotonic(), 0, set()
        while (now := time.monotonic()) < self.until:
            due = int((now - start) * spec["rate"]) - sent
            for _ in range(due):
                task = asyncio.create_task(self.put(raws[sent % len(raws)], spec["batch"], now))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
            await asyncio.sleep(0.005)
        if tasks:
            await asyncio.wait(tasks, timeout=self.timeout + 1)

    async def consumer(self, index: int) -> None:
        name = self.queues[index % len(self.queues)]
        take = post(f"/v1/queues/{name}/take", {"max": self.spec["take_max"], "wait": 1})
        while time.monotonic() < self.until:
            body = await self.call("take", take, time.monotonic())
            if body is None:
                await asyncio.sleep(0.05)
                continue
            messages = json.loads(body)["messages"]
            self.tallies["take"].messages += len(messages)
            if not messages:
                continue
            items = [{"id": m["id"], "lease": m["lease"]} for m in messages]
            ack = post(f"/v1/queues/{name}/ack", {"items": items})
            if await self.call("ack", ack, time.monotonic()) is not None:
                self.tallies["ack"].messages += len(items)

    async def reporter(self) -> None:
        while True:
            await asyncio.sleep(1)
            self.flush()

    def flush(self) -> None:
        doc: dict[str, dict[str, Any] | int | float] = {
            op: t.report() for op, t in self.tallies.items()
        }
        doc["not_sent"], self.not_sent = self.not_sent, 0
        doc["t"] = time.monotonic()
        self.out.put(doc)

    async def run(self) -> None:
        spec = self.spec
        reporter = asyncio.create_task(self.reporter())
        jobs = [self.consumer(i) for i in range(spec.get("consumers", 0))]
        if spec.get("rate"):
            jobs.append(self.open_producer())
        else:
            jobs += [self.closed_producer(i) for i in range(spec.get("producers", 0))]
        await asyncio.gather(*jobs)
        reporter.cancel()
        self.flush()


def _kind(status: int, retry_after: bool) -> str:
    if 200 <= status < 300:
        return "ok"
    if status == 429:
        return "r429" if retry_after else "r429_no_retry_after"
    return "r503" if status == 503 else "other"


def _load_main(spec: dict[str, Any], out: Any) -> None:
    asyncio.run(Load(spec, out).run())
