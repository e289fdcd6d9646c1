"""An adapter for the shared load generator (``../shared/bench/loadgen.py``) that spreads the
producers over several queues of evq: ``--opt queues=Q --opt per_proc=P`` puts producer ``i``
of load-generator process ``p`` on queue ``<queue>-<(p * P + i) % Q>`` (process ``p`` is the
multiprocessing child ``SpawnProcess-<p + 1>``; a single process is 0), so 64 producers from
8 processes with ``per_proc=8`` use each of 64 queues once, or each of 8 queues 8 times.

Run with ``loadtest/`` on ``PYTHONPATH`` and ``--adapter evq_queues:SpreadAdapter``;
``loadtest/bench_queues.py`` does.

``GatewaysAdapter`` spreads the processes over gateways instead: ``--opt targets=URL,URL``
sends the producers of process ``p`` to gateway ``p % len(targets)``, all on one queue
(``loadtest/bench_gateways.py``).
"""

from __future__ import annotations

import itertools
import multiprocessing

import aiohttp
from adapters.http_json import HttpJsonAdapter

_instances = itertools.count()


def _process_slot() -> int:
    name = multiprocessing.current_process().name  # SpawnProcess-3 -> 2; MainProcess -> 0
    _, _, number = name.rpartition("-")
    return int(number) - 1 if number.isdigit() else 0


def _queues(queue: str, opts: dict) -> list[str]:
    return [f"{queue}-{i}" for i in range(int(opts["queues"]))]


class SpreadAdapter(HttpJsonAdapter):
    name = "evq_queues"

    def __init__(self, target: str, queue: str, opts: dict) -> None:
        names = _queues(queue, opts)
        index = _process_slot() * int(opts.get("per_proc", 8)) + next(_instances)
        super().__init__(target, names[index % len(names)], opts)

    @classmethod
    async def prepare(cls, target: str, queue: str, opts: dict) -> None:
        async with aiohttp.ClientSession() as s:
            for name in _queues(queue, opts):
                async with s.put(f"{target.rstrip('/')}/v1/queues/{name}", json={}) as r:
                    r.raise_for_status()

    @classmethod
    async def cleanup(cls, target: str, queue: str, opts: dict) -> None:
        async with aiohttp.ClientSession() as s:
            for name in _queues(queue, opts):
                async with s.delete(f"{target.rstrip('/')}/v1/queues/{name}"):
                    pass


def _targets(opts: dict) -> list[str]:
    return [t for t in str(opts["targets"]).split(",") if t]


class GatewaysAdapter(HttpJsonAdapter):
    name = "evq_gateways"

    def __init__(self, target: str, queue: str, opts: dict) -> None:
        targets = _targets(opts)
        super().__init__(targets[_process_slot() % len(targets)], queue, opts)

    @classmethod
    async def prepare(cls, target: str, queue: str, opts: dict) -> None:
        url = f"{_targets(opts)[0]}/v1/queues/{queue}"
        async with aiohttp.ClientSession() as s, s.put(url, json={}) as r:
            r.raise_for_status()

    @classmethod
    async def cleanup(cls, target: str, queue: str, opts: dict) -> None:
        url = f"{_targets(opts)[0]}/v1/queues/{queue}"
        async with aiohttp.ClientSession() as s, s.delete(url):
            pass
