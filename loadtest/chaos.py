"""The reliability campaign: a mixed workload against a real ``evq serve``, faults injected at
random, then the whole history checked (``loadtest/chaos_check.py``).

    .venv/bin/python loadtest/chaos.py --faults 20 --seed 7 --out /tmp/chaos
    .venv/bin/python loadtest/chaos.py --duration 3600 --faults 1000 --seed 1 --out /work/chaos
    .venv/bin/python loadtest/chaos.py --cluster --faults 20 --seed 3 --out /tmp/chaos-2n
    .venv/bin/python loadtest/chaos.py --disk tmpfs,faultfs --faults 20 --out /tmp/chaos-disk
    .venv/bin/python loadtest/chaos.py --s3 --faults 20 --seed 5 --out /tmp/chaos-s3
    .venv/bin/python loadtest/chaos.py --kinds move_kill,move_pause --faults 300 --seed 9 \
        --duration 7200 --out /work/chaos-moves                  # faults during resizes
    .venv/bin/python loadtest/chaos.py --recheck /tmp/chaos     # the checker again, on a saved run
    .venv/bin/python loadtest/chaos.py --table /tmp/chaos /tmp/chaos-s3  # per fault kind, rechecked

The server runs on a fresh data directory under ``--dir`` with ``--shards`` shards and
``--workers`` gateway processes. The workload (threads, each with its own blocking client):

- producers put batches of 1 to 20 into a standard queue, half with idempotency keys (a batch
  whose answer was an error is sent again with the same keys, half of the time), half
  without; a fifth of the batches delayed 0.2 to 2 s;
- consumers take 1, 5, 50 or 1000 at a time and, per message: ack; release with a delay;
  reschedule; patch the body, then ack; or drop it so that its lease expires; or, one take
  in ten, release all of it at once with one delay (a consumer backing off);
- a FIFO queue: one producer puts each of four groups' messages in sequence (keyed), two
  consumers ack them in order, sometimes dropping the rest of a group's batch;
- a queue with ``max_receives`` 3 and a dead-letter queue: its consumer only releases or
  drops, so every message ends in the dead-letter queue, whose consumer acks;
- a writer of four user keys, and watchers of those keys and of the queues' ``queue:`` keys
  (long-poll, resubscribing from the last version seen);
- one probe per shard: put, take and ack on a queue of that shard every 100 ms, no retries,
  which measures how long each fault keeps the queues from answering.

Faults, one at a time, each after the previous one's queues answered again, at random among
``--kinds``: ``shard_kill`` (SIGKILL of a shard process; Ray starts it again),
``worker_kill`` (SIGKILL of a gateway worker process; the server starts it again),
``server_kill`` (SIGKILL of the whole server, Ray included; started again on the same data),
``pause`` (SIGSTOP of a shard process for longer than a lease, then SIGCONT),
``conn_drop`` (the shard's data-channel connections killed with ``ss -K``). Faults during
a resize, asked for by name (``--kinds move_kill,move_pause``): the shard count goes to one
more and back, queue by queue (``POST /v1/admin/shards``), and 0.05 to 1 s in, the shard
being added or removed, another shard, or the whole server (the coordinator) is SIGKILLed
(``move_kill``), or a shard is paused past its leases and resumed (``move_pause``: a
zombie); the resize is then asked for again until done.

Faults of the disk, with ``--disk`` (needs root; faultfs also /dev/fuse and libfuse 3, ``make
fuse``; the helpers are ``loadtest/diskfaults.py`` and ``loadtest/faultfs.py``):

- ``--disk tmpfs``: the data directory on a tmpfs of ``--disk-size`` MiB (512). Kind
  ``disk_full``: a filler file fills it; ballast (1 MiB messages, acked at once) goes into
  one shard until it needs a new segment and refuses puts (503; /readyz 200 ``degraded``);
  half of the time that shard's process is then SIGKILLed, and Ray starts it again on the
  full disk (it waits, recovering, for room for a segment); after 1 to 3 s more the filler
  is deleted, and the shard takes puts again by itself.
  (Without the ballast a short fill would rarely meet the end of a 16 MiB segment, and no
  shard would notice it.)
- ``--disk faultfs``: the data directory through faultfs, a FUSE file system whose fsyncs
  and writes fail or sleep on command. Kinds ``fsync_eio`` (every fsync of one shard's log
  fails with EIO until /readyz shows the shard failed; then, as an operator would, the
  fault is cleared and the shard's process SIGKILLed: Ray starts it again and it recovers
  from its log) and ``disk_slow`` (20 to 200 ms on every write and fsync of the logs, for
  2 to 5 s).
- ``--disk tmpfs,faultfs``: faultfs over a directory on the tmpfs: the three kinds at once.

Faults of the object store, with ``--s3``: the log in moto's S3 server (``loadtest/moto_s3.py``, a
subprocess) behind ``loadtest/s3_fault_proxy.py`` (a subprocess, its plan set over HTTP);
each request gives up after 1.5 s, retries after 2 s. Each fault is a proxy rule, active
until its N requests are spent or its random window (0.5 to 3 s) ends, then cleared:
``s3_500`` and ``s3_503`` (InternalError, SlowDown: every request, for the window or its
first N), ``s3_timeout`` (N requests hang past the client's timeout), ``s3_reset`` (N
segment uploads reset midway), ``s3_lost_answer`` (N conditional segment PUTs land but
their answer is lost: a reset, a hang, a 500 or a 503 instead).

With ``--in-turn`` the kinds come in turn (each once, in a seeded shuffled order, then again)
instead of at random, so that a few faults cover every kind. Without ``--kinds``, a
set-up's faults are all of its kinds (the process faults and its
disk's or object store's). Each fault is a ``fault`` record: its kind, its ``target`` (a
shard, or ``all``), ``t0`` and ``t1`` (when it was cleared), what it did (``res``).

At the end the workload stops, every queue is drained (the dead-letter source by releasing
until its messages have moved), each key's final version is read, the watchers catch up,
and the checker runs. Written to ``--out``: ``history.jsonl`` (every record), ``report.json``
(counts, violations with each message's story, unavailability per fault kind). Progress is
printed as JSON lines. Exit code 0 when every guarantee held, 1 when one did not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from chaos_check import GUARANTEES, Rec, by_fault, check, unavailability
from chaos_deploy import ClusterDeployment, Deployment, wait_answering
from chaos_env import Disk, ObjectStore, kind_sequence, known_kinds, parse_disks
from chaos_faults import CLUSTER_KINDS, KINDS, MOVE_KINDS, Faults
from chaos_ops import DLQ, FIFO, MAX_RECEIVES, SRC, History
from chaos_workload import Workload


def say(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


# ---------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kinds = _kinds(args)
    rng = random.Random(args.seed)
    history = History()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="evq-chaos-") as tmp:
        root = Path(tmp)
        try:
            with _environment(args, root) as (dep, disk, store):
                work = Workload(dep.url, history, args.seed, args.shards)
                faults = Faults(dep, history, rng, disk=disk, store=store)
                caught_up = _campaign(args, dep, work, faults, kinds, rng)
        finally:
            for log in [*root.glob("*.log"), *root.glob("*.faults.json.log")]:
                with contextlib.suppress(OSError):  # the server's, gateways', nodes', stores'
                    (out / log.name).write_bytes(log.read_bytes())
    return _report(args, out, history, work, faults, caught_up)


def _kinds(args: argparse.Namespace) -> list[str]:
    """The fault kinds asked for, checked against those the set-up offers."""
    try:
        disks = parse_disks(args.disk)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if args.cluster and (disks or args.s3):
        raise SystemExit("--cluster runs on a local directory: no --disk, no --s3")
    if disks and args.s3:
        raise SystemExit("--s3 keeps the log in the object store: no --disk")
    args.disks = disks
    known = known_kinds(CLUSTER_KINDS if args.cluster else KINDS, disks, args.s3)
    offered = known if args.cluster else known + MOVE_KINDS  # moves: asked for by name
    kinds = [k for k in (args.kinds or ",".join(known)).split(",") if k]
    for k in kinds:
        if k not in offered:
            raise SystemExit(f"unknown fault kind {k!r} (kinds: {', '.join(offered)})")
    return kinds


@contextlib.contextmanager
def _environment(
    args: argparse.Namespace, root: Path
) -> Iterator[tuple[Deployment | ClusterDeployment, Disk | None, ObjectStore | None]]:
    """The disk or the object store (if asked for), the deployment on it, started; stopped
    and undone in the reverse order."""
    with contextlib.ExitStack() as stack:
        disk = store = None
        if args.disks:
            disk = stack.enter_context(Disk(root, args.disks, args.disk_size).mounted())
        if args.s3:
            store = stack.enter_context(ObjectStore(root, args.seed).running())
        dep: Deployment | ClusterDeployment
        if args.cluster:
            dep = ClusterDeployment(root, args.shards, args.workers)
        else:
            data = disk.data if disk is not None else None
            dep = Deployment(root, args.shards, args.workers, data=data, store=store)
        stack.callback(dep.stop)
        dep.start()
        say({"started": dep.url, "shards": args.shards, "workers": args.workers,
             "disk": list(args.disks), "s3": args.s3})  # fmt: skip
        yield dep, disk, store


def _campaign(
    args: argparse.Namespace,
    dep: Deployment | ClusterDeployment,
    work: Workload,
    faults: Faults,
    kinds: list[str],
    rng: random.Random,
) -> bool:
    """The workload, the faults, the drain: whether the watchers caught up at the end."""
    try:
        work.setup()
        work.start()
        time.sleep(args.warmup)
        started = time.monotonic()
        injected = 0
        sequence = kind_sequence(kinds, rng, args.in_turn)
        while injected < args.faults and time.monotonic() - started < args.duration:
            if work.errors:
                break
            time.sleep(rng.uniform(args.gap / 2, args.gap * 1.5))
            rec = faults.inject(next(sequence))
            if rec is None:
                continue
            injected += 1
            back = wait_answering(dep, work=work, since_ms=rec.t1)
            say(
                {
                    "fault": injected,
                    "kind": rec.kind,
                    "target": rec.target,
                    "res": rec.res,
                    "answering_after_s": round(back, 2),
                    "records": len(work.history.recs),
                }
            )
        work.join()
        say({"workload": "stopped", "records": len(work.history.recs)})
        left = work.drain()
        say({"drained": left})
        work.final_keys()
        return work.watchers_caught_up(30)
    finally:
        work.end()


def _report(
    args: argparse.Namespace,
    out: Path,
    history: History,
    work: Workload,
    faults: Faults,
    caught_up: bool,
) -> int:
    with (out / "history.jsonl").open("wb") as f:
        for rec in history.recs:
            f.write(msgspec.json.encode(rec) + b"\n")
    report = check(history.recs, dead_letter={SRC: (DLQ, MAX_RECEIVES)}, fifo=[FIFO])
    doc = {
        "seed": args.seed,
        "faults": faults.count,
        "faults_total": sum(faults.count.values()),
        "operations": report.operations,
        "acknowledged_puts": report.acknowledged_puts,
        "deliveries": report.deliveries,
        "violations": report.counts,
        "unavailability": unavailability(history.recs),
        "workload_errors": work.errors,
        "watchers_caught_up": caught_up,
    }
    (out / "report.json").write_text(
        json.dumps({**doc, "found": report.violations}, indent=1, default=str)
    )
    say({"summary": doc})
    for found in report.violations[:5]:
        say({"violation": found})
    return 0 if report.ok and not work.errors and caught_up else 1


def recheck(out: Path) -> int:
    """Check a run's saved history again (with this version of the checker)."""
    decoder = msgspec.json.Decoder(Rec)
    with (out / "history.jsonl").open("rb") as f:
        recs = [decoder.decode(line) for line in f]
    report = check(recs, dead_letter={SRC: (DLQ, MAX_RECEIVES)}, fifo=[FIFO])
    doc = {
        "records": len(recs),
        "faults": sum(1 for r in recs if r.op == "fault"),
        "operations": report.operations,
        "acknowledged_puts": report.acknowledged_puts,
        "deliveries": report.deliveries,
        "violations": report.counts,
        "unavailability": unavailability(recs),
        "by_fault": by_fault(recs, report.violations),
    }
    (out / "recheck.json").write_text(
        json.dumps({**doc, "found": report.violations}, indent=1, default=str)
    )
    say({"recheck": str(out), **doc})
    return 0 if report.ok else 1


def table(outs: list[Path]) -> str:
    """Per fault kind, over the runs' ``recheck.json``: faults, the operations and
    acknowledged puts in their windows (:func:`chaos_check.by_fault`), the violations there,
    and the runs."""
    rows: dict[str, dict[str, int]] = {}
    runs: dict[str, list[str]] = {}
    for out in outs:
        doc = json.loads((out / "recheck.json").read_text())
        for kind, counts in doc["by_fault"].items():
            row = rows.setdefault(kind, dict.fromkeys(counts, 0))
            for name, n in counts.items():
                row[name] = row.get(name, 0) + n
            runs.setdefault(kind, []).append(out.name)
    lines = [
        "| fault | runs | faults | operations | acknowledged puts | lost | delivered again "
        "after an ok ack | duplicated idempotent puts | other guarantees broken |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    main_three = ("lost", "delivered_after_ack", "duplicated")
    for kind in sorted(rows, key=lambda k: (k == "none", k)):
        row = rows[kind]
        other = sum(n for name, n in row.items() if name in GUARANTEES and name not in main_three)
        cells = [kind, ", ".join(runs[kind]), row["faults"], f"{row['operations']:,}"]
        cells += [f"{row['acknowledged_puts']:,}", *(row[name] for name in main_three), other]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def _stop_on_sigterm() -> None:
    """SIGTERM ends the run like an error: the server is stopped, the mounts undone."""

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    _stop_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--faults", type=int, default=20, help="stop after this many faults")
    p.add_argument("--duration", type=float, default=3600, help="or after this many seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--kinds",
        default=None,
        help=f"comma-separated fault kinds (default: all: {','.join(KINDS)}; with --cluster "
        f"{','.join(CLUSTER_KINDS)})",
    )
    p.add_argument(
        "--in-turn",
        action="store_true",
        help="each kind once (in a seeded shuffled order), then again, instead of at random",
    )
    p.add_argument(
        "--cluster",
        action="store_true",
        help="the two-node set-up: two Ray nodes, two gateways (see ClusterDeployment)",
    )
    p.add_argument(
        "--disk",
        default=None,
        help="the data directory on a tmpfs (kind disk_full), through faultfs (kinds "
        "fsync_eio, disk_slow), or both: tmpfs,faultfs",
    )
    p.add_argument("--disk-size", type=int, default=512, help="the tmpfs's size, MiB")
    p.add_argument(
        "--s3",
        action="store_true",
        help="the log in moto's S3 server behind the fault proxy (kinds s3_500, s3_503, "
        "s3_timeout, s3_reset, s3_lost_answer)",
    )
    p.add_argument("--gap", type=float, default=2.0, help="mean seconds between faults")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="gateway processes")
    p.add_argument("--dir", default=None, help="where the data directory goes (default: /tmp)")
    p.add_argument("--out", help="history.jsonl, report.json and the processes' logs")
    p.add_argument("--recheck", metavar="OUT", help="check the history a run left in OUT again")
    p.add_argument(
        "--table",
        nargs="+",
        metavar="OUT",
        help="a Markdown table per fault kind over runs already rechecked (--recheck)",
    )
    args = p.parse_args(argv)
    if args.recheck:
        return recheck(Path(args.recheck))
    if args.table:
        print(table([Path(out) for out in args.table]))
        return 0
    if not args.out:
        p.error("--out is required")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
