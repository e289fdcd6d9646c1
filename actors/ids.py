"""Production id source: time-ordered message ids and random lease tokens."""

from __future__ import annotations

import os
import random

from actors.core.ids import IdSource, SequentialIds

__all__ = ["IdSource", "RandomIds", "SequentialIds"]

_MASK63 = (1 << 63) - 1


class RandomIds:
    """Message ids ``now_ms << 20`` plus a random offset below ``2**19`` (sortable by creation
    time to the millisecond; the core adds 1 on collisions within a queue), and random 63-bit
    lease tokens. The offset makes two queues' ids of the same millisecond differ, so a
    message moved between queues (dead letters, redrives) almost always keeps its id."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random(os.urandom(16))

    def next_id(self, now_ms: int) -> int:
        """A candidate id from the clock."""
        return ((now_ms << 20) | self._rng.getrandbits(19)) & _MASK63

    def next_lease(self) -> int:
        """A random token in 1 .. 2**63-1."""
        return self._rng.getrandbits(63) or 1
