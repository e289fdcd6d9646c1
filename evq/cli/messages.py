"""`evq peek` and `evq touch`: looking at a queue's messages without taking them, and
keeping a taken message's lease alive."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import IO, Any

from evq.cli.common import (
    Output,
    count_arg,
    item_results,
    parse_time,
    seconds_arg,
    show_body,
    show_time,
    table,
)
from evq.client import Client
from evq.client_wire import Message, message_doc

__all__ = ["add_parsers", "delete", "edit", "peek", "reschedule", "run_now", "touch"]

STATES = ("ready", "delayed", "reserved")


def add_parsers(sub: Any) -> None:
    """The ``peek`` and ``touch`` subcommands."""
    s = sub.add_parser(
        "peek",
        help="list a queue's ready, delayed or reserved messages without taking them",
        description="Ready and delayed messages in activation order (ready: the order take "
        "hands them out), reserved ones by lease expiry; a page at a time, and the cursor "
        "of the next one on stderr. --json: one document per page, or one line per message "
        "with --all.",
    )
    s.add_argument("queue")
    s.add_argument("--state", choices=STATES, default="ready")
    s.add_argument("-n", type=count_arg, default=100, metavar="N", help="per page (1-1000)")
    s.add_argument("--after", metavar="CURSOR", help="continue after a page's cursor")
    s.add_argument("--all", action="store_true", help="every page, not only the first")

    s = sub.add_parser("run-now", help="make a delayed message ready now")
    _message_arguments(s)
    s = sub.add_parser("reschedule", help="move a message's activation time")
    _message_arguments(s)
    when = s.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay", type=seconds_arg, metavar="S", help="ready in S seconds")
    when.add_argument("--at", type=parse_time, metavar="TIME", help="ISO-8601 or Unix seconds")
    s = sub.add_parser("edit", help="replace a message's body")
    _message_arguments(s)
    s.add_argument("body", help="the new body (text)")
    s = sub.add_parser(
        "delete", help="delete one message (a reserved one: its lease, or --force as an admin)"
    )
    _message_arguments(s)
    s.add_argument(
        "--force",
        action="store_true",
        help="delete a reserved message without its lease (admin; its holder's ack is stale)",
    )

    s = sub.add_parser("touch", help="extend the lease of a taken message")
    s.add_argument("queue")
    s.add_argument("id")
    s.add_argument("lease")
    s.add_argument(
        "--visibility-timeout", type=seconds_arg, metavar="S", help="from now (default: queue's)"
    )


def peek(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    """``evq peek QUEUE [--state S] [-n N] [--after CURSOR | --all]``."""
    if args.all:
        messages = client.browse_all(args.queue, args.state, limit=args.n)
        if out.json:
            for m in messages:
                out.doc(message_doc(m))
        else:
            _show(list(messages), args.state, out)
        return 0
    page = client.browse(args.queue, args.state, limit=args.n, after=args.after)
    if out.json:
        out.doc({"messages": [message_doc(m) for m in page.messages], "next": page.next})
        return 0
    _show(page.messages, args.state, out)
    if page.next is not None:
        out.note(f"more: evq peek {args.queue} --state {args.state} --after {page.next}")
    return 0


def _show(messages: Iterable[Message], state: str, out: Output) -> None:
    """Messages as a table: id, receive count, activation time (reserved: lease expiry),
    body, and the last failure's reason when any message has one."""
    reserved = state == "reserved"
    messages = list(messages)
    failed = any(m.failures for m in messages)
    rows = [
        (
            m.id,
            m.receive_count,
            show_time(m.lease_expires_at if reserved else m.activate_at),
            show_body(m.body),
            *([show_body(m.failures[-1]["reason"].encode()) if m.failures else "-"] * failed),
        )
        for m in messages
    ]
    if not rows:
        out.note(f"no {state} messages")
        return
    heads = ("ID", "RECEIVES", "EXPIRES" if reserved else "ACTIVE_AT", "BODY")
    for line in table(rows, heads + ("LAST FAILURE",) * failed):
        out.line(line)


def touch(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    """``evq touch QUEUE ID LEASE [--visibility-timeout S]``."""
    results = client.touch(
        args.queue, (args.id, args.lease), visibility_timeout=args.visibility_timeout
    )
    return item_results(results, "touch", out)


def _message_arguments(s: Any) -> None:
    s.add_argument("queue")
    s.add_argument("id")
    s.add_argument("--lease", help="its lease, when it is reserved")


def _view(message: Message, out: Output, what: str) -> int:
    if out.json:
        out.doc(message_doc(message))
    else:
        when = show_time(message.activate_at)
        out.line(f"{message.id}: {what}; {message.state}, active at {when}")
    return 0


def run_now(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    """``evq run-now QUEUE ID [--lease L]``."""
    return _view(client.run_now(args.queue, args.id, lease=args.lease), out, "runs now")


def reschedule(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    """``evq reschedule QUEUE ID (--delay S | --at TIME) [--lease L]``."""
    m = client.reschedule(
        args.queue, args.id, delay=args.delay, activate_at=args.at, lease=args.lease
    )
    return _view(m, out, "rescheduled")


def edit(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    """``evq edit QUEUE ID BODY [--lease L]``."""
    m = client.update_message(args.queue, args.id, body=args.body.encode(), lease=args.lease)
    return _view(m, out, "edited")


def delete(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    """``evq delete QUEUE ID [--lease L | --force]``."""
    client.delete_message(args.queue, args.id, args.lease, force=args.force)
    if out.json:
        out.doc({"id": args.id, "deleted": True})
    else:
        out.line(f"deleted {args.id} from {args.queue}")
    return 0
