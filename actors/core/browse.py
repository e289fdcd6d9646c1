"""Browsing: the messages of one state, a page at a time, read from the state's own indexes.

Order. Each state lists its messages by a key of (time, arrival sequence):

- ``ready``: (activation time, arrival): the order ``take`` hands them out in a standard
  queue (a FIFO queue's take also keeps group runs together and skips blocked groups; its
  ready messages are listed in the same (activation time, arrival) order);
- ``delayed``: (activation time, arrival): the order in which they become ready;
- ``reserved``: (lease expiry, arrival): the order in which their leases run out.

Cursor. A page's ``next`` names the key of its last message (``"ready.<ms>.<seq>"``;
clients treat it as opaque); the next page lists the messages of that state whose key is
greater. So, while a client pages through a queue that changes meanwhile, a message that
stays in the state with the same key is listed exactly once, whatever else comes and
goes. A message whose key changes meanwhile — a touch moves its lease expiry, a
release or an update gives it a new activation time — is as one that left and came back:
listed (again) if its new key lies ahead of the cursor, not if it lies behind. ``next`` is
None when no message follows the page at the time of the call (later arrivals with
greater keys are found by browsing again from the last cursor).

A page holds up to ``limit`` messages and at most :data:`PAGE_BYTES` of bodies, but always
at least one message (a message may be 64 MiB).

Cost: nothing is indexed for browsing (commands that change messages pay nothing for it).
A page walks the state's heap from its root in key order, O((d + limit) log n) for a page
at depth d (the entries before the cursor, stale ones included): the first pages are cheap
(~0.5 ms for 100 messages of a million). Deep in a long queue, a scan of every message is
cheaper: once the walk has taken as long as a scan would, the page scans instead, so a page
costs at most about two scans (~0.15 µs a message here: ~75 ms per page deep in a queue of
500k; the shard serves nothing else meanwhile). A FIFO queue's ready messages have no
complete heap (only group heads are offered to take), nor does a fair queue's (each
group's ready messages have a heap of their own, fair.py): their pages always scan.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable
from itertools import islice

from actors.core.state import DELAYED, READY, RESERVED, QueuedMessage, QueueState
from actors.errors import BadRequest
from actors.settings import MAX_BATCH

__all__ = ["PAGE_BYTES", "STATES", "cursor_of", "page", "walk_budget"]

PAGE_BYTES = 8 * 1024 * 1024
# A step of the heap walk costs about as much as scanning this many messages (measured:
# ~3.6 µs against ~0.15 µs).
SCAN_RATIO = 24
STATES = {"ready": READY, "delayed": DELAYED, "reserved": RESERVED}

Key = tuple[int, int]
_HEAPS: dict[int, Callable[[QueueState], list[tuple[int, int, QueuedMessage]]]] = {
    READY: lambda s: s.ready,
    DELAYED: lambda s: s.delayed,
    RESERVED: lambda s: s.reserved,
}

_CURSOR = re.compile(r"(ready|delayed|reserved)\.(\d{1,19})\.(\d{1,19})")


def page(
    state: QueueState, which: object, limit: object, after: object
) -> tuple[list[QueuedMessage], str | None]:
    """The messages in state ``which`` after cursor ``after``, up to ``limit`` (and
    :data:`PAGE_BYTES`), in the state's order; and the cursor of the next page (None: no
    message follows now).

    Raises:
        BadRequest: an unknown state, a limit outside 1-1000, a malformed cursor, or a
            cursor of another state's listing.
    """
    code = STATES.get(which) if isinstance(which, str) else None
    if code is None:
        raise BadRequest("state must be ready, delayed or reserved")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BATCH:
        raise BadRequest(f"limit must be 1-{MAX_BATCH}")
    start = _parse(after, str(which))
    found: list[QueuedMessage] = []
    size = 0
    for m in _ordered(state, code, start, limit + 1):
        if len(found) == limit or (found and size + len(m.body) > PAGE_BYTES):
            return found, cursor_of(found[-1])
        found.append(m)
        size += len(m.body)
    return found, None


def cursor_of(m: QueuedMessage) -> str:
    """The cursor after message ``m`` in the listing of its state."""
    name = "reserved" if m.state == RESERVED else "ready" if m.state == READY else "delayed"
    return f"{name}.{_key(m)[0]}.{m.seq}"


def _key(m: QueuedMessage) -> Key:
    return (m.deadline_ms if m.state == RESERVED else m.activate_at_ms, m.seq)


def _parse(after: object, which: str) -> Key | None:
    """The key a cursor names.

    Raises:
        BadRequest: not a cursor, or one of another state's listing.
    """
    if after is None:
        return None
    found = _CURSOR.fullmatch(after) if isinstance(after, str) else None
    if found is None:
        raise BadRequest("after must be the 'next' cursor of an earlier page")
    if found.group(1) != which:
        raise BadRequest(f"the cursor belongs to a listing of {found.group(1)}, not {which}")
    return int(found.group(2)), int(found.group(3))


def _ordered(state: QueueState, code: int, after: Key | None, want: int) -> list[QueuedMessage]:
    """The first ``want`` messages in state ``code`` with a key greater than ``after``, in
    key order: from the state's heap while few entries lie before the cursor, else (deep in
    a long heap, or a FIFO queue's ready messages) from a scan of every message."""
    found = None
    if not (code == READY and (state.settings.fifo or state.fair is not None)):
        heap = _HEAPS[code](state)
        found = _walk(heap, code, after, want, walk_budget(state, want))
    if found is None:
        found = _scan(state, code, after, want)
    # messages held in runs (runs.py), ready or delayed, in the same key order: merged in
    if code == READY and state.grouped:
        runs = state.grouped_after(after)  # a FIFO queue's runs (never ready ones as well)
    elif code == READY and state.spilled:
        runs = state.spilled_after(after)
    elif code == DELAYED and (state.deferred or (state.grouped and state.later)):
        runs = state.deferred_after(after)
    else:
        return found
    found = list(heapq.merge(found, islice(runs, want), key=_key))
    del found[want:]
    return found


def walk_budget(state: QueueState, want: int) -> int:
    """Steps a heap walk may take before a scan is the cheaper way to a page (so a page
    costs at most about two scans of the queue's messages)."""
    return 4 * want + len(state.messages) // SCAN_RATIO


def _walk(
    heap: list[tuple[int, int, QueuedMessage]], code: int, after: Key | None, want: int, budget: int
) -> list[QueuedMessage] | None:
    """The first ``want`` valid entries of a lazy heap past ``after``, in key order, each
    message once; None when that takes more than ``budget`` steps.

    Best-first from the root: the smallest unvisited entry is always a child of one visited,
    so a frontier of (key, index) yields the heap in order without changing it. Entries up
    to ``after`` are passed over (their children may lie past it); an entry is valid while
    its message is in ``code`` with that time (see state.py: heaps are lazy)."""
    found: list[QueuedMessage] = []
    if not heap:
        return found
    reserved = code == RESERVED
    size = len(heap)
    frontier = [(heap[0][0], heap[0][1], 0)]
    last = after
    while frontier and len(found) < want:
        budget -= 1
        if budget < 0:
            return None
        t, seq, i = heapq.heappop(frontier)
        for child in (2 * i + 1, 2 * i + 2):
            if child < size:
                entry = heap[child]
                heapq.heappush(frontier, (entry[0], entry[1], child))
        if last is not None and (t, seq) <= last:
            continue  # before the cursor, or a second entry of a message just listed
        m = heap[i][2]
        if m.state == code and (m.deadline_ms if reserved else m.activate_at_ms) == t:
            last = (t, seq)
            found.append(m)
    return found


def _scan(state: QueueState, code: int, after: Key | None, want: int) -> list[QueuedMessage]:
    """The first ``want`` messages in state ``code`` past ``after``, by a scan of them all."""
    if code == RESERVED:
        keyed = ((m.deadline_ms, m.seq, m) for m in state.messages.values() if m.state == code)
    else:
        keyed = ((m.activate_at_ms, m.seq, m) for m in state.messages.values() if m.state == code)
    if after is not None:
        keyed = (e for e in keyed if (e[0], e[1]) > after)
    # Keys are unique (seq), so the tuples never compare their messages.
    return [e[2] for e in heapq.nsmallest(want, keyed)]
