"""The classic attacks on a live ``evq serve``, one at a time, while a well-behaved client
measures its round trips: what each attack costs the server and what answer it gets.

    .venv/bin/python loadtest/attacks.py --seconds 20 --out /tmp/attacks.json
    .venv/bin/python loadtest/attacks.py --attacks smuggling,oversized_headers --seconds 5

For each attack: the good client (one blocking client: put, take, ack, in a loop, from
127.0.0.1) runs ``--seconds`` on the quiet server, then ``--seconds`` with the attack running
beside it (from an address of its own, 127.0.0.2, .3, …: the server refuses addresses that
send too many requests failing as HTTP); with ``--floor``, ``--seconds`` more with the attack
aimed at a process that only refuses (what the attack costs the machine, evq aside). The
report gives, per attack, the good client's p50/p99 round trip quiet and attacked (and their
ratio), its failures, the gateway process's memory (RSS) before and at its peak, and what the
attacking connections got: a status line, a WebSocket close, a close without an answer
(with how long it took), or nothing yet (still open when the phase ended).

The attacks (each with ``--scale`` connections or requests where it applies):

- ``slowloris_headers``: connections that trickle a request head, one byte a second;
- ``slowloris_body``: connections that send a head and trickle the body it announces;
- ``slowloris_sqs``: the same on an SQS request (``POST /``, a route aiohttp serves);
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
import contextlib
import functools
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import procstat
from served import ROOT, EvqServe

sys.path.insert(0, str(ROOT))

from evq.client import Client

QUEUE = "attacked"
Outcome = Counter[str]
# The address the attack connects from: one of its own per attack (127.0.0.2, .3, …), as
# from another host, apart from the well-behaved client's 127.0.0.1. The server refuses an
# address that sends too many requests failing as HTTP (gateway/penalty.py); an attack's
# ban must neither refuse the client nor the attacks after it.
SOURCE = ["127.0.0.2"]
CONNECT_S = 5.0  # a connection not set up by then was dropped (a silenced address)
_IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux


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


async def _open(
    port: int, outcome: Outcome | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A connection to the server, or None (counted in ``outcome``) if it refused one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # The port is chosen at connect, as without a bound address: bound first, the kernel
        # picks among ports no TIME_WAIT holds, and the attack slowed down after a few
        # thousand connections (the attacker's limit, not the server's).
        sock.setsockopt(socket.IPPROTO_IP, _IP_BIND_ADDRESS_NO_PORT, 1)
        sock.bind((SOURCE[0], 0))
        sock.setblocking(False)
        connect = asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        await asyncio.wait_for(connect, CONNECT_S)
        return await asyncio.open_connection(sock=sock)
    except TimeoutError:
        sock.close()
        if outcome is not None:
            outcome["dropped (no answer to connect)"] += 1
        return None
    except OSError:
        sock.close()
        if outcome is not None:
            outcome["not accepted"] += 1
        return None


async def _trickle(port: int, n: int, seconds: float, head: bytes, drip: bytes) -> Outcome:
    """``n`` connections send ``head``, then one byte of ``drip`` a second."""
    until = time.monotonic() + seconds
    outcome: Outcome = Counter()

    async def one() -> None:
        conn = await _open(port, outcome)
        if conn is None:
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


async def slowloris_sqs(port: int, n: int, seconds: float) -> Outcome:
    head = (
        b"POST / HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n"
    )
    return await _trickle(port, n, seconds, head, b"Action=ListQueues&X=" + b"a" * 99_000)


async def _requests(port: int, requests: list[bytes], seconds: float) -> Outcome:
    """Each request on a connection of its own, over and over for ``seconds``; the answers
    they got."""
    until = time.monotonic() + seconds
    outcome: Outcome = Counter()

    async def one(request: bytes) -> None:
        conn = await _open(port, outcome)
        if conn is None:
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
        conn = await _open(port, outcome)
        if conn is None:
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
        conn = await _open(port, outcome)
        if conn is None:
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
    connector = aiohttp.TCPConnector(local_addr=(SOURCE[0], 0))
    async with aiohttp.ClientSession(connector=connector) as session:
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
    "slowloris_sqs": slowloris_sqs,
    "oversized_headers": oversized_headers,
    "smuggling": smuggling,
    "connection_flood": connection_flood,
    "pipeline_no_read": pipeline_no_read,
    "websocket_no_read": websocket_no_read,
}
SCALE = {  # connections (or requests) per attack, at --scale 1
    "slowloris_headers": 500,
    "slowloris_body": 500,
    "slowloris_sqs": 500,
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
        self.times: list[tuple[float, float]] = []  # (when a cycle began, how long it took)
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
                self.times.append((began, time.perf_counter() - began))

    def measure(self, seconds: float, during: Callable[[], None] | None = None) -> dict[str, Any]:
        """The cycles that began within ``seconds``, quiet or while ``during()`` runs (an
        attack that outlasts the phase, e.g. its connections held up by the kernel's drops,
        is not measured longer: its quiet tail would thin the p99 out)."""
        self.times, self.failures = [], []
        self.stop.clear()
        start = time.perf_counter()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if during is not None:
            during()
        else:
            time.sleep(seconds)
        self.stop.set()
        self.thread.join(60)
        times = sorted(took for began, took in self.times if began < start + seconds)
        return {
            "cycles": len(times),
            "p50_ms": round(1000 * statistics.median(times), 2) if times else None,
            "p99_ms": round(1000 * times[int(0.99 * (len(times) - 1))], 2) if times else None,
            "failures": len(self.failures),
            "failure_examples": self.failures[:3],
        }


def _gateway_rss(server: EvqServe) -> int:
    return procstat.rss_bytes(server.pid) or 0


def _attacker(niceness: int) -> None:
    os.nice(niceness)


def _run_attack(name: str, port: int, n: int, seconds: float, source: str) -> dict[str, int]:
    SOURCE[0] = source
    return dict(asyncio.run(ATTACKS[name](port, n, seconds)))


def _attack(
    server: EvqServe,
    name: str,
    n: int,
    seconds: float,
    peak: list[int],
    outcome: Outcome,
    niceness: int,
    port: int | None = None,
) -> None:
    """Run one attack to its end, sampling the gateway's memory meanwhile.

    The attack runs in a process of its own, not beside the well-behaved client: in one
    interpreter the attacker's event loop and the client's thread share the GIL, and the
    client's round trips measured the attacker's Python as much as the server (the first
    full run). At ``niceness`` (10 by default) the attacker stands for one on another
    machine: on these 2 cores it still takes every cycle the server and the client leave,
    but does not push them off the CPU (``--attacker-nice 0`` measures it pushing)."""
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _gateway_rss(server))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(
            1, mp_context=context, initializer=_attacker, initargs=(niceness,)
        ) as pool:
            source = f"127.0.0.{2 + sorted(ATTACKS).index(name)}"
            job = pool.submit(_run_attack, name, port or server.port, n, seconds, source)
            outcome.update(job.result())
    finally:
        done.set()
        sampler.join()


_REFUSAL = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 10\r\n"
    b'Connection: close\r\nContent-Length: 20\r\n\r\n{"error": "refused"}'
)


def _refuser(ports: Any) -> None:
    """The floor: a process that answers every connection as evq answers a refused address
    (read what came, a 429, close), with nothing else to do. An attack aimed at it costs the
    machine what the attack costs by itself (the attacker, the kernel's connections)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    ports.put(listener.getsockname()[1])
    dropped = bytearray(65536)
    while True:
        conn, _ = listener.accept()
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            conn.recv_into(dropped)
        with contextlib.suppress(OSError):
            conn.send(_REFUSAL)
        conn.close()


def run(
    attacks: list[str],
    seconds: float,
    scale: float,
    out: Path | None,
    niceness: int = 10,
    floor: bool = False,
) -> dict[str, Any]:
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

                attack = functools.partial(
                    _attack, server, name, n, seconds, peak, outcome, niceness
                )
                attacked = prober.measure(seconds, during=attack)
                ratio = None
                if quiet["p99_ms"] and attacked["p99_ms"]:
                    ratio = round(attacked["p99_ms"] / quiet["p99_ms"], 2)
                results[name] = {
                    "connections": n,
                    "quiet": quiet,
                    "attacked": attacked,
                    "p99_ratio": ratio,
                    **(_floor(server, prober, name, n, seconds, niceness, quiet) if floor else {}),
                    "gateway_rss_mib_before": round(rss_before / 2**20, 1),
                    "gateway_rss_mib_peak": round(peak[0] / 2**20, 1),
                    "answers": dict(outcome.most_common()),
                    "server_alive": server.proc.poll() is None,
                }
                print(json.dumps({name: results[name]}), flush=True)
                time.sleep(1)
        finally:
            server.stop()
    report = {
        "seconds": seconds,
        "scale": scale,
        "attacker_nice": niceness,
        "attacks": results,
        "command": " ".join(sys.argv),
    }
    if out is not None:
        out.write_text(json.dumps(report, indent=2))
    return report


def _floor(
    server: EvqServe,
    prober: Prober,
    name: str,
    n: int,
    seconds: float,
    niceness: int,
    quiet: dict[str, Any],
) -> dict[str, Any]:
    """The client on evq while the same attack is aimed at a process that only refuses
    (:func:`_refuser`): what the attack costs the machine, evq aside."""
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    refuser = context.Process(target=_refuser, args=(ports,), daemon=True)
    refuser.start()
    try:
        port = ports.get(timeout=30)
        attack = functools.partial(
            _attack, server, name, n, seconds, [0], Counter(), niceness, port
        )
        beside = prober.measure(seconds, during=attack)
    finally:
        refuser.kill()
        refuser.join()
    ratio = None
    if quiet["p99_ms"] and beside["p99_ms"]:
        ratio = round(beside["p99_ms"] / quiet["p99_ms"], 2)
    return {"floor": beside, "floor_p99_ratio": ratio}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    parser.add_argument("--scale", type=float, default=1.0, help="times the default sizes")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--attacker-nice", type=int, default=10, help="the attacking process's niceness"
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="a third phase per attack: the client on evq while the attack is aimed at a "
        "process that only refuses (what the attack costs the machine, evq aside)",
    )
    args = parser.parse_args()
    names = [a for a in args.attacks.split(",") if a]
    unknown = set(names) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks: {', '.join(sorted(unknown))}")
    report = run(names, args.seconds, args.scale, args.out, args.attacker_nice, args.floor)
    bad = [
        n
        for n, r in report["attacks"].items()
        if r["attacked"]["failures"] or not r["server_alive"]
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
