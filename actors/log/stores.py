"""Opening a store by its path or URL: the one module that knows every kind of store.

``actors/log/store.py`` (the protocol and the local directory) and
``actors/log/obstore_store.py`` (object stores through obstore) do not import each other;
this module imports the local store and loads obstore only for an object-store URL.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from actors.errors import BadRequest
from actors.log.store import LocalDirStore, ObjectStore

__all__ = ["open_store"]

_OBSTORE_SCHEMES = frozenset({"memory", "s3", "s3a", "gs", "az", "azure", "abfs", "abfss"})


def open_store(target: str, **options: Any) -> ObjectStore:
    """Open the store for a directory path, ``file://``, ``memory://``, ``s3://``, ``gs://``
    or ``az://`` URL.

    ``s3://bucket/prefix`` reads the usual AWS environment variables; the keyword options
    ``endpoint``, ``region``, ``access_key_id``, ``secret_access_key`` override them.
    ``memory://`` opens a new, empty store each time.

    Raises: BadRequest.
    """
    if not isinstance(target, str) or not target:
        raise BadRequest("a store target must be a non-empty path or URL", target=repr(target))
    scheme, sep, _ = target.partition("://")
    if not sep:
        return _open_local(target, target, options)
    scheme = scheme.lower()
    if scheme == "file":
        parts = urlsplit(target)
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise BadRequest("a file:// URL must be file:///absolute/path", target=target)
        return _open_local(unquote(parts.path), target, options)
    if scheme in _OBSTORE_SCHEMES:
        # Imported here so that the local default does not load obstore's native library.
        from actors.log.obstore_store import open_obstore

        return open_obstore(target, **options)
    raise BadRequest(
        f"unsupported store scheme {scheme!r}: use a directory path, file://, memory://, "
        "s3://, gs:// or az://",
        target=target,
    )


def _open_local(path: str, target: str, options: dict[str, Any]) -> LocalDirStore:
    unknown = sorted(set(options) - {"max_threads"})
    if unknown:
        raise BadRequest(f"options {unknown} do not apply to a local store", target=target)
    return LocalDirStore(path, **options)
