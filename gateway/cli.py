"""The `evq` command line: `evq serve` (the server) and thin clients of the native API.

Output is for people by default (aligned columns) and for programs with ``--json``: one
JSON document per command, or JSON lines for ``take`` and ``watch``. Exit codes: 0 ok,
1 an API error (its code and message on stderr), 2 a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

import msgspec

from actors.errors import QueueError
from actors.handlers import cli as handle_cli  # light: Ray loads only when a handler runs
from gateway.client import DEFAULT_URL, Client
from gateway.client_wire import ItemResult, KeyValue, Message, PutResult, QueueInfo, message_doc
from pipeline import args as pipeline_args  # light: Spark loads only when a job runs
from pipeline import main as pipeline_main

__all__ = ["build_parser", "main"]

MAX_BATCH = 1000  # messages per put request (API.md)
BODY_WIDTH = 80  # characters of a body shown in human output

# Item statuses of ack / release and the error code each stands for.
_ITEM_CODES = {"stale_lease": "StaleLease", "not_found": "MessageNotFound"}


# ------------------------------------------------------------------ argument types


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"seconds must be >= 0, not {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {text!r}")
    return value


def parse_time(text: str) -> float:
    """Unix seconds from Unix seconds or ISO-8601 (local time when no offset is given)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time (ISO-8601 or Unix seconds): {text!r}"
        ) from None


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON: {text!r} (quote strings: '\"x\"')") from None


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
    p.add_argument("--json", action="store_true", help="machine output (JSON / JSON lines)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _serve_arguments(sub.add_parser("serve", help="run the server on this machine"))

    s = sub.add_parser("create", help="create a queue (no change if it exists alike)")
    s.add_argument("name")
    s.add_argument("--client-ids", action="store_true", help="ids come from the client")
    s.add_argument("--visibility-timeout", type=_seconds, metavar="S")
    s.add_argument("--max-receives", type=_count, metavar="N")
    s.add_argument("--dead-letter-queue", metavar="Q", help="needs --max-receives")
    s.add_argument("--retention", type=_seconds, metavar="S")
    s.add_argument("--max-message-bytes", type=_count, metavar="N")
    s.add_argument("--fifo", action="store_true", help="FIFO queue (name ends in .fifo)")
    s.add_argument("--delay", type=_seconds, metavar="S", help="default delay of every put")

    s = sub.add_parser("put", help="put messages (bodies as arguments, or one per stdin line)")
    s.add_argument("queue")
    s.add_argument("bodies", nargs="*", metavar="BODY")
    when = s.add_mutually_exclusive_group()
    when.add_argument("--delay", type=_seconds, metavar="S")
    when.add_argument("--at", type=parse_time, metavar="TIME", help="ISO-8601 or Unix seconds")
    s.add_argument("--id", help="message id (client-id queues; one message)")
    s.add_argument("--key", help="idempotency key (one message)")
    s.add_argument("--group", help="message group (FIFO queues)")

    s = sub.add_parser("take", help="take (reserve) messages")
    s.add_argument("queue")
    s.add_argument("-n", type=_count, default=1, metavar="N", help="at most N messages")
    s.add_argument("--wait", type=_seconds, metavar="S", help="wait up to S s for a message")
    s.add_argument("--visibility-timeout", type=_seconds, metavar="S")

    s = sub.add_parser("ack", help="acknowledge (delete) a taken message")
    s.add_argument("queue")
    s.add_argument("id")
    s.add_argument("lease")

    s = sub.add_parser("release", help="give a taken message back")
    s.add_argument("queue")
    s.add_argument("id")
    s.add_argument("lease")
    s.add_argument("--delay", type=_seconds, metavar="S")

    s = sub.add_parser("stats", help="a queue's settings and counters")
    s.add_argument("queue")
    sub.add_parser("queues", help="list queues")

    s = sub.add_parser("set", help="set a key to a JSON value")
    s.add_argument("key")
    s.add_argument("value", type=_json_value, metavar="VALUE-JSON")
    s = sub.add_parser("get", help="a key's value and version")
    s.add_argument("key")
    s = sub.add_parser("watch", help="print a key's state, then each change")
    s.add_argument("key")
    s.add_argument("--once", action="store_true", help="stop after the first state printed")
    s.add_argument("--version", type=int, default=0, help="start after this version")
    s.add_argument("--timeout", type=_seconds, default=30.0, help="long-poll timeout (s)")

    s = sub.add_parser("delete-queue", help="delete a queue and its messages")
    s.add_argument("name")
    s = sub.add_parser("purge", help="delete every message of a queue")
    s.add_argument("name")

    s = sub.add_parser(
        "reshard",
        help="change the shard count of a stopped server's store (--shards N; serve's options)",
    )
    _serve_arguments(s)

    s = sub.add_parser(
        "shards", help="the shard actors of a Ray cluster, which outlive its gateways"
    )
    s.add_argument("action", choices=["status", "stop"], help="list them, or close and end them")
    s.add_argument("--ray-address", help="the Ray cluster (default: EVQ_RAY_ADDRESS, else auto)")
    s.add_argument("--timeout", type=_seconds, default=60.0, help="per shard call (s)")

    s = sub.add_parser("pipeline", help="Spark jobs over the event log: stats, audit, archive")
    pipeline_args.add_arguments(s)
    _handle_command(sub)
    return p


def _handle_command(sub: Any) -> None:
    """`evq handle module:function --queue Q`: run a handler as Ray tasks (actors.handlers)."""
    help_text = "run a Python function on a queue's messages as Ray tasks"
    handle_cli.add_arguments(sub.add_parser("handle", help=help_text))


# ------------------------------------------------------------------ output


@dataclass
class Output:
    """Where a command writes, and whether as JSON."""

    out: IO[str]
    err: IO[str]
    json: bool

    def doc(self, value: Any) -> None:
        """One JSON document on one line."""
        print(json.dumps(value, ensure_ascii=False), file=self.out)

    def line(self, text: str = "") -> None:
        """One line of human output."""
        print(text, file=self.out)

    def note(self, text: str) -> None:
        """A remark for people on stderr (never in JSON output)."""
        print(text, file=self.err)


def table(rows: Iterable[Sequence[object]], headers: Sequence[str] | None = None) -> list[str]:
    """Rows as aligned lines (the last column is not padded)."""
    cells = [[str(c) for c in row] for row in ([headers] if headers else []) + list(rows)]
    if not cells:
        return []
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(len(cells[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)) + "  " + r[-1]
        if len(r) > 1
        else r[0]
        for r in cells
    ]


def show_body(body: bytes, width: int = BODY_WIDTH) -> str:
    """A body for people: text as is, text with control characters quoted, else its size."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(body)} bytes, binary>"
    if not text.isprintable():
        text = json.dumps(text, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def _num(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "-" if value is None else str(value)


def queue_lines(info: QueueInfo) -> list[str]:
    """A queue's stats and settings for people."""
    lines = [f"queue {info.name}"]
    if info.stats is not None:
        stats = msgspec.structs.asdict(info.stats)
        lines += ["  " + x for x in table((k, _num(v)) for k, v in stats.items())]
    lines.append("settings")
    settings = msgspec.structs.asdict(info.settings)
    lines += ["  " + x for x in table((k, _num(v)) for k, v in settings.items())]
    return lines


def message_lines(messages: Sequence[Message]) -> list[str]:
    """Taken messages as a table: id, lease, receive count, body."""
    rows = [(m.id, m.lease or "-", m.receive_count, show_body(m.body)) for m in messages]
    return table(rows, ("ID", "LEASE", "RECEIVES", "BODY"))


def _key_line(state: KeyValue) -> str:
    return f"{state.key} version {state.version}: {json.dumps(state.value, ensure_ascii=False)}"


def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value)


# ------------------------------------------------------------------ commands

Handler = Callable[[Client, argparse.Namespace, Output, IO[Any]], int]


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
    )
    if out.json:
        out.doc({"name": info.name, "settings": _builtins(info.settings), "created": info.created})
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
            out.doc({"results": _builtins(results)})
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


def _item_results(results: list[ItemResult], verb: str, out: Output) -> int:
    if out.json:
        out.doc({"results": _builtins(results)})
    else:
        for line in table((r.id, r.status) for r in results):
            out.line(line)
    failed = [r for r in results if not r.ok]
    for r in failed:
        code = _ITEM_CODES.get(r.status, "Conflict")
        out.note(f"evq {verb}: {code}: message {r.id}: {r.status}")
    return 1 if failed else 0


def _ack(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    return _item_results(client.ack(args.queue, (args.id, args.lease)), "ack", out)


def _release(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    results = client.release(args.queue, (args.id, args.lease), delay=args.delay)
    return _item_results(results, "release", out)


def _stats(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    info = client.get_queue(args.queue)
    if out.json:
        out.doc(
            {
                "name": info.name,
                "settings": _builtins(info.settings),
                "stats": _builtins(info.stats),
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
        out.doc(_builtins(state))
    else:
        out.line(_key_line(state))
    return 0


def _watch(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    for state in client.watch_loop(args.key, version=args.version, wait=args.timeout):
        if out.json:
            out.doc(_builtins(state))
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


COMMANDS: dict[str, Handler] = {
    "create": _create,
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
    if args.command in ("serve", "reshard", "shards"):
        return _serve(args, err)
    if args.command == "pipeline":  # runs Spark locally; no server involved
        return pipeline_main.run(args, err)
    if args.command == "handle":  # a handler runtime on Ray; drains on SIGTERM
        return handle_cli.main(args, out_stream, err)
    out = Output(out_stream, err, args.json)
    own = client is None
    if client is None:
        server = args.server or os.environ.get("EVQ_SERVER") or DEFAULT_URL
        client = Client(server, token=args.token or os.environ.get("EVQ_TOKEN") or None)
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
