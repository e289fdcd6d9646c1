"""The fault injectors of the chaos campaign (``loadtest/chaos.py``): :class:`Faults`, one
fault at a time into a deployment (:mod:`chaos_deploy`), each recorded in the history, and
the kinds of the process faults (:data:`KINDS`; :data:`CLUSTER_KINDS` for the two-node
set-up). The disk's and the object store's kinds, and their rules, are :mod:`chaos_env`'s.

Imported as a sibling module (``python loadtest/chaos.py`` puts ``loadtest/`` first on
``sys.path``).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

from chaos_check import Rec
from chaos_deploy import ClusterDeployment, Deployment, readyz, wait_answering
from chaos_env import Disk, ObjectStore, failed_shards, s3_fault
from chaos_ops import RETRIES, VT, History, now_ms
from chaos_workload import _probe_queues
from served import ROOT, session_pids

sys.path.insert(0, str(ROOT))

from actors.errors import QueueError
from evq.client import Client
from evq.client_wire import RetryPolicy

__all__ = ["CLUSTER_KINDS", "KINDS", "MOVE_KINDS", "Faults"]

KINDS = ("shard_kill", "worker_kill", "server_kill", "pause", "conn_drop")
CLUSTER_KINDS = ("shard_kill", "gateway_kill", "node_kill", "pause", "conn_drop")
# Faults during a resize (issue 34), asked for with --kinds: the shard count goes from the
# campaign's to one more and back, queue by queue, and meanwhile a shard that gives or takes
# queues is SIGKILLed (move_kill: the source, the target, or the whole server, which is the
# coordinator), or paused past its leases and resumed (move_pause: a zombie). The resize is
# then asked for again until it is done, as an operator would.
MOVE_KINDS = ("move_kill", "move_pause")
RESIZE_WAIT_S = 120.0


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

    # -- faults during a resize (MOVE_KINDS)

    def _move_kill(self, rec: Rec) -> bool:
        return self._move(rec, pause=False)

    def _move_pause(self, rec: Rec) -> bool:
        return self._move(rec, pause=True)

    def _move(self, rec: Rec, *, pause: bool) -> bool:
        """Start a resize (the campaign's count and one more, in turn), hit it after 0.05 to
        1 s, then ask for it again until it is done."""
        dep = self.dep
        if not isinstance(dep, Deployment):
            return False
        with Client(dep.url, retries=RETRIES) as c:
            count = c.shards()["count"]
        to = dep.shards + 1 if count == dep.shards else dep.shards
        rec.t0 = now_ms()
        task = self._resize(to, wait=False)
        midway = self._moving(task)  # hit while queues move, not before or after
        shards = dep.shard_pids()
        if pause:
            index = self.rng.choice(sorted(shards))
            what = f"paused shard {index}"
            os.kill(shards[index], signal.SIGSTOP)
            try:
                time.sleep(VT + self.rng.uniform(0.5, 1.5))
            finally:
                os.kill(shards[index], signal.SIGCONT)
        else:
            victim = self.rng.choice(["source", "target", "coordinator"])
            if victim == "coordinator":
                what = "killed the server (the resize's coordinator)"
                dep.kill()
                dep.start()
            else:
                # the shard that is added or removed takes or gives every queue that moves
                index = (
                    max(count, to) - 1 if victim == "target" else self.rng.randrange(min(count, to))
                )
                pid = shards.get(index)
                what = f"killed shard {index} ({victim})"
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
        rec.target = "all"
        rec.t1 = now_ms()
        wait_answering(dep)
        took = self._resize(to, wait=True)
        when = "while queues moved" if midway else "outside the moves"
        rec.res = f"resize {count} -> {to}: {what} {when}; done {took:.1f} s after, asked again"
        return True

    def _moving(self, task: str) -> bool:
        """Wait until the resize ``task`` moves queues (its shards started, its map
        written), then a moment more (0 to 150 ms); whether it still ran then."""
        deadline = time.monotonic() + 20
        with Client(self.dep.url, retries=RETRIES) as c:
            while time.monotonic() < deadline:
                with contextlib.suppress(QueueError):
                    doc = c.task(task)
                    if doc["state"] != "running":
                        return False
                    if doc["total"] > 0:
                        break
                time.sleep(0.02)
            time.sleep(self.rng.uniform(0.0, 0.15))
            with contextlib.suppress(QueueError):
                return bool(c.task(task)["state"] == "running")
        return False

    def _resize(self, to: int, *, wait: bool) -> Any:
        """Ask for ``to`` shards (again while another resize runs); with ``wait``, until a
        resize to ``to`` is done: the seconds it took; else the task's id."""
        started = time.monotonic()
        deadline = started + RESIZE_WAIT_S
        with Client(self.dep.url, retries=RETRIES) as c:
            while time.monotonic() < deadline:
                try:
                    task = c.resize_shards(to)
                except QueueError as exc:
                    if exc.fields.get("status") not in (409, 503):
                        raise
                    time.sleep(0.2)  # one runs (or this worker cannot start shards)
                    continue
                if not wait:
                    return task
                state = self._follow(c, task, deadline)
                if state == "done" and c.shards()["count"] == to:
                    return time.monotonic() - started
                time.sleep(0.2)
        raise RuntimeError(f"the resize to {to} shards did not end within {RESIZE_WAIT_S} s")

    @staticmethod
    def _follow(c: Client, task: str, deadline: float) -> str:
        """The task's end state (``lost``: its gateway was restarted)."""
        while time.monotonic() < deadline:
            try:
                state = c.task(task)["state"]
            except QueueError as exc:
                if exc.fields.get("status") == 404:
                    return "lost"  # another gateway process, or it was restarted
                raise
            if state != "running":
                return str(state)
            time.sleep(0.1)
        return "running"

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
