"""The `evq` command line: `evq serve` (the server) and thin clients of the native API.

Output is for people by default (aligned columns) and for programs with ``--json``: one
JSON document per command, or JSON lines for ``take``, ``watch`` and ``peek --all``. Exit
codes: 0 ok, 1 an API error (its code and message on stderr), 2 a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

import msgspec

from actors.errors import QueueError
from actors.settings import MAX_BATCH  # messages per put request (API.md)
from evq.cli import handle as handle_cli  # light: Ray loads only when a handler runs
from evq.cli import messages as cli_messages
from evq.cli.common import (
    Output,
    count_arg,
    item_results,
    json_arg,
    parse_time,
    plain,
    seconds_arg,
    show_body,
    show_num,
    table,
)
from evq.client import DEFAULT_URL, Client
from evq.client_wire import KeyValue, Message, PutResult, QueueInfo, message_doc
from pipeline import args as pipeline_args  # light: Spark loads only when a job runs
from pipeline import main as pipeline_main

__all__ = ["build_parser", "main", "parse_time", "show_body"]

# ------------------------------------------------------------------ parser


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's own options (``gateway.settings``); the API.md ones if it is missing."""
    # Defaults stay None: the server merges flags over EVQ_* variables and its TOML file.
    try:
        settings = importlib.import_module("gateway.settings")
    except ModuleNotFoundError as e:
        if e.name != "gateway.settings":
            raise
        settings = None
    add_arguments = getattr(settings, "add_arguments", None)
    if add_arguments is not None:
        add_arguments(parser)
        return
    parser.add_argument("--data", metavar="DIR", help="local data directory (default ./evq-data)")
    parser.add_argument("--store", metavar="URL", help="object store, e.g. s3://bucket/prefix")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8700)")


_IDEMPOTENCY_WINDOW_HELP = "how long a put's idempotency key (or client id) is remembered"


def build_parser() -> argparse.ArgumentParser:
    """The `evq` argument parser with every subcommand."""
    p = argparse.ArgumentParser(prog="evq", description="evq: a durable queue server and client")
    p.add_argument(
        "--server",
        default=None,
        help=f"server URL, or several separated by commas: the next is tried when one cannot "
        f"be reached (default: $EVQ_SERVER or {DEFAULT_URL})",
    )
    p.add_argument("--token", default=None, help="bearer token (default: $EVQ_TOKEN)")
    p.add_argument(
        "--ca-bundle",
        default=None,
        metavar="FILE",
        help="https: the CAs to verify the server with, PEM (default: $EVQ_CA_BUNDLE, else "
        "the system's)",
    )
    p.add_argument("--json", action="store_true", help="machine output (JSON / JSON lines)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _serve_arguments(sub.add_parser("serve", help="run the server on this machine"))

    s = sub.add_parser("create", help="create a queue (no change if it exists alike)")
    s.add_argument("name")
    s.add_argument("--client-ids", action="store_true", help="ids come from the client")
    s.add_argument("--visibility-timeout", type=seconds_arg, metavar="S")
    s.add_argument("--max-receives", type=count_arg, metavar="N")
    s.add_argument("--dead-letter-queue", metavar="Q", help="needs --max-receives")
    s.add_argument("--retention", type=seconds_arg, metavar="S")
    s.add_argument("--max-message-bytes", type=count_arg, metavar="N")
    s.add_argument("--fifo", action="store_true", help="FIFO queue (name ends in .fifo)")
    s.add_argument("--delay", type=seconds_arg, metavar="S", help="default delay of every put")
    s.add_argument(
        "--idempotency-window", type=seconds_arg, metavar="S", help=_IDEMPOTENCY_WINDOW_HELP
    )
    s.add_argument(
        "--fair", action="store_true", help="hand messages out fairly across their groups"
    )
    _limit_arguments(s)

    s = sub.add_parser("configure", help="change a queue's settings while it runs")
    s.add_argument("name")
    s.add_argument("--visibility-timeout", type=seconds_arg, metavar="S")
    s.add_argument("--max-receives", type=_or_none(count_arg), metavar="N|none")
    s.add_argument("--dead-letter-queue", type=_or_none(str), metavar="Q|none")
    s.add_argument("--retention", type=seconds_arg, metavar="S")
    s.add_argument("--max-message-bytes", type=count_arg, metavar="N")
    s.add_argument("--delay", type=seconds_arg, metavar="S", help="default delay of every put")
    s.add_argument("--max-messages", type=_or_none(count_arg), metavar="N|none")
    s.add_argument(
        "--idempotency-window", type=seconds_arg, metavar="S", help=_IDEMPOTENCY_WINDOW_HELP
    )
    _limit_arguments(s, lift=True)
    fair = s.add_mutually_exclusive_group()
    fair.add_argument("--fair", action="store_const", const=True, dest="fair")
    fair.add_argument("--no-fair", action="store_const", const=False, dest="fair")

    s = sub.add_parser("put", help="put messages (bodies as arguments, or one per stdin line)")
    s.add_argument("queue")
    s.add_argument("bodies", nargs="*", metavar="BODY")
    when = s.add_mutually_exclusive_group()
    when.add_argument("--delay", type=seconds_arg, metavar="S")
    when.add_argument("--at", type=parse_time, metavar="TIME", help="ISO-8601 or Unix seconds")
    s.add_argument("--id", help="message id (client-id queues; one message)")
    s.add_argument("--key", help="idempotency key (one message)")
    s.add_argument("--group", help="message group (FIFO queues; fair queues' tenants)")

    s = sub.add_parser("take", help="take (reserve) messages")
    s.add_argument("queue")
    s.add_argument("-n", type=count_arg, default=1, metavar="N", help="at most N messages")
    s.add_argument("--wait", type=seconds_arg, metavar="S", help="wait up to S s for a message")
    s.add_argument("--visibility-timeout", type=seconds_arg, metavar="S")

    s = sub.add_parser("ack", help="acknowledge (delete) a taken message")
    s.add_argument("queue")
    s.add_argument("id")
    s.add_argument("lease")

    s = sub.add_parser("release", help="give a taken message back (now, or later)")
    s.add_argument("queue")
    s.add_argument("id")
    s.add_argument("lease")
    when = s.add_mutually_exclusive_group()
    when.add_argument("--delay", type=seconds_arg, metavar="S", help="ready again in S seconds")
    when.add_argument("--at", type=parse_time, metavar="TIME", help="ISO-8601 or Unix seconds")
    s.add_argument("--reason", help="why it failed (kept with the message, up to 1 KiB)")
    cli_messages.add_parsers(sub)

    s = sub.add_parser("stats", help="a queue's settings and counters")
    s.add_argument("queue")
    sub.add_parser("queues", help="list queues")

    s = sub.add_parser("set", help="set a key to a JSON value")
    s.add_argument("key")
    s.add_argument("value", type=json_arg, metavar="VALUE-JSON")
    s = sub.add_parser("get", help="a key's value and version")
    s.add_argument("key")
    s = sub.add_parser("watch", help="print a key's state, then each change")
    s.add_argument("key")
    s.add_argument("--once", action="store_true", help="stop after the first state printed")
    s.add_argument("--version", type=int, default=0, help="start after this version")
    s.add_argument("--timeout", type=seconds_arg, default=30.0, help="long-poll timeout (s)")

    s = sub.add_parser("delete-queue", help="delete a queue and its messages")
    s.add_argument("name")
    s = sub.add_parser("purge", help="delete every message of a queue")
    s.add_argument("name")
    s = sub.add_parser("pause", help="takes of a queue hand out nothing (puts go on)")
    s.add_argument("name")
    s = sub.add_parser("resume", help="takes of a paused queue hand out messages again")
    s.add_argument("name")

    s = sub.add_parser(
        "reshard",
        help="change the shard count of a stopped server's store (--shards N; serve's options)",
    )
    _serve_arguments(s)

    s = sub.add_parser(
        "shards", help="the shard actors of a Ray cluster, which outlive its gateways"
    )
    s.add_argument(
        "action",
        choices=["status", "stop", "resize", "restart"],
        help="list them, close and end them (over Ray); resize the running server (evq shards "
        "resize N) or restart each of its shards in turn (over its API)",
    )
    s.add_argument("count", nargs="?", type=count_arg, help="resize: the new shard count")
    s.add_argument("--wait", action="store_true", help="resize, restart: follow the task")
    s.add_argument("--ray-address", help="the Ray cluster (default: EVQ_RAY_ADDRESS, else auto)")
    s.add_argument("--timeout", type=seconds_arg, default=60.0, help="per shard call (s)")

    s = sub.add_parser(
        "redrive", help="move a dead-letter queue's messages back where they came from"
    )
    s.add_argument("queue", help="the dead-letter queue")
    s.add_argument("--to", help="move them all to this queue instead")
    s.add_argument("--rate", type=int, help="at most this many messages a second")
    s.add_argument("--id", action="append", help="only this message (repeat for more)")
    s.add_argument("--wait", action="store_true", help="follow the task until it ends")

    s = sub.add_parser(
        "tasks", help="the server's tasks (resizes, restarts, redrives): list, show or cancel one"
    )
    s.add_argument("id", nargs="?", help="one task")
    s.add_argument("--cancel", action="store_true", help="cancel that task")

    s = sub.add_parser("pipeline", help="Spark jobs over the event log: stats, audit, archive")
    pipeline_args.add_arguments(s)
    _handle_command(sub)
    return p


def _handle_command(sub: Any) -> None:
    """`evq handle module:function --queue Q`: run a handler as Ray tasks (evq.handlers)."""
    help_text = "run a Python function on a queue's messages as Ray tasks"
    handle_cli.add_arguments(sub.add_parser("handle", help=help_text))


# ------------------------------------------------------------------ output


def queue_lines(info: QueueInfo) -> list[str]:
    """A queue's stats and settings for people."""
    lines = [f"queue {info.name}"]
    if info.stats is not None:
        stats = msgspec.structs.asdict(info.stats)
        lines += ["  " + x for x in table((k, show_num(v)) for k, v in stats.items())]
    lines.append("settings")
    settings = msgspec.structs.asdict(info.settings)
    lines += ["  " + x for x in table((k, show_num(v)) for k, v in settings.items())]
    return lines


def message_lines(messages: Sequence[Message]) -> list[str]:
    """Taken messages as a table: id, lease, receive count, body."""
    rows = [(m.id, m.lease or "-", m.receive_count, show_body(m.body)) for m in messages]
    return table(rows, ("ID", "LEASE", "RECEIVES", "BODY"))


def _key_line(state: KeyValue) -> str:
    return f"{state.key} version {state.version}: {json.dumps(state.value, ensure_ascii=False)}"


# ------------------------------------------------------------------ commands

Handler = Callable[[Client, argparse.Namespace, Output, IO[Any]], int]


_NONE = object()  # "none" given to a limit: lifted (None in the settings)


def _or_none(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type that also takes ``none`` (the setting lifted)."""

    def parse(text: str) -> Any:
        return _NONE if text.lower() == "none" else kind(text)

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def _limit_arguments(s: argparse.ArgumentParser, lift: bool = False) -> None:
    """--take-rate, --put-rate, --max-in-flight (with ``lift``: each also ``none``)."""
    kind = _or_none(count_arg) if lift else count_arg
    meta = "N|none" if lift else "N"
    s.add_argument("--take-rate", type=kind, metavar=meta, help="messages taken a second")
    s.add_argument("--put-rate", type=kind, metavar=meta, help="messages put a second")
    s.add_argument("--max-in-flight", type=kind, metavar=meta, help="messages reserved at once")


_CONFIGURABLE = (
    "visibility_timeout",
    "max_receives",
    "dead_letter_queue",
    "retention",
    "max_message_bytes",
    "delay",
    "max_messages",
    "idempotency_window",
    "take_rate",
    "put_rate",
    "max_in_flight",
    "fair",
)


def _configure(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    changes = {
        name: None if value is _NONE else value
        for name in _CONFIGURABLE
        if (value := getattr(args, name)) is not None
    }
    if not changes:
        raise _Usage("configure: name at least one setting to change")
    info = client.update_queue(args.name, **changes)
    if out.json:
        out.doc({"name": info.name, "settings": plain(info.settings)})
    else:
        out.line(f"{info.name}: " + ", ".join(f"{k} {getattr(info.settings, k)}" for k in changes))
    return 0


def _create(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    info = client.create_queue(
        args.name,
        id_mode="client" if args.client_ids else None,
        visibility_timeout=args.visibility_timeout,
        max_receives=args.max_receives,
        dead_letter_queue=args.dead_letter_queue,
        retention=args.retention,
        max_message_bytes=args.max_message_bytes,
        fifo=True if args.fifo else None,
        delay=args.delay,
        idempotency_window=args.idempotency_window,
        fair=True if args.fair else None,
        take_rate=args.take_rate,
        put_rate=args.put_rate,
        max_in_flight=args.max_in_flight,
    )
    if out.json:
        out.doc({"name": info.name, "settings": plain(info.settings), "created": info.created})
    elif info.created is False:
        out.line(f"queue {info.name} exists with these settings")
    else:
        out.line(f"created queue {info.name}")
    return 0


def _stdin_bodies(stdin: IO[Any]) -> Iterator[bytes]:
    """One body per line (line ends stripped, empty lines skipped: bodies are never empty)."""
    for line in getattr(stdin, "buffer", stdin):
        raw = line.encode("utf-8") if isinstance(line, str) else line
        raw = raw.rstrip(b"\n").rstrip(b"\r")
        if raw:
            yield raw


def _batches(bodies: Iterable[bytes | str], size: int = MAX_BATCH) -> Iterator[list[bytes | str]]:
    batch: list[bytes | str] = []
    for body in bodies:
        batch.append(body)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _put(client: Client, args: argparse.Namespace, out: Output, stdin: IO[Any]) -> int:
    bodies: Iterable[bytes | str] = args.bodies if args.bodies else _stdin_bodies(stdin)
    results: list[PutResult] = []
    try:
        for batch in _batches(bodies):
            if (args.id or args.key) and (results or len(batch) > 1):
                raise _Usage("--id and --key name one message; give one body")
            done = client.put(
                args.queue,
                batch,
                delay=args.delay,
                activate_at=args.at,
                group=args.group,
                id=args.id,
                idempotency_key=args.key,
            )
            results += done
            if not out.json:
                for line in table((r.id, r.status) for r in done):
                    out.line(line)
    finally:
        if out.json and results:
            out.doc({"results": plain(results)})
    if not results:
        out.note("evq put: no message given (bodies as arguments or lines on stdin)")
    return 0


def _take(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    messages = client.take(
        args.queue, args.n, wait=args.wait, visibility_timeout=args.visibility_timeout
    )
    if out.json:
        for m in messages:
            out.doc(message_doc(m))
    elif messages:
        for line in message_lines(messages):
            out.line(line)
    else:
        out.note("no messages")
    return 0


def _ack(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    return item_results(client.ack(args.queue, (args.id, args.lease)), "ack", out)


def _release(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    results = client.release(
        args.queue, (args.id, args.lease), delay=args.delay, activate_at=args.at, reason=args.reason
    )
    return item_results(results, "release", out)


def _stats(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    info = client.get_queue(args.queue)
    if out.json:
        out.doc(
            {
                "name": info.name,
                "settings": plain(info.settings),
                "stats": plain(info.stats),
            }
        )
    else:
        for line in queue_lines(info):
            out.line(line)
    return 0


def _queues(client: Client, _args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    names = client.list_queues()
    if out.json:
        out.doc({"queues": names})
    else:
        for name in names:
            out.line(name)
    return 0


def _set(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    version = client.set_key(args.key, args.value)
    if out.json:
        out.doc({"key": args.key, "version": version})
    else:
        out.line(f"{args.key} version {version}")
    return 0


def _get(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    state = client.get_key(args.key)
    if out.json:
        out.doc(plain(state))
    else:
        out.line(_key_line(state))
    return 0


def _watch(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    for state in client.watch_loop(args.key, version=args.version, wait=args.timeout):
        if out.json:
            out.doc(plain(state))
        else:
            out.line(_key_line(state))
        out.out.flush()
        if args.once:
            break
    return 0


def _delete_queue(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    client.delete_queue(args.name)
    if out.json:
        out.doc({"name": args.name, "deleted": True})
    else:
        out.line(f"deleted queue {args.name}")
    return 0


def _purge(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    purged = client.purge(args.name)
    if out.json:
        out.doc({"purged": purged})
    else:
        out.line(f"purged {purged} message{'' if purged == 1 else 's'} from {args.name}")
    return 0


def _pause(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    paused = client.pause(args.name) if args.command == "pause" else client.resume(args.name)
    if out.json:
        out.doc({"name": args.name, "paused": paused})
    else:
        out.line(f"{args.name}: {'paused' if paused else 'resumed'}")
    return 0


def _task_line(task: dict[str, Any]) -> str:
    line = f"{task['id']}  {task['kind']}  {task['state']}  {task['done']}/{task['total']}"
    if "count" in task:
        line += f"  {task.get('was', '?')} -> {task['count']} shard(s)"
    if task["kind"] == "redrive":
        line += f"  {task['queue']} -> {task.get('to') or 'their sources'}"
        if task.get("skipped"):
            line += f" ({task['skipped']} skipped)"
    if task.get("error"):
        line += f"  {task['error']['code']}: {task['error']['message']}"
    return line


TASK_POLL_S = 0.5


def _shards(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    """``evq shards resize N`` and ``evq shards restart``: start the task, follow it."""
    if args.action == "restart":
        if args.count is not None:
            raise _Usage("usage: evq shards restart (no count)")
        task_id = client.restart_shards()
    elif args.count is None:
        raise _Usage("usage: evq shards resize N (the new shard count)")
    else:
        task_id = client.resize_shards(args.count)
    return _started(client, task_id, out, wait=args.wait)


def _redrive(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    """``evq redrive DLQ [--to Q] [--rate R] [--id ID …]``: start the task, follow it."""
    task_id = client.redrive(args.queue, to=args.to, rate=args.rate, ids=args.id or None)
    return _started(client, task_id, out, wait=args.wait)


_UNITS = {"restart": "shard(s) restarted", "resize": "queue(s) moved", "redrive": "message(s)"}


def _started(client: Client, task_id: str, out: Output, *, wait: bool) -> int:
    """A task just started: its id, or (``wait``) its progress until it ends, then how it
    ended (exit status 1 unless done)."""
    if not wait:
        if out.json:
            out.doc({"task": task_id})
        else:
            out.line(task_id)
            out.note(f"follow it with: evq tasks {task_id}")
        return 0
    seen = None
    while True:
        task = client.task(task_id)
        if (task["done"], task["total"]) != seen:
            seen = (task["done"], task["total"])
            what = _UNITS.get(task["kind"], "step(s)")
            out.note(f"{task_id}: {task['done']}/{task['total']} {what}")
        if task["state"] != "running":
            break
        time.sleep(TASK_POLL_S)
    if out.json:
        out.doc(task)
    else:
        out.line(_task_line(task))
    return 0 if task["state"] == "done" else 1


def _tasks(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    if args.id is None:
        if args.cancel:
            raise _Usage("usage: evq tasks ID --cancel (which task to cancel)")
        tasks = client.tasks()
        if out.json:
            out.doc({"tasks": tasks})
        for task in [] if out.json else tasks:
            out.line(_task_line(task))
        return 0
    task = client.cancel_task(args.id) if args.cancel else client.task(args.id)
    if out.json:
        out.doc(task)
    else:
        out.line(_task_line(task))
    return 0


COMMANDS: dict[str, Handler] = {
    "create": _create,
    "configure": _configure,
    "put": _put,
    "take": _take,
    "ack": _ack,
    "release": _release,
    "stats": _stats,
    "queues": _queues,
    "set": _set,
    "get": _get,
    "watch": _watch,
    "delete-queue": _delete_queue,
    "purge": _purge,
    "pause": _pause,
    "resume": _pause,
    "redrive": _redrive,
    "peek": cli_messages.peek,
    "run-now": cli_messages.run_now,
    "reschedule": cli_messages.reschedule,
    "edit": cli_messages.edit,
    "delete": cli_messages.delete,
    "touch": cli_messages.touch,
    "tasks": _tasks,
    "shards": _shards,  # evq shards resize|restart (status and stop go over Ray)
}


class _Usage(Exception):
    """A usage error found after parsing (exit 2)."""


def _serve(args: argparse.Namespace, err: IO[str]) -> int:
    """Run ``gateway.server.main(args)`` (or its ``reshard_main``), imported only now (it
    pulls in Ray)."""
    try:
        server = importlib.import_module("gateway.server")
    except ModuleNotFoundError as e:
        if e.name != "gateway.server":
            raise
        server = None
    entry = {"serve": "main", "reshard": "reshard_main", "shards": "shards_main"}[args.command]
    run = getattr(server, entry, None)
    if run is None:
        print(f"evq {args.command}: not available", file=err)
        return 2
    result = run(args)
    return result if isinstance(result, int) else 0


def _late_bodies(extra: Sequence[str]) -> list[str] | None:
    """Bodies argparse left over (after an option, or after ``--``); None if one is an option."""
    bodies: list[str] = []
    for i, word in enumerate(extra):
        if word == "--":
            return bodies + list(extra[i + 1 :])
        if word.startswith("-"):
            return None
        bodies.append(word)
    return bodies


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; put's bodies may follow its options.

    Raises:
        SystemExit: a usage error (2) or --help (0), from argparse.
    """
    args, extra = parser.parse_known_args(argv)
    late = _late_bodies(extra) if args.command == "put" else None
    if extra and late is None:
        parser.error("unrecognized arguments: " + " ".join(extra))
    if late:
        args.bodies = [*args.bodies, *late]
    if args.command == "create" and args.dead_letter_queue and not args.max_receives:
        parser.error("--dead-letter-queue needs --max-receives")
    return args


def main(
    argv: Sequence[str] | None = None,
    *,
    client: Client | None = None,
    stdin: IO[Any] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """Entry point of the `evq` console script; returns the exit code."""
    out_stream = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    parser = build_parser()
    try:
        with contextlib.redirect_stdout(out_stream), contextlib.redirect_stderr(err):
            args = parse_args(parser, argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return e.code if isinstance(e.code, int) else 2
    if args.command in ("serve", "reshard") or (
        args.command == "shards" and args.action not in ("resize", "restart")
    ):
        return _serve(args, err)
    if args.command == "pipeline":  # runs Spark locally; no server involved
        return pipeline_main.run(args, err)
    if args.command == "handle":  # a handler runtime on Ray; drains on SIGTERM
        return handle_cli.main(args, out_stream, err)
    out = Output(out_stream, err, args.json)
    own = client is None
    if client is None:
        server = args.server or os.environ.get("EVQ_SERVER") or DEFAULT_URL
        client = Client(
            server,
            token=args.token or os.environ.get("EVQ_TOKEN") or None,
            ca_bundle=args.ca_bundle,
        )
    try:
        return COMMANDS[args.command](client, args, out, stdin if stdin is not None else sys.stdin)
    except _Usage as e:
        print(f"evq {args.command}: {e}", file=err)
        return 2
    except QueueError as e:
        status = e.fields.get("status")
        where = f" (HTTP {status})" if status is not None else ""
        print(f"evq {args.command}: {e.code}: {e.message}{where}", file=err)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if own:
            client.close()


if __name__ == "__main__":
    sys.exit(main())
