"""The command line of ``loadtest/watch_swarm.py``: its options (a table, so that ``--help``
stays the documentation) and their checks (:func:`parse_args`), and :func:`main`, which runs
the swarm against the server (or the memory profile) and prints the summary."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .common import N_COUNTERS, log, machine, now
from .coordinator import start_clients
from .memprof import profile_memory
from .memprof_server import profile_server_main
from .phases import coordinate
from .report import table
from .server import serve_process

__all__ = ["main", "parse_args"]

_D = " (default %(default)s)"
# (group, flags, argparse keywords): kept as a table so that --help stays the documentation.
# fmt: off
_OPTIONS: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("server", ("--url",), {"default": "http://127.0.0.1:8700", "help": "a running server" + _D}),
    ("server", ("--server-pid",), {"type": int, "help": "pid of the evq main process "
        "(default: the process listening on the port whose parent is not)"}),
    ("server", ("--serve",), {"action": "store_true", "help": "start `evq serve` on a fresh "
        "temporary data dir instead of --url; stop it at the end (SIGTERM, exit 0 expected)"}),
    ("server", ("--workers",), {"type": int, "default": 7, "help": "--serve: gateway "
        "processes (each holds at most ~19k watchers)" + _D}),
    ("server", ("--max-watchers",), {"type": int, "help": "--serve: watchers per process"}),
    ("server", ("--shards",), {"type": int, "help": "--serve: shard processes"}),
    ("server", ("--port",), {"type": int, "help": "--serve: port (default: a free one)"}),
    ("server", ("--serve-arg",), {"action": "append", "default": [], "metavar": "ARG",
        "help": "--serve: one more argument for `evq serve` (repeatable)"}),
    ("server", ("--keep-dir",), {"action": "store_true",
        "help": "--serve: keep the temporary directory (data, evq-serve.log)"}),
    ("swarm", ("-n", "--watchers"), {"dest": "n", "type": int, "default": 1000,
        "help": "watchers" + _D}),
    ("swarm", ("--mode",), {"choices": ["ws", "poll"], "default": "ws",
        "help": "WebSocket /v1/ws or long poll /v1/watch" + _D}),
    ("swarm", ("--keys",), {"type": int, "default": 1,
        "help": "keys; watcher i watches key i mod KEYS" + _D}),
    ("swarm", ("--key-prefix",), {"default": "swarm-",
        "help": "key names: PREFIX + random tag + number" + _D}),
    ("swarm", ("--procs",), {"type": int,
        "help": "client processes (default: one per 12,500 watchers; at most 15,000 each)"}),
    ("swarm", ("--sources",), {"type": int,
        "help": "source addresses 127.0.0.2, .3, … (default: one per client process)"}),
    ("swarm", ("--connect-concurrency",), {"type": int, "default": 64,
        "help": "connections being opened at once per client process" + _D}),
    ("swarm", ("--connect-timeout",), {"type": float, "default": 20.0,
        "help": "seconds for one connection and its handshake" + _D}),
    ("swarm", ("--retries",), {"type": int, "default": 3,
        "help": "attempts after a failed connection" + _D}),
    ("swarm", ("--poll-timeout",), {"type": float, "default": 120.0,
        "help": "long poll: the timeout= of each poll, seconds" + _D}),
    ("swarm", ("--client-nice",), {"type": int, "default": 0, "help": "niceness added to "
        "the client processes: with 19 the server gets the CPU first (a control showing how "
        "much the client, on the same cores, delays the server's delivery)" + _D}),
    ("swarm", ("--settle",), {"type": float, "default": 2.0,
        "help": "seconds after all are armed before the memory is read" + _D}),
    ("swarm", ("--progress-every",), {"type": float, "default": 3.0,
        "help": "seconds between progress lines while connecting" + _D}),
    ("changes", ("--singles",), {"type": int, "default": 5,
        "help": "single changes measured one after another" + _D}),
    ("changes", ("--single-pause",), {"type": float, "default": 1.0,
        "help": "seconds of quiet before each single change" + _D}),
    ("changes", ("--burst",), {"type": int, "default": 1000,
        "help": "changes per watched key in the burst; 0: none" + _D}),
    ("changes", ("--unwatched-burst",), {"type": int, "default": 1000, "help": "changes on a "
        "key nobody watches, before connecting and again with all connected; 0: none" + _D}),
    ("changes", ("--unwatched-repeats",), {"type": int, "default": 3,
        "help": "bursts on unwatched keys per measurement (the median is reported)" + _D}),
    ("changes", ("--burst-max-seconds",), {"type": float, "default": 900.0,
        "help": "stop sending a burst's PUTs after this long (the rest is still measured)" + _D}),
    ("changes", ("--put-concurrency",), {"type": int, "default": 64,
        "help": "PUTs in flight during a burst (keep-alive connections)" + _D}),
    ("changes", ("--idle-seconds",), {"type": float, "default": 5.0,
        "help": "quiet seconds with all connected, to measure idle CPU" + _D}),
    ("bounds and output", ("--wait-timeout",), {"type": float, "default": 120.0,
        "help": "seconds for every watcher to get a change" + _D}),
    ("bounds and output", ("--phase-timeout",), {"type": float, "default": 600.0,
        "help": "seconds for connecting and arming all watchers" + _D}),
    ("bounds and output", ("--max-seconds",), {"type": float, "default": 1800.0,
        "help": "the whole run at most this long" + _D}),
    ("bounds and output", ("--json-out",), {"type": Path,
        "help": "also write the JSON summary to this file"}),
    ("memory profile", ("--profile-memory",), {"action": "store_true", "help": "instead of a "
        "run: hold -n WebSocket watchers on one server process of each --profile-kinds, once "
        "plain (RSS, Python objects by type) and once under tracemalloc (allocation sites), and "
        "report where the memory per connection goes. The server side runs as "
        "`watch_swarm.py --profile-server KIND PORT CONTROL_PORT [--trace]` (internal)"}),
    ("memory profile", ("--profile-kinds",), {"default": "lean,bare,gateway", "help": "lean: "
        "a raw asyncio WebSocket server (handshake, frames, pong: what a connection costs "
        "without a framework); bare: a bare aiohttp WebSocket endpoint (answers pings); "
        "gateway: evq's gateway app (gateway.app, queues in the process, no Ray)" + _D}),
    ("memory profile", ("--profile-puts",), {"type": int, "default": 1000, "help": "gateway, "
        "not traced: bursts of PUTs on unwatched keys (3 before, 3 with the watchers): the "
        "server's CPU per PUT and its garbage collections; 0: none" + _D}),
    ("memory profile", ("--profile-top",), {"type": int, "default": 20,
        "help": "rows per breakdown" + _D}),
]
# fmt: on


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    """The options (``description``: the text above them in ``--help``), checked."""
    ap = argparse.ArgumentParser(
        prog="watch_swarm.py",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    groups: dict[str, Any] = {}
    for group, flags, kw in _OPTIONS:
        if group not in groups:
            groups[group] = ap.add_argument_group(group)
        groups[group].add_argument(*flags, **kw)
    args = ap.parse_args(argv)
    if args.n < 1 or args.keys < 1 or args.singles < 0:
        ap.error("need at least one watcher and one key")
    args.procs = args.procs or max(1, math.ceil(args.n / 12_500))
    args.sources = args.sources or args.procs
    if math.ceil(args.n / args.procs) > 15_000:
        ap.error("at most 15,000 watchers per client process: raise --procs")
    if math.ceil(args.n / args.sources) > 25_000:
        ap.error("at most 25,000 watchers per source address: raise --sources")
    if args.sources > 250:
        ap.error("at most 250 source addresses (127.0.0.2-251)")
    if not args.serve:
        u = urlsplit(args.url)
        args.host, args.port = u.hostname or "127.0.0.1", u.port or 80
    else:
        args.host = "127.0.0.1"
    if not args.host.startswith("127."):
        ap.error("this load test only talks to 127.0.0.x")
    tag = random.randbytes(3).hex()
    args.key_list = [f"{args.key_prefix}{tag}-{i}" for i in range(args.keys)]
    return args


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """Run the tool on ``argv`` (default: the command line); the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--profile-server"]:
        return profile_server_main(argv[1:])
    args = parse_args(argv, description)
    if args.profile_memory:
        return profile_memory(args)
    doc: dict[str, Any] = {"machine": machine()}
    doc["config"] = {k: v for k, v in vars(args).items() if k in _CONFIG}
    deadline = now() + args.max_seconds
    # Client processes first (fork before this process has threads or a loop).
    ctx = mp.get_context("fork")
    shared = ctx.RawArray("q", args.procs * N_COUNTERS)
    workdir = Path(tempfile.mkdtemp(prefix="watch-swarm-"))
    args.serve_proc = None
    ok = False
    try:
        _start_server(args, workdir, doc)
        ok = _swarm(args, ctx, shared, deadline, doc)
    finally:
        ok = _stop_server(args, workdir, doc, ok)
    doc["machine"]["load_end"] = [round(x, 2) for x in os.getloadavg()]
    _print(args, doc)
    return 0 if ok else 1


# The options that go into the summary's "config".
_CONFIG = (
    "n",
    "mode",
    "keys",
    "procs",
    "sources",
    "burst",
    "unwatched_burst",
    "singles",
    "put_concurrency",
    "workers",
    "serve",
    "connect_concurrency",
    "key_list",
    "client_nice",
)


def _start_server(args: argparse.Namespace, workdir: Path, doc: dict[str, Any]) -> None:
    """With ``--serve``, start ``evq serve`` (its port and pid go into ``args``)."""
    if args.serve:
        args.serve_proc = serve_process(args, workdir)
        args.host, args.port = "127.0.0.1", args.serve_proc.port
        args.server_pid = args.serve_proc.pid
        log(f"started: {' '.join(args.serve_proc.command)} (pid {args.serve_proc.pid})")
    doc["server"] = {"url": f"http://{args.host}:{args.port}", "started_by_tool": args.serve}
    if args.serve:
        doc["server"]["command"] = " ".join(args.serve_proc.command[1:])


def _swarm(
    args: argparse.Namespace, ctx: Any, shared: Any, deadline: float, doc: dict[str, Any]
) -> bool:
    """The client processes and the coordinator's phases: whether the run was correct."""
    ok = False
    clients = start_clients(args, ctx, shared, deadline)
    try:
        timeout = max(1.0, deadline - now())
        result = asyncio.run(asyncio.wait_for(coordinate(args, clients, shared), timeout))
        doc.update(result)
        ok = bool(doc.get("correctness", {}).get("ok"))
    except (TimeoutError, RuntimeError, ConnectionError, OSError) as exc:
        doc.update(getattr(args, "partial", {}) or {})
        doc["failure"] = f"{type(exc).__name__}: {exc}"
        log(f"run failed: {doc['failure']}")
    finally:
        codes = [c.stop() for c in clients]
        doc["client_exit_codes"] = codes
    return ok


def _stop_server(args: argparse.Namespace, workdir: Path, doc: dict[str, Any], ok: bool) -> bool:
    """Stop a server started here (``ok`` only if it exits 0) and remove the directory
    unless ``--keep-dir``."""
    if args.serve_proc is not None:
        log("stopping the server (SIGTERM)…")
        doc["server_stop"] = args.serve_proc.stop(120)
        log(f"  {doc['server_stop']}")
        ok = ok and doc["server_stop"]["exit_code"] == 0
        if args.keep_dir:
            doc["server"]["workdir"] = str(workdir)
    if not args.keep_dir:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return ok


def _print(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    """The summary: a table, then JSON (also to ``--json-out``)."""
    print(table(doc))
    text = json.dumps(doc, indent=2, default=str)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
