"""The reliability campaign: a mixed workload against a real ``evq serve``, faults injected at
random, then the whole history checked (``loadtest/chaos_check.py``).

    .venv/bin/python loadtest/chaos.py --faults 20 --seed 7 --out /tmp/chaos
    .venv/bin/python loadtest/chaos.py --duration 3600 --faults 1000 --seed 1 --out /work/chaos
    .venv/bin/python loadtest/chaos.py --cluster --faults 20 --seed 3 --out /tmp/chaos-2n
    .venv/bin/python loadtest/chaos.py --disk tmpfs,faultfs --faults 20 --out /tmp/chaos-disk
    .venv/bin/python loadtest/chaos.py --s3 --faults 20 --seed 5 --out /tmp/chaos-s3
    .venv/bin/python loadtest/chaos.py --recheck /tmp/chaos     # the checker again, on a saved run
    .venv/bin/python loadtest/chaos.py --table /tmp/chaos /tmp/chaos-s3  # per fault kind, rechecked

The server runs on a fresh data directory under ``--dir`` with ``--shards`` shards and
``--workers`` gateway processes. The workload (threads, each with its own blocking client):

- producers put batches of 1 to 20 into a standard queue, half with idempotency keys (a batch
  whose answer was an error is sent again with the same keys, half of the time), half
  without; a fifth of the batches delayed 0.2 to 2 s;
- consumers take 1, 5, 50 or 1000 at a time and, per message: ack; release with a delay;
  reschedule; patch the body, then ack; or drop it so that its lease expires;
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
``conn_drop`` (the shard's data-channel connections killed with ``ss -K``).

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

Faults of the object store, with ``--s3``: the log in moto's S3 server (``moto_server``, a
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
import base64
import contextlib
import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
from chaos_check import GUARANTEES, Delivery, Rec, by_fault, check, unavailability
from chaos_env import (
    S3_ENV,
    Disk,
    ObjectStore,
    answering,
    failed_shards,
    kind_sequence,
    known_kinds,
    parse_disks,
    s3_fault,
)
from served import RAY_ENV, ROOT, EvqServe, cmdline, free_port, kill_session, session_pids

sys.path.insert(0, str(ROOT))

from actors.errors import QueueError
from actors.log.shard_recovery import placement
from gateway.client import Client
from gateway.client_wire import NewMessage, RetryPolicy

KINDS = ("shard_kill", "worker_kill", "server_kill", "pause", "conn_drop")
CLUSTER_KINDS = ("shard_kill", "gateway_kill", "node_kill", "pause", "conn_drop")
VT = 2.0  # the queues' lease, s
STD, FIFO, SRC, DLQ = "chaos-std", "chaos.fifo", "chaos-dl-src", "chaos-dlq"
MAX_RECEIVES = 3
GROUPS = 4
USER_KEYS = [f"chaos:k{i}" for i in range(4)]
QUEUE_KEYS = [f"queue:{q}" for q in (STD, FIFO)]
CHANNEL_LINE = re.compile(rb"shard (\d+): data channel on [^:\s]+:(\d+)")
RETRIES = RetryPolicy(retries=6, backoff=0.05, max_backoff=1.0)


def now_ms() -> int:
    return int(time.time() * 1000)


def say(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


# ---------------------------------------------------------------- the deployment


class Deployment:
    """One ``evq serve`` on a data directory, with what the faults need: its shard and
    gateway-worker processes, the shards' channel ports, SIGKILL and start again."""

    def __init__(
        self,
        root: Path,
        shards: int,
        workers: int,
        *,
        data: Path | None = None,
        store: ObjectStore | None = None,
    ) -> None:
        self.data = data or root / "data"
        self.log = root / "serve.log"
        self.port = free_port()
        self.shards = shards
        self.args = ["--shards", str(shards), "--workers", str(workers)]
        self.env: dict[str, str] = {}
        if store is not None:  # the log in the object store; --data holds nothing then
            self.args += store.server_args()
            self.env = dict(S3_ENV)
        self.server: EvqServe | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server = EvqServe(self.data, self.log, self.args, port=self.port, env=self.env)
        self.server.wait_ready(180)

    def ready(self) -> bool:
        return answering(*readyz(self.url))

    def pids(self) -> list[int]:
        assert self.server is not None
        return session_pids(self.server.pid)

    def shard_pids(self) -> dict[int, int]:
        """Shard index → pid of the live shard processes that have opened their channel."""
        return {index: pid for index, (pid, _) in self._channels().items()}

    def channel_ports(self) -> dict[int, int]:
        return {index: port for index, (_, port) in self._channels().items()}

    def _channels(self) -> dict[int, tuple[int, int]]:
        found: dict[int, tuple[int, int]] = {}
        for pid in self.pids():
            if not cmdline(pid).startswith("ray::ShardActor"):
                continue
            with contextlib.suppress(OSError), open(os.readlink(f"/proc/{pid}/fd/2"), "rb") as f:
                for m in CHANNEL_LINE.finditer(f.read()):
                    found[int(m.group(1))] = (pid, int(m.group(2)))
        return found

    def worker_pids(self) -> list[int]:
        return [p for p in self.pids() if "gateway.workers" in cmdline(p)]

    def kill(self) -> None:
        assert self.server is not None
        kill_session(self.server.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.server.proc.wait(10)
        self.server._log.close()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(60)


class ClusterDeployment:
    """The two-node set-up: a Ray head (127.0.0.2) and a second node (127.0.0.3), both
    offering ``evq_shard``, with Ray's health checks tightened (a node is dead after 3
    failed checks 0.5 s apart), and two gateways (``evq serve --ray-address``) that spread
    the shards over both nodes. The store is one local directory both nodes see."""

    HEAD_IP, SECOND_IP = "127.0.0.2", "127.0.0.3"
    ENV = {
        "EVQ_CLUSTER_SECRET": "chaos-campaign-cluster-secret",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
        "RAY_health_check_initial_delay_ms": "0",
        "RAY_health_check_period_ms": "500",
        "RAY_health_check_timeout_ms": "500",
        "RAY_health_check_failure_threshold": "3",
    }

    def __init__(self, root: Path, shards: int, workers: int) -> None:
        self.root = root
        self.data = root / "data"
        self.log = root / "serve.log"
        self.shards = shards
        self.gcs = free_port()
        self.address = f"{self.HEAD_IP}:{self.gcs}"
        self.ray = str(Path(sys.executable).with_name("ray"))
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.ports = [free_port(), free_port()]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.url = ",".join(self.urls)
        self.gateways: list[EvqServe | None] = [None, None]
        self.args = ["--ray-address", self.address, "--shards", str(shards)]
        self.args += ["--shard-spread", "--shard-resource", "evq_shard"]
        self.args += ["--workers", str(workers)]

    def _node(self, name: str) -> None:
        slots = json.dumps({"evq_shard": 2 * self.shards})
        if name == "head":
            args = ["--head", "--port", str(self.gcs), "--node-ip-address", self.HEAD_IP]
            args += ["--include-dashboard", "false", "--temp-dir", str(self.root / "ray")]
        else:
            args = ["--address", self.address, "--node-ip-address", self.SECOND_IP]
        ports: list[str] = []
        for flag in ("--node-manager-port", "--object-manager-port",
                     "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                     "--runtime-env-agent-port", "--metrics-export-port"):  # fmt: skip
            ports += [flag, str(free_port())]
        cmd = [self.ray, "start", "--block", "--disable-usage-stats", *args, *ports]
        cmd += ["--num-cpus", "1", "--resources", slots, "--min-worker-port", "0"]
        cmd += ["--max-worker-port", "0"]
        with open(self.root / f"{name}.log", "ab") as log:
            self.nodes[name] = subprocess.Popen(
                cmd, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def _env(self) -> dict[str, str]:
        return {**os.environ, **RAY_ENV, **self.ENV, "PYTHONUNBUFFERED": "1"}

    def start(self) -> None:
        self._node("head")
        time.sleep(3)
        self._node("second")
        time.sleep(3)
        for i in range(2):
            self.start_gateway(i)

    def start_gateway(self, i: int) -> None:
        gw = EvqServe(self.data, self.root / f"gateway{i}.log", self.args, self.ports[i],
                      self.ENV)  # fmt: skip
        self.gateways[i] = gw
        gw.wait_ready(180)

    def ready(self) -> bool:
        return all(answering(*readyz(u)) for u in self.urls)

    def pids(self) -> list[int]:
        pids = []
        for proc in self.nodes.values():
            pids += session_pids(proc.pid)
        for gw in self.gateways:
            if gw is not None:
                pids += session_pids(gw.pid)
        return pids

    shard_pids = Deployment.shard_pids
    channel_ports = Deployment.channel_ports
    _channels = Deployment._channels

    worker_pids = Deployment.worker_pids

    def kill_gateway(self, i: int) -> None:
        gw = self.gateways[i]
        assert gw is not None
        kill_session(gw.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            gw.proc.wait(10)
        gw._log.close()

    def kill_node(self, name: str) -> None:
        proc = self.nodes.pop(name)
        kill_session(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)

    def stop(self) -> None:
        for gw in self.gateways:
            if gw is not None and gw.proc.poll() is None:
                gw.stop(60)
        subprocess.run(
            [sys.executable, "-m", "gateway.cli", "shards", "stop", "--ray-address", self.address],
            cwd=ROOT, env=self._env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            check=False, timeout=120,
        )  # fmt: skip
        for name in list(self.nodes):
            self.kill_node(name)


def readyz(url: str) -> tuple[int | None, Any]:
    """``/readyz``'s status and document (None, None: no answer)."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        with contextlib.suppress(ValueError, OSError):
            return exc.code, json.loads(exc.read() or b"null")
        return exc.code, None
    except (OSError, ValueError):
        return None, None


# ---------------------------------------------------------------- the workload


class History:
    """Every record of the run, appended by many threads."""

    def __init__(self) -> None:
        self.recs: list[Rec] = []
        self._lock = threading.Lock()

    def add(self, rec: Rec) -> None:
        with self._lock:
            self.recs.append(rec)


def _code(exc: Exception) -> str:
    return getattr(exc, "code", None) or type(exc).__name__


def _delivery(m: Any) -> Delivery:
    return Delivery(
        id=m.id,
        body=m.body.decode(),
        rc=m.receive_count,
        lease=m.lease or "",
        exp=int((m.lease_expires_at or 0) * 1000),
        group=m.group,
    )


class Workload:
    """The threads of the mixed workload (see the module's doc)."""

    def __init__(self, url: str, history: History, seed: int, shards: int) -> None:
        self.url = url
        self.history = history
        self.seed = seed
        self.stop = threading.Event()  # the producers and consumers
        self.watching = threading.Event()  # the watchers (they stop last)
        self.probing = threading.Event()
        self.threads: list[threading.Thread] = []
        self.probe_queues = _probe_queues(shards)
        self.errors: list[str] = []
        self.finals: dict[str, int] = {}  # each key's final version, once the workload stopped
        self.probed_ok: dict[int, int] = {}  # shard → when its last good probe was sent, ms

    def client(self, retries: RetryPolicy = RETRIES, timeout: float = 10.0) -> Client:
        return Client(self.url, retries=retries, timeout=timeout)

    def setup(self) -> None:
        with self.client() as c:
            c.create_queue(STD, visibility_timeout=VT)
            c.create_queue(FIFO, visibility_timeout=VT, fifo=True)
            c.create_queue(DLQ, visibility_timeout=VT)
            c.create_queue(
                SRC, visibility_timeout=VT, max_receives=MAX_RECEIVES, dead_letter_queue=DLQ
            )
            for q in self.probe_queues.values():
                c.create_queue(q, visibility_timeout=VT)

    def start(self) -> None:
        plan: list[tuple[str, Callable[[str, random.Random], None]]] = [
            ("p0", self.producer),
            ("p1", self.producer),
            ("c0", self.consumer),
            ("c1", self.consumer),
            ("f0", self.fifo_producer),
            ("fc0", self.fifo_consumer),
            ("fc1", self.fifo_consumer),
            ("d0", self.dl_producer),
            ("dc0", self.dl_consumer),
            ("dq0", self.dlq_consumer),
            ("k0", self.key_writer),
        ]
        for i in range(2):
            for key in [*USER_KEYS, *QUEUE_KEYS]:
                plan.append((f"watch{i}:{key}", self._watcher(key)))
        for shard, q in self.probe_queues.items():
            plan.append((f"probe{shard}", self._prober(shard, q)))
        for n, (name, target) in enumerate(plan):
            rng = random.Random(f"{self.seed}:{n}")
            t = threading.Thread(target=self._guard, args=(name, target, rng), name=name)
            t.start()
            self.threads.append(t)

    def _guard(self, name: str, target: Callable[[str, random.Random], None], rng: Any) -> None:
        try:
            target(name, rng)
        except Exception as exc:  # a bug of the workload: the run is not valid
            self.errors.append(f"{name}: {exc!r}")
            raise

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            if not t.name.startswith(("watch", "probe")):
                t.join()

    def end(self) -> None:
        self.probing.set()
        self.watching.set()
        for t in self.threads:
            t.join()

    # -- producers

    def producer(self, w: str, rng: random.Random) -> None:
        n = 0
        with self.client() as c:
            retry: Rec | None = None
            while not self.stop.is_set():
                if retry is not None:
                    toks, keys, delays = retry.toks, retry.keys, retry.delays
                else:
                    size = rng.randint(1, 20)
                    toks = [f"{w}-{n + i}" for i in range(size)]
                    n += size
                    keyed = rng.random() < 0.5
                    keys = [f"key-{t}" if keyed else None for t in toks]
                    delay = rng.randint(200, 2000) if rng.random() < 0.2 else 0
                    delays = [delay] * size
                rec = self._put(c, w, STD, toks, keys, delays, auto_key=keys[0] is not None)
                retry = rec if rec.err and keys[0] is not None and rng.random() < 0.5 else None
                time.sleep(rng.uniform(0.02, 0.1))

    def _put(
        self,
        c: Client,
        w: str,
        q: str,
        toks: list[str],
        keys: list[str | None],
        delays: list[int],
        *,
        auto_key: bool,
        groups: list[str | None] | None = None,
        seqs: list[int] | None = None,
    ) -> Rec:
        groups = groups or [None] * len(toks)
        items = [
            NewMessage(
                body=t.encode(),
                idempotency_key=k,
                delay=d / 1000 if d else None,
                group=g,
            )
            for t, k, d, g in zip(toks, keys, delays, groups, strict=True)
        ]
        rec = Rec(op="put", w=w, q=q, toks=toks, keys=keys, delays=delays, groups=groups)
        rec.seqs = seqs or []
        rec.t0 = now_ms()
        try:
            results = c.put(q, items, auto_key=auto_key)
            rec.ids = [r.id for r in results]
        except QueueError as exc:
            rec.err = _code(exc)
        rec.t1 = now_ms()
        self.history.add(rec)
        return rec

    def fifo_producer(self, w: str, rng: random.Random) -> None:
        seq = [0] * GROUPS
        with self.client() as c:
            while not self.stop.is_set():
                g = rng.randrange(GROUPS)
                tok = f"{w}-g{g}-{seq[g]}"
                while not self.stop.is_set():
                    rec = self._put(
                        c, w, FIFO, [tok], [f"key-{tok}"], [0], auto_key=True,
                        groups=[f"g{g}"], seqs=[seq[g]],
                    )  # fmt: skip
                    if rec.err is None:
                        break
                    time.sleep(0.1)
                seq[g] += 1
                time.sleep(rng.uniform(0.01, 0.05))

    def dl_producer(self, w: str, rng: random.Random) -> None:
        n = 0
        with self.client() as c:
            while not self.stop.is_set():
                size = rng.randint(1, 5)
                toks = [f"{w}-{n + i}" for i in range(size)]
                n += size
                self._put(c, w, SRC, toks, [f"key-{t}" for t in toks], [0] * size, auto_key=True)
                time.sleep(rng.uniform(0.1, 0.3))

    # -- consumers

    def _take(self, c: Client, w: str, q: str, most: int, wait: float = 1.0) -> list[Any]:
        rec = Rec(op="take", w=w, q=q, t0=now_ms())
        got: list[Any] = []
        try:
            got = c.take(q, most, wait=wait)
            rec.got = [_delivery(m) for m in got]
        except QueueError as exc:
            rec.err = _code(exc)
        rec.t1 = now_ms()
        self.history.add(rec)
        return got

    def _end(self, c: Client, w: str, q: str, op: str, m: Any, delay: int = 0) -> str:
        """ack, release or resched (a reschedule ends the lease) one message: its result."""
        rec = Rec(op=op, w=w, q=q, id=m.id, lease=m.lease or "", delay=delay, t0=now_ms())
        try:
            if op == "ack":
                rec.res = c.ack(q, m)[0].status
            elif op == "release":
                rec.res = c.release(q, m, delay=delay / 1000 if delay else None)[0].status
            else:
                c.reschedule(q, m, delay=delay / 1000)
                rec.res = "ok"
        except QueueError as exc:
            rec.err = _code(exc)
            if rec.err == "StaleLease":
                rec.err, rec.res = None, "stale_lease"
        rec.t1 = now_ms()
        self.history.add(rec)
        return rec.res

    def _patch(self, c: Client, w: str, q: str, m: Any) -> bool:
        rec = Rec(op="patch", w=w, q=q, id=m.id, lease=m.lease or "", t0=now_ms())
        try:
            c.update_message(q, m, body=(m.body.decode() + "+p").encode())
            rec.res = "ok"
        except QueueError as exc:
            rec.err = _code(exc)
        rec.t1 = now_ms()
        self.history.add(rec)
        return rec.res == "ok"

    def consumer(self, w: str, rng: random.Random) -> None:
        with self.client() as c:
            while not self.stop.is_set():
                for m in self._take(c, w, STD, rng.choice((1, 5, 50, 1000))):
                    r = rng.random()
                    if r < 0.6:
                        self._end(c, w, STD, "ack", m)
                    elif r < 0.7:
                        self._end(c, w, STD, "release", m, rng.randint(0, 1000))
                    elif r < 0.78:
                        self._end(c, w, STD, "resched", m, rng.randint(100, 800))
                    elif r < 0.86:
                        if not m.body.endswith(b"+p") and self._patch(c, w, STD, m):
                            m = msgspec.structs.replace(m, body=m.body + b"+p")
                        self._end(c, w, STD, "ack", m)
                    # else: dropped, its lease expires

    def fifo_consumer(self, w: str, rng: random.Random) -> None:
        with self.client() as c:
            while not self.stop.is_set():
                dropped: set[str | None] = set()
                for m in self._take(c, w, FIFO, rng.randint(1, 10)):
                    if m.group in dropped or rng.random() < 0.05:
                        dropped.add(m.group)  # the rest of the group's batch expires too
                        continue
                    self._end(c, w, FIFO, "ack", m)

    def dl_consumer(self, w: str, rng: random.Random) -> None:
        with self.client() as c:
            while not self.stop.is_set():
                for m in self._take(c, w, SRC, 10):
                    if rng.random() < 0.8:
                        self._end(c, w, SRC, "release", m)

    def dlq_consumer(self, w: str, rng: random.Random) -> None:
        with self.client() as c:
            while not self.stop.is_set():
                for m in self._take(c, w, DLQ, 100):
                    self._end(c, w, DLQ, "ack", m)

    # -- keys and watches

    def key_writer(self, w: str, rng: random.Random) -> None:
        n = 0
        with self.client() as c:
            while not self.stop.is_set():
                key = rng.choice(USER_KEYS)
                rec = Rec(op="set", w=w, key=key, t0=now_ms())
                try:
                    rec.version = c.set_key(key, n)
                except QueueError as exc:
                    rec.err = _code(exc)
                rec.t1 = now_ms()
                self.history.add(rec)
                n += 1
                time.sleep(rng.uniform(0.02, 0.1))

    def final_keys(self) -> dict[str, int]:
        """Each watched key's version now (after the workload stopped): a ``get`` record."""
        out = {}
        with self.client() as c:
            for key in [*USER_KEYS, *QUEUE_KEYS]:
                rec = Rec(op="get", key=key, t0=now_ms())
                rec.version = c.get_key(key).version
                rec.t1 = now_ms()
                self.history.add(rec)
                out[key] = rec.version
        self.finals.update(out)
        return out

    def _watcher(self, key: str) -> Callable[[str, random.Random], None]:
        def watch(w: str, rng: random.Random) -> None:
            version = 0
            with self.client() as c:
                while not self.watching.is_set():
                    final = self.finals.get(key)
                    if final is not None and version >= final:
                        return  # caught up with the key's final version
                    rec = Rec(op="watch", w=w, key=key, t0=now_ms())
                    try:
                        kv = c.watch(key, version, wait=1.0)
                    except QueueError as exc:
                        rec.err = _code(exc)
                        time.sleep(0.1)
                        continue
                    if kv is None:
                        continue  # no change within the wait: subscribe again
                    rec.version, rec.t1 = kv.version, now_ms()
                    self.history.add(rec)
                    version = kv.version

        return watch

    def watchers_caught_up(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(not t.is_alive() for t in self.threads if t.name.startswith("watch")):
                return True
            time.sleep(0.2)
        return False

    # -- probes

    def _prober(self, shard: int, q: str) -> Callable[[str, random.Random], None]:
        def probe(w: str, rng: random.Random) -> None:
            with self.client(RetryPolicy(retries=0), timeout=2.0) as c:
                while not self.probing.is_set():
                    rec = Rec(op="probe", w=w, q=q, target=str(shard), t0=now_ms())
                    try:
                        c.put(q, b"probe")
                        for m in c.take(q, 10):
                            c.ack(q, m)
                    except QueueError as exc:
                        rec.err = _code(exc)
                    rec.t1 = now_ms()
                    self.history.add(rec)
                    if rec.err is None:
                        self.probed_ok[shard] = rec.t0
                    time.sleep(0.1)

        return probe

    # -- the drain

    def drain(self) -> dict[str, int]:
        """Take what is left of every queue (the dead-letter source by releasing until its
        messages have moved), as takes and acks in the history."""
        time.sleep(VT + 2.5)  # leases and delays run out
        left = {}
        with self.client() as c:
            for q in (STD, FIFO, SRC, DLQ):
                left[q] = self._drain_queue(c, q)
        return left

    def _drain_queue(self, c: Client, q: str) -> int:
        taken, empty = 0, 0
        deadline = time.monotonic() + 120
        while empty < 3 and time.monotonic() < deadline:
            got = self._take(c, "drain", q, 1000, wait=0.5)
            for m in got:
                self._end(c, "drain", q, "release" if q == SRC else "ack", m)
            taken += len(got)
            stats = c.get_queue(q).stats
            empty = empty + 1 if not got and (stats is None or stats.total == 0) else 0
        return taken


def _probe_queues(shards: int, prefix: str = "chaos-probe") -> dict[int, str]:
    """A probe queue on each shard (or another queue per shard, named ``prefix-<n>``)."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < shards:
        name = f"{prefix}-{n}"
        found.setdefault(placement(name, shards), name)
        n += 1
    return found


# ---------------------------------------------------------------- faults


class Faults:
    """Injects one fault at a time into a :class:`Deployment`; records each."""

    def __init__(
        self,
        dep: Deployment | ClusterDeployment,
        history: History,
        rng: random.Random,
        *,
        disk: Disk | None = None,
        store: ObjectStore | None = None,
    ) -> None:
        self.dep = dep
        self.history = history
        self.rng = rng
        self.disk = disk
        self.store = store
        self.count: dict[str, int] = {}

    def inject(self, kind: str) -> Rec | None:
        rec = Rec(op="fault", kind=kind, t0=now_ms())
        done = getattr(self, f"_{kind}")(rec)
        if not done:
            return None
        rec.t1 = max(rec.t1, rec.t0)
        self.history.add(rec)
        self.count[kind] = self.count.get(kind, 0) + 1
        return rec

    def _shard(self) -> tuple[int, int] | None:
        shards = self.dep.shard_pids()
        if not shards:
            return None
        index = self.rng.choice(sorted(shards))
        return index, shards[index]

    def _shard_kill(self, rec: Rec) -> bool:
        found = self._shard()
        if found is None:
            return False
        rec.target = str(found[0])
        rec.t0 = rec.t1 = now_ms()
        os.kill(found[1], signal.SIGKILL)
        return True

    def _worker_kill(self, rec: Rec) -> bool:
        workers = self.dep.worker_pids()
        if not workers:
            return False
        rec.target = "all"
        rec.t0 = rec.t1 = now_ms()
        os.kill(self.rng.choice(workers), signal.SIGKILL)
        return True

    def _server_kill(self, rec: Rec) -> bool:
        rec.target = "all"
        rec.t0 = rec.t1 = now_ms()
        self.dep.kill()
        self.dep.start()
        return True

    def _pause(self, rec: Rec) -> bool:
        found = self._shard()
        if found is None:
            return False
        rec.target = str(found[0])
        rec.t0 = now_ms()
        os.kill(found[1], signal.SIGSTOP)
        try:
            time.sleep(VT + self.rng.uniform(0.5, 1.5))
        finally:
            os.kill(found[1], signal.SIGCONT)
        rec.t1 = now_ms()
        return True

    def _gateway_kill(self, rec: Rec) -> bool:
        """SIGKILL one gateway of the two; start it again once the other has answered."""
        dep = self.dep
        if not isinstance(dep, ClusterDeployment):
            return False
        i = self.rng.randrange(2)
        rec.target = "all"
        rec.res = f"gateway {i}"
        rec.t0 = rec.t1 = now_ms()
        dep.kill_gateway(i)
        time.sleep(self.rng.uniform(0.5, 2.0))  # its clients move to the other one
        dep.start_gateway(i)
        return True

    def _node_kill(self, rec: Rec) -> bool:
        """SIGKILL every process of the second Ray node (raylet, workers, the shards on
        it), as if the machine lost power; Ray restarts its shards on the head; then a new
        second node joins."""
        dep = self.dep
        if not isinstance(dep, ClusterDeployment):
            return False
        on_second = {
            i for i, pid in dep.shard_pids().items()
            if pid in session_pids(dep.nodes["second"].pid)
        }  # fmt: skip
        rec.target = "all"
        rec.res = f"shards {sorted(on_second)}"
        rec.t0 = rec.t1 = now_ms()
        dep.kill_node("second")
        wait_answering(dep)
        dep._node("second")
        return True

    def _conn_drop(self, rec: Rec) -> bool:
        ports = self.dep.channel_ports()
        if not ports:
            return False
        index = self.rng.choice(sorted(ports))
        rec.target = str(index)
        rec.t0 = rec.t1 = now_ms()
        done = subprocess.run(
            ["ss", "-K", "-t", "state", "established", "sport", "=", f":{ports[index]}"],
            capture_output=True,
            text=True,
            check=False,
        )
        killed = max(0, len(done.stdout.strip().splitlines()) - 1)
        rec.res = f"{killed} connection(s)"
        return True

    # -- the disk (--disk) and the object store (--s3)

    def _disk_full(self, rec: Rec) -> bool:
        """Fill the tmpfs; put ballast (big messages, acked at once) into a queue of one shard
        until it needs a new segment and refuses puts; half of the time SIGKILL the shard's
        process (it starts again on the full disk); hold 1 to 3 s; delete the filler.
        (A shard that needs no new segment while the disk is full notices nothing: without
        the ballast, a short fill would rarely meet a 16 MiB segment's end.)"""
        disk = self.disk
        assert disk is not None
        assert disk.tmpfs is not None
        index = self.rng.randrange(self.dep.shards)
        hold = self.rng.uniform(1.0, 3.0)
        rec.target = str(index)
        q = _probe_queues(self.dep.shards, "chaos-ballast")[index]
        with Client(self.dep.url, retries=RETRIES) as c:
            c.create_queue(q, visibility_timeout=60)  # before the disk is full
        rec.t0 = now_ms()
        written = disk.fill()
        killed = self.rng.random() < 0.5
        try:
            ballast, refused = self._ballast(q, time.monotonic() + 30)
            if killed:  # and it starts again on the full disk
                pid = self.dep.shard_pids().get(index)
                killed = pid is not None
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
            time.sleep(hold)
            status, doc = readyz(self.dep.url)
        finally:
            disk.unfill()
        rec.t1 = now_ms()
        degraded = [d["index"] for d in doc.get("degraded", [])] if status == 200 else status
        rec.res = (
            f"filled {written >> 20} MiB; ballast {ballast >> 20} MiB; puts refused: "
            f"{refused}; shard killed while full: {killed}; degraded after {hold:.1f} s: "
            f"{degraded}"
        )
        return True

    def _ballast(self, q: str, deadline: float) -> tuple[int, bool]:
        """Put 1 MiB messages (random, so they do not compress) into the queue ``q``, taking
        and acking them, until a put is refused with 503, 64 MiB went in, or ``deadline``:
        the bytes put, whether a put was refused."""
        put = 0
        with Client(self.dep.url, retries=RetryPolicy(retries=0), timeout=10.0) as c:
            while put < 64 << 20 and time.monotonic() < deadline:
                body = base64.b64encode(self.rng.randbytes(768 << 10))
                try:
                    c.put(q, body)
                except QueueError as exc:
                    if exc.fields.get("status") == 503:
                        return put, True
                    continue
                put += len(body)
                with contextlib.suppress(QueueError):
                    got = c.take(q, 10)
                    if got:
                        c.ack(q, *got)
        return put, False

    def _fsync_eio(self, rec: Rec) -> bool:
        """Every fsync of one shard's log fails with EIO until the shard's log has failed
        (/readyz 503); then, as an operator would: clear the fault, SIGKILL the shard's
        process; Ray starts it again and it recovers from its log."""
        fs = self.disk.fs if self.disk is not None else None
        assert fs is not None
        found = self._shard()
        if found is None:
            return False
        index, pid = found
        rec.target = str(index)
        rec.t0 = now_ms()
        fs.set(fsync_errno=errno.EIO, only=f"/wal/{index:04d}/")
        deadline = time.monotonic() + 10
        seen = False
        while time.monotonic() < deadline and not seen:
            seen = index in failed_shards(*readyz(self.dep.url))
            time.sleep(0.05)
        time.sleep(self.rng.uniform(0.0, 1.0))  # the operator takes a moment
        fs.set()
        pid = self.dep.shard_pids().get(index, pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        rec.t1 = now_ms()
        rec.res = f"{len(fs.injected())} fsyncs failed so far; /readyz failed: {seen}"
        return True

    def _disk_slow(self, rec: Rec) -> bool:
        """Every write and fsync of the logs sleeps 20 to 200 ms, for 2 to 5 s."""
        fs = self.disk.fs if self.disk is not None else None
        assert fs is not None
        delay = round(self.rng.uniform(0.02, 0.2), 3)
        rec.target = "all"
        rec.res = f"{delay * 1000:.0f} ms per write and fsync"
        rec.t0 = now_ms()
        fs.set(write_delay_s=delay, fsync_delay_s=delay, only="/wal/")
        try:
            time.sleep(self.rng.uniform(2.0, 5.0))
        finally:
            fs.set()
        rec.t1 = now_ms()
        return True

    def _s3(self, rec: Rec) -> bool:
        """One object-store fault (:func:`chaos_env.s3_fault`) through the proxy, until its
        requests are spent or its window ends; then cleared."""
        assert self.store is not None
        rule, window = s3_fault(rec.kind, self.rng)
        rec.target = "all"
        rec.t0 = now_ms()
        self.store.plan([rule])
        until = time.monotonic() + window
        while time.monotonic() < until and not self.store.spent():
            time.sleep(0.05)
        state = self.store.clear()
        rec.t1 = now_ms()
        fired = sum(r["fired"] for r in state["rules"])
        rec.res = f"{rule['fault']} x{fired} (times {rule['times']}, window {window} s)"
        return True

    _s3_500 = _s3_503 = _s3_timeout = _s3_reset = _s3_lost_answer = _s3


def wait_answering(
    dep: Deployment | ClusterDeployment,
    timeout: float = 120.0,
    work: Workload | None = None,
    since_ms: int = 0,
) -> float:
    """Seconds until ``/readyz`` answers 200 with no shard degraded (a full disk: 200, but
    puts refused; a failed log: 503 until the shard's new process recovered), every shard
    has a channel again, and (given ``work``) every shard's probe sent after ``since_ms``
    went through: /readyz stays 200 while a restarted shard recovers (on S3, seconds)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        probed = work is None or all(
            work.probed_ok.get(i, 0) >= since_ms for i in range(dep.shards)
        )
        if probed and dep.ready() and len(dep.shard_pids()) == dep.shards:
            return time.monotonic() - started
        time.sleep(0.1)
    raise RuntimeError(f"the server did not answer again within {timeout} s")


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
    kinds = [k for k in (args.kinds or ",".join(known)).split(",") if k]
    for k in kinds:
        if k not in known:
            raise SystemExit(f"unknown fault kind {k!r} (kinds: {', '.join(known)})")
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


def main(argv: list[str] | None = None) -> int:
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
