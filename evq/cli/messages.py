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
    seconds_arg,
    show_body,
    show_time,
    table,
)
from evq.client import Client
from evq.client_wire import Message, message_doc

__all__ = ["add_parsers", "peek", "touch"]

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
    body."""
    reserved = state == "reserved"
    rows = [
        (
            m.id,
            m.receive_count,
            show_time(m.lease_expires_at if reserved else m.activate_at),
            show_body(m.body),
        )
        for m in messages
    ]
    if not rows:
        out.note(f"no {state} messages")
        return
    for line in table(rows, ("ID", "RECEIVES", "EXPIRES" if reserved else "ACTIVE_AT", "BODY")):
        out.line(line)


def touch(client: Client, args: argparse.Namespace, out: Output, _stdin: IO[Any]) -> int:
    """``evq touch QUEUE ID LEASE [--visibility-timeout S]``."""
    results = client.touch(
        args.queue, (args.id, args.lease), visibility_timeout=args.visibility_timeout
    )
    return item_results(results, "touch", out)
