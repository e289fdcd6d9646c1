"""How long ``evq shards resize`` takes on a running ``evq serve`` (issue 34: 1 → 4 shards
with 1,000 queues in ≤ 60 s), and what each queue's move cost.

Starts ``evq serve --shards FROM`` on a fresh data directory, creates ``--queues`` queues
with ``--messages`` messages each (one put each), then asks for ``--to`` shards
(``POST /v1/admin/shards``) and follows the task until it is done, with an optional light
load running meanwhile (``--load``: producers and consumers on the queues, counting every
failed operation). Reads each move's unavailability from the server's log (the
coordinator logs "… ms without an owner" per queue). Prints progress, then one JSON line:
``resize_s``, ``moves``, ``moved_per_s``, ``unavailable_p50_ms`` / ``_p99_ms`` / ``_max_ms``,
``failed_ops``, ``ops`` and the operations' ``op_p99_ms`` / ``op_max_ms`` (with ``--load``).

With ``--restart`` it asks for the rolling restart instead (``POST /v1/admin/shards/restart``:
each of the ``--from`` shards hands its queues to a spare, starts again as a new process
and takes them back) and reports ``restart_s``, ``restarted`` and the same load figures. The
load's clients do not retry: a 503 is a failed operation, however soon a retry would have
hidden it (stricter than the issue's count, which forgives what a retry hides in 100 ms).

    .venv/bin/python loadtest/resize.py --queues 1000 --from 1 --to 4
    .venv/bin/python loadtest/resize.py --queues 200 --from 4 --restart --load 8
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from served import EvqServe

_MOVED = re.compile(r"moved from shard \d+ to \d+ .*: ([0-9.]+) ms without an owner")


def call(url: str, method: str, path: str, doc: Any = None, timeout: float = 30) -> Any:
    """One JSON request; the decoded answer (raises on an HTTP error)."""
    data = None if doc is None else json.dumps(doc).encode()
    request = urllib.request.Request(
        url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body else None


class Load:
    """Producers and consumers on the queues, in threads (plain HTTP), counting failures."""

    def __init__(self, url: str, queues: list[str], threads: int) -> None:
        self.url, self.queues, self.threads = url, queues, threads
        self.stop = threading.Event()
        self.ops = 0
        self.failed: list[str] = []
        self.latencies: list[float] = []  # s, each operation's (a take and its ack: one)
        self._lock = threading.Lock()
        self._workers = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)
        ]

    def start(self) -> None:
        for worker in self._workers:
            worker.start()

    def finish(self) -> None:
        self.stop.set()
        for worker in self._workers:
            worker.join()

    def _run(self, n: int) -> None:
        i = n
        while not self.stop.is_set():
            queue = self.queues[i % len(self.queues)]
            i += 1
            began = time.monotonic()
            try:
                if n % 2 == 0:
                    call(
                        self.url,
                        "POST",
                        f"/v1/queues/{queue}/messages",
                        {"messages": [{"body": "x"}]},
                    )
                else:
                    got = call(self.url, "POST", f"/v1/queues/{queue}/take", {"max": 10})[
                        "messages"
                    ]
                    if got:
                        items = [{"id": m["id"], "lease": m["lease"]} for m in got]
                        call(self.url, "POST", f"/v1/queues/{queue}/ack", {"items": items})
                with self._lock:
                    self.ops += 1
                    self.latencies.append(time.monotonic() - began)
            except Exception as exc:  # counted: the figure is how many failed
                why = repr(exc)
                if isinstance(exc, urllib.error.HTTPError):
                    why += " " + exc.read().decode(errors="replace")
                with self._lock:
                    self.failed.append(why[:300])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def fill(url: str, count: int, messages: int) -> list[str]:
    """Create ``count`` queues with ``messages`` messages each; their names."""
    queues = [f"rs{i}" for i in range(count)]
    started = time.monotonic()
    for index, queue in enumerate(queues):
        call(url, "PUT", f"/v1/queues/{queue}", {})
        if messages:
            bodies = [{"body": f"m{k}"} for k in range(messages)]
            call(url, "POST", f"/v1/queues/{queue}/messages", {"messages": bodies})
        if (index + 1) % 200 == 0:
            print(f"created {index + 1}/{len(queues)} queues", file=sys.stderr, flush=True)
    print(f"filled in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return queues


def follow(url: str, task: str, what: str) -> Any:
    """Poll the task until it ends, printing its progress; its last state."""
    seen = -1
    while True:
        doc = call(url, "GET", f"/v1/tasks/{task}")
        if doc["done"] != seen:
            seen = doc["done"]
            print(f"{doc['done']}/{doc['total']} {what}", file=sys.stderr, flush=True)
        if doc["state"] != "running":
            return doc
        time.sleep(0.2)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    log = work / "serve.log"
    server = EvqServe(work / "data", log, ["--shards", str(args.from_)])
    load: Load | None = None
    try:
        server.wait_ready(180)
        queues = fill(server.url, args.queues, args.messages)
        load = Load(server.url, queues, args.load) if args.load else None
        if load is not None:
            load.start()
            time.sleep(1)
        begun = time.monotonic()
        if args.restart:
            task = call(server.url, "POST", "/v1/admin/shards/restart")["task"]
        else:
            task = call(server.url, "POST", "/v1/admin/shards", {"count": args.to})["task"]
        doc = follow(server.url, task, "shards restarted" if args.restart else "queues moved")
        took = time.monotonic() - begun
        if load is not None:
            time.sleep(1)
            load.finish()
        if doc["state"] != "done":
            raise RuntimeError(f"the task ended {doc['state']}: {doc.get('error')}")
        shards = call(server.url, "GET", "/v1/admin/shards")
    finally:
        if load is not None:
            load.finish()  # also when the run failed: its threads end
        server.stop()
    pauses = [float(m.group(1)) for m in _MOVED.finditer(log.read_text(errors="replace"))]
    result: dict[str, Any] = {"queues": args.queues, "messages_each": args.messages}
    if args.restart:
        result |= {"shards": shards["count"], "restart_s": round(took, 2), "restarted": doc["done"]}
    else:
        result |= _resize_figures(args, shards, took, doc, pauses)
    if load is not None:
        result["ops"], result["failed_ops"] = load.ops, len(load.failed)
        result["op_p99_ms"] = round(percentile(load.latencies, 0.99) * 1000, 1)
        result["op_max_ms"] = round(max(load.latencies, default=0.0) * 1000, 1)
        result["failures"] = load.failed[:5]
    return result


def _resize_figures(
    args: argparse.Namespace, shards: Any, took: float, doc: Any, pauses: list[float]
) -> dict[str, Any]:
    return {
        "from": args.from_,
        "to": args.to,
        "count_after": shards["count"],
        "resize_s": round(took, 2),
        "moves": doc["total"],
        "moved_per_s": round(doc["total"] / took, 1) if took else 0,
        "unavailable_p50_ms": round(percentile(pauses, 0.5), 1),
        "unavailable_p99_ms": round(percentile(pauses, 0.99), 1),
        "unavailable_max_ms": round(max(pauses, default=0.0), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=10, help="put into each queue first")
    parser.add_argument("--from", dest="from_", type=int, default=1, help="shards to start with")
    parser.add_argument("--to", type=int, default=4, help="shards to resize to")
    parser.add_argument(
        "--restart", action="store_true", help="the rolling restart of the --from shards instead"
    )
    parser.add_argument("--load", type=int, default=0, help="threads of load meanwhile (0: none)")
    parser.add_argument("--dir", help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.dir:
        result = run(args, Path(args.dir))
    else:
        with tempfile.TemporaryDirectory() as work:
            result = run(args, Path(work))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
