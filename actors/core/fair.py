"""Fair queues: a standard queue's ready messages handed out turn by turn across their groups.

A queue with ``fair`` set keeps each group's ready messages in a heap of their own (by
activation time, then arrival), not in the queue's ready heap: that one keeps the messages
without a group, which (with the spilled ones of runs.py) are each a tenant of their own,
as in SQS.

Take order. Whoever has a ready message — a group, or one message without a group — has a
key ``(last, activation time, seq)`` of its first ready message, where ``last`` is the turn
at which the group was last served. A take hands out the first message of whoever has the
smallest key, again and again, and a group it serves gets the next turn as its ``last``. So
groups with a backlog take turns, one message each, oldest first within a group; a group
that comes back (one with no ready message until now: ``last`` is 0 again), and a message
without a group (always 0), go before every group served meanwhile. One tenant with 99 % of
the backlog gets one message in as many as there are tenants with messages ready.

``turn`` counts the grouped messages taken. Both it and each group's ``last`` follow from
the events (``MessagesTaken`` sets them, a message that becomes ready in an empty group
clears its group's), so a state rebuilt from the log or restored from a snapshot (which
keeps them) hands out the same order. A group with no ready message is as one never seen,
so it may be forgotten whenever it is found empty.

Heaps are lazy, as the state's others: a group's entry is valid while its message is ready
at that time. ``order`` holds ``(last, activation, seq, group)`` for every group with ready
messages, valid while the group has that ``last`` and that first message; one whose first
message left is mended when it surfaces (a message that becomes a group's first pushes one).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

__all__ = ["Fair", "FairGroup", "FairOrder"]

READY = 1  # state.READY (state.py imports this module, not the other way round)


class FairMessage(Protocol):
    """What this module reads of a ``state.QueuedMessage``."""

    state: int
    activate_at_ms: int
    seq: int
    group: str | None


M = TypeVar("M", bound=FairMessage)
_SLACK = 4096


def _valid(entry: tuple[int, int, M]) -> bool:
    m = entry[2]
    return m.state == READY and m.activate_at_ms == entry[0]


class FairGroup(Generic[M]):
    """One group's ready messages (a heap of entries) and the turn it was last served at."""

    __slots__ = ("heap", "last", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.heap: list[tuple[int, int, M]] = []
        self.last = 0

    def __lt__(self, other: object) -> bool:
        """Entries of ``order`` may tie on their numbers (a group's second entry for the same
        first message): never ordered by the group itself."""
        return False


class Fair(Generic[M]):
    """A fair queue's groups, the order they are served in, and the turns taken so far."""

    __slots__ = ("entries", "groups", "order", "turn")

    def __init__(self, turn: int = 0) -> None:
        self.groups: dict[str, FairGroup[M]] = {}
        self.order: list[tuple[int, int, int, FairGroup[M]]] = []
        self.turn = turn
        self.entries = 0  # entries in the groups' heaps, stale ones too (at least)

    def push(self, m: M) -> None:
        """Ready message ``m`` (with a group) joins its group: first served if the group had
        no other ready message (its turn forgotten)."""
        name = m.group
        assert name is not None
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = FairGroup(name)
        heap = g.heap
        while heap and (heap[0][2] is m or not _valid(heap[0])):
            heapq.heappop(heap)  # an older entry of ``m`` itself counts as none
            self.entries -= 1
        if not heap:
            g.last = 0
        entry = (m.activate_at_ms, m.seq, m)
        heapq.heappush(heap, entry)
        self.entries += 1
        if heap[0] is entry:
            heapq.heappush(self.order, (g.last, entry[0], entry[1], g))

    def head(self, g: FairGroup[M]) -> M | None:
        """``g``'s first ready message (None: it has none), stale entries dropped on the way."""
        heap = g.heap
        while heap and not _valid(heap[0]):
            heapq.heappop(heap)
            self.entries -= 1
        return heap[0][2] if heap else None

    def served(self, names: list[str]) -> None:
        """The grouped messages of a take, in its order, left their groups: each group
        served takes the next turn."""
        groups = self.groups
        seen: dict[str, FairGroup[M]] = {}
        for name in names:
            g = groups.get(name)
            if g is not None:
                self.turn += 1
                g.last = self.turn
                seen[name] = g
        for name, g in seen.items():
            h = self.head(g)
            if h is None:
                del groups[name]
            else:
                heapq.heappush(self.order, (g.last, h.activate_at_ms, h.seq, g))

    def oldest(self) -> int | None:
        """The earliest activation time of a grouped ready message."""
        oldest = None
        for g in self.groups.values():
            h = self.head(g)
            if h is not None and (oldest is None or h.activate_at_ms < oldest):
                oldest = h.activate_at_ms
        return oldest

    def ready(self) -> Iterator[M]:
        """Every grouped ready message, once each (in no order)."""
        seen: set[int] = set()
        for g in self.groups.values():
            for entry in g.heap:
                m = entry[2]
                if _valid(entry) and m.seq not in seen:
                    seen.add(m.seq)
                    yield m

    def lasts(self) -> list[tuple[str, int]]:
        """``(group, last)`` of each group with ready messages that was served, by name (what a
        snapshot keeps)."""
        return sorted(
            (g.name, g.last) for g in self.groups.values() if g.last and self.head(g) is not None
        )

    def rebuild(self, ready: list[M], lasts: dict[str, int]) -> None:
        """The groups of the grouped ready messages ``ready``, their ``last`` turns from
        ``lasts`` (0 for the others)."""
        groups: dict[str, FairGroup[M]] = {}
        seen: set[int] = set()
        for m in ready:
            if m.seq in seen:
                continue
            seen.add(m.seq)
            name = m.group
            assert name is not None
            g = groups.get(name)
            if g is None:
                g = groups[name] = FairGroup(name)
                g.last = lasts.get(name, 0)
            g.heap.append((m.activate_at_ms, m.seq, m))
        order = []
        for g in groups.values():
            heapq.heapify(g.heap)
            h = g.heap[0]
            order.append((g.last, h[0], h[1], g))
        heapq.heapify(order)
        self.groups, self.order, self.entries = groups, order, len(seen)

    def maybe_sweep(self, n_ready: int) -> None:
        """Sweep stale entries once they outnumber the ready messages."""
        if self.entries > 2 * n_ready + _SLACK or len(self.order) > 2 * len(self.groups) + _SLACK:
            self.rebuild(list(self.ready()), {g.name: g.last for g in self.groups.values()})


class FairOrder(Generic[M]):
    """A take's walk of a fair queue's ready messages in take order, merging ``plain`` (the
    messages without a group, in their own order: entry and message, the entry popped from
    ``plain_heap``, or None for a spilled one) with the groups' turns. Yields ``(heap, entry,
    message)``: the heap the entry was popped from (None: no entry), for the caller to put
    back what it does not take. The turns are the take's own until its event is applied:
    :meth:`finish` puts back what the walk drew and the take does not hand out."""

    __slots__ = ("fair", "pending", "plain", "plain_heap", "popped")

    def __init__(
        self,
        fair: Fair[M],
        plain: Iterator[tuple[tuple[int, int, M] | None, M]],
        plain_heap: list[tuple[int, int, M]],
    ) -> None:
        self.fair = fair
        self.plain = plain
        self.plain_heap = plain_heap
        self.popped: list[tuple[int, int, int, FairGroup[M]]] = []
        # the next message without a group, drawn from ``plain`` and not yielded yet
        self.pending: tuple[tuple[int, int, M] | None, M] | None = None

    def __iter__(
        self,
    ) -> Iterator[tuple[list[tuple[int, int, M]] | None, tuple[int, int, M] | None, M]]:
        order = self.fair.order
        pop, push = heapq.heappop, heapq.heappush
        # groups this take served: (its turn, its next message, the group)
        again: list[tuple[int, int, int, FairGroup[M]]] = []
        served: set[int] = set()
        picked: set[int] = set()  # seqs of grouped messages taken
        turn = self.fair.turn
        plain = self.pending = next(self.plain, None)
        while True:
            best = self._best(served)
            nxt = best
            if again and (nxt is None or again[0][:3] < nxt[:3]):
                nxt = again[0]
            if plain is not None and (
                nxt is None or (0, plain[1].activate_at_ms, plain[1].seq) < nxt[:3]
            ):
                entry, m = plain
                self.pending = None
                yield (None if entry is None else self.plain_heap), entry, m
                plain = self.pending = next(self.plain, None)
                continue
            if nxt is None:
                return
            g = nxt[3]
            if nxt is best:
                self.popped.append(pop(order))
                served.add(id(g))
            else:
                pop(again)
            heap = g.heap
            entry = pop(heap)
            picked.add(entry[1])
            turn += 1
            yield heap, entry, entry[2]
            while heap and (not _valid(heap[0]) or heap[0][1] in picked):
                pop(heap)  # stale, or a second entry of a message taken
            if heap:
                push(again, (turn, heap[0][0], heap[0][1], g))

    def _best(self, served: set[int]) -> tuple[int, int, int, FairGroup[M]] | None:
        """The first valid entry of ``order`` for a group the walk has not served (left at
        the top), stale ones dropped and those whose first message left mended."""
        fair = self.fair
        order, groups = fair.order, fair.groups
        pop = heapq.heappop
        while order:
            last, act, seq, g = order[0]
            if id(g) in served:
                self.popped.append(pop(order))  # a second entry of a group served
                continue
            if groups.get(g.name) is not g or g.last != last:
                pop(order)  # stale
                continue
            h = fair.head(g)
            if h is None:
                pop(order)
                del groups[g.name]  # as one never seen
                continue
            if h.activate_at_ms != act or h.seq != seq:  # its first message left
                heapq.heapreplace(order, (last, h.activate_at_ms, h.seq, g))
                continue
            return order[0]
        return None

    def finish(self, consume: bool, refused: M | None = None) -> None:
        """After the walk: the message without a group drawn but not yielded goes back to
        its heap, and the groups' entries taken from ``order`` go back: all of them unless
        ``consume`` (the take's event, applied next, gives the groups served their turns and
        entries anew), else those of the group of ``refused``, the message yielded last and
        not taken (the walk served it, the take does not)."""
        if self.pending is not None and self.pending[0] is not None:
            heapq.heappush(self.plain_heap, self.pending[0])
        self.pending = None
        order = self.fair.order
        if not consume:
            for entry in self.popped:
                heapq.heappush(order, entry)
        elif refused is not None and refused.group is not None:
            for entry in self.popped:
                if entry[3].name == refused.group:
                    heapq.heappush(order, entry)
        self.popped = []
