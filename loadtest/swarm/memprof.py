"""``--profile-memory``: where a WebSocket watcher's memory goes in one server process.

For each of ``--profile-kinds``, plain and then under tracemalloc, one at a time: start the
server side in a fresh interpreter (``watch_swarm.py --profile-server``, ``swarm.memprof_server``),
wait for it (its control port, and the gateway's ``/readyz``), hold ``-n`` watchers on it from
the swarm's client processes, ask it for the difference, and print the breakdowns
(:func:`profile_table`) and the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing as mp
import random
import signal
import subprocess
import sys
from typing import Any

from procstat import total_cpu_seconds
from served import ROOT, free_port

from .common import C_ARMED, N_COUNTERS, log, machine, now
from .coordinator import Client, start_clients
from .http_client import Http, timed_put

__all__ = ["PROFILE_KEY", "profile_memory", "profile_table"]

PROFILE_KEY = "profile-key"
ENTRY = ROOT / "loadtest" / "watch_swarm.py"  # the tool's script: --profile-server
START_TIMEOUT_S = 60.0  # a fresh interpreter importing aiohttp (and the gateway)
READY_TIMEOUT_S = 60.0  # the gateway's shard recovering its (empty) data directory
POLL_S = 0.3


def profile_memory(args: argparse.Namespace) -> int:
    """``--profile-memory``: each kind of server plain and under tracemalloc, one at a time."""
    if args.n > 15_000:
        raise SystemExit("--profile-memory: at most 15,000 watchers (one server process)")
    results: dict[str, Any] = {"machine": machine(), "watchers": args.n}
    deadline = now() + args.max_seconds
    for kind in args.profile_kinds.split(","):
        for trace in (False, True):
            if now() > deadline:
                break
            name = kind + (" + tracemalloc" if trace else "")
            log(f"profile: {name}, {args.n} WebSocket watchers")
            results[name] = _profile_one(args, kind, trace, deadline)
    print(profile_table(results, args.profile_top))
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    return 0


def _profile_one(args: argparse.Namespace, kind: str, trace: bool, deadline: float) -> Any:
    args.host, args.port, args.control_port = "127.0.0.1", free_port(), free_port()
    args.key_list, args.mode = [PROFILE_KEY], "ws"
    args.profile_kind, args.profile_trace = kind, trace
    command = [sys.executable, str(ENTRY), "--profile-server", kind]
    command += [str(args.port), str(args.control_port), *(["--trace"] if trace else [])]
    server = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
    ctx = mp.get_context("fork")
    shared = ctx.RawArray("q", args.procs * N_COUNTERS)
    clients = start_clients(args, ctx, shared, deadline)
    try:
        coro = _profile_coordinate(args, clients, server)
        return asyncio.run(asyncio.wait_for(coro, max(1.0, deadline - now())))
    finally:
        for c in clients:
            c.stop()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


async def _profile_coordinate(
    args: argparse.Namespace, clients: list[Client], server: subprocess.Popen[bytes]
) -> Any:
    loop = asyncio.get_running_loop()
    for c in clients:
        c.listen(loop)
    http = Http(args.host, args.control_port)
    await _await_server(args, http, server)
    puts = args.profile_puts if args.profile_kind == "gateway" and not args.profile_trace else 0
    before: list[dict[str, Any]] = []
    if puts:
        await _profile_puts(args, http, server.pid, min(200, puts))  # warm up
        before = [await _profile_puts(args, http, server.pid, puts) for _ in range(3)]
    await http.json("GET", "/_profile/mark")
    p = len(clients)
    shares = [args.n // p + (1 if i < args.n % p else 0) for i in range(p)]
    firsts = list(itertools.accumulate([0, *shares[:-1]]))
    timeout = args.phase_timeout
    results = await asyncio.gather(
        *(
            c.call("connect", timeout + 10, n=n, first=f, version=0, timeout=timeout)
            for c, n, f in zip(clients, shares, firsts, strict=True)
        )
    )
    armed = sum(r["counters"][C_ARMED] for r in results)
    log(f"  {armed} armed; settling {args.settle} s")
    await asyncio.sleep(args.settle)
    doc = await http.json("GET", f"/_profile/report?n={armed}&top={args.profile_top}")
    if puts:
        after = [await _profile_puts(args, http, server.pid, puts) for _ in range(3)]
        doc["unwatched_puts"] = {"none": before, "connected": after}
    await asyncio.gather(*(c.call("close", 30) for c in clients))
    http.close()
    return doc


async def _await_server(
    args: argparse.Namespace,
    ctl: Http,
    server: subprocess.Popen[bytes],
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> None:
    """Wait until the profile server answers on its control port and, for the gateway, until
    its ``/readyz`` answers 200: its shard has recovered. The control port answers first, and
    a PUT before the shard has recovered is a 503 ("shard 0 is still recovering").

    Raises: RuntimeError (the server exited, or was not there in time)."""
    started = "the profile server did not start"
    await _await_200(ctl, "/_profile/gc", server, START_TIMEOUT_S, started)
    if args.profile_kind != "gateway":
        return  # lean and bare serve only WebSockets: ready once listening
    gateway = Http(args.host, args.port)
    try:
        ready = "the profile server's gateway was not ready"
        await _await_200(gateway, "/readyz", server, ready_timeout_s, ready)
    finally:
        gateway.close()


async def _await_200(
    http: Http, path: str, server: subprocess.Popen[bytes], timeout_s: float, failure: str
) -> None:
    """GET ``path`` every POLL_S until it answers 200. Raises: RuntimeError (``failure``:
    ``server`` exited, or ``timeout_s`` passed; with the last answer)."""
    t_end = now() + timeout_s
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"{failure}: it exited with {server.returncode}")
        try:
            answer = http.request("GET", path)
            status, body = await asyncio.wait_for(answer, min(5, max(0.1, t_end - now())))
        except (OSError, asyncio.IncompleteReadError) as exc:  # TimeoutError is an OSError
            last = repr(exc)
        else:
            if status == 200:
                return
            last = f"{status} {body[:200]!r}"
        if now() >= t_end:
            raise RuntimeError(f"{failure} within {timeout_s:g} s (GET {path}: {last})")
        await asyncio.sleep(POLL_S)


async def _profile_puts(args: argparse.Namespace, ctl: Http, pid: int, n: int) -> dict[str, Any]:
    """``n`` PUTs on a key nobody watches, 16 at once: time, the server's CPU and its
    garbage collections per generation meanwhile."""
    key = f"unwatched-{random.randbytes(4).hex()}"
    gc0 = await ctl.json("GET", "/_profile/gc")
    cpu0, t0 = total_cpu_seconds([pid]), now()
    jobs = iter(range(n))

    async def lane() -> None:
        http = Http(args.host, args.port)
        for i in jobs:
            await timed_put(http, key, i)
        http.close()

    await asyncio.gather(*(lane() for _ in range(16)))
    seconds, cpu = now() - t0, total_cpu_seconds([pid]) - cpu0
    gc1 = await ctl.json("GET", "/_profile/gc")
    return {
        "puts_per_s": round(n / seconds, 1),
        "cpu_ms_per_put": round(cpu / n * 1000, 3),
        "gc_collections": [b - a for a, b in zip(gc0, gc1, strict=True)],
    }


def profile_table(results: dict[str, Any], top: int) -> str:
    lines = [f"memory per WebSocket connection, {results['watchers']} connections, one process"]
    for name, doc in results.items():
        if not isinstance(doc, dict) or "rss_per_conn_kib" not in doc:
            continue
        lines.append("")
        head = f"{name}: RSS {doc['rss_per_conn_kib']} KiB/conn; gc-tracked objects "
        head += f"{doc['gc_objects_per_conn']}/conn, {doc['gc_bytes_per_conn_kib']} KiB/conn; "
        head += (
            f"a full gc.collect() {doc['full_gc_ms']['before']} → {doc['full_gc_ms']['after']} ms"
        )
        if "traced_per_conn_kib" in doc:
            head += f"; tracemalloc {doc['traced_per_conn_kib']} KiB/conn"
        lines.append(head)
        if "unwatched_puts" in doc:
            for label, runs in doc["unwatched_puts"].items():
                text = "; ".join(
                    f"{r['puts_per_s']}/s, {r['cpu_ms_per_put']} ms CPU/PUT, "
                    f"gc {r['gc_collections']}"
                    for r in runs
                )
                lines.append(f"  PUTs on an unwatched key, {label}: {text}")
        if "by_line" in doc:
            lines.append("  bytes/conn  file")
            for row in doc["by_file"][: max(3, top // 2)]:
                lines.append(f"  {row['bytes_per_conn']:>10}  {row['file']}")
            lines.append("  bytes/conn  blocks/conn  allocated at")
            for row in doc["by_line"][:top]:
                lines.append(
                    f"  {row['bytes_per_conn']:>10}  {row['blocks_per_conn']:>11}  {row['where']}"
                )
        else:
            lines.append("  bytes/conn  objects/conn  type")
            for row in doc["by_type"][:top]:
                lines.append(f"  {row['bytes_per_conn']:>10}  {row['per_conn']:>12}  {row['type']}")
    return "\n".join(lines)
