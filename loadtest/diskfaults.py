"""Real disk faults, through the kernel: a small tmpfs (a real ENOSPC) and ``faultfs``, a
passthrough FUSE file system whose writes and fsyncs answer an errno or sleep on command (a
real EIO on fsync, real latency per write). Used by the tests (through
:mod:`tests.diskfaults`, which adds :func:`~tests.diskfaults.require`) and by the chaos
campaign (``loadtest/chaos.py --disk``), so it imports nothing of pytest; the tools import
it as a sibling module, the tests as ``loadtest.diskfaults``.

Both need root (``mount``); ``faultfs`` also needs ``/dev/fuse``, libfuse 3 (Debian's
``fuse3``: ``make fuse``) and the ``mfusepy`` binding (the ``dev`` extra). :func:`why_not_tmpfs`
and :func:`why_not_fuse` say why one cannot run here (None: it can).

``faultfs`` (:mod:`loadtest.faultfs`) runs in a process of its own (``python -m
loadtest.faultfs BACKING MOUNT CONTROL``), so a stuck file system never blocks the caller's
own threads. Faults are set by rewriting the JSON file ``CONTROL``
(:meth:`FaultFs.set`); the file system reads it again whenever it changes, and appends one
line per injected fault to ``CONTROL.log``.

Every mount is undone when its context ends, also when the caller failed (a lazy unmount
when files on it are still open).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "FaultFs",
    "faultfs",
    "fill",
    "mounted",
    "tmpfs",
    "why_not_fuse",
    "why_not_tmpfs",
]

ROOT = Path(__file__).resolve().parents[1]


def mounted(path: Path) -> bool:
    """Whether a file system is mounted exactly at ``path``."""
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def why_not_tmpfs() -> str | None:
    """Why a tmpfs cannot be mounted here (None: it can)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("mount") is None:
        return "no mount(8)"
    return None


def why_not_fuse() -> str | None:
    """Why ``faultfs`` cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "mounting FUSE needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    with open("/proc/filesystems") as f:
        if "fuse" not in f.read().split():
            return "the kernel has no fuse file system"
    try:
        import mfusepy  # noqa: F401  # loads libfuse
    except (ImportError, OSError) as exc:
        return f"mfusepy or libfuse 3 is missing ({exc}); run `make fuse` and `make setup`"
    return None


def _umount(path: Path) -> None:
    if not mounted(path):
        return
    done = subprocess.run(["umount", str(path)], capture_output=True, check=False)
    if done.returncode != 0 and mounted(path):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@contextlib.contextmanager
def tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` at ``path`` (created), unmounted at the end."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(path)],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        _umount(path)


def fill(path: Path, *, leave_bytes: int = 0) -> int:
    """Write the file ``path`` until its file system is full (or only ``leave_bytes`` are
    left); return the bytes written. Deleting the file gives the space back."""
    chunk = bytes(64 * 1024)
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            st = os.statvfs(path)
            free = st.f_bavail * st.f_frsize - leave_bytes
            if free <= 0:
                break
            try:
                written += os.write(fd, chunk[: min(len(chunk), free)])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    return written


# ------------------------------------------------------------------ faultfs


class FaultFs:
    """A running ``faultfs``: ``mount`` shows ``backing``; faults are set with :meth:`set`."""

    def __init__(self, backing: Path, mount: Path, control: Path, proc: subprocess.Popen[bytes]):
        self.backing = backing
        self.mount = mount
        self.control = control
        self.proc = proc

    def set(
        self,
        *,
        fsync_errno: int | None = None,
        write_errno: int | None = None,
        write_delay_s: float = 0.0,
        fsync_delay_s: float = 0.0,
        only: str = "",
    ) -> None:
        """Fault every later fsync / write (of paths containing ``only``): answer the errno,
        or sleep first. ``set()`` with no arguments clears every fault."""
        faults = {
            "fsync_errno": fsync_errno,
            "write_errno": write_errno,
            "write_delay_s": write_delay_s,
            "fsync_delay_s": fsync_delay_s,
            "only": only,
        }
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(faults))
        os.replace(tmp, self.control)  # a new inode: the file system sees the change at once

    def injected(self) -> list[str]:
        """One line per fault injected so far: ``op errno-or-delay path``."""
        log = Path(f"{self.control}.log")
        return log.read_text().splitlines() if log.exists() else []


@contextlib.contextmanager
def faultfs(backing: Path, mount: Path) -> Iterator[FaultFs]:
    """``backing`` mounted at ``mount`` through ``faultfs``, no faults yet; unmounted at
    the end (the file system's process is stopped, the mount undone lazily if busy)."""
    backing.mkdir(parents=True, exist_ok=True)
    mount.mkdir(parents=True, exist_ok=True)
    control = mount.parent / f"{mount.name}.faults.json"
    control.write_text("{}")
    Path(f"{control}.log").unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtest.faultfs", str(backing), str(mount), str(control)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 15
        while not mounted(mount):
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode() if proc.poll() is not None and proc.stdout else ""
                raise RuntimeError(f"faultfs did not mount {mount} (exit {proc.poll()}): {out}")
            time.sleep(0.02)
        yield FaultFs(backing, mount, control, proc)
    finally:
        if proc.poll() is None:
            proc.terminate()  # libfuse unmounts on SIGTERM
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _umount(mount)
        if proc.stdout is not None:
            proc.stdout.close()
