"""Clocks: the only module that reads time. The core takes ``now_ms`` as an argument."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """A source of wall-clock time in integer milliseconds."""

    def now_ms(self) -> int:
        """Current time in Unix milliseconds."""
        ...


class SystemClock:
    """Wall-clock time that never goes backwards within one process."""

    def __init__(self) -> None:
        self._last = 0

    def now_ms(self) -> int:
        """Current Unix time in ms, clamped to be monotonic."""
        now = time.time_ns() // 1_000_000
        if now < self._last:
            return self._last
        self._last = now
        return now


class ManualClock:
    """A clock the tests move by hand."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        """The time set by the test."""
        return self._now

    def advance(self, delta_ms: int) -> int:
        """Move the clock forward by ``delta_ms`` and return the new time."""
        if delta_ms < 0:
            raise ValueError("a clock does not go backwards")
        self._now += delta_ms
        return self._now
