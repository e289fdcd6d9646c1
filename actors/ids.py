"""Id sources: where message ids and lease tokens come from.

The core asks an injected :class:`IdSource`; it never draws randomness itself. Ids and leases
are recorded in the events, so replay does not depend on the source.
"""

from __future__ import annotations

import os
import random
from typing import Protocol

__all__ = ["IdSource", "RandomIds", "SequentialIds"]

_MASK63 = (1 << 63) - 1


class IdSource(Protocol):
    """Makes server-assigned message ids and lease tokens."""

    def next_id(self, now_ms: int) -> int:
        """A candidate message id; the core makes ids strictly increasing per queue."""
        ...

    def next_lease(self) -> int:
        """A fresh lease token (positive int, hard to guess)."""
        ...


class RandomIds:
    """Production ids: time-ordered message ids and random 63-bit lease tokens."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random(os.urandom(16))

    def next_id(self, now_ms: int) -> int:
        """``now_ms << 20``: ids sort by creation time; the core adds 1 on collisions."""
        return (now_ms << 20) & _MASK63

    def next_lease(self) -> int:
        """A random token in 1 .. 2**63-1."""
        return self._rng.getrandbits(63) or 1


class SequentialIds:
    """Deterministic ids for tests: 1, 2, 3 … and leases 1001, 1002, …"""

    def __init__(self) -> None:
        self._id = 0
        self._lease = 1000

    def next_id(self, now_ms: int) -> int:
        """The next integer."""
        self._id += 1
        return self._id

    def next_lease(self) -> int:
        """The next lease number."""
        self._lease += 1
        return self._lease
