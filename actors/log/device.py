"""Where a shard's log lives: one interface, two layouts (FORMAT.md, "Shard log").

- :class:`LocalLogDevice` (a local directory, the embedded default): a segment is a file,
  zero-filled ahead of time by a background thread, that blocks are appended to with
  ``pwrite`` and one ``fdatasync`` per group commit — no file creation, link or directory
  fsync per commit. Segments roll by size or age. An exclusive ``flock`` on the log's
  ``LOCK`` file keeps a second process from writing the same log.
- :class:`ObjectLogDevice` (S3, GCS, Azure, memory, and any store wrapped for fault
  injection): one object per group commit, created with ``put_if_absent``, so a zombie's
  write fails instead of forking the log; :class:`CachedObjectLogDevice` also keeps a local
  copy of the objects to read bodies back from.

Both read back through the same codec (:mod:`actors.log.wal`); the shard's writer
(:mod:`actors.log.shardlog`) and recovery (:mod:`actors.log.shard_recovery`) use only this
interface.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Protocol

from actors.clock import Clock, SystemClock
from actors.errors import DataError, Fenced, Unavailable
from actors.log import keys
from actors.log.store import (
    NO_SPACE,
    DiskFailed,
    DiskFull,
    KeyNotFound,
    LocalDirStore,
    ObjectStore,
    StoreError,
    copy_object,
    fsync_dir,
)
from actors.log.wal import SEGMENT_HEADER_SIZE, decode_wal_header, encode_wal_header

__all__ = [
    "CachedObjectLogDevice",
    "Disk",
    "LocalLogDevice",
    "LogDevice",
    "LogHeld",
    "ObjectLogDevice",
    "OwnWriteLanded",
    "SegmentFiles",
    "open_device",
]


class LogHeld(Unavailable):
    """A shard's local log is locked by another process: an older incarnation of the shard
    that has not exited yet (paused, or still closing), or a second server on the same data
    directory (its wire code stays ``Unavailable``)."""


log = logging.getLogger(__name__)

MIB = 1024 * 1024
_JUNK_RETRIES = 4
_READERS = 16  # segment files kept open for reading bodies back
# While the disk is full, look for space again at most this often (statvfs, then a new
# spare segment): a rate limit on a cheap check, not state time.
SPACE_CHECK_S = 0.25
# The last part of a segment (this fraction of it) is the reserve of takes, acks and
# releases while the next spare is still being made: puts that reach it wait for the
# spare, and are refused if it cannot be made (FORMAT.md, "Faults of the disk").
TAIL_RESERVE = 8


class OwnWriteLanded(Unavailable):
    """A segment name we wanted holds a segment of our own epoch: a write reported as failed
    did happen. The log must be read again before this shard writes again."""

    code = "Unavailable"


class LogDevice(Protocol):
    """A shard log's segments: list, read, repair, append, prune."""

    url: str
    write_slots: int  # how many block writes may be in flight at once

    async def open(self) -> None:
        """Take the log for this process. Raises: Unavailable (another process has it)."""
        ...

    async def segments(self) -> list[tuple[int, str]]:
        """``(first LSN, key)`` of every segment, in order. Raises: StoreError."""
        ...

    async def read(self, key: str) -> bytes:
        """A segment's bytes. Raises: KeyNotFound, StoreError."""
        ...

    async def truncate(self, key: str, length: int) -> None:
        """Cut a segment to its first ``length`` bytes (a torn tail), or remove it when no
        block is left. Raises: StoreError."""
        ...

    async def keep_copy(self, key: str, epoch: int) -> None:
        """Keep a copy of a damaged segment under ``damaged/`` (recovery then cuts it to its
        valid blocks). Raises: StoreError."""
        ...

    async def begin(self, epoch: int, next_lsn: int) -> None:
        """Start writing as incarnation ``epoch`` from ``next_lsn``. Raises: StoreError."""
        ...

    async def write(self, epoch: int, first_lsn: int, block: bytes) -> tuple[str, int]:
        """Append one block; durable when this returns. Returns the segment it went to and
        the block's offset in it.

        Raises: StoreError (``ambiguous``: it may have landed), Fenced, OwnWriteLanded,
        DataError.
        """
        ...

    def active(self) -> str | None:
        """The segment being written to (never pruned), if any."""
        ...

    def full(self) -> str | None:
        """Why new data must not be logged now (its disk is full, a reserve is kept for
        takes, acks and releases); None when it may. Cheap: called for every batch."""
        ...

    async def delete(self, key: str) -> None:
        """Remove a segment that snapshots cover. Raises: StoreError."""
        ...

    async def close(self) -> None:
        """Stop writing and let go of the log."""
        ...


def open_device(
    store: ObjectStore,
    shard: int,
    *,
    clock: Clock | None = None,
    segment_bytes: int = 16 * MIB,
    roll_after_ms: int = 300_000,
    cache_dir: str | None = None,
) -> LogDevice:
    """The device for shard ``shard``'s log in ``store``: appended files in a local
    directory, objects anywhere else (with ``cache_dir``, copied there as well, so that
    bodies are read back locally: :class:`CachedObjectLogDevice`)."""
    if isinstance(store, LocalDirStore):
        return LocalLogDevice(
            store, shard, clock=clock, segment_bytes=segment_bytes, roll_after_ms=roll_after_ms
        )
    if cache_dir is not None:
        return CachedObjectLogDevice(store, shard, cache_dir)
    return ObjectLogDevice(store, shard)


def _segment_keys(listed: list[str]) -> list[tuple[int, str]]:
    return sorted((keys.seq_of(key), key) for key in listed if keys.is_wal_segment(key))


async def _keep_copy(store: ObjectStore, key: str, epoch: int) -> None:
    """Copy segment ``key`` under ``damaged/`` for people (gone already: nothing to keep)."""
    await copy_object(store, key, keys.wal_damaged_key(key, epoch))


# ------------------------------------------------------------------ objects


class ObjectLogDevice:
    """One object per group commit, created with ``put_if_absent`` (fencing, FORMAT.md)."""

    def __init__(self, store: ObjectStore, shard: int) -> None:
        self.store = store
        self.shard = shard
        self.url = f"{store.url}/{keys.wal_prefix(shard)}"
        self.write_slots = max(1, getattr(store, "write_slots", 1))

    def __repr__(self) -> str:
        return f"ObjectLogDevice({self.url!r})"

    async def open(self) -> None:
        """Nothing to take: create-only puts fence other writers."""

    async def segments(self) -> list[tuple[int, str]]:
        return _segment_keys(await self.store.list(keys.wal_prefix(self.shard)))

    async def read(self, key: str) -> bytes:
        return await self.store.get(key)

    async def truncate(self, key: str, length: int) -> None:
        if length <= SEGMENT_HEADER_SIZE:
            await self.store.delete(key)
            return
        try:
            data = await self.store.get(key)
        except KeyNotFound:
            return
        await self.store.put(key, data[:length])

    async def keep_copy(self, key: str, epoch: int) -> None:
        await _keep_copy(self.store, key, epoch)

    async def begin(self, epoch: int, next_lsn: int) -> None:
        """Nothing to prepare: each block is an object of its own."""

    def active(self) -> str | None:
        return None

    def full(self) -> str | None:
        """An object store has no disk of ours to fill."""
        return None

    async def write(self, epoch: int, first_lsn: int, block: bytes) -> tuple[str, int]:
        data = encode_wal_header(epoch, first_lsn, self.shard) + block
        key = keys.wal_segment_key(self.shard, first_lsn)
        for _ in range(_JUNK_RETRIES):
            if await self.store.put_if_absent(key, data) or await self._taken(key, data, epoch):
                self.written(key, data)
                return key, SEGMENT_HEADER_SIZE
        raise Unavailable(f"{key}: kept finding a fenced writer's segments there", key=key)

    def written(self, key: str, data: bytes) -> None:
        """``data`` is now object ``key`` (a cache keeps a copy)."""

    async def _taken(self, key: str, data: bytes, epoch: int) -> bool:
        """Explain why ``key`` was taken: True if the object is exactly ``data`` (the store
        retried our own create after a lost response), False if it was a fenced writer's
        leftover now set aside (write again); otherwise raise."""
        try:
            existing = await self.store.get(key)
            if existing == data:
                return True
            header = decode_wal_header(existing)
        except KeyNotFound:
            return False  # set aside meanwhile: write again
        except DataError as exc:
            raise DataError(f"{key} is taken by a damaged segment: {exc.message}") from exc
        if header.epoch > epoch:
            raise Fenced(
                f"shard {self.shard}: epoch {header.epoch} took over from epoch {epoch}",
                shard=self.shard,
                epoch=epoch,
                newer=header.epoch,
            )
        if header.epoch == epoch:
            raise OwnWriteLanded(f"{key}: a write reported as failed did land", key=key)
        # An older epoch above our claim: a fenced writer's late write. It was never
        # acknowledged (its writes before it failed first) and no reader will use it.
        log.warning("shard %d: setting aside %s of fenced epoch %d", self.shard, key, header.epoch)
        await self.store.put(keys.wal_damaged_key(key, epoch), existing)
        await self.store.delete(key)
        return False

    async def delete(self, key: str) -> None:
        await self.store.delete(key)

    async def close(self) -> None:
        """Nothing held."""


class CachedObjectLogDevice(ObjectLogDevice):
    """An object-store log whose objects are also copied into ``cache_dir`` as they are
    written or read, so that :meth:`read_at` reads spilled bodies with a ``pread``, never
    with a GET (docs/DESIGN-NOTES.md, "100M queued messages").

    No fsync: it is a copy; the store holds the log. It starts empty each time the log is
    opened, and recovery, which reads every segment the shard keeps, fills it again;
    deleting or cutting a segment drops its copy. So it holds what the store's log holds,
    and a body placed in a segment can always be read back from it.
    """

    def __init__(self, store: ObjectStore, shard: int, cache_dir: str) -> None:
        super().__init__(store, shard)
        self.cache_dir = os.path.join(cache_dir, f"shard-{shard:04d}")
        self.files = SegmentFiles(self.cache_dir)
        self._dirs: set[str] = set()

    def __repr__(self) -> str:
        return f"CachedObjectLogDevice({self.url!r}, cache={self.cache_dir!r})"

    async def open(self) -> None:
        """Start the copy empty: what an earlier process left may no longer be the log
        (recovery reads every segment kept, and copies it again)."""
        self.files.close()
        self._dirs.clear()
        try:
            shutil.rmtree(self.cache_dir, ignore_errors=True)
            os.makedirs(self.cache_dir, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot make {self.cache_dir}: {exc}", ambiguous=False) from exc
        await super().open()

    async def read(self, key: str) -> bytes:
        data = await super().read(key)
        self._keep(key, data)
        return data

    def written(self, key: str, data: bytes) -> None:
        self._keep(key, data)

    async def truncate(self, key: str, length: int) -> None:
        self._drop(key)
        await super().truncate(key, length)

    async def delete(self, key: str) -> None:
        self._drop(key)
        await super().delete(key)

    def read_at(self, key: str, offset: int, length: int) -> bytes:
        return self.files.read_at(key, offset, length)

    async def close(self) -> None:
        self.files.close()
        await super().close()

    def _keep(self, key: str, data: bytes) -> None:
        path = self.files.path(key)
        parent = os.path.dirname(path)
        tmp = path + ".tmp"
        try:
            if parent not in self._dirs:
                os.makedirs(parent, exist_ok=True)
                self._dirs.add(parent)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(
                f"cannot copy {key} into {self.cache_dir}: {exc}", ambiguous=True
            ) from exc
        self.files.forget(key)  # a descriptor of an older copy reads the old file

    def _drop(self, key: str) -> None:
        self.files.forget(key)
        try:
            os.unlink(self.files.path(key))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreError(
                f"cannot drop {key} from {self.cache_dir}: {exc}", ambiguous=False
            ) from exc


# ------------------------------------------------------------------ local files


class Disk:
    """The calls the local log makes to write and sync its files: the seam disk faults are
    injected through (:class:`actors.log.faults.FaultyDisk`). ``path`` names the file, for
    faults aimed at one kind of file."""

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int, path: str) -> int:
        """``os.pwrite``."""
        return os.pwrite(fd, data, offset)

    def fdatasync(self, fd: int, path: str) -> None:
        """``os.fdatasync``."""
        os.fdatasync(fd)

    def free_bytes(self, path: str) -> int:
        """Bytes an unprivileged writer may still use on ``path``'s file system."""
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize


class _Spare:
    """A segment file zero-filled ahead of time by a thread, so a roll never waits for it."""

    def __init__(self, path: str, size: int, disk: Disk) -> None:
        self.path = path
        self.size = size
        self.disk = disk
        self.error: OSError | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="evq-wal-spare", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        try:
            _zero_file(self.path, self.size, self.disk)
        except OSError as exc:
            self.error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        """Whether the thread has finished (made the file, or failed: ``error``)."""
        return self._done.is_set()

    def wait(self) -> None:
        self._thread.join()


def _zero_file(path: str, size: int, disk: Disk) -> None:
    """A new file of ``size`` zero bytes, written (not just allocated) and synced: writing
    into written blocks later changes no metadata, so each commit's fdatasync flushes data
    only (0.11 ms here against 0.19 ms for fallocate'd blocks, loadtest/RESULTS.md). On a
    failure the part written is removed: a full disk gets its space back."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        chunk = bytes(min(size, MIB))
        written = 0
        while written < size:
            written += disk.pwrite(fd, chunk[: size - written], written, path)
        disk.fdatasync(fd, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)


def _no_space(exc: OSError) -> bool:
    return exc.errno in NO_SPACE


class SegmentFiles:
    """Files named by segment key under ``root``, read at an offset."""

    def __init__(self, root: str, keep_open: int = _READERS) -> None:
        self.root = root
        self.keep_open = keep_open
        self._fds: dict[str, int] = {}  # open for reading, least recently used first

    def path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def read_at(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of segment ``key`` from ``offset``, read at once (through the
        page cache: a body wanted by a take was written recently or is read in order).

        Raises: DataError (the file is shorter: it was cut, or it is gone), StoreError.
        """
        fd = self._fds.pop(key, None)
        if fd is None:
            try:
                fd = os.open(self.path(key), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise DataError(f"log segment {key} is gone; a body in it was wanted") from None
            except OSError as exc:
                raise StoreError(f"cannot open {key}: {exc}", ambiguous=False) from exc
            while len(self._fds) >= self.keep_open:
                os.close(self._fds.pop(next(iter(self._fds))))
        self._fds[key] = fd  # the most recently used last
        try:
            data = os.pread(fd, length, offset)
        except OSError as exc:
            raise StoreError(f"cannot read {key}: {exc}", ambiguous=False) from exc
        if len(data) != length:
            raise DataError(f"log segment {key} ends before offset {offset + length}")
        return data

    def forget(self, key: str) -> None:
        """Close ``key``'s descriptor, if open (before its file goes or changes)."""
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class LocalLogDevice:
    """Segments as preallocated files appended to; one fdatasync per block.

    Disk faults (FORMAT.md, "Faults of the disk"):

    - *Full* (ENOSPC, EDQUOT): the spare segment is the reserve. When the next spare cannot
      be made, :meth:`full` says so and the shard refuses puts, while takes, acks and
      releases still go to the segment being written, whose last eighth
      (:data:`TAIL_RESERVE`) puts reach only once the next spare is made. While full, the
      device looks for space again at most every :data:`SPACE_CHECK_S` (statvfs, then a new
      spare); once a spare is made, puts are taken again. Running out of the reserve too
      fails the write without writing (:class:`DiskFull`): the shard reads its log again
      until space returns.
    - *Failed* (any error of an fsync, or of a write other than ENOSPC): after a failed
      fdatasync the page cache may hold data that never reached the disk, so neither a
      second fsync nor reading the file back proves anything (PostgreSQL's "fsyncgate").
      The device refuses every later write with the same :class:`DiskFailed`; only a new
      process, reading the log from the disk, may write it again.
    """

    def __init__(
        self,
        store: LocalDirStore,
        shard: int,
        *,
        segment_bytes: int = 16 * MIB,
        roll_after_ms: int = 300_000,
        clock: Clock | None = None,
        disk: Disk | None = None,
    ) -> None:
        self.store = store
        self.shard = shard
        self.root = str(store.root)
        self.dir = os.path.join(self.root, keys.wal_prefix(shard).rstrip("/"))
        self.url = Path(self.dir).as_uri()
        self.segment_bytes = segment_bytes
        self.roll_after_ms = roll_after_ms
        self.clock = clock or SystemClock()
        self.disk = disk or Disk()
        self.write_slots = 1  # blocks go to one file in order
        self.failed: DiskFailed | None = None  # set for good by a failed fsync or write
        self._full: str | None = None  # why puts are refused (None: they are not)
        self._space_checked = 0.0
        self._lock_fd: int | None = None
        self._fd: int | None = None
        self._key: str | None = None
        self._pos = 0
        self._size = 0
        self._opened_ms = 0
        self._epoch = 0
        self._spare: _Spare | None = None
        self._spare_path = os.path.join(self.root, ".tmp", f"wal-{shard:04d}.spare")
        self.files = SegmentFiles(self.root)  # segments read back for bodies

    def __repr__(self) -> str:
        return f"LocalLogDevice({self.dir!r})"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key)

    # -- taking the log

    async def open(self) -> None:
        """Take the log's exclusive lock, or fail at once if another process holds it."""
        if self._lock_fd is not None:
            return
        try:
            self.store.make_durable_dir(self.dir)
            fd = os.open(os.path.join(self.dir, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreError(f"cannot open {self.dir}: {exc}", ambiguous=False) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise LogHeld(
                    f"the log {self.dir} is held by another process; a log has one writer",
                    log=self.dir,
                ) from None
            raise StoreError(f"cannot lock {self.dir}: {exc}", ambiguous=False) from exc
        self._lock_fd = fd

    # -- reading and repairing

    async def segments(self) -> list[tuple[int, str]]:
        prefix = keys.wal_prefix(self.shard)
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {self.dir}: {exc}", ambiguous=False) from exc
        return _segment_keys([prefix + n for n in names])

    async def read(self, key: str) -> bytes:
        return await self.store.get(key)

    async def truncate(self, key: str, length: int) -> None:
        path = self._path(key)
        try:
            if length <= SEGMENT_HEADER_SIZE:
                os.unlink(path)
                fsync_dir(self.dir)
                return
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, length)
                os.fsync(fd)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"cannot truncate {key}: {exc}", ambiguous=True) from exc

    async def keep_copy(self, key: str, epoch: int) -> None:
        await _keep_copy(self.store, key, epoch)

    # -- writing

    async def begin(self, epoch: int, next_lsn: int) -> None:
        """Start a segment of its own for incarnation ``epoch`` (the segments before it are
        closed: recovery has cut them to their valid blocks).

        Raises: DiskFailed (this process must not write the log again), DiskFull,
        StoreError."""
        if self.failed is not None:
            raise self.failed
        if self._lock_fd is None:
            await self.open()
        self._epoch = epoch
        self._close_segment()
        self._roll(next_lsn, 0)

    def active(self) -> str | None:
        return self._key

    async def write(self, epoch: int, first_lsn: int, block: bytes) -> tuple[str, int]:
        return self.write_now(epoch, first_lsn, block)

    def write_now(self, epoch: int, first_lsn: int, block: bytes) -> tuple[str, int]:
        """:meth:`write`, done before it returns: a ``pwrite`` and an ``fdatasync`` block the
        event loop anyway, so the shard log calls this straight from its pump instead of
        starting a task for each block (a loop turn and a task less per group commit)."""
        if self.failed is not None:
            raise self.failed
        if self._fd is None or epoch != self._epoch:
            raise StoreError("the log is not open for writing", ambiguous=False)
        if self._pos + len(block) > self._size or self._old():
            self._roll(first_lsn, len(block))
        fd, key = self._fd, self._key  # set and cleared together
        assert fd is not None
        assert key is not None
        pos = start = self._pos
        path = self._path(key)
        try:
            view = memoryview(block)
            while view:
                n = self.disk.pwrite(fd, view, pos, path)
                view, pos = view[n:], pos + n
        except OSError as exc:
            # Some of it may be in the file: recovery reads the segment again and keeps
            # what is whole (a partial block is a torn tail, never acknowledged). Out of
            # space inside a written segment (a copy-on-write file system) is a full disk;
            # anything else, a disk that fails.
            self._pos = pos
            if not _no_space(exc):
                raise self._fail("write", exc) from exc
            self._set_full(exc)
            raise DiskFull(
                f"writing the shard log {self._key} failed: {exc}",
                op="write",
                key=self._key or "",
                ambiguous=True,
                errno=exc.errno,
            ) from exc
        try:
            self.disk.fdatasync(fd, path)
        except OSError as exc:
            self._pos = pos
            raise self._fail("fdatasync", exc) from exc
        self._pos = pos
        return key, start

    def read_at(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of segment ``key`` from ``offset`` (:class:`SegmentFiles`)."""
        return self.files.read_at(key, offset, length)

    def _fail(self, op: str, exc: OSError) -> DiskFailed:
        """Stop writing for good: a failed fsync (or write) leaves the file's state unknown
        and unknowable from this process."""
        self.failed = DiskFailed(
            f"{op} of the shard log {self._key or self.dir} failed: "
            f"{errno.errorcode.get(exc.errno or 0, exc.errno)} ({exc.strerror}); "
            "the log is not written again by this process",
            op=op,
            key=self._key or "",
            ambiguous=True,
            errno=exc.errno,
        )
        log.error(
            "shard %d: %s of its log failed with errno %s (%s) in %s: writes stop until "
            "the shard restarts and recovers from its log",
            self.shard,
            op,
            exc.errno,
            errno.errorcode.get(exc.errno or 0, "?"),
            self.dir,
        )
        return self.failed

    def _old(self) -> bool:
        return self.clock.now_ms() - self._opened_ms >= self.roll_after_ms and self._pos > (
            SEGMENT_HEADER_SIZE
        )

    def _roll(self, first_lsn: int, block_bytes: int) -> None:
        """Close the current segment (cut to its blocks) and start the next at ``first_lsn``.

        Raises: DiskFull (no space for a segment), DiskFailed (a sync failed), StoreError
        (nothing was written yet: not ambiguous).
        """
        self._close_segment()
        key = keys.wal_segment_key(self.shard, first_lsn)
        path = self._path(key)
        size = max(self.segment_bytes, SEGMENT_HEADER_SIZE + block_bytes)
        try:
            ready = False
            if self._spare is not None:
                self._spare.wait()  # done long ago, unless segments fill up very fast
                ready = self._spare.error is None and self._spare.size >= size
            if not ready:
                self.store.make_durable_dir(os.path.dirname(self._spare_path))
                _zero_file(self._spare_path, size, self.disk)
        except OSError as exc:
            if _no_space(exc):
                self._set_full(exc)
                raise DiskFull(
                    f"no space for shard log segment {key}: {exc}", op="roll", ambiguous=False
                ) from exc
            raise self._fail("zero-filling a segment", exc) from exc
        fd = self._start_segment(key, path, first_lsn)
        self._fd, self._key, self._pos, self._size = fd, key, SEGMENT_HEADER_SIZE, size
        self._opened_ms = self.clock.now_ms()
        self._spare = _Spare(self._spare_path, self.segment_bytes, self.disk)

    def _start_segment(self, key: str, path: str, first_lsn: int) -> int:
        """Write the header into the spare and give it the segment's name; its fd."""
        try:
            fd = os.open(self._spare_path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreError(
                f"starting shard log segment {key} failed: {exc}", op="roll", ambiguous=False
            ) from exc
        op = "write"
        try:
            self.disk.pwrite(fd, encode_wal_header(self._epoch, first_lsn, self.shard), 0, path)
            op = "fdatasync"
            self.disk.fdatasync(fd, path)
            op = "rename"
            os.rename(self._spare_path, path)  # nobody else writes here (the lock)
            op = "fsync of the directory"
            fsync_dir(self.dir)
        except OSError as exc:
            os.close(fd)
            if op == "rename":
                raise StoreError(
                    f"starting shard log segment {key} failed: {exc}", op="roll", ambiguous=False
                ) from exc
            raise self._fail(op, exc) from exc
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _set_full(self, exc: OSError) -> None:
        if self._full is None:
            log.error(
                "shard %d: the disk of its log is full (errno %s, %s) in %s: puts are "
                "refused until space returns; takes, acks and releases go on",
                self.shard,
                exc.errno,
                exc.strerror,
                self.dir,
            )
        self._full = (
            f"shard {self.shard}: the disk of its log is full ({exc.strerror}); puts are "
            "refused until space returns, takes, acks and releases still work"
        )
        self._space_checked = time.perf_counter()

    def full(self) -> str | None:
        spare = self._spare
        if self._full is None and (spare is None or spare.error is None):
            if spare is None or spare.done() or self._room() >= self._size // TAIL_RESERVE:
                return None  # the common case: a few attribute reads
            # Puts reached the segment's tail before its successor was made (a slow disk,
            # or one that just filled up): learn whether it can be, before the tail goes.
            spare.wait()
            if spare.error is None:
                return None
        if spare is not None and spare.done():
            if spare.error is None:
                log.warning("shard %d: space returned; puts are taken again", self.shard)
                self._full = None
                return None
            if _no_space(spare.error):
                if self._full is None:
                    self._set_full(spare.error)
                self._look_for_space()
        return self._full

    def _room(self) -> int:
        """Bytes left in the segment being written."""
        return self._size - self._pos

    def _look_for_space(self) -> None:
        """At most every SPACE_CHECK_S: when statvfs shows room for a segment, make a new
        spare (it ends the full state once it is made)."""
        now = time.perf_counter()  # a rate limit, not state time
        if now - self._space_checked < SPACE_CHECK_S or self.failed is not None:
            return
        self._space_checked = now
        try:
            free = self.disk.free_bytes(os.path.dirname(self._spare_path))
        except OSError:
            return
        if free >= self.segment_bytes:
            self._spare = _Spare(self._spare_path, self.segment_bytes, self.disk)

    def _close_segment(self) -> None:
        """Close the segment being written, cut to its blocks (a crash before the cut leaves
        zeros after them, which readers take as the end). A failed log is left as it is."""
        if self._fd is None:
            return
        fd, self._fd, self._key = self._fd, None, None
        if self.failed is None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._pos)
        os.close(fd)

    async def delete(self, key: str) -> None:
        if key == self._key:
            return
        self.files.forget(key)
        await self.store.delete(key)

    async def close(self) -> None:
        self._close_segment()
        self.files.close()
        if self._spare is not None:
            self._spare.wait()
            self._spare = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None
