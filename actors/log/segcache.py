"""The local copy an object-store shard keeps of its log, so that spilled bodies are read
with a ``pread``, never with a GET (docs/DESIGN-NOTES.md, "100M queued messages").

:class:`CachedObjectLogDevice` is an :class:`ObjectLogDevice` that writes
every object it writes or reads into a directory of its own too (no fsync: it is a cache;
the store holds the log). It starts empty each time the log is opened, and recovery, which
reads every segment the shard keeps, fills it again; deleting or cutting a segment drops
its copy. So it holds what the store's log holds, and a body placed in a segment can always
be read back from it.
"""

from __future__ import annotations

import os
import shutil

from actors.log.device import ObjectLogDevice, SegmentFiles
from actors.log.store import ObjectStore, StoreError

__all__ = ["CachedObjectLogDevice"]


class CachedObjectLogDevice(ObjectLogDevice):
    """An object-store log whose segments are copied into ``cache_dir`` as they are written
    or read, so that :meth:`read_at` reads them locally."""

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
