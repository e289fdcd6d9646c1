"""Deep queues (issue 22, "100 million queued messages on one machine: bodies on disk, a
compact index in memory"): fill, measure and restart ``evq serve`` at a row of depths.

It starts a fresh ``evq serve`` (its defaults; the data directory in a temporary directory
under ``--dir``), creates ``--queues`` queues and measures the base: the RSS of every process
of the server's session (the gateway, the shards and Ray's own) with the queues empty.
Then, for each depth of ``--depths`` in turn, it

1. fills the queues to that depth, evenly: ``--producers`` producers in ``--procs``
   processes, ``--batch`` messages of ``--size`` random base64 characters per put, a
   ``progress`` line every ``--progress`` s (depth, rate, the server's RSS);
2. measures the fill rate since the previous depth; the server's RSS per message (the
   session's RSS less the base, over the depth); the data directory's bytes per message
   (st_blocks of its files, as du counts); ``--takes`` takes of ``--take-max`` messages
   from one client, one at a time, each followed at once by a release of what it took (so
   the depth stays): p50/p99 of the takes alone;
3. with ``--restart`` (the default) stops the server (SIGTERM) and starts it again on the
   same data directory, timing until every queue's stats count its whole share of the
   depth; the fill goes on on the restarted server.

Message kinds (issue 33): by default every message is put ready. ``--delay 1h`` delays
every message by that long, a put's messages all ready at one time (a delayed run in the
server: actors/core/runs.py); ``--delay-spread 1h..30d`` delays each message by its own
time, drawn evenly from the range. Either way the queues keep messages a day past the
longest delay (``retention``), and the timed takes find nothing ready. ``--attrs`` gives
each message two attributes, as SQS senders set them (a tenant among 1,000 and a random
trace id), with any of the above; ``--fifo`` makes the queues FIFO, each message in one of
1,000 groups; ``--client-ids`` makes them take ids from the client (16 random hex digits).

With ``--backoff-churn 60s`` (off by default), once the last depth is measured (and
restarted), ``--churn-clients`` consumers take every message once (1000 a take) and release
it due 60 s later (with ``--backoff-jitter 60s``, each message up to 60 s later still, at a
time of its own: given back one at a time, not as batches), as consumers that fail and
retry with a backoff do; the row
(``backoff_churn``) has the RSS per queued message before and after (the depth is the same),
and their ratio (the issue's claim: within 2x of the untouched queue); then the server is
restarted on the churned queue, and the row has that restart's seconds and RSS per message
(the representation without the process's history: its body cache, freed memory).

With ``--churn`` (off by default), once the last depth is measured (and restarted), it
checks the issue's claim on disk: under a churn where half of all messages are acked, disk
stays at most twice the live data.

4. acks half of every queue's share of the depth (rounded down), its oldest messages
   (with ``--churn-keep-first``: none of the first queue's and all of every other's, so
   with ``--queues 2`` half of all messages stay as one old backlog among dead records:
   what compaction is for):
   ``--churn-clients`` clients, each taking up to 1000 messages of a queue (lease 600 s) and
   acking them, round robin over the queues; a ``progress`` line every ``--progress`` s
   (acked, rate);
5. waits for the server to prune its log (it drops the segments its snapshots cover; a
   snapshot every 200k records by default): polls the data directory's bytes, the archive
   aside, every second until they have not shrunk for ``--churn-quiet`` s (15) or
   ``--churn-wait`` s (120) have passed;
6. measures the live messages (the queues' stats), their bodies (that many times ``--size``
   bytes), the data directory's bytes without ``archive/`` (the live log, its preallocated
   files, the snapshots) over those bodies (``disk_over_live``, the claim: ≤ 2), the
   archive's bytes (what the log pruned, kept apart), and the server's RSS per live message.

Output: JSON lines (``run``: the machine, the commit, the command; ``base``; ``progress``;
``depth``, one per depth; ``stopped``; ``churn``), then a Markdown table of the depths (and
one of the churn).

The memory guard: before a fill, and every second of a fill or a restart, it projects the
server's RSS at the next depth from the cost per message measured so far (once 100k
messages are in) and stops when that would pass ``--max-rss-gib`` (default: 75 % of the
machine's memory) or need more than the memory the machine has available, less 1 GiB; it
also stops when the RSS itself passes ``--max-rss-gib``. It then says why, reports the
depth reached and exits 3. (Exit 1: an error, e.g. the server refused puts for 60 s.)

    .venv/bin/python loadtest/bench_depth.py [--depths 1M 10M] [--queues 1] [--procs 1]
        [--producers 16] [--takes 300] [--no-restart] [--max-rss-gib G] [--dir /work]
        [--backoff-churn 60s] [--churn [--churn-clients 4] [--churn-quiet 15]
         [--churn-wait 120] [--churn-keep-first]]
        [--serve-arg=--shards --serve-arg=2]

The issue's runs: the defaults (1 queue, 1M then 10M: ~1.5 min, ~6 GiB),
``--queues 100 --depths 1M``, and for the churn ``--depths 1M --churn``. One producer
process is enough: it uses ~15 % of a core while the server, at ~1 core, sets the rate
(``client_cpu_pct``, ``server_cpu_pct``). Depths are counts, with k, M or G allowed (1M,
10M, 100M). The load side (producer processes, the API client, the takes, the churn's
consumers) and the readings are ``loadtest/bench_depth_load.py``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from pathlib import Path
from typing import Any

import procstat
from bench_depth_load import (
    Acker,
    Api,
    Filler,
    batches,
    churn_acks,
    disk_bytes,
    plan,
    run_info,
    session_rss,
    settled_rss,
    share,
    take_latencies,
)
from procstat import total_cpu_seconds
from served import EvqServe, get_json, session_pids

MIB, GIB = 2**20, 2**30
PROJECT_FROM = 100_000  # messages in before their cost is projected (below: noise)
HEADROOM = GIB  # what the machine keeps available whatever the projection
STOP_TIMEOUT_S = 600.0  # SIGTERM to exit: the server finishes its writes and snapshots first
TAKE_MAX = 1000  # the churn's takes: the most a take answers
ARCHIVE = ("archive",)  # the data directory's folder of pruned history, not the live data


class MemoryGuard(Exception):
    """Going on would run the machine out of memory."""


def emit(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


def count(text: str) -> int:
    """A number of messages: 250000, 50k, 1M, 100M."""
    scale = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1:])
    try:
        n = round(float(text[:-1]) * scale) if scale else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("a depth is 1 or more")
    return n


def over_memory(
    rss: int, base: int, depth: int, target: int, limit: int, available: int
) -> str | None:
    """Why filling from ``depth`` to ``target`` would run the machine out of memory, or None.

    ``rss``: the server's now; ``base``: its RSS empty; ``available``: the machine's."""
    if rss > limit:
        return f"the server's RSS, {rss / GIB:.2f} GiB, is past --max-rss-gib {limit / GIB:.1f}"
    if depth < max(PROJECT_FROM, target // 100):
        return None  # what the server holds whatever its depth would dominate the projection
    per_message = max(rss - base, 0) / depth
    more = per_message * (target - depth)
    if rss + more > limit:
        return (
            f"at {per_message:.0f} B of RSS per message, {target:,} messages would take the "
            f"server to {(rss + more) / GIB:.1f} GiB, past --max-rss-gib {limit / GIB:.1f}"
        )
    if more > available - HEADROOM:
        return (
            f"at {per_message:.0f} B of RSS per message, {target:,} messages would need "
            f"{more / GIB:.1f} GiB more; the machine has {available / GIB:.1f} GiB available"
        )
    return None


# ------------------------------------------------------------------ the run


class Bench:
    """One run: the server, the producer processes, the depth reached, the rows measured."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp, self.data = args, tmp, tmp / "data"
        suffix = ".fifo" if args.fifo else ""  # a FIFO queue's name says so
        self.names = [f"depth-{i}{suffix}" for i in range(args.queues)]
        self.limit = int(args.max_rss_gib * GIB)
        self.server: EvqServe | None = None
        self.filler: Filler | None = None
        self.depth = 0
        self.base: dict[str, Any] = {}
        self.rows: list[dict[str, Any]] = []
        self.churned: dict[str, Any] | None = None
        self.backed_off: dict[str, Any] | None = None

    @property
    def live(self) -> EvqServe:
        assert self.server is not None
        return self.server

    def run(self) -> int:
        """Every depth in turn; 3 when the memory guard stopped the run."""
        self.begin()
        try:
            for target in self.args.depths:
                self.rows.append(self.step(target))
                emit({"depth": self.rows[-1]})
            if self.args.backoff_churn is not None:
                self.backed_off = self.backoff_churn(self.args.backoff_churn)
                emit({"backoff_churn": self.backed_off})
            if self.args.churn:
                self.churned = self.churn()
                emit({"churn": self.churned})
        except MemoryGuard as e:
            reached = {"reason": str(e), "depth_reached": self.depth}
            emit({"stopped": {**reached, "depths_measured": [r["depth"] for r in self.rows]}})
            print(f"bench_depth: stopped at depth {self.depth:,}: {e}", file=sys.stderr)
            return 3
        finally:
            print(table(self.rows, self.base, self.args, self.churned), flush=True)
            if self.backed_off is not None:
                print("\n".join(backoff_table(self.backed_off)), flush=True)
        return 0

    def begin(self) -> None:
        """The fresh server, its empty queues, the base, the producer processes."""
        started = time.monotonic()
        self.server = EvqServe(self.data, self.tmp / "serve.log", self.args.serve_arg)
        self.live.wait_ready(self.args.start_timeout)
        ready_s = time.monotonic() - started
        api = Api(self.live.port)
        delays = timing(self.args)
        # the messages must outlive their delays (the default retention is 4 days)
        settings: dict[str, Any] = {} if delays is None else {"retention": int(delays[1]) + 86_400}
        if self.args.fifo:
            settings["fifo"] = True
        if self.args.client_ids:
            settings["id_mode"] = "client"
        for name in self.names:
            status, doc, _ = api.call("PUT", f"/v1/queues/{name}", settings)
            if status not in (200, 201):
                raise RuntimeError(f"creating {name} answered {status}: {doc}")
        api.close()
        rss = settled_rss(self.live.pid, self.args.settle)
        self.base = {"rss_bytes": rss["total"], "processes": rss["processes"]}
        self.base |= {"rss_mib": _mib(rss), "ready_s": round(ready_s, 2)}
        self.base["disk_bytes"] = disk_bytes(self.data)  # the log's preallocated files
        emit({"base": self.base})
        self.filler = Filler(
            self.args.procs,
            self.args.producers,
            self.args.size,
            timing(self.args),
            self.args.attrs,
            kinds(self.args),
        )

    def step(self, target: int) -> dict[str, Any]:
        """Fill to ``target``, measure, restart: the depth's row."""
        self.guard(target)
        row = {"depth": target, "queues": len(self.names), **self.fill(target)}
        row |= self.measure(target)
        if self.args.restart:
            row["restart"] = self.restart(target)
        return row

    def guard(self, target: int) -> None:
        """Raises: MemoryGuard (filling to ``target`` would run the machine out of memory)."""
        rss = session_rss(self.live.pid)["total"]
        available = procstat.memory_bytes()["available"]
        why = over_memory(rss, self.base["rss_bytes"], self.depth, target, self.limit, available)
        if why is not None:
            raise MemoryGuard(why)

    def fill(self, target: int) -> dict[str, Any]:
        """Put the messages from the depth reached to ``target``: rate, time, CPU."""
        assert self.filler is not None
        start, puts = self.depth, plan(self.depth, target, len(self.names), self.args.batch)
        pids = session_pids(self.live.pid)
        server_cpu = total_cpu_seconds(pids)
        started = time.monotonic()
        futures = self.filler.start(self.live.port, self.names, puts)
        self.watch(futures, start, target, started)
        seconds = time.monotonic() - started
        done = [f.result() for f in futures]  # raises a producer's error
        self.depth = start + sum(n for n, _ in done)
        server_cpu = total_cpu_seconds(pids) - server_cpu
        return {
            "fill_msgs_per_s": round((target - start) / seconds),
            "fill_s": round(seconds, 2),
            "client_cpu_pct": round(100 * sum(cpu for _, cpu in done) / seconds),
            "server_cpu_pct": round(100 * server_cpu / seconds),
        }

    def watch(self, futures: list[Future], start: int, target: int, started: float) -> None:
        """Until the producers are done: the guard every second, progress every --progress s.

        Raises: MemoryGuard (then the producers are stopped and the depth is counted)."""
        assert self.filler is not None
        last, last_put = started, 0
        while True:
            done, pending = wait(futures, timeout=1.0, return_when=FIRST_EXCEPTION)
            if not pending or any(f.exception() for f in done):
                return
            rss, put, now = session_rss(self.live.pid), self.filler.put, time.monotonic()
            available = procstat.memory_bytes()["available"]
            base = self.base["rss_bytes"]
            why = over_memory(rss["total"], base, start + put, target, self.limit, available)
            if why is not None:
                self.filler.stop.set()
                wait(futures)
                self.depth = self.count()
                raise MemoryGuard(why)
            if now - last >= self.args.progress:
                rate = round((put - last_put) / (now - last))
                doc = {"depth": start + put, "target": target, "msgs_per_s": rate}
                emit({"progress": doc | {"rss_mib": _mib(rss), "s": round(now - started, 1)}})
                last, last_put = now, put

    def measure(self, target: int) -> dict[str, Any]:
        """RSS and disk per message, and the takes, at ``target``."""
        rss = settled_rss(self.live.pid, self.args.settle)
        disk = disk_bytes(self.data)
        api = Api(self.live.port)
        try:
            takes = take_latencies(api, self.names, self.args.takes, self.args.take_max)
        finally:
            api.close()
        return {
            "rss_per_msg": round((rss["total"] - self.base["rss_bytes"]) / target, 1),
            "rss_mib": _mib(rss),
            "disk_per_msg": round(disk / target, 1),
            "disk_bytes": disk,
            "take": takes,
        }

    def restart(self, target: int) -> dict[str, Any]:
        """Stop the server, start it on the same data: seconds until the whole depth is back."""
        held = self.totals()  # past ``target`` if a put a producer sent again was written twice
        stopped = self.live.stop(STOP_TIMEOUT_S)
        started = time.monotonic()
        self.server = EvqServe(self.data, self.tmp / "serve.log", self.args.serve_arg)
        ready_s, stats = self.wait_full(target, started, held)
        seconds = time.monotonic() - started
        rss = settled_rss(self.live.pid, self.args.settle)
        return {
            "seconds": round(seconds, 2),
            "ready_s": None if ready_s is None else round(ready_s, 2),
            "stats": stats,
            "stop": stopped,
            "rss_per_msg_after": round((rss["total"] - self.base["rss_bytes"]) / target, 1),
        }

    def wait_full(
        self, target: int, started: float, held: list[int] | None = None
    ) -> tuple[float | None, dict[str, int]]:
        """Poll until every queue's stats count its share of ``target`` (or what ``held``
        says it held): (seconds until /readyz answered, or None if the stats were first; the
        stats summed)."""
        if held is None:
            held = [share(target, len(self.names), i) for i in range(len(self.names))]
        api, ready_s, next_guard = Api(self.live.port, timeout=10), None, 0.0
        try:
            while time.monotonic() - started < self.args.restart_timeout:
                if self.live.proc.poll() is not None:
                    raise RuntimeError(f"evq serve exited with {self.live.proc.returncode}")
                if time.monotonic() >= next_guard:
                    self.guard(self.depth)  # the RSS alone: nothing more to put
                    next_guard = time.monotonic() + 1
                if ready_s is None and get_json(f"{self.live.url}/readyz", 2) is not None:
                    ready_s = time.monotonic() - started
                stats = self._full_stats(api, held)
                if stats is not None:
                    return ready_s, stats
                time.sleep(0.1)
        finally:
            api.close()
        raise RuntimeError(f"the depth was not back within {self.args.restart_timeout} s")

    def _full_stats(self, api: Api, held: list[int]) -> dict[str, int] | None:
        """The queues' stats summed once each counts what ``held`` says, else None."""
        summed = dict.fromkeys(("total", "ready", "reserved", "delayed"), 0)
        for index, name in enumerate(self.names):
            stats = api.stats(name)
            if stats is None or stats["total"] != held[index]:
                return None
            for key in summed:
                summed[key] += stats[key]
        return summed

    def churn(self) -> dict[str, Any]:
        """Ack half of every queue's messages, let the server prune its log, then weigh the
        disk against the live data: the churn's row."""
        acks = churn_acks(self.depth, len(self.names), self.args.churn_keep_first)
        seconds = self.consume(acks)
        settle_s, settled = self.settle()
        return {
            "acked": sum(acks),
            "seconds": round(seconds, 2),
            "acks_per_s": round(sum(acks) / max(seconds, 1e-6)),
            "settle_s": round(settle_s, 1),
            "settled": settled,
            **self.weigh(),
        }

    def backoff_churn(self, backoff: float) -> dict[str, Any]:
        """Take every message once and release it ``backoff`` seconds later, as consumers
        that fail and retry do; then the RSS per queued message (the depth is unchanged)
        against the untouched queue's (the last depth's row, before and after its restart)."""
        row = self.rows[-1]
        rss = settled_rss(self.live.pid, self.args.settle)
        before = (rss["total"] - self.base["rss_bytes"]) / self.depth
        counts = [share(self.depth, len(self.names), i) for i in range(len(self.names))]
        seconds = self.consume(counts, backoff)
        rss = settled_rss(self.live.pid, self.args.settle)
        after = (rss["total"] - self.base["rss_bytes"]) / self.depth
        restarted = self.restart(self.depth)  # the same queue, without the churn's history
        return {
            "depth": self.depth,
            "backoff_s": backoff,
            "jitter_s": self.args.backoff_jitter,
            "released": sum(counts),
            "seconds": round(seconds, 2),
            "releases_per_s": round(sum(counts) / max(seconds, 1e-6)),
            "rss_per_msg_untouched": round(before, 1),
            "rss_per_msg_filled": row["rss_per_msg"],
            "rss_per_msg": round(after, 1),
            "over_untouched": round(after / before, 2) if before > 0 else None,
            "rss_mib": _mib(rss),
            "restart_s": restarted["seconds"],
            "rss_per_msg_after_restart": restarted["rss_per_msg_after"],
        }

    def consume(self, acks: list[int], backoff: float | None = None) -> float:
        """Take and ack ``acks[i]`` messages of queue i (with ``backoff``: release each that
        many seconds later), progress every --progress s: the seconds it took. Raises:
        RuntimeError (a take or an ack failed)."""
        jitter = self.args.backoff_jitter if backoff is not None else 0.0
        acker = Acker(self.live.port, self.names, self.args.churn_clients, backoff, jitter)
        started = last = time.monotonic()
        last_acked = 0
        try:
            futures = acker.start(batches(acks, TAKE_MAX))
            while True:
                done, pending = wait(futures, timeout=1.0, return_when=FIRST_EXCEPTION)
                if not pending or any(f.exception() for f in done):
                    break
                now, acked = time.monotonic(), acker.acked
                if now - last >= self.args.progress:
                    rate = round((acked - last_acked) / (now - last))
                    doc = {"acked": acked, "of": sum(acks), "acks_per_s": rate}
                    emit({"progress": doc | {"s": round(now - started, 1)}})
                    last, last_acked = now, acked
            seconds = time.monotonic() - started
            for future in futures:
                future.result()  # raises a client's error
        finally:
            acker.close()
        return seconds

    def settle(self) -> tuple[float, bool]:
        """Wait until the live data's bytes have not shrunk for --churn-quiet s (the server
        prunes a while after the acks, once snapshots cover its oldest segments), at most
        --churn-wait s: (seconds waited, whether they settled)."""
        started = time.monotonic()
        low, low_at = disk_bytes(self.data, ARCHIVE), started
        while True:
            time.sleep(1.0)
            now, live = time.monotonic(), disk_bytes(self.data, ARCHIVE)
            if live < low:
                low, low_at = live, now
            if now - low_at >= self.args.churn_quiet:
                return now - started, True
            if now - started >= self.args.churn_wait:
                return now - started, False

    def weigh(self) -> dict[str, Any]:
        """The live messages, their bodies' bytes, the disk they take and the archive beside
        them, the server's RSS per live message."""
        live = self.count()
        body = live * self.args.size
        rss = settled_rss(self.live.pid, self.args.settle)
        disk = disk_bytes(self.data, ARCHIVE)
        per_msg = (rss["total"] - self.base["rss_bytes"]) / live if live else None
        return {
            "live_messages": live,
            "live_body_bytes": body,
            "disk_live_bytes": disk,
            "disk_archive_bytes": disk_bytes(self.data / "archive"),
            "disk_over_live": round(disk / body, 2) if body else None,
            "rss_per_live_msg": None if per_msg is None else round(per_msg, 1),
            "rss_mib": _mib(rss),
        }

    def count(self) -> int:
        """The messages the queues hold, as their stats say."""
        return sum(self.totals())

    def totals(self) -> list[int]:
        """The messages each queue holds, as its stats say."""
        api = Api(self.live.port)
        try:
            return [(api.stats(name) or {"total": 0})["total"] for name in self.names]
        finally:
            api.close()

    def close(self) -> None:
        if self.filler is not None:
            self.filler.stop.set()
        if self.server is not None:
            self.server.stop()
        if self.filler is not None:
            self.filler.close()


def _mib(rss: dict[str, int]) -> dict[str, float]:
    return {k: round(v / MIB, 1) for k, v in rss.items() if k != "processes"}


# ------------------------------------------------------------------ the report


def table(
    rows: list[dict[str, Any]],
    base: dict[str, Any],
    args: argparse.Namespace,
    churn: dict[str, Any] | None = None,
) -> str:
    """The depths as a Markdown table, under a line on the base; the churn's below."""
    lines = [
        f"base: {base['rss_mib']['total']:,.1f} MiB of RSS in {base['processes']} processes, "
        f"ready in {base['ready_s']} s, {base['disk_bytes'] / MIB:,.1f} MiB on disk; "
        f"{args.queues} queue(s), {args.producers} producers in "
        f"{args.procs} process(es), {args.batch} messages of {args.size} B per put",
        "",
        "| depth | fill msg/s | RSS B/msg | disk B/msg | take p50 ms | take p99 ms "
        "| restart s | RSS B/msg after restart |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        restart = r.get("restart") or {}
        cells = [f"{r['depth']:,}", f"{r['fill_msgs_per_s']:,}", r["rss_per_msg"]]
        cells += [r["disk_per_msg"], r["take"]["p50_ms"], r["take"]["p99_ms"]]
        cells += [restart.get("seconds", "—"), restart.get("rss_per_msg_after", "—")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if churn is not None:
        lines += ["", *churn_table(churn)]
    return "\n".join(lines)


def backoff_table(b: dict[str, Any]) -> list[str]:
    """The backoff churn's Markdown table."""
    return [
        "",
        "| depth | backoff s | released msg/s | RSS B/msg untouched | RSS B/msg after "
        "| over untouched | restart s | RSS B/msg after restart |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {b['depth']:,} | {_backoff(b)} | {b['releases_per_s']:,} "
        f"| {b['rss_per_msg_untouched']} | {b['rss_per_msg']} | {b['over_untouched']} "
        f"| {b['restart_s']} | {b['rss_per_msg_after_restart']} |",
    ]


def _backoff(b: dict[str, Any]) -> str:
    """The backoff's seconds, or their range with a jitter."""
    lo, jitter = b["backoff_s"], b.get("jitter_s", 0.0)
    return f"{lo:g}..{lo + jitter:g}" if jitter else f"{lo:g}"


def churn_table(c: dict[str, Any]) -> list[str]:
    """The churn's row under its header: the disk against the live data (the claim: at most 2)."""
    cells = [f"{c['acked']:,}", f"{c['acks_per_s']:,}", f"{c['live_messages']:,}"]
    cells += [f"{c[k] / MIB:,.1f}" for k in ("live_body_bytes", "disk_live_bytes")]
    cells += [f"{c['disk_archive_bytes'] / MIB:,.1f}", c["disk_over_live"]]
    cells += [c["rss_per_live_msg"], f"{c['settle_s']}{'' if c['settled'] else ' (not settled)'}"]
    return [
        "| churn: acked | acks/s | live msgs | live bodies MiB | disk MiB (no archive) "
        "| archive MiB | disk / live | RSS B/live msg | settle s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| " + " | ".join(str(x) for x in cells) + " |",
    ]


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def duration(text: str) -> float:
    """Seconds of ``90s``, ``30m``, ``1h``, ``2d`` (or a plain number of seconds)."""
    unit = _UNITS.get(text[-1:])
    try:
        seconds = float(text[:-1]) * unit if unit else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r}") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"a delay must be positive: {text!r}")
    return seconds


def spread(text: str) -> tuple[float, float]:
    """``LO..HI`` as two durations, LO < HI."""
    lo, sep, hi = text.partition("..")
    if not sep:
        raise argparse.ArgumentTypeError(f"not LO..HI: {text!r}")
    bounds = duration(lo), duration(hi)
    if bounds[0] >= bounds[1]:
        raise argparse.ArgumentTypeError(f"LO must be below HI: {text!r}")
    return bounds


def kinds(args: argparse.Namespace) -> frozenset[str]:
    """The message kinds the producers put (bench_depth_load.put_body)."""
    return frozenset(k for k in ("fifo", "client_ids") if getattr(args, k))


def timing(args: argparse.Namespace) -> tuple[float, float] | None:
    """The producers' delays: (lo, hi) seconds, lo == hi for one time a put."""
    if args.delay is not None:
        return (args.delay, args.delay)
    return args.delay_spread


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--depths", type=count, nargs="+", default=[10**6, 10**7], help="in all, growing")
    add("--queues", type=int, default=1, help="the depth is spread evenly over them")
    add("--producers", type=int, default=16)
    add("--procs", type=int, default=1, help="producer processes")
    add("--batch", type=int, default=1000, help="messages per put (1..1000)")
    add("--size", type=int, default=100, help="bytes of each message's body")
    add("--takes", type=int, default=300, help="timed takes at each depth (2 or more)")
    add("--take-max", type=int, default=100, help="messages per take")
    add("--restart", action=argparse.BooleanOptionalAction, default=True)
    mem_gib = procstat.memory_bytes()["total"] / GIB
    add("--max-rss-gib", type=float, default=round(0.75 * mem_gib, 1), help="the server's")
    add("--progress", type=float, default=5.0, help="seconds between progress lines")
    add("--settle", type=float, default=1.0, help="seconds before reading the RSS")
    add("--dir", default="/work", help="where the data directory goes (a temporary one)")
    add("--start-timeout", type=float, default=180.0)
    add("--restart-timeout", type=float, default=1800.0)
    add("--serve-arg", action="append", default=[], help="one more argument for evq serve")
    add(
        "--delay",
        type=duration,
        default=None,
        help="every message delayed this long, a put's all ready at one time (1h, 30m, 90s, 2d)",
    )
    add(
        "--delay-spread",
        type=spread,
        default=None,
        help="each message delayed by its own time, drawn evenly from LO..HI (1h..30d)",
    )
    add("--attrs", action="store_true", help="each message with two attributes (SQS-style)")
    add("--fifo", action="store_true", help="a FIFO queue, each message in one of 1,000 groups")
    add("--client-ids", action="store_true", help="each message with an id of the client's")
    add(
        "--backoff-churn",
        type=duration,
        default=None,
        metavar="BACKOFF",
        help="at the end: take every message once, release it BACKOFF later (60s, 5m)",
    )
    add(
        "--backoff-jitter",
        type=duration,
        default=0.0,
        metavar="JITTER",
        help="with --backoff-churn: each message released up to JITTER later still, its own time",
    )
    add("--churn", action="store_true", help="at the end: ack half, weigh disk against live")
    add("--churn-clients", type=int, default=4, help="clients taking and acking at once")
    add("--churn-quiet", type=float, default=15.0, help="s the live log must not shrink")
    add("--churn-wait", type=float, default=120.0, help="s at most waiting for it to settle")
    add(
        "--churn-keep-first",
        action="store_true",
        help="ack none of the first queue and all of the others (compaction's case)",
    )
    args = p.parse_args(argv)
    if args.depths != sorted(set(args.depths)):
        p.error("--depths must grow")
    if args.takes < 2 or not 1 <= args.batch <= 1000 or not 1 <= args.procs <= args.producers:
        p.error("--takes >= 2, --batch 1..1000, --procs 1..--producers")
    if args.delay is not None and args.delay_spread is not None:
        p.error("--delay or --delay-spread, not both")
    if args.churn_clients < 1:
        p.error("--churn-clients >= 1")
    if args.churn_keep_first and args.queues < 2:
        p.error("--churn-keep-first needs --queues 2 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # SIGTERM (a test's timeout) unwinds, so the server's session is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    emit({"run": run_info(args)})
    with tempfile.TemporaryDirectory(prefix="evq-depth-", dir=args.dir) as tmp:
        bench = Bench(args, Path(tmp))
        try:
            return bench.run()
        except Exception:
            log = Path(tmp) / "serve.log"  # gone with the directory: its end goes to stderr
            if log.exists():
                print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            bench.close()


if __name__ == "__main__":
    sys.exit(main())
