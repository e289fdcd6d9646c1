"""The id source the core is given, and a deterministic one for tests and replays.

The core never draws randomness: server-assigned message ids and lease tokens come from an
injected :class:`IdSource` and are written into the events.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["IdSource", "SequentialIds"]


class IdSource(Protocol):
    """Makes server-assigned message ids and lease tokens."""

    def next_id(self, now_ms: int) -> int:
        """A candidate message id; the core makes ids strictly increasing per queue."""
        ...

    def next_lease(self) -> int:
        """A fresh lease token (positive int, hard to guess)."""
        ...


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
