"""Object storage for the event log: one small interface, several real implementations.

The log needs only four operations, all on whole objects named by ``/``-separated keys:

- ``get(key)``: the object's bytes; :class:`KeyNotFound` if there is none.
- ``put_if_absent(key, data)``: create the object unless one exists; ``True`` if this call
  created it, ``False`` if the key was taken. Never overwrites, also when several writers race:
  exactly one of them gets ``True``. This is what fences a zombie writer.
- ``list(prefix)``: the keys that start with ``prefix``, sorted.
- ``delete(key)``: remove the object; deleting a missing key is not an error.

``put(key, data)`` (unconditional overwrite) exists for reports that are not part of the log.
When a call returns, its effect is durable (fsync'd on a local disk, acknowledged by the
object store). A failed call raises :class:`StoreError`; its ``fields["ambiguous"]`` is
``True`` when the write may nevertheless have happened.

Implementations: :class:`LocalDirStore` (the embedded default) and :class:`ObstoreStore`
(``s3://``, ``gs://``, ``az://``, ``memory://`` through obstore). :func:`open_store` picks one
from a URL or a plain directory path.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import itertools
import os
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from actors.errors import BadRequest, ErrorKind, QueueError

__all__ = [
    "NO_SPACE",
    "DiskFailed",
    "DiskFull",
    "KeyNotFound",
    "LocalDirStore",
    "ObjectStore",
    "StoreError",
    "check_key",
    "copy_object",
    "fsync_dir",
]


class StoreError(QueueError):
    """An object-store call failed. ``fields['ambiguous']``: a write may have happened."""

    kind = ErrorKind.UNAVAILABLE
    code = "StoreUnavailable"


class DiskFull(StoreError):
    """A local write found no space (ENOSPC, EDQUOT). Puts are refused until space returns
    (actors/log/device.py, "Full")."""


class DiskFailed(StoreError):
    """A local fsync (or write) failed: what the file holds on the disk is unknown, and the
    page cache may show data the disk does not have. The log is not written again by this
    process; a new one recovers from the disk (actors/log/device.py, "Failed")."""


# errnos of a full file system (or a quota): nothing is wrong with the data
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class KeyNotFound(QueueError):
    """No object under that key."""

    kind = ErrorKind.NOT_FOUND
    code = "KeyNotFound"


class ObjectStore(Protocol):
    """The interface the log writes through (see the module docstring for the contract)."""

    url: str
    write_slots: int  # how many log segment writes should run at once against this store

    async def get(self, key: str) -> bytes:
        """The object's bytes. Raises: KeyNotFound, StoreError."""
        ...

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create the object unless the key exists; True if created. Raises: StoreError."""
        ...

    async def put(self, key: str, data: bytes) -> None:
        """Create or overwrite the object. Raises: StoreError."""
        ...

    async def list(self, prefix: str) -> list[str]:
        """Sorted keys starting with ``prefix``. Raises: StoreError."""
        ...

    async def delete(self, key: str) -> None:
        """Remove the object if it exists. Raises: StoreError."""
        ...

    async def close(self) -> None:
        """Release resources (connections, thread pools)."""
        ...


# ---------------------------------------------------------------- keys

# The local store keeps temp files here; no key may live under it, so a temp file left by a
# crash can never be listed or read as an object.
_TMP_DIR = ".tmp"
# S3's limit; keeping every store to it means a key that works locally also works on S3.
_MAX_KEY_BYTES = 1024


def check_key(key: str, *, prefix: bool = False) -> str:
    """Validate an object key (or, with ``prefix=True``, a list prefix) and return it.

    A key is ``/``-separated segments, none empty, ``.`` or ``..``, without NUL or a leading
    ``/``, and not under the reserved ``.tmp/``. A prefix may be empty and its last segment
    may be partial or empty (``"queues/q1/log/0000"``, ``"queues/"``).

    Raises: BadRequest.
    """
    if not isinstance(key, str):
        raise BadRequest("an object key must be a string", key=repr(key))
    what = "prefix" if prefix else "key"
    if prefix and not key:
        return key
    if not key:
        raise BadRequest("an object key must not be empty", key=key)
    if "\x00" in key:
        raise BadRequest(f"an object {what} must not contain NUL", key=key)
    if key.startswith("/"):
        raise BadRequest(f"an object {what} must not start with '/'", key=key)
    if len(key.encode("utf-8", "surrogatepass")) > _MAX_KEY_BYTES:
        raise BadRequest(f"an object {what} must be at most {_MAX_KEY_BYTES} bytes", key=key)
    segments = key.split("/")
    # The last segment of a prefix is a partial name, compared with startswith only.
    whole = segments[:-1] if prefix else segments
    for segment in whole:
        if segment in ("", ".", ".."):
            raise BadRequest(f"an object {what} has an empty, '.' or '..' segment", key=key)
    if (len(segments) > 1 or not prefix) and segments[0] == _TMP_DIR:
        raise BadRequest(f"keys under {_TMP_DIR}/ are reserved", key=key)
    return key


def _store_error(op: str, key: str, exc: BaseException, *, ambiguous: bool) -> StoreError:
    # Keep the fields picklable (str/bool/int) so the error survives a Ray round trip.
    cls = DiskFull if getattr(exc, "errno", None) in NO_SPACE else StoreError
    return cls(
        f"{op} {key!r} failed: {exc}",
        op=op,
        key=key,
        ambiguous=ambiguous,
        errno=getattr(exc, "errno", None),
    )


# ---------------------------------------------------------------- local directory

_T = TypeVar("_T")


async def copy_object(store: ObjectStore, key: str, to: str) -> bool:
    """Copy object ``key`` to ``to``; False when ``key`` is gone already (nothing copied)."""
    try:
        data = await store.get(key)
    except KeyNotFound:
        return False
    await store.put(to, data)
    return True


def fsync_dir(path: str) -> None:
    """Make the directory's entries durable (a new or removed entry is durable only once the
    directory itself is fsync'd). Raises: OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    # Best effort: a temp file that survives is garbage that is never listed or read.
    with contextlib.suppress(OSError):
        os.unlink(path)


def _link(tmp: str, final: str) -> bool:
    try:
        os.link(tmp, final)  # the kernel refuses an existing name: exactly one writer wins
    except FileExistsError:
        if os.path.isdir(final):
            raise IsADirectoryError(errno.EISDIR, "is a directory", final) from None
        return False  # another writer won; its object stays untouched
    return True


def _replace(tmp: str, final: str) -> bool:
    os.replace(tmp, final)
    return True


def _clash(key: str) -> BadRequest:
    # S3 allows both "a" and "a/b"; a directory tree cannot. The log's keys never clash.
    return BadRequest(f"key {key!r} clashes with a directory or a file of other keys", key=key)


class LocalDirStore:
    """Objects as files under a root directory; every write is fsync'd before it returns.

    Writes go to a unique temp file under ``<root>/.tmp/`` (same filesystem), are
    fdatasync'd, then appear atomically under their final name: ``os.link`` for
    ``put_if_absent`` (the kernel refuses an existing name, so exactly one writer wins, also
    across processes) and ``os.replace`` for ``put``. The final directory is fsync'd so the
    new entry survives a crash. Blocking calls run on a small private thread pool.
    """

    def __init__(self, root: str | Path, *, max_threads: int = 4) -> None:
        self._root = os.path.abspath(os.fspath(root))
        self._tmp = os.path.join(self._root, _TMP_DIR)
        self.url = Path(self._root).as_uri()
        self._executor = ThreadPoolExecutor(max_threads, thread_name_prefix="evq-localstore")
        self._names = itertools.count()  # next() on a count is atomic under the GIL
        # Directories whose whole path up to the root this instance has made durable. The
        # store never removes a directory; if someone else does, _publish forgets it.
        self._durable_dirs: set[str] = set()
        self._closed = False
        # One segment write at a time: parallel creates contend on directory fsyncs and are
        # slower in total than one bigger batch (loadtest/RESULTS.md, "Durable log").
        self.write_slots = 1

    @property
    def root(self) -> Path:
        """The directory that holds the objects."""
        return Path(self._root)

    def __repr__(self) -> str:
        return f"LocalDirStore({self._root!r})"

    async def get(self, key: str) -> bytes:
        """The object's bytes. Raises: KeyNotFound, StoreError, BadRequest."""
        return await self._run(self._get_sync, check_key(key))

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create the object unless the key exists; True if created.

        Raises: StoreError, BadRequest.
        """
        return await self._run(self._publish, "put_if_absent", check_key(key), data, _link)

    async def put(self, key: str, data: bytes) -> None:
        """Create or overwrite the object. Raises: StoreError, BadRequest."""
        await self._run(self._publish, "put", check_key(key), data, _replace)

    async def list(self, prefix: str) -> list[str]:
        """Sorted keys starting with ``prefix``. Raises: StoreError, BadRequest."""
        return await self._run(self._list_sync, check_key(prefix, prefix=True))

    async def delete(self, key: str) -> None:
        """Remove the object if it exists. Raises: StoreError, BadRequest."""
        await self._run(self._delete_sync, check_key(key))

    async def close(self) -> None:
        """Wait for the calls in flight, then stop the thread pool."""
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise StoreError("the store is closed", url=self.url, ambiguous=False)
        # A cancelled caller does not stop the thread: the write may still complete, which is
        # the same uncertainty as a crash, and the log resolves it on recovery.
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- blocking parts, run on the pool

    def _get_sync(self, key: str) -> bytes:
        try:
            with open(os.path.join(self._root, key), "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            # A directory holds other keys; it is not an object.
            raise KeyNotFound(f"no object {key!r}", key=key) from None
        except OSError as e:
            raise _store_error("get", key, e, ambiguous=False) from e

    def _publish(self, op: str, key: str, data: bytes, publish: Callable[[str, str], bool]) -> bool:
        final = os.path.join(self._root, key)
        parent = os.path.dirname(final)
        tmp = self._write_temp(op, key, data)
        try:
            try:
                self.make_durable_dir(parent)
            except NotADirectoryError:
                raise _clash(key) from None
            except OSError as e:  # nothing is visible yet: safe to retry
                raise _store_error(op, key, e, ambiguous=False) from e
            try:
                if not publish(tmp, final):
                    return False
            except (IsADirectoryError, NotADirectoryError):
                raise _clash(key) from None
            except FileNotFoundError as e:
                # The directory vanished behind our back (we never remove one): nothing was
                # published, and the next call creates it again.
                self._durable_dirs.discard(parent)
                raise _store_error(op, key, e, ambiguous=False) from e
            except OSError as e:
                # Conservative: the call that publishes the object failed in an unknown way.
                raise _store_error(op, key, e, ambiguous=True) from e
            try:
                fsync_dir(parent)
            except OSError as e:  # visible now, but maybe not after a crash
                raise _store_error(op, key, e, ambiguous=True) from e
            return True
        finally:
            _unlink_quietly(tmp)  # after a replace it is gone already

    def _delete_sync(self, key: str) -> None:
        final = os.path.join(self._root, key)
        try:
            os.unlink(final)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return  # no such object: deleting is idempotent
        except OSError as e:
            raise _store_error("delete", key, e, ambiguous=True) from e
        try:
            fsync_dir(os.path.dirname(final))
        except OSError as e:
            raise _store_error("delete", key, e, ambiguous=True) from e

    def _list_sync(self, prefix: str) -> builtins.list[str]:  # `list` is a method here
        # Only the directory named by the prefix's complete segments can hold matches.
        head, _, part = prefix.rpartition("/")
        stack = [(os.path.join(self._root, head) if head else self._root, head)]
        keys: list[str] = []
        try:
            while stack:
                path, key = stack.pop()
                try:
                    entries = os.scandir(path)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # nothing stored there (or removed while we listed)
                with entries:
                    for entry in entries:
                        if key == head and (
                            not entry.name.startswith(part) or (not head and entry.name == _TMP_DIR)
                        ):
                            continue
                        child = f"{key}/{entry.name}" if key else entry.name
                        if entry.is_dir(follow_symlinks=False):
                            stack.append((entry.path, child))
                        else:
                            keys.append(child)
        except OSError as e:
            raise _store_error("list", prefix, e, ambiguous=False) from e
        keys.sort()  # code-point order equals the UTF-8 byte order that S3 lists in
        return keys

    def _write_temp(self, op: str, key: str, data: bytes) -> str:
        # pid + counter make the name unique among live writers; the random part keeps a
        # reused pid from meeting a temp file left by an earlier crash (O_EXCL would refuse).
        tmp = os.path.join(self._tmp, f"{os.getpid()}-{next(self._names)}-{secrets.token_hex(4)}")
        try:
            if self._tmp not in self._durable_dirs:
                self.make_durable_dir(self._root)
                # The temp directory itself needs no fsync: after a crash its contents are
                # garbage anyway.
                os.makedirs(self._tmp, exist_ok=True)
                self._durable_dirs.add(self._tmp)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            _unlink_quietly(tmp)
            self._durable_dirs.discard(self._tmp)  # maybe removed behind our back
            raise _store_error(op, key, e, ambiguous=False) from e
        return tmp

    def make_durable_dir(self, path: str) -> None:
        """Create the directory ``path`` (under the root) if needed and make every directory
        entry from it up to the root durable.

        Raises: OSError (NotADirectoryError: a file is in the way).
        """
        # fsync parents also when another process created the directories, because it may
        # not have fsync'd yet when our object is acknowledged.
        if path in self._durable_dirs:
            return
        missing = []
        probe = path
        while not os.path.isdir(probe):
            missing.append(probe)
            probe = os.path.dirname(probe)
        to_sync = set()
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):  # a concurrent writer made it
                os.mkdir(directory)
            to_sync.add(os.path.dirname(directory))  # covers new directories above the root
        if not os.path.isdir(path):  # a file where a directory should be
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        probe = path
        while probe != self._root and probe.startswith(self._root + os.sep):
            probe = os.path.dirname(probe)
            to_sync.add(probe)
        for directory in sorted(to_sync, key=len, reverse=True):
            fsync_dir(directory)
        self._durable_dirs.add(path)
