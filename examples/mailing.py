"""A mailing run by handlers: Python functions on queues, executed as Ray tasks.

- ``send`` (one call per mail) "sends" each mail through a flaky mail server: some
  recipients get a temporary error first (the handler raises, the runtime retries with
  backoff), one address always bounces (after ``max_receives`` deliveries the queue moves it
  to the dead-letter queue). Each sent mail cascades into ``report``: the put is made
  durable before the ack, with an idempotency key taken from the mail's id, so a crash
  between the two never reports a mail twice.
- ``report`` (one call per batch) tallies delivery reports, up to 50 at a time.
- ``digest`` is periodic: one message that asks to be rescheduled every ``--every`` seconds
  instead of being acked.

One command runs it all: without ``--server`` it starts Ray and an ``evq serve`` that joins
that Ray cluster, so the handlers take straight from the queues (no HTTP hop):

    python examples/mailing.py                     # everything on this machine
    python examples/mailing.py --server URL        # a running server, over HTTP
    python examples/mailing.py --server URL --ray-address ADDR   # join the server's cluster
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

from actors.clock import SystemClock
from evq import Backoff, Client, Job, QueueStats, Reschedule, Send, handler

BOUNCE = "nobody@invalid.example"


# ------------------------------------------------------------------ the handlers


def _flaky_first_try(address: str) -> bool:
    return zlib.crc32(address.encode()) % 4 == 0


@handler("mail-send", batch_size=20, max_concurrency=4, num_cpus=0.1)
def send(message: Job) -> Send:
    """Deliver one mail; report it. Raises on temporary and permanent SMTP errors."""
    mail = message.json()
    to = mail["to"]
    time.sleep(0.05)  # the round trip to the mail server
    if to == BOUNCE:
        raise RuntimeError(f"550 mailbox unavailable: {to}")
    if message.receive_count == 1 and _flaky_first_try(to):
        raise RuntimeError(f"421 try again later ({to})")
    report = {"to": to, "attempts": message.receive_count}
    return Send(mail["report_to"], json.dumps(report))


@handler("mail-report", batch=True, batch_size=50, num_cpus=0.1)
def report(messages: list[Job]) -> None:
    """Tally a batch of delivery reports (a real app would write them to its database)."""
    retried = [m.json()["to"] for m in messages if m.json()["attempts"] > 1]
    note = f", {len(retried)} after a retry ({', '.join(retried)})" if retried else ""
    print(f"report: {len(messages)} mail(s) delivered{note}", flush=True)


@handler("mail-digest", num_cpus=0.1)
def digest(message: Job) -> Reschedule:
    """Periodic: send the digest, then come back in ``every`` seconds."""
    job = message.json()
    print(f"digest: sent the {job['name']} digest", flush=True)
    return Reschedule(job["every"])


# ------------------------------------------------------------------ set-up


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server(ray_address: str) -> Iterator[str]:
    """``evq serve`` on a fresh data directory, joined to this Ray cluster."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="evq-mailing-") as data:
        command = [sys.executable, "-m", "evq", "serve", "--data", data]
        command += ["--port", str(port), "--ray-address", ray_address]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, proc)
            yield url
        finally:
            proc.terminate()
            proc.wait(60)


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"evq serve exited with {proc.returncode}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url + "/readyz", timeout=2) as reply,
        ):
            if reply.status == 200:
                return
        time.sleep(0.2)
    raise SystemExit("evq serve did not get ready")


class Queues:
    """The queues of one mailing (``--prefix`` keeps runs on a shared server apart)."""

    def __init__(self, prefix: str) -> None:
        self.send, self.report = f"{prefix}-send", f"{prefix}-report"
        self.digest, self.dead = f"{prefix}-digest", f"{prefix}-dead"

    def create(self, client: Client, mails: int, every: float) -> None:
        """Create the queues (alike if they exist); queue the mails and the digest job."""
        client.create_queue(self.dead)
        client.create_queue(
            self.send, visibility_timeout=10, max_receives=3, dead_letter_queue=self.dead
        )
        client.create_queue(self.report)
        client.create_queue(self.digest, id_mode="client")
        addresses = [f"reader{n}@example.com" for n in range(mails - 1)] + [BOUNCE]
        mail = {"subject": "Our news", "report_to": self.report}
        client.put(self.send, [json.dumps({**mail, "to": a}) for a in addresses])
        job = json.dumps({"name": "daily", "every": every})
        client.put(self.digest, job, id="daily-digest")

    def handled(self, client: Client) -> int:
        """Mails sent or dead-lettered so far (all runs on these queues)."""
        send, dead = _stats(client, self.send), _stats(client, self.dead)
        return send.acked + dead.enqueued

    def idle(self, client: Client) -> bool:
        """Nothing left to send or report."""
        send, report = _stats(client, self.send), _stats(client, self.report)
        return send.total == 0 and report.total == 0


def _stats(client: Client, queue: str) -> QueueStats:
    return client.get_queue(queue).stats or QueueStats()


def main() -> None:
    """Set up, run the three handlers until the mailing is through, print what happened."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", help="a running evq server (default: start one here)")
    p.add_argument("--ray-address", help="join this Ray cluster (default: a local one)")
    p.add_argument("--mails", type=int, default=12, help="recipients (the last one bounces)")
    p.add_argument("--every", type=float, default=2.0, help="seconds between digests")
    p.add_argument("--digests", type=int, default=3, help="digests to wait for")
    p.add_argument("--prefix", default="mail", help="queue names start with this")
    args = p.parse_args()
    if args.mails < 2:
        p.error("--mails must be at least 2")

    import ray

    from evq import start

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every report line, not "repeated 2x"
    if not args.ray_address:
        # Our own one-node cluster: its node holds the cluster secret (a cluster's nodes get
        # it from their environment, as the server joining it does).
        os.environ.setdefault("EVQ_CLUSTER_SECRET", secrets.token_hex(16))
    ray.init(address=args.ray_address, include_dashboard=False if not args.ray_address else None)
    try:
        with contextlib.ExitStack() as stack:
            url = args.server or stack.enter_context(_server(ray.get_runtime_context().gcs_address))
            run(url, args, start)
    finally:
        ray.shutdown()


def run(url: str, args: argparse.Namespace, start: Any) -> None:
    """The mailing against the server at ``url``."""
    clock = SystemClock()
    began = clock.now_ms() / 1000
    queues = Queues(args.prefix)
    backoff = Backoff(base=0.5, factor=2.0, cap=5.0)
    with Client(url) as client:
        before = queues.handled(client) if queues.send in client.list_queues() else 0
        queues.create(client, args.mails, args.every)
        print(f"{args.mails} mails queued on {url}; a digest every {args.every:g}s", flush=True)
        runs = {
            "send": start(send.with_options(queue=queues.send, backoff=backoff), server=url),
            "report": start(report.with_options(queue=queues.report), server=url),
            "digest": start(digest.with_options(queue=queues.digest), server=url),
        }

        def finished() -> bool:
            through = queues.handled(client) - before >= args.mails and queues.idle(client)
            return through and runs["digest"].stats().rescheduled >= args.digests

        while not finished():
            if clock.now_ms() / 1000 - began > 120:
                raise SystemExit("the mailing did not finish within 2 minutes")
            time.sleep(0.5)
        finals = {name: r.drain() for name, r in runs.items()}
        for r in runs.values():
            r.kill()
        time.sleep(1.0)  # Ray forwards the workers' output a moment later
        dead = client.take(queues.dead, 100)
        if dead:
            client.ack(queues.dead, *dead)
        _summary(finals, dead, clock.now_ms() / 1000 - began)


def _summary(finals: dict[str, Any], dead: list[Any], seconds: float) -> None:
    s, r, d = finals["send"], finals["report"], finals["digest"]
    print(f"\nafter {seconds:.1f}s ({s.transport}):")
    print(f"  send:   {s.acked} sent, {s.released} failed attempt(s) retried with backoff")
    print(f"          {s.put_created} report(s) cascaded, {s.put_duplicate} duplicate(s)")
    bounced = ", ".join(json.loads(m.body)["to"] for m in dead) or "none"
    print(f"  dead:   {len(dead)} dead-lettered after 3 deliveries: {bounced}")
    print(f"  report: {r.acked} report(s) tallied in {r.tasks} batch(es)")
    print(f"  digest: sent {d.rescheduled} time(s), rescheduled each time, never acked")


if __name__ == "__main__":
    main()
