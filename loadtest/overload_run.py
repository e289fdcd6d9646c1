"""One run of loadtest/overload.py (either command): ``Run`` starts ``evq serve`` and holds
it with its sampler and the output (JSON lines, ``--out``), names and creates the queues,
builds the load processes' specs and calibrates the sustainable put rate."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from overload_sample import Phase, Sampler, Totals
from served import EvqServe

__all__ = ["Run"]


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

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *_: object) -> None:
        """Stop the server (its last line says how) and close ``--out``, however the run
        ended."""
        try:
            self.emit({"server_stop": self.stop()})
        finally:
            self.close()
