"""A queue's counts over the last hour, a sample a minute (the console's chart of a queue:
``GET /v1/queues/{name}/history``). Pure: no I/O, no clock of its own.

The queue actor notes its counts after a commit at most every ``NOTE_EVERY_MS`` (the other
commits cost it one comparison); a note replaces the sample of its minute, so a minute's
sample holds the counts after its last noted commit, at most ``NOTE_EVERY_MS`` older than
its last commit. A minute without a commit has no sample: its counts did not change (time
alone moves delayed messages to ready and expired leases back, so a chart may lag those by
up to a minute). :meth:`History.view` gives the samples of the last ``KEEP`` minutes, and
the counts now as a last one.

A fixed ring of ``KEEP`` minutes in one array of 64-bit integers: 2.9 KB a queue, made at
its first change. It lives in the actor, not in the queue's state: it is neither logged nor
snapshotted, so a restart or a move to another shard starts it again.
"""

from __future__ import annotations

from array import array

import msgspec

__all__ = ["KEEP", "MINUTE_MS", "NOTE_EVERY_MS", "History", "Sample"]

MINUTE_MS = 60_000
KEEP = 60  # minutes
NOTE_EVERY_MS = 5_000  # how often a busy queue's commits note its counts, at most
_FIELDS = 6  # minute, ready, delayed, reserved, enqueued, acked


class Sample(msgspec.Struct, array_like=True, frozen=True):
    """The counts at ``at_ms``: gauges, and the totals put and acked so far (their
    differences are the rates)."""

    at_ms: int
    ready: int
    delayed: int
    reserved: int
    enqueued: int
    acked: int


class History:
    """The last ``KEEP`` minutes' samples of one queue (see the module docstring)."""

    __slots__ = ("_data", "_last", "_minute", "_n")

    def __init__(self) -> None:
        self._data = array("q", bytes(8 * KEEP * _FIELDS))
        self._last = -1  # the ring's slot of the newest sample
        self._n = 0  # samples held
        self._minute = -1  # the newest sample's minute
        # a note within the newest sample's minute overwrites it; a later one takes a slot

    def note(
        self, now_ms: int, ready: int, delayed: int, reserved: int, enqueued: int, acked: int
    ) -> None:
        """The counts after a change at ``now_ms`` (a clock going back writes into the
        newest minute: samples stay in time order)."""
        minute = now_ms // MINUTE_MS
        if minute > self._minute:
            self._minute = minute
            self._last = (self._last + 1) % KEEP
            self._n = min(self._n + 1, KEEP)
        base = self._last * _FIELDS
        data = self._data
        data[base] = now_ms
        data[base + 1] = ready
        data[base + 2] = delayed
        data[base + 3] = reserved
        data[base + 4] = enqueued
        data[base + 5] = acked

    def view(self, now: Sample) -> list[Sample]:
        """The samples of the minutes that ended less than ``KEEP`` minutes before
        ``now.at_ms``, oldest first, and ``now`` last."""
        floor = now.at_ms // MINUTE_MS - KEEP
        out = []
        data = self._data
        for k in range(self._n):
            base = ((self._last - self._n + 1 + k) % KEEP) * _FIELDS
            at = data[base]
            if at // MINUTE_MS > floor and at <= now.at_ms:
                out.append(Sample(*data[base : base + _FIELDS]))
        out.append(now)
        return out
