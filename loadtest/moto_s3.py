"""moto's S3 server with conditional writes as atomic as S3's.

S3 decides an ``If-None-Match: *`` put (or multipart completion) atomically: of writers
racing for an absent key, exactly one wins. moto checks for the key and writes it in two
steps of a threaded server, so two racing writers can both win (seen in
``tests/unit/log/test_store.py``'s race, once in a few thousand runs). evq fences a shard's
incarnations with such puts, so the stand-in must not be weaker than the real thing:
:func:`atomic_conditional_writes` makes moto write keys one request at a time, in this
process. The tests call it before starting moto's ``ThreadedMotoServer``; the load tools run
``python loadtest/moto_s3.py -H 127.0.0.1 -p PORT`` instead of ``moto_server``.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["atomic_conditional_writes"]

_LOCK = threading.RLock()
_PATCHED = "_evq_atomic"


def _serialized(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return method(*args, **kwargs)

    setattr(locked, _PATCHED, True)
    return locked


def atomic_conditional_writes() -> None:
    """Make moto's S3 write keys (puts, copies, multipart completions) one at a time, so a
    conditional write's check and write are one step (idempotent)."""
    from moto.s3.responses import S3Response

    for name in ("_key_response_put", "_key_response_post"):
        method = getattr(S3Response, name)
        if not getattr(method, _PATCHED, False):
            setattr(S3Response, name, _serialized(method))


def main(argv: list[str]) -> None:
    """``moto_server``'s command line, with :func:`atomic_conditional_writes`."""
    from moto.server import main as moto_main

    atomic_conditional_writes()
    moto_main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
