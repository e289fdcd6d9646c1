"""Where the chaos campaign (``loadtest/chaos.py``) puts the server's log when its faults are
the disk's or the object store's, and the pure rules of those faults.

- :class:`Disk` (``--disk tmpfs``, ``--disk faultfs``, or both): the data directory on a
  tmpfs of a given size (a filler file makes it full: a real ENOSPC), and/or through
  ``faultfs`` (fsyncs fail with EIO, writes and fsyncs sleep). Both: faultfs's backing
  directory lies on the tmpfs, so the three disk faults hit one data directory. The helpers
  are ``loadtest/diskfaults.py``'s (shared with the tests).
- :class:`ObjectStore` (``--s3``): moto's S3 server and ``loadtest/s3_fault_proxy.py`` in front
  of it, each a subprocess; ``evq serve --store s3://…`` talks to the proxy, whose plan is set
  over HTTP.

Imported as a sibling module (``python loadtest/chaos.py`` puts ``loadtest/`` first on
``sys.path``).
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from diskfaults import FaultFs, faultfs, fill, tmpfs, why_not_fuse, why_not_tmpfs
from served import free_port

__all__ = [
    "DISK_KINDS",
    "S3_KINDS",
    "Disk",
    "ObjectStore",
    "answering",
    "failed_shards",
    "kind_sequence",
    "known_kinds",
    "parse_disks",
    "s3_fault",
]

MIB = 1024 * 1024
DISK_KINDS = {"tmpfs": ("disk_full",), "faultfs": ("fsync_eio", "disk_slow")}
S3_KINDS = ("s3_500", "s3_503", "s3_timeout", "s3_reset", "s3_lost_answer")
SEGMENT = r"/wal/\d{4}/\d{20}\.seg$"  # a shard log's block, as the proxy sees its path
BUCKET = "evq-chaos"
REGION = "us-east-1"
# moto accepts any credentials; a request gives up after 1.5 s, retries after 2 s, so a
# hung request or an outage costs seconds, not the default 10 s and 15 s.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": REGION,
    "EVQ_S3_REQUEST_TIMEOUT_MS": "1500",
    "EVQ_S3_RETRY_TIMEOUT_MS": "2000",
}


# ---------------------------------------------------------------- pure rules


def parse_disks(text: str | None) -> tuple[str, ...]:
    """``--disk``'s value (``tmpfs``, ``faultfs``, or both comma-separated), checked.

    Raises: ValueError (an unknown disk)."""
    disks = tuple(sorted({d for d in (text or "").split(",") if d}))
    for d in disks:
        if d not in DISK_KINDS:
            raise ValueError(f"unknown disk {d!r} (disks: {', '.join(DISK_KINDS)})")
    return disks


def known_kinds(base: tuple[str, ...], disks: tuple[str, ...], s3: bool) -> tuple[str, ...]:
    """The fault kinds a set-up offers: the process faults ``base``, plus its disks' or its
    object store's."""
    extra: tuple[str, ...] = S3_KINDS if s3 else ()
    for d in disks:
        extra += DISK_KINDS[d]
    return base + extra


def kind_sequence(kinds: list[str], rng: random.Random, in_turn: bool) -> Iterator[str]:
    """The kind of each fault, without end: drawn at random among ``kinds``, or (``in_turn``)
    each kind once in a shuffled order, then each once again in another, and so on."""
    while True:
        if in_turn:
            order = list(kinds)
            rng.shuffle(order)
            yield from order
        else:
            yield rng.choice(kinds)


def answering(status: int | None, doc: Any) -> bool:
    """Whether a ``/readyz`` answer says every shard serves everything: 200, and no shard
    degraded (a full disk answers 200 but refuses puts)."""
    return status == 200 and isinstance(doc, dict) and not doc.get("degraded")


def failed_shards(status: int | None, doc: Any) -> set[int]:
    """The shards a ``/readyz`` answer says have a failed log (503 ``failed``)."""
    if status != 503 or not isinstance(doc, dict) or doc.get("status") != "failed":
        return set()
    return {int(s["index"]) for s in doc.get("shards", [])}


def s3_fault(kind: str, rng: random.Random) -> tuple[dict[str, Any], float]:
    """The proxy rule of one object-store fault, and the longest it stays (s): a 500/503
    outage of every request (for the whole window, or its first N requests); N requests
    that hang past the client's timeout; N segment uploads reset midway; N conditional
    segment PUTs that landed but whose answer is lost (a reset, a hang, or a 500/503)."""
    window = round(rng.uniform(0.5, 3.0), 2)
    n = rng.randint(1, 4)
    match kind:
        case "s3_500" | "s3_503":
            fault = "internal_error" if kind == "s3_500" else "slow_down"
            rule: dict[str, Any] = {"fault": fault, "times": rng.choice([n, None])}
            if fault == "slow_down":
                rule["retry_after_s"] = 1
        case "s3_timeout":
            rule = {"fault": "hang", "times": min(n, 2), "hold_s": 30.0}
        case "s3_reset":
            reset_after = round(rng.uniform(0.1, 0.9), 2)
            rule = {"fault": "reset_upload", "method": "PUT", "key": SEGMENT, "times": n}
            rule["reset_after"] = reset_after
        case "s3_lost_answer":
            then = rng.choice(["reset", "hang", "internal_error", "slow_down"])
            rule = {"fault": "lost_answer", "method": "PUT", "key": SEGMENT, "times": min(n, 2)}
            rule.update(conditional=True, then=then, hold_s=30.0)
        case _:
            raise ValueError(f"not an object-store fault: {kind!r}")
    return rule, window


# ---------------------------------------------------------------- the disk


class Disk:
    """The data directory on the ``disks`` asked for (see the module's doc)."""

    def __init__(self, root: Path, disks: tuple[str, ...], size_mib: int) -> None:
        self.root = root
        self.disks = disks
        self.size_mib = size_mib
        self.data = root / "data"
        self.tmpfs: Path | None = None
        self.fs: FaultFs | None = None

    @contextlib.contextmanager
    def mounted(self) -> Iterator[Disk]:
        """Mount what was asked for; unmount at the end (stop the server first).

        Raises: RuntimeError (this machine cannot mount it)."""
        for d, why in (("tmpfs", why_not_tmpfs()), ("faultfs", why_not_fuse())):
            if d in self.disks and why:
                raise RuntimeError(f"--disk {d}: {why}")
        with contextlib.ExitStack() as stack:
            base = self.root
            if "tmpfs" in self.disks:
                self.tmpfs = stack.enter_context(tmpfs(self.root / "disk", self.size_mib * MIB))
                base = self.tmpfs
                self.data = base / "data"
            if "faultfs" in self.disks:
                self.fs = stack.enter_context(faultfs(base / "backing", self.root / "mnt"))
                self.data = self.fs.mount / "data"
            yield self

    def fill(self) -> int:
        """Fill the tmpfs (a filler file next to the data): the bytes written."""
        assert self.tmpfs is not None
        return fill(self.tmpfs / "filler")

    def unfill(self) -> None:
        """Give the filler's space back."""
        assert self.tmpfs is not None
        (self.tmpfs / "filler").unlink(missing_ok=True)


# ---------------------------------------------------------------- the object store


class ObjectStore:
    """moto's S3 server and the fault proxy in front of it (subprocesses), a bucket."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.seed = seed
        self.moto_port, self.proxy_port = free_port(), free_port()
        self.upstream = f"http://127.0.0.1:{self.moto_port}"
        self.url = f"http://127.0.0.1:{self.proxy_port}"  # evq's endpoint
        self.store = f"s3://{BUCKET}/chaos-{seed}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def server_args(self) -> list[str]:
        """``evq serve``'s arguments for this store."""
        return ["--store", self.store, "--endpoint", self.url, "--region", REGION]

    @contextlib.contextmanager
    def running(self) -> Iterator[ObjectStore]:
        """Start moto's server (with the bucket) and the proxy; stop both at the end."""
        moto = [sys.executable, str(Path(__file__).with_name("moto_s3.py"))]  # S3's atomicity
        proxy = Path(__file__).with_name("s3_fault_proxy.py")
        try:
            with open(self.root / "moto.log", "ab") as log:
                self.procs.append(
                    subprocess.Popen(
                        [*moto, "-H", "127.0.0.1", "-p", str(self.moto_port)],
                        stdout=log, stderr=subprocess.STDOUT,
                    )
                )  # fmt: skip
            with open(self.root / "proxy.log", "ab") as log:
                cmd = [sys.executable, str(proxy), "--upstream", self.upstream]
                cmd += ["--port", str(self.proxy_port), "--seed", str(self.seed)]
                self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
            _wait_answer(f"{self.upstream}/", 30)
            _call("PUT", f"{self.upstream}/{BUCKET}", None)
            _wait_answer(f"{self.url}/_faults", 30)
            yield self
        finally:
            for proc in self.procs:
                proc.terminate()
            for proc in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def plan(self, rules: list[dict[str, Any]]) -> None:
        """Replace the proxy's plan (every rule's count starts at 0)."""
        _call("PUT", f"{self.url}/_faults/rules", {"seed": self.seed, "rules": rules})

    def clear(self) -> dict[str, Any]:
        """No more faults; the proxy's state before (``rules`` with ``fired``)."""
        state = _call("GET", f"{self.url}/_faults", None)
        _call("DELETE", f"{self.url}/_faults/rules", None)
        return state

    def spent(self) -> bool:
        """Whether every rule of the plan fired as often as it may."""
        rules = _call("GET", f"{self.url}/_faults", None)["rules"]
        return all(r["times"] is not None and r["fired"] >= r["times"] for r in rules)


def _call(method: str, url: str, doc: Any) -> Any:
    data = json.dumps(doc).encode() if doc is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body and r.headers.get_content_type() == "application/json" else None


def _wait_answer(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {timeout} s") from None
            time.sleep(0.2)
