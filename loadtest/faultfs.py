"""``faultfs``: a passthrough FUSE file system whose writes and fsyncs answer an errno or sleep
on command. Run as ``python -m loadtest.faultfs BACKING MOUNT CONTROL`` (by
:func:`loadtest.diskfaults.faultfs`, which also unmounts it).

``CONTROL`` is a JSON file: ``{"fsync_errno": 5, "write_errno": null, "write_delay_s": 0.0,
"fsync_delay_s": 0.0, "only": "wal/"}``; it is read again whenever it changes. Each fault
injected adds a line ``op errno path`` to ``CONTROL.log``. Locks (``flock``) are left to the
kernel, which keeps them locally for a file system that does not implement them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import mfusepy


class Faults:
    """The control file, read again whenever it is replaced or changed."""

    def __init__(self, control: str) -> None:
        self.control = control
        self.seen: tuple[int, int] | None = None
        self.now: dict[str, Any] = {}
        self.lock = threading.Lock()

    def get(self) -> dict[str, Any]:
        try:
            st = os.stat(self.control)
        except FileNotFoundError:
            return self.now
        key = (st.st_ino, st.st_mtime_ns)
        if key != self.seen:
            with self.lock, contextlib.suppress(OSError, ValueError):
                self.now = json.loads(Path(self.control).read_text() or "{}")
                self.seen = key
        return self.now

    def inject(self, op: str, path: str) -> None:
        """Sleep or raise for ``op`` on ``path`` as the control file says."""
        faults = self.get()
        if faults.get("only", "") not in path:
            return
        delay = faults.get(f"{op}_delay_s") or 0.0
        if delay:
            time.sleep(delay)
        code = faults.get(f"{op}_errno")
        if code:
            with self.lock, open(f"{self.control}.log", "a") as f:
                f.write(f"{op} {code} {path}\n")
            raise mfusepy.FuseOSError(code)


class Passthrough(mfusepy.Operations):  # type: ignore[misc]
    """Every call goes to the same path under ``backing``; writes and fsyncs ask ``faults``."""

    use_ns = True

    def __init__(self, backing: str, faults: Faults) -> None:
        self.backing = backing
        self.faults = faults

    def _full(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._full(path), amode):
            raise mfusepy.FuseOSError(errno.EACCES)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._full(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._full(path), uid, gid)
        return 0

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
        out = {
            k: getattr(st, k)
            for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks")
        }
        out.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return out

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._full(path))]

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._full(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._full(path))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._full(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        os.rename(self._full(old), self._full(new))
        return 0

    def link(self, target: str, source: str) -> int:
        os.link(self._full(source), self._full(target))
        return 0

    def symlink(self, target: str, source: str) -> int:
        os.symlink(source, self._full(target))
        return 0

    def readlink(self, path: str) -> str:
        return os.readlink(self._full(path))

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._full(path), ns=times)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._full(path))
        names = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files")
        return {k: getattr(st, k) for k in (*names, "f_ffree", "f_favail", "f_namemax")}

    def open(self, path: str, flags: int) -> int:
        return os.open(self._full(path), flags & ~os.O_APPEND)

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        return os.open(self._full(path), os.O_RDWR | os.O_CREAT | (flags & os.O_EXCL), mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self.faults.inject("write", path)
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._full(path), length)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self.faults.inject("fsync", path)
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self.faults.inject("fsync", path)
        return 0


def main(backing: str, mount: str, control: str) -> None:
    """Serve ``backing`` at ``mount`` until SIGTERM (libfuse unmounts then)."""
    ops = Passthrough(backing, Faults(control))
    mfusepy.FUSE(ops, mount, foreground=True, nothreads=False, fsname="faultfs")


if __name__ == "__main__":
    main(*sys.argv[1:4])
