"""S3 requests against busy queues: how many object PUTs ``evq serve`` makes per second on
S3 as the number of busy queues grows (moto's S3 server on 127.0.0.1).

Each group commit of a shard is one object (FORMAT.md), so the log's PUTs per second should
follow the shards' commits per second, whatever the number of queues; the version-1 layout
(one object per queue per commit) would have made one PUT for every queue in every commit.
This tool starts moto's server, a counting proxy in front of it (every request, by method
and by kind of object: shard log, snapshot, other), and ``evq serve --store s3://…`` through
the proxy; ``--producers`` closed-loop producers put single 100-B messages into ``--queues``
queues in turn (producer ``i`` puts into queue ``i``, ``i + P``, ``i + 2P``, …, so every
queue is busy). Over the measured window it reports puts/s, the log's PUT requests/s, the
shards' commits/s (``evq_shard_log_commits_total``) and the PUTs a per-queue layout would
have made (the sum over queues of the commits each had a part in,
``evq_queue_log_segments``).

    .venv/bin/python loadtest/bench_s3_puts.py [--shards 1 2] [--queues 10 100 1000] \\
        [--producers 64] [--duration 10]

Prints one JSON line per (shards, queues) and a summary line per shard count.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from served import EvqServe, free_port

BUCKET = "evq-bench"
REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
BODY = "x" * 100


# ------------------------------------------------------------------ the counting proxy


def _kind(path: str) -> str:
    if "/wal/" in path:
        return "wal"
    if "/snap/" in path:
        return "snapshot"
    return "other"


def _proxy_main(listen: int, upstream: str, ready: Any) -> None:
    """A reverse proxy that counts requests by (method, kind); ``GET /__counts`` says them."""
    counts: collections.Counter[str] = collections.Counter()

    async def counts_page(request: web.Request) -> web.Response:
        return web.json_response(dict(counts))

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        counts[f"{request.method} {_kind(request.path)}"] += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        async with request.app["session"].request(
            request.method,
            upstream + request.path_qs,
            data=body,
            headers=headers,
            allow_redirects=False,
            auto_decompress=False,
        ) as up:
            data = await up.read()
            out = {k: v for k, v in up.headers.items() if k.lower() not in _HOP}
            return web.Response(status=up.status, body=data, headers=out)

    async def session(app: web.Application) -> Any:
        app["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256), skip_auto_headers=["User-Agent"]
        )
        yield
        await app["session"].close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.cleanup_ctx.append(session)
    app.router.add_get("/__counts", counts_page)
    app.router.add_route("*", "/{tail:.*}", forward)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=listen, print=None, access_log=None)


_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding"}


# ------------------------------------------------------------------ the load


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as r:
        r.raise_for_status()
        return await r.json()


async def _metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Sums of the shards' commits and of the queues' commits from /metrics."""
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    sums = {"commits": 0.0, "queue_commits": 0.0}
    for name, key in (
        ("evq_shard_log_commits_total", "commits"),
        ("evq_queue_log_segments", "queue_commits"),
    ):
        for value in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M):
            sums[key] += float(value)
    return sums


async def drive(url: str, proxy: str, queues: int, args: argparse.Namespace) -> dict[str, Any]:
    names = [f"s3q{queues}-{i}" for i in range(queues)]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for name in names:
            async with session.put(f"{url}/v1/queues/{name}", json={}) as r:
                r.raise_for_status()
        done = 0
        stop = False

        async def producer(i: int) -> None:
            nonlocal done
            k = i
            async with aiohttp.ClientSession() as own:  # a keep-alive connection of its own
                while not stop:
                    q = names[k % queues]
                    k += args.producers
                    async with own.post(
                        f"{url}/v1/queues/{q}/messages", json={"messages": [{"body": BODY}]}
                    ) as r:
                        r.raise_for_status()
                        await r.read()
                    done += 1

        tasks = [asyncio.ensure_future(producer(i)) for i in range(args.producers)]
        await asyncio.sleep(args.warmup)
        c0, d0, t0 = await _get_json(session, f"{proxy}/__counts"), done, time.time()
        m0 = await _metrics(session, url)
        await asyncio.sleep(args.duration)
        c1, d1, t1 = await _get_json(session, f"{proxy}/__counts"), done, time.time()
        m1 = await _metrics(session, url)
        stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
        for name in names:
            async with session.delete(f"{url}/v1/queues/{name}"):
                pass
    seconds = t1 - t0

    def rate(key: str) -> float:
        return round((c1.get(key, 0) - c0.get(key, 0)) / seconds, 1)

    commits = (m1["commits"] - m0["commits"]) / seconds
    return {
        "shards": args.shard_count,
        "queues": queues,
        "producers": args.producers,
        "puts_per_s": round((d1 - d0) / seconds),
        "wal_puts_per_s": rate("PUT wal"),
        "commits_per_s": round(commits, 1),
        "snapshot_puts_per_s": rate("PUT snapshot"),
        "other_puts_per_s": rate("PUT other"),
        "gets_per_s": round(sum(rate(k) for k in c1 if k.startswith("GET")), 1),
        "deletes_per_s": round(sum(rate(k) for k in c1 if k.startswith("DELETE")), 1),
        "per_queue_layout_puts_per_s": round((m1["queue_commits"] - m0["queue_commits"]) / seconds),
    }


# ------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--queues", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--producers", type=int, default=64)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    args = ap.parse_args()
    os.environ.update(CREDENTIALS)
    moto_port, proxy_port = free_port(), free_port()
    moto_s3 = [sys.executable, str(Path(__file__).with_name("moto_s3.py"))]  # S3's atomicity
    moto = subprocess.Popen(
        [*moto_s3, "-H", "127.0.0.1", "-p", str(moto_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ready = multiprocessing.Event()
    upstream = f"http://127.0.0.1:{moto_port}"
    proxy = multiprocessing.Process(
        target=_proxy_main, args=(proxy_port, upstream, ready), daemon=True
    )
    proxy.start()
    ready.wait(30)
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    try:
        _wait_for(upstream)
        import boto3

        s3 = boto3.client("s3", endpoint_url=upstream, region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        _wait_for(f"{proxy_url}/__counts")
        for shards in args.shards:
            args.shard_count = shards
            rows = []
            with tempfile.TemporaryDirectory() as tmp:
                store = f"s3://{BUCKET}/bench-{shards}-{time.monotonic_ns()}"
                extra = ["--store", store, "--endpoint", proxy_url, "--region", REGION]
                extra += ["--shards", str(shards)]
                server = EvqServe(Path(tmp) / "data", Path(tmp) / "serve.log", extra)
                try:
                    server.wait_ready(180)
                    for queues in args.queues:
                        row = asyncio.run(drive(server.url, proxy_url, queues, args))
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                finally:
                    stopped = server.stop()
                    if stopped["exit_code"] != 0:
                        print((Path(tmp) / "serve.log").read_text()[-3000:], file=sys.stderr)
            print(
                json.dumps(
                    {
                        "shards": shards,
                        "wal_puts_per_s_by_queues": {
                            r["queues"]: r["wal_puts_per_s"] for r in rows
                        },
                        "per_queue_layout_by_queues": {
                            r["queues"]: r["per_queue_layout_puts_per_s"] for r in rows
                        },
                    }
                ),
                flush=True,
            )
    except BaseException as exc:
        # Said again after the proxy stopped: its shutdown's noise would bury the traceback.
        proxy.terminate()
        proxy.join(10)
        print(f"bench_s3_puts failed: {exc!r}", file=sys.stderr, flush=True)
        raise
    finally:
        proxy.terminate()
        moto.terminate()
        moto.wait(10)


def _wait_for(url: str, timeout: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


if __name__ == "__main__":
    main()
