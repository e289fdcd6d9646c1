"""The harness's adapters for PostgreSQL, Redis and evq (HTTP), each filling its fresh queue
in ``prepare`` before the run's clock starts (``loadtest/depth_mixed.py`` says how). Imported
by the harness's load generator in its own virtualenv (asyncpg, redis-py)."""

from __future__ import annotations

import asyncio
import base64
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "shared" / "bench"))

import aiohttp
import asyncpg
import redis.asyncio as aioredis
from adapters.http_json import HttpJsonAdapter
from adapters.postgres import PostgresAdapter, _table
from adapters.redis import ACK, PUT, TAKE, RedisAdapter, _hostport, _keys

BODY = b"d" * 100  # the fill's bodies: the load's size


class _Deep:
    """An adapter whose ``prepare`` also fills the fresh queue: ``opts`` ``depth`` messages,
    and with ``mode=churned`` takes and acks them all (``deepen``, each system's own)."""

    @classmethod
    async def prepare(cls, target: str, queue: str, opts: dict[str, Any]) -> None:
        await super().prepare(target, queue, opts)  # type: ignore[misc]
        depth = int(opts.get("depth", 0))
        if depth:
            await cls.deepen(target, queue, depth, str(opts.get("mode", "empty")) == "churned")

    @classmethod
    async def deepen(cls, target: str, queue: str, depth: int, churn: bool) -> None:
        raise NotImplementedError


def _progress(target: str, what: str, done: int, total: int, started: float) -> None:
    rate = done / max(time.monotonic() - started, 1e-9)
    print(f"    {target}: {what} {done:,}/{total:,} ({rate:,.0f}/s)", flush=True)


async def _in_steps(
    target: str, what: str, total: int, step: Callable[[int], Awaitable[int]]
) -> None:
    """Call ``step(left)`` until ``total`` messages are done or a step does none (it returns
    how many it did), with a progress line every 200,000 and at the end."""
    started, done = time.monotonic(), 0
    while done < total:
        n = await step(total - done)
        if not n:
            break
        done += n
        if done % 200_000 == 0 and done < total:
            _progress(target, what, done, total, started)
    _progress(target, what, done, total, started)


class DeepPostgres(_Deep, PostgresAdapter):
    @classmethod
    async def deepen(cls, target: str, queue: str, depth: int, churn: bool) -> None:
        t = _table(queue)
        conn = await asyncpg.connect(target)
        try:
            started = time.monotonic()
            await conn.execute(
                f"INSERT INTO {t} (vt, message) SELECT now(), $1::bytea "
                "FROM generate_series(1, $2::int)",
                BODY,
                depth,
            )
            _progress("postgres", "put", depth, depth, started)
            if churn:
                started = time.monotonic()
                await conn.execute(
                    f"UPDATE {t} SET vt = now() + interval '30 seconds', read_ct = read_ct + 1"
                )
                await conn.execute(f"DELETE FROM {t}")
                _progress("postgres", "taken and acked", depth, depth, started)
        finally:
            await conn.close()


class DeepRedis(_Deep, RedisAdapter):
    @classmethod
    async def deepen(cls, target: str, queue: str, depth: int, churn: bool) -> None:
        host, port = _hostport(target)
        seq, ready, inflight, job = _keys(queue)
        r = aioredis.Redis(host=host, port=port)
        try:
            put, take, ack = [await r.script_load(s) for s in (PUT, TAKE, ACK)]

            async def put_some(left: int) -> int:
                n = min(2000, left)
                pipe = r.pipeline(transaction=False)
                for _ in range(n):
                    pipe.evalsha(put, 2, seq, ready, job, BODY, 0)
                await pipe.execute()
                return n

            async def take_and_ack(left: int) -> int:
                got = await r.evalsha(take, 2, ready, inflight, job, min(1000, left), 30_000)
                if got:
                    await r.evalsha(ack, 1, inflight, job, *got[0::2])
                return len(got) // 2

            await _in_steps("redis", "put", depth, put_some)
            if churn:
                await _in_steps("redis", "taken and acked", depth, take_and_ack)
        finally:
            await r.aclose()


class DeepHttp(_Deep, HttpJsonAdapter):
    @classmethod
    async def deepen(cls, target: str, queue: str, depth: int, churn: bool) -> None:
        url = f"{target.rstrip('/')}/v1/queues/{queue}"
        message = {"body_b64": base64.b64encode(BODY).decode()}
        async with aiohttp.ClientSession() as s:

            async def put(n: int) -> None:
                async with s.post(f"{url}/messages", json={"messages": [message] * n}) as r:
                    r.raise_for_status()

            async def put_some(left: int) -> int:
                chunk = [n for i in range(8) if (n := min(1000, left - i * 1000)) > 0]
                await asyncio.gather(*(put(n) for n in chunk))
                return sum(chunk)

            async def take_and_ack(left: int) -> int:
                take = {"max": min(1000, left), "visibility_timeout": 600}
                async with s.post(f"{url}/take", json=take) as r:
                    r.raise_for_status()
                    got = (await r.json())["messages"]
                if got:
                    items = [{"id": m["id"], "lease": m["lease"]} for m in got]
                    async with s.post(f"{url}/ack", json={"items": items}) as r:
                        r.raise_for_status()
                return len(got)

            await _in_steps("evq", "put", depth, put_some)
            if churn:
                await _in_steps("evq", "taken and acked", depth, take_and_ack)
