"""``evq handle module:function --queue Q [--server URL] [options]``: run a handler from the
command line until SIGTERM/SIGINT, then drain it (stop taking, let running tasks finish for
``--drain-timeout`` seconds, release the rest) and exit 0.

Ray: a local runtime of its own, or the cluster at ``--ray-address``. Transport: straight
from the shards when that cluster hosts the server (``auto``), else over HTTP to
``--server``. Options given here override the ones the function was decorated with.

Exit codes: 0 drained, 1 the server or queue cannot be used, 2 a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import IO, Any

import msgspec

from actors.clock import SystemClock
from actors.errors import QueueError
from actors.logsetup import add_log_arguments, config_of, setup_logging
from evq.client_wire import DEFAULT_URL
from evq.handlers.api import Backoff, Handler, load_handler, resolve

__all__ = ["add_arguments", "main"]


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value >= 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, not {text!r}")
        return value

    return parse


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON: {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``evq handle``."""
    p = parser
    p.add_argument("handler", metavar="MODULE:FUNCTION", help="the function (or @handler)")
    p.add_argument("--queue", help="the queue it handles (default: the decorator's)")
    p.add_argument(
        "--server",
        dest="handle_server",
        metavar="URL",
        help=f"the server (default: $EVQ_SERVER or {DEFAULT_URL})",
    )
    p.add_argument("--batch-size", type=int, metavar="N", help="messages per take (1..1000)")
    p.add_argument(
        "--batch",
        action="store_true",
        default=None,
        help="call the function once per batch with a list",
    )
    p.add_argument("--max-concurrency", type=int, metavar="N", help="chunks running at once")
    p.add_argument("--visibility-timeout", type=_positive(float), metavar="S")
    p.add_argument("--backoff-base", type=_positive(float), metavar="S")
    p.add_argument("--backoff-factor", type=_positive(float), metavar="F")
    p.add_argument("--backoff-cap", type=_positive(float), metavar="S")
    p.add_argument("--backoff-jitter", type=_positive(float), metavar="J", help="0..1")
    p.add_argument("--num-cpus", type=_positive(float), metavar="N", help="per worker")
    p.add_argument("--num-gpus", type=_positive(float), metavar="N", help="per worker")
    p.add_argument("--memory", type=_positive(int), metavar="BYTES", help="per worker")
    p.add_argument(
        "--warm-workers",
        type=int,
        metavar="N",
        help="idle workers kept for the next message (default 1; 0: none when idle)",
    )
    p.add_argument("--runtime-env", type=_json_object, metavar="JSON", help="Ray runtime_env")
    p.add_argument("--drain-timeout", type=_positive(float), metavar="S")
    p.add_argument(
        "--transport",
        choices=("auto", "direct", "http"),
        default="auto",
        help="direct: straight from the shards (same Ray cluster); http: via --server",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="join this Ray cluster (default: start a local one)",
    )
    add_log_arguments(p)
    p.add_argument(
        "--status-every",
        type=_positive(float),
        default=10.0,
        metavar="S",
        help="print what it did every S seconds (0: only at the end)",
    )


_OPTIONS = {
    "queue": "queue",
    "batch_size": "batch_size",
    "batch": "batch",
    "max_concurrency": "max_concurrency",
    "visibility_timeout": "visibility_timeout",
    "num_cpus": "num_cpus",
    "num_gpus": "num_gpus",
    "memory": "memory",
    "runtime_env": "runtime_env",
    "drain_timeout": "drain_timeout",
    "warm_workers": "warm_workers",
}


def _overrides(args: argparse.Namespace, current: Backoff) -> dict[str, Any]:
    changes = {
        option: getattr(args, flag)
        for flag, option in _OPTIONS.items()
        if getattr(args, flag) is not None
    }
    backoff = {
        name: getattr(args, f"backoff_{name}")
        for name in ("base", "factor", "cap", "jitter")
        if getattr(args, f"backoff_{name}") is not None
    }
    if backoff:
        changes["backoff"] = dataclasses.replace(current, **backoff)
    return changes


def _load(args: argparse.Namespace) -> Handler:
    """The handler with the command line's options.

    Raises:
        ValueError, ImportError: as load_handler.
    """
    if os.getcwd() not in sys.path:  # as ``python -m``: modules next to where it runs
        sys.path.insert(0, os.getcwd())
    found = resolve(args.handler)
    current = found.options.backoff if isinstance(found, Handler) else Backoff()
    return load_handler(args.handler, **_overrides(args, current))


def _check_queue(handler: Handler, server: str, token: str | None, transport: str) -> str | None:
    """Why the queue cannot be used (None: it can, or it cannot be checked over HTTP)."""
    from evq.client import Client, TransportError

    with Client(server, token=token, retries=1, timeout=10) as client:
        try:
            client.get_queue(handler.options.queue)
        except TransportError as exc:
            if transport == "http":
                return f"{exc.code}: {exc.message}"
        except QueueError as exc:
            return f"{exc.code}: {exc.message}"
    return None


def _line(stats: Any) -> str:
    return (
        f"{stats.name} on {stats.queue} ({stats.transport}, {stats.state}): "
        f"acked {stats.acked}, released {stats.released}, rescheduled {stats.rescheduled}, "
        f"abandoned {stats.abandoned}, drained {stats.drained}, put {stats.put_created} "
        f"(+{stats.put_duplicate} duplicate), running {stats.in_flight} task(s)"
    )


class _Reporter:
    """Prints a status line every ``every`` seconds when something changed."""

    def __init__(self, out: IO[str], every: float, as_json: bool) -> None:
        self.out, self.every, self.as_json = out, every, as_json
        self.clock = SystemClock()
        self.last_at = self.clock.now_ms() / 1000
        self.last: Any = None

    def __call__(self, stats: Any) -> None:
        now = self.clock.now_ms() / 1000
        if not self.every or now - self.last_at < self.every or stats == self.last:
            return
        self.last_at, self.last = now, stats
        self.print(stats)

    def print(self, stats: Any) -> None:
        text = msgspec.json.encode(stats).decode() if self.as_json else _line(stats)
        print(text, file=self.out, flush=True)


def main(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Run ``evq handle``; the exit code."""
    try:
        handler = _load(args)
        log = config_of(args)
    except (ValueError, ImportError) as exc:
        print(f"evq handle: {exc}", file=err)
        return 2
    server = args.handle_server or args.server or os.environ.get("EVQ_SERVER") or DEFAULT_URL
    token = args.token or os.environ.get("EVQ_TOKEN") or None
    problem = _check_queue(handler, server, token, args.transport)
    if problem is not None:
        print(f"evq handle: queue {handler.options.queue}: {problem}", file=err)
        return 1
    from evq.handlers import cluster  # Ray: only now

    fields = {"handler": handler.name, "queue": handler.options.queue}
    setup_logging(log.level, log.format, mode=log.mode, stream=err, fields=fields)

    reporter = _Reporter(out, args.status_every, args.json)
    try:
        final = cluster.run(
            handler,
            server=server,
            transport=args.transport,
            token=token,
            ray_address=args.ray_address,
            report=reporter,
            log=log,
        )
    except QueueError as exc:
        print(f"evq handle: {exc.code}: {exc.message}", file=err)
        return 1
    except cluster.HandlerStartError as exc:
        print(f"evq handle: {exc}", file=err)
        return 1
    finally:
        import ray

        ray.shutdown()
    reporter.print(final)
    return 0
