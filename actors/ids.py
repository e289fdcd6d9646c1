"""Production id source: time-ordered message ids and random lease tokens."""

from __future__ import annotations

import os
import random

from actors.core.ids import IdSource, SequentialIds

__all__ = ["IdSource", "RandomIds", "SequentialIds"]

_MASK63 = (1 << 63) - 1


class RandomIds:
    """Message ids ``now_ms << 20`` (sortable by creation time; the core adds 1 on collisions)
    and random 63-bit lease tokens."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random(os.urandom(16))

    def next_id(self, now_ms: int) -> int:
        """A candidate id from the clock."""
        return (now_ms << 20) & _MASK63

    def next_lease(self) -> int:
        """A random token in 1 .. 2**63-1."""
        return self._rng.getrandbits(63) or 1
