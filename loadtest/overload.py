"""Overload and soak of a real ``evq serve`` (issue 19, "Overload and soak").

``overload``: starts ``evq serve`` on a fresh data directory with a shard memory budget
(``--shard-memory-mb``: past it a shard refuses puts with 429) and the gateway's request
bound (``--max-requests``), then

1. **calibrates**: a closed loop of ``--producers`` connections putting ``--batch``
   messages of ``--size`` bytes per request, while ``--consumers`` take and ack, for
   ``--calibrate`` s: the *sustainable* put rate (requests/s and messages/s);
2. **overloads**: offers ``--factor`` (10) times that many *messages* per second open-loop
   for ``--minutes``, with no consumers (the backlog grows until the budget refuses it). One
   Python process cannot offer 10x the requests it could complete on this 2-core machine, so
   the requests are ``--overload-batch-factor`` times bigger (more messages each) and the
   request rate is the rest of the factor; the summary's ``offered`` says exactly what
   10x was (messages/s, bytes/s, requests/s, messages per request) and what was really sent.
   Each request waits at most ``--timeout`` s for an answer (else: a client timeout);
3. **recovers**: drops to ``--recovery-fraction`` (0.5) of the sustainable put rate
   (open-loop, the calibration's request shape) with the consumers draining, until puts are
   answered 2xx again at that rate (``--recovery-window`` consecutive seconds with >= 99 % of
   answers 2xx and >= half the rate answered 2xx) or ``--recovery-limit`` s pass. Not the
   whole sustainable rate: that is the machine's capacity with producers and consumers
   sharing it, so the backlog would drain only as fast as it grows and the shards would stay
   at their budget (measured: ~30k messages/s put and as many acked, a quarter to a third of
   the puts still refused after 120 s).

Every second it samples the RSS of each process of the server's session (the gateway, its
workers, the shards, Ray's own) and counts answers by kind: 2xx, 429 with and without
Retry-After, 503, other, client timeouts, connection errors; p50/p99 of answered requests.
It prints JSON lines (``baseline``, ``calibration``, ``offered``, ``progress`` every
``--progress`` s, ``overload``, ``recovery``, then ``summary``) and exits 1 when

- a shard's peak RSS passed the budget plus the shard allowance: by default 16 MiB (1-s
  sampling, the allocator) + the bytes of the requests the gateways let in at once
  (``--max-requests`` x ``--workers`` x one overload request): their bodies reach a shard
  before it can refuse them (``--shard-allowance-mb`` overrides);
- a gateway process's peak passed its idle RSS (the ``baseline``, measured after start)
  plus the gateway allowance: 64 MiB + one overload request's bytes x (the client's
  connections + 3 x ``--max-requests``: read, decoded, framed toward a shard) — a gateway
  has no memory budget, only its bounds on requests and connections
  (``--gateway-allowance-mb`` overrides);
- a request timed out (``--timeout``) instead of being answered, or a connection failed;
- a 429 lacked Retry-After; overload brought no 429 at all; or it did not recover.

The summary states the allowances, every process's base and peak, and Ray's own processes'
peaks (reported, not judged). ``--then-soak S`` runs the soak workload below for S seconds
on the same server after the recovery (the integration test does, to start one server).

``soak``: the same server (no memory budget unless given) under a mixed workload: open-loop
puts at ``--fraction`` of the sustainable rate, consumers taking and acking, for
``--minutes`` (60). Every second: RSS and open file descriptors (``/proc/PID/fd``) of every
process of the session; put/take/ack latencies per minute. The summary gives per process
the RSS slope (least squares over the samples after ``--warmup`` s, MiB/hour), fds at start
and end, and p99 per minute (first and last 10 minutes). Exit 1 when a gateway or shard
process's RSS slope passes ``--max-rss-slope`` MiB/h (judged when at least
``--min-slope-minutes`` (10) remain after the warm-up: a shorter slope is the warm-up's),
its fds grew by more than ``--max-fd-growth``, or a request timed out.

Usage (the long runs of the issue; each starts and stops its own server)::

    .venv/bin/python loadtest/overload.py overload --minutes 5 --shard-memory-mb 400 \\
        --out loadtest/reports/overload
    .venv/bin/python loadtest/overload.py soak --minutes 60 --out loadtest/reports/soak

    common: --shards 2 --workers 1 --producers 32 --consumers 8 --queues 4 --size 1000
            --batch 10 --take-max 1000 --procs 2 (load processes) --max-conns 1024 (each)
            --max-requests 512 --timeout 10 --calibrate 10 --progress 5 --dir --out --keep
    overload: --factor 10 --overload-batch-factor 5 --recovery-limit 120
              --recovery-window 3 --shard-allowance-mb --gateway-allowance-mb --then-soak S
    soak: --fraction 0.5 --warmup 120 --max-rss-slope 20 --min-slope-minutes 10
          --max-fd-growth 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import signal
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

from served import EvqServe, session_pids

MIB = 1024 * 1024
KINDS = ("ok", "r429", "r429_no_retry_after", "r503", "other", "timeout", "conn_error")
EVQ_KINDS = ("gateway", "worker", "shard")  # judged; Ray's own processes are only reported


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

    def report(self) -> dict[str, Any]:
        doc = {"kinds": dict(self.kinds), "hist": dict(self.hist), "messages": self.messages}
        self.kinds, self.hist, self.messages = Counter(), Counter(), 0
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
        return body if 200 <= status < 300 else None

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
        doc = {op: t.report() for op, t in self.tallies.items()}
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


# ------------------------------------------------------------------ the server's processes


def role(pid: int, server_pid: int) -> str:
    """What a process of the server's session is: gateway, worker, shard, or ray."""
    if pid == server_pid:
        return "gateway"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if cmdline.startswith("ray::ShardActor"):
        return "shard"
    if "gateway.workers" in cmdline:
        return "worker"
    return "ray"


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB
    except (OSError, ValueError, IndexError):
        return None


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


class Sampler:
    """RSS (and fds) of every process of the server's session, once a second."""

    def __init__(self, server_pid: int, fds: bool = False) -> None:
        self.server_pid, self.fds = server_pid, fds
        self.roles: dict[int, str] = {}
        self.rss: dict[int, list[tuple[float, float]]] = {}
        self.fd: dict[int, list[int]] = {}

    def sample(self, t: float) -> dict[int, float]:
        now: dict[int, float] = {}
        for pid in session_pids(self.server_pid):
            if pid not in self.roles:
                self.roles[pid] = role(pid, self.server_pid)
            rss = rss_mib(pid)
            if rss is None:
                continue
            now[pid] = rss
            self.rss.setdefault(pid, []).append((t, rss))
            if self.fds and (n := fd_count(pid)) is not None:
                self.fd.setdefault(pid, []).append(n)
        return now

    def name(self, pid: int) -> str:
        return f"{self.roles.get(pid, '?')}:{pid}"

    def peak(self, pid: int) -> float:
        return max(r for _, r in self.rss[pid])

    def judged(self) -> list[int]:
        return [p for p, r in self.roles.items() if r in EVQ_KINDS and p in self.rss]


# ------------------------------------------------------------------ one phase of load


class Phase:
    """Load processes for a while; their reports folded per second."""

    def __init__(self, ctx: Any, specs: list[dict[str, Any]]) -> None:
        self.out = ctx.Queue()
        # daemonic: ended by multiprocessing at exit (also on SIGTERM, through SystemExit)
        self.procs = [
            ctx.Process(target=_load_main, args=(s, self.out), daemon=True) for s in specs
        ]
        for proc in self.procs:
            proc.start()

    def drain(self) -> list[dict[str, Any]]:
        docs = []
        while True:
            try:
                docs.append(self.out.get_nowait())
            except queue_mod.Empty:
                return docs

    def alive(self) -> bool:
        return any(p.is_alive() for p in self.procs)

    def join(self) -> list[dict[str, Any]]:
        docs = []
        for proc in self.procs:
            while proc.is_alive():
                docs += self.drain()
                proc.join(0.1)
        return docs + self.drain()


class Totals:
    """Answers by kind and latency per operation, over a phase."""

    def __init__(self) -> None:
        self.kinds = {op: Counter[str]() for op in ("put", "take", "ack")}
        self.hist = {op: Counter[int]() for op in ("put", "take", "ack")}
        self.messages: Counter[str] = Counter()
        self.not_sent = 0

    def add(self, doc: dict[str, Any]) -> None:
        for op in self.kinds:
            self.kinds[op].update(doc[op]["kinds"])
            self.hist[op].update({int(k): v for k, v in doc[op]["hist"].items()})
            self.messages[op] += doc[op]["messages"]
        self.not_sent += doc["not_sent"]

    def summary(self, seconds: float) -> dict[str, Any]:
        out: dict[str, Any] = {"seconds": round(seconds, 1), "not_sent": self.not_sent}
        for op, kinds in self.kinds.items():
            if not kinds:
                continue
            out[op] = {
                **{k: kinds.get(k, 0) for k in KINDS},
                "messages": self.messages[op],
                "p50_ms": quantile(self.hist[op], 0.5),
                "p99_ms": quantile(self.hist[op], 0.99),
            }
        return out


# ------------------------------------------------------------------ the tool


class Run:
    """The server, the sampler, the output."""

    def __init__(self, args: argparse.Namespace, server_args: list[str]) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="evq-overload-", dir=args.dir))
        self.out_file = None
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            self.out_file = open(Path(args.out) / f"{args.command}.jsonl", "w")  # noqa: SIM115
        server_args = [*server_args, *args.serve_arg]
        self.server = EvqServe(self.tmp / "data", self.tmp / "serve.log", server_args)
        try:
            self.server.wait_ready(180)
        except BaseException:
            self.emit({"server_stop": self.server.stop(30), "log": str(self.tmp / "serve.log")})
            raise
        self.sampler = Sampler(self.server.pid)
        self.ctx = mp.get_context("fork")
        self.t0 = time.monotonic()
        self.shards = args.shards

    def emit(self, doc: dict[str, Any]) -> None:
        line = json.dumps(doc)
        print(line, flush=True)
        if self.out_file is not None:
            self.out_file.write(line + "\n")
            self.out_file.flush()

    def queues(self, count: int) -> list[str]:
        """``count`` queue names spread evenly over the shards (crc32 placement, as
        actors.shard.placement)."""
        names: list[str] = []
        i = 0
        while len(names) < count:
            name = f"ovl-{i}"
            if zlib.crc32(name.encode()) % self.shards == len(names) % self.shards:
                names.append(name)
            i += 1
        return names

    def create(self, names: list[str]) -> None:
        import urllib.request

        for name in names:
            req = urllib.request.Request(
                f"{self.server.url}/v1/queues/{name}", data=b"{}", method="PUT"
            )
            req.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(req, timeout=30):
                pass

    def spec(self, seconds: float, queues: list[str], **kw: Any) -> dict[str, Any]:
        args = self.args
        base = {
            "port": self.server.port,
            "timeout": args.timeout,
            "until": time.monotonic() + seconds,
            "queues": queues,
            "size": args.size,
            "batch": args.batch,
            "take_max": args.take_max,
            "max_conns": args.max_conns,
        }
        return {**base, **kw}

    def split(self, total: int, procs: int) -> list[int]:
        return [total // procs + (1 if i < total % procs else 0) for i in range(procs)]

    def calibrate(self, queues: list[str]) -> dict[str, Any]:
        """Closed loop: the sustainable put rate with the consumers draining."""
        args = self.args
        specs = []
        producers = self.split(args.producers, args.procs)
        consumers = self.split(args.consumers, args.procs)
        for p, c in zip(producers, consumers, strict=True):
            specs.append(self.spec(args.calibrate + 1, queues, producers=p, consumers=c))
        phase = Phase(self.ctx, specs)
        totals, start = Totals(), time.monotonic() + 1  # the first second is warm-up
        for doc in phase.join():
            if doc["t"] > start + 0.5:
                totals.add(doc)
        seconds = args.calibrate
        put = totals.messages["put"] / seconds
        acked = totals.messages["ack"] / seconds
        # what goes through end to end: put, and taken and acked as fast
        messages = min(put, acked) if args.consumers else put
        result = {
            "means": "messages/s both put and acked by the closed loop (the smaller rate)",
            "messages_per_s": round(messages, 1),
            "requests_per_s": round(messages / args.batch, 1),
            "put_messages_per_s": round(put, 1),
            "acked_messages_per_s": round(acked, 1),
            **totals.summary(seconds),
        }
        if messages == 0:
            raise SystemExit(json.dumps({"error": "calibration: nothing went through", **result}))
        return result

    def stop(self) -> dict[str, Any]:
        stopped = self.server.stop(60)
        if not self.args.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return stopped

    def close(self) -> None:
        """Close ``--out``'s file (after the last line: the server's stop)."""
        if self.out_file is not None:
            self.out_file.close()
            self.out_file = None


def baseline(run: Run) -> dict[str, dict[str, float]]:
    """Idle RSS of every process (median of three samples)."""
    samples: dict[int, list[float]] = {}
    for _ in range(3):
        for pid, rss in run.sampler.sample(time.monotonic() - run.t0).items():
            samples.setdefault(pid, []).append(rss)
        time.sleep(0.5)
    return {run.sampler.name(pid): round(sorted(v)[len(v) // 2], 1) for pid, v in samples.items()}


def watch_phase(run: Run, phase: Phase, totals: Totals, label: str, seconds: float) -> None:
    """Sample every second while ``phase`` runs; progress lines every ``--progress`` s."""
    args, started, last = run.args, time.monotonic(), time.monotonic()
    window = Totals()
    while phase.alive():
        time.sleep(1)
        rss = run.sampler.sample(time.monotonic() - run.t0)
        for doc in phase.drain():
            totals.add(doc)
            window.add(doc)
        if time.monotonic() - last >= args.progress:
            last = time.monotonic()
            by_role: dict[str, float] = {}
            for pid, r in rss.items():
                key = run.sampler.roles.get(pid, "?")
                by_role[key] = round(max(by_role.get(key, 0), r), 1)
            run.emit(
                {
                    "progress": label,
                    "t": round(time.monotonic() - started, 1),
                    "of": seconds,
                    "max_rss_mib": by_role,
                    **window.summary(args.progress),
                }
            )
            window = Totals()
    for doc in phase.join():
        totals.add(doc)


def overload(args: argparse.Namespace) -> int:
    server_args = ["--shards", str(args.shards), "--workers", str(args.workers)]
    server_args += ["--shard-memory-mb", str(args.shard_memory_mb)]
    server_args += ["--max-requests", str(args.max_requests)]
    run = Run(args, server_args)
    try:
        return _overload(run, args)
    finally:
        run.emit({"server_stop": run.stop()})
        run.close()


def _overload(run: Run, args: argparse.Namespace) -> int:
    queues = run.queues(args.queues)
    run.create(queues)
    base = baseline(run)
    run.emit({"baseline": base, "shard_memory_mb": args.shard_memory_mb})
    sustainable = run.calibrate(queues)
    run.emit({"calibration": sustainable})
    offered = offer(args, sustainable)
    run.emit({"offered": offered})
    # overload: open loop, no consumers
    batch = args.batch * args.overload_batch_factor
    specs = [
        run.spec(args.minutes * 60, queues, rate=r, batch=batch)
        for r in _rates(offered["requests_per_s"], args.procs)
    ]
    totals = Totals()
    watch_phase(run, Phase(run.ctx, specs), totals, "overload", args.minutes * 60)
    over = totals.summary(args.minutes * 60)
    sent = sum(totals.kinds["put"].values())
    over["sent_requests_per_s"] = round(sent / (args.minutes * 60), 1)
    over["sent_messages_per_s"] = round(sent * batch / (args.minutes * 60), 1)
    run.emit({"overload": over})
    recovery = recover(run, queues, sustainable)
    run.emit({"recovery": recovery})
    summary = judge(run, args, base, sustainable, offered, over, recovery)
    if args.then_soak:  # the same server, after the overload: does it serve as before?
        soaked = soak_phase(run, args, queues, sustainable, args.then_soak)
        summary["soak"] = soaked
        summary["failures"] += [f"soak: {f}" for f in soaked["failures"]]
        summary["ok"] = not summary["failures"]
    run.emit({"summary": summary})
    return 0 if summary["ok"] else 1


def offer(args: argparse.Namespace, sustainable: dict[str, Any]) -> dict[str, Any]:
    """What ``--factor`` times the sustainable load is, and how it is offered."""
    messages_per_s = args.factor * sustainable["messages_per_s"]
    per_request = args.batch * args.overload_batch_factor
    requests_per_s = messages_per_s / per_request
    return {
        "factor": args.factor,
        "means": f"{args.factor}x the sustainable messages/s (and bytes/s), open-loop, "
        f"in requests of {per_request} messages ({args.overload_batch_factor}x the "
        f"calibration's {args.batch}) at {requests_per_s:.0f} requests/s "
        f"({requests_per_s / sustainable['requests_per_s']:.2f}x its request rate)",
        "messages_per_s": round(messages_per_s, 1),
        "bytes_per_s": round(messages_per_s * args.size),
        "requests_per_s": round(requests_per_s, 1),
        "messages_per_request": per_request,
        "processes": args.procs,
    }


def _rates(total: float, procs: int) -> list[float]:
    return [total / procs] * procs


def recover(run: Run, queues: list[str], sustainable: dict[str, Any]) -> dict[str, Any]:
    """``--recovery-fraction`` of the sustainable put rate (open loop), consumers draining:
    seconds until puts are answered 2xx at that rate for ``--recovery-window`` seconds in a
    row."""
    args = run.args
    rate = sustainable["requests_per_s"] * args.recovery_fraction
    consumers = run.split(args.consumers, args.procs)
    specs = [
        run.spec(args.recovery_limit, queues, rate=rate / args.procs, consumers=c)
        for c in consumers
    ]
    dropped = time.monotonic()
    phase = Phase(run.ctx, specs)
    seconds: dict[int, Counter[str]] = {}
    totals = Totals()
    recovered_at: float | None = None
    last = dropped
    while phase.alive() and recovered_at is None:
        time.sleep(0.5)
        rss = run.sampler.sample(time.monotonic() - run.t0)
        if time.monotonic() - last >= args.progress:
            last = time.monotonic()
            run.emit(_recovery_line(run, rss, seconds, last - dropped))
        for doc in phase.drain():
            totals.add(doc)
            seconds.setdefault(int(doc["t"] - dropped), Counter()).update(doc["put"]["kinds"])
        recovered_at = _recovered(seconds, rate, args.recovery_window)
    for proc in phase.procs:
        proc.terminate()
    phase.join()
    return {
        "rate_requests_per_s": rate,
        "recovered": recovered_at is not None,
        "seconds_to_recover": recovered_at,
        "limit_s": args.recovery_limit,
        **totals.summary(time.monotonic() - dropped),
    }


def _recovery_line(
    run: Run, rss: dict[int, float], seconds: dict[int, Counter[str]], t: float
) -> dict[str, Any]:
    recent = Counter[str]()
    for s in sorted(seconds)[-int(run.args.progress) :]:
        recent.update(seconds[s])
    shards = {
        run.sampler.name(p): round(r, 1)
        for p, r in rss.items()
        if run.sampler.roles.get(p) == "shard"
    }
    return {"progress": "recovery", "t": round(t, 1), "shard_rss_mib": shards, "put": dict(recent)}


def _recovered(seconds: dict[int, Counter[str]], rate: float, window: int) -> float | None:
    """The first second that starts ``window`` complete seconds in which >= 99 % of put
    answers were 2xx and at least half of ``rate`` was answered 2xx (None: not yet): refused
    no more, and flowing (the rate itself is the machine's whole capacity, measured on a
    busy machine, and the consumers are draining the backlog besides). A second is complete
    once a later one has reports (every process reports each second)."""
    done = sorted(seconds)[:-1]
    good = [
        s
        for s in done
        if seconds[s]["ok"] >= 0.5 * rate and seconds[s]["ok"] >= 0.99 * sum(seconds[s].values())
    ]
    for s in good:
        if all(s + k in good for k in range(window)):
            return float(s)
    return None


def judge(
    run: Run,
    args: argparse.Namespace,
    base: dict[str, float],
    sustainable: dict[str, Any],
    offered: dict[str, Any],
    over: dict[str, Any],
    recovery: dict[str, Any],
) -> dict[str, Any]:
    """The verdict: memory, timeouts, Retry-After, recovery."""
    sampler = run.sampler
    memory = {}
    failures = []
    allowances = allowances_mib(args)
    for pid in sampler.judged():
        name, kind = sampler.name(pid), sampler.roles[pid]
        if kind == "shard":
            limit = args.shard_memory_mb + allowances["shard_mib"]
        else:
            limit = base.get(name, sampler.rss[pid][0][1]) + allowances["gateway_mib"]
        limit = round(limit, 1)
        peak = sampler.peak(pid)
        memory[name] = {"base_mib": base.get(name), "peak_mib": round(peak, 1), "limit_mib": limit}
        if peak > limit:
            failures.append(f"{name} peaked at {peak:.0f} MiB > {limit:.0f} MiB")
    if not any(sampler.roles[p] == "shard" for p in sampler.judged()):
        failures.append("no shard process was sampled")
    for label, doc in (("overload", over), ("recovery", recovery)):
        for op in ("put", "take", "ack"):
            counts = doc.get(op, {})
            if counts.get("timeout"):
                failures.append(f"{label}: {counts['timeout']} {op}s timed out")
            if counts.get("conn_error"):
                failures.append(f"{label}: {counts['conn_error']} {op}s: connection failed")
            if counts.get("r429_no_retry_after"):
                failures.append(
                    f"{label}: {counts['r429_no_retry_after']} 429s without Retry-After"
                )
    if not over.get("put", {}).get("r429"):
        failures.append("overload: no 429 at all (was the server overloaded?)")
    if not recovery["recovered"]:
        failures.append(f"no recovery within {recovery['limit_s']} s")
    return {
        "ok": not failures,
        "failures": failures,
        "sustainable": sustainable,
        "offered": offered,
        "overload": over,
        "recovery": recovery,
        "memory": memory,
        "allowances": allowances,
        "other_processes_peak_mib": {
            sampler.name(p): round(sampler.peak(p), 1)
            for p in sampler.rss
            if sampler.roles.get(p) not in EVQ_KINDS
        },
    }


def allowances_mib(args: argparse.Namespace) -> dict[str, Any]:
    """What a process may hold past its budget (shards) or its idle size (gateways), in
    MiB: as given, else from the bounds that hold those bytes (stated in the summary)."""
    request = len(put_request("ovl-0", args.batch * args.overload_batch_factor, args.size))
    in_flight = args.max_requests * args.workers * request / MIB
    shard = args.shard_allowance_mb
    if shard is None:
        shard = 16 + in_flight
    gateway = args.gateway_allowance_mb
    if gateway is None:
        gateway = 64 + (args.procs * args.max_conns + 3 * args.max_requests) * request / MIB
    return {
        "shard_mib": round(shard, 1),
        "gateway_mib": round(gateway, 1),
        "request_bytes": request,
        "rule": "shard peak <= --shard-memory-mb + shard allowance; gateway (and worker) "
        "peak <= its idle RSS (baseline) + gateway allowance",
        "shard_default": "16 MiB (1-s sampling, allocator) + the requests the gateways let in "
        "at once (--max-requests x --workers x request bytes): their bodies reach a shard "
        "before it can refuse them",
        "gateway_default": "64 MiB (allocator, buffers) + request bytes x (the client's "
        "connections, each with a request read, + 3 x --max-requests: those in flight "
        "decoded, and twice in a frame toward a shard)",
    }


# ------------------------------------------------------------------ soak


def soak(args: argparse.Namespace) -> int:
    server_args = ["--shards", str(args.shards), "--workers", str(args.workers)]
    server_args += ["--max-requests", str(args.max_requests)]
    if args.shard_memory_mb:
        server_args += ["--shard-memory-mb", str(args.shard_memory_mb)]
    run = Run(args, server_args)
    try:
        return _soak(run, args)
    finally:
        run.emit({"server_stop": run.stop()})
        run.close()


def _soak(run: Run, args: argparse.Namespace) -> int:
    queues = run.queues(args.queues)
    run.create(queues)
    sustainable = run.calibrate(queues)
    run.emit({"calibration": sustainable})
    summary = soak_phase(run, args, queues, sustainable, args.minutes * 60)
    run.emit({"summary": summary})
    return 0 if summary["ok"] else 1


def soak_phase(
    run: Run,
    args: argparse.Namespace,
    queues: list[str],
    sustainable: dict[str, Any],
    seconds: float,
) -> dict[str, Any]:
    """The mixed workload for ``seconds``, with a sampler of its own (RSS and fds)."""
    rate = args.fraction * sustainable["requests_per_s"]
    run.emit({"soak": {"put_requests_per_s": round(rate, 1), "seconds": seconds}})
    consumers = run.split(args.consumers, args.procs)
    specs = [
        run.spec(seconds, queues, rate=rate / args.procs, consumers=c, max_conns=512)
        for c in consumers
    ]
    run.sampler = Sampler(run.server.pid, fds=True)
    phase = Phase(run.ctx, specs)
    start = time.monotonic()
    run.sampler.sample(0.0)
    minutes: dict[int, Totals] = {}
    totals, last = Totals(), start

    def fold(doc: dict[str, Any]) -> None:
        totals.add(doc)
        minutes.setdefault(int((doc["t"] - start) // 60), Totals()).add(doc)

    while phase.alive():
        time.sleep(1)
        rss = run.sampler.sample(time.monotonic() - start)
        for doc in phase.drain():
            fold(doc)
        if time.monotonic() - last >= args.progress:
            last = time.monotonic()
            top = {run.sampler.name(p): round(r, 1) for p, r in rss.items()}
            run.emit({"progress": "soak", "t": round(last - start), "of": seconds, "rss": top})
    for doc in phase.join():
        fold(doc)
    return soak_summary(run, args, totals, minutes, time.monotonic() - start)


def slope_mib_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) points, in MiB/hour."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(r for _, r in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return None
    return round(3600 * sum((t - mx) * (r - my) for t, r in points) / var, 2)


def soak_summary(
    run: Run,
    args: argparse.Namespace,
    totals: Totals,
    minutes: dict[int, Totals],
    seconds: float,
) -> dict[str, Any]:
    sampler = run.sampler
    processes, failures = {}, []
    # A slope over a few minutes is the warm-up's, not a leak's: judged from 10 minutes on.
    slope_judged = seconds - args.warmup >= args.min_slope_minutes * 60
    for pid, points in sampler.rss.items():
        name, kind = sampler.name(pid), sampler.roles.get(pid)
        kept = [(t, r) for t, r in points if t >= args.warmup]
        slope = slope_mib_per_hour(kept)
        fds = sampler.fd.get(pid, [])
        processes[name] = {
            "rss_start_mib": round(points[0][1], 1),
            "rss_end_mib": round(points[-1][1], 1),
            "rss_slope_mib_per_hour": slope,
            "samples": len(points),
            "fds_start": fds[0] if fds else None,
            "fds_end": fds[-1] if fds else None,
        }
        if kind not in EVQ_KINDS:
            continue
        if slope_judged and slope is not None and slope > args.max_rss_slope:
            failures.append(f"{name}: RSS grows {slope} MiB/h > {args.max_rss_slope}")
        if fds and fds[-1] - fds[0] > args.max_fd_growth:
            failures.append(f"{name}: fds {fds[0]} -> {fds[-1]} (> +{args.max_fd_growth})")
    per_minute = {
        op: [quantile(minutes[m].hist[op], 0.99) for m in sorted(minutes)]
        for op in ("put", "take", "ack")
    }
    for op in ("put", "take", "ack"):
        for kind in ("timeout", "conn_error"):
            if totals.kinds[op].get(kind):
                failures.append(f"{totals.kinds[op][kind]} {op}s: {kind}")
    roles = Counter(sampler.roles[p] for p in sampler.rss)
    return {
        "ok": not failures,
        "failures": failures,
        "seconds": round(seconds, 1),
        "processes": processes,
        "roles": dict(roles),
        "p99_ms_per_minute": per_minute,
        "p99_ms_first_vs_last_10_min": {
            op: {"first": v[:10], "last": v[-10:]} for op, v in per_minute.items()
        },
        "totals": totals.summary(seconds),
        "thresholds": {
            "rss_slope_mib_per_hour": args.max_rss_slope,
            "rss_slope_judged": slope_judged,
            "rss_slope_judged_from_minutes": args.min_slope_minutes,
            "fd_growth": args.max_fd_growth,
            "judged": list(EVQ_KINDS),
            "warmup_s": args.warmup,
        },
    }


# ------------------------------------------------------------------ command line


def _common(p: argparse.ArgumentParser, minutes: float) -> None:
    p.add_argument("--minutes", type=float, default=minutes)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="gateway processes")
    p.add_argument("--max-requests", type=int, default=512)
    p.add_argument("--producers", type=int, default=32, help="calibration: closed loop")
    p.add_argument("--consumers", type=int, default=8)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--size", type=int, default=1000, help="message body bytes")
    p.add_argument("--batch", type=int, default=10, help="messages per put request")
    p.add_argument("--take-max", type=int, default=1000)
    p.add_argument("--procs", type=int, default=2, help="load-generator processes")
    p.add_argument("--max-conns", type=int, default=1024, help="per load process")
    p.add_argument("--timeout", type=float, default=10.0, help="client timeout per request, s")
    p.add_argument("--calibrate", type=float, default=10.0, help="seconds")
    p.add_argument("--progress", type=float, default=5.0, help="seconds between lines")
    p.add_argument("--dir", default=None, help="where the data directory goes")
    p.add_argument("--out", default=None, help="also write the JSON lines here")
    p.add_argument("--keep", action="store_true", help="keep the data directory")
    p.add_argument(
        "--serve-arg", action="append", default=[], help="one more argument for evq serve"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    o = sub.add_parser("overload")
    _common(o, 5.0)
    o.add_argument("--shard-memory-mb", type=int, default=400)
    o.add_argument("--factor", type=float, default=10.0)
    o.add_argument("--overload-batch-factor", type=int, default=5)
    o.add_argument("--shard-allowance-mb", type=float, default=None, help="default: computed")
    o.add_argument("--gateway-allowance-mb", type=float, default=None, help="default: computed")
    o.add_argument("--recovery-limit", type=float, default=120.0)
    o.add_argument("--recovery-window", type=int, default=3)
    o.add_argument(
        "--recovery-fraction", type=float, default=0.5, help="of the sustainable put rate"
    )
    o.add_argument("--then-soak", type=float, default=0, help="s of soak on the same server")
    s = sub.add_parser("soak")
    _common(s, 60.0)
    s.add_argument("--shard-memory-mb", type=int, default=0, help="0: the server's default")
    for p in (o, s):
        p.add_argument("--fraction", type=float, default=0.5, help="of the sustainable rate")
        p.add_argument("--warmup", type=float, default=120.0, help="s left out of slopes")
        p.add_argument("--max-rss-slope", type=float, default=20.0, help="MiB/h per process")
        p.add_argument("--max-fd-growth", type=int, default=50)
        p.add_argument("--min-slope-minutes", type=float, default=10.0, help="to judge slopes")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # SIGTERM (a test's timeout) unwinds, so the server's session is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return overload(args) if args.command == "overload" else soak(args)


if __name__ == "__main__":
    sys.exit(main())
