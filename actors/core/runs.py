"""Runs: the messages of one put held as one object, their bodies in the log.

Most messages of a deep queue are put ready (no delay, no group) with server ids, and sit
untouched until a take reaches them; many others are put in batches all due at one later
time, and sit untouched until then (a *delayed* run: ``act``, ``waiting``; QueueState keeps
it apart until its time, then it joins the ready runs whole). A state that *spills*
(``QueueState.spill``, set by a shell that can read its log back) holds such a put as one
:class:`Run` instead of one :class:`~actors.core.state.QueuedMessage` per message: the
messages' arrival sequences and times follow from the run's first ones, their ids too
when they are consecutive (else 8 bytes each: server ids are drawn from the clock with a
random part, and increase), and their bodies (and attributes, if any) stay in the log
once the put is durable (the shell *places* the run: it tells the state where the put's
record is, and the inline contents go). A slot of a run costs the 2 bytes of its body's
length (4 for a body of 64 KiB or more), and its id's 8 if ids are not consecutive.

A slot leaves its run — is *materialized* into a ``QueuedMessage``, body read back through
the state's reader — only when an event changes it (a take, an update, a delete); reads
(peek, browse, a take being decided) see a transient ``QueuedMessage`` built on the fly.
Takes reach runs in order, so the slots still spilled are almost always a suffix of each
run: ``next`` is the first slot not yet materialized, and ``out`` the few slots after it
that were materialized out of order.

Pure: the reader is a function the shell gives the state; nothing here does I/O.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Any, NamedTuple, Protocol, cast

import msgspec
import numpy as np

from actors.core.events import BodiesMoved

__all__ = [
    "BodyReader",
    "Contents",
    "LoanRecord",
    "Patches",
    "Run",
    "RunRecord",
    "moved_contents",
]

Attributes = dict[str, Any]


class Contents(NamedTuple):
    """What a put's record holds of its messages beyond the index: every body, in order,
    and every message's attributes (``attrs`` None: no message of the put has any)."""

    bodies: list[bytes]
    attrs: list[Attributes | None] | None = None


def moved_contents(moved: BodiesMoved, i: int) -> Contents:
    """The contents of the run ``moved`` wrote ``i``-th, as its put held them: the slots
    before the record's first for it blank (``b""``, no attributes: taken before, never
    read again)."""
    start = moved.firsts[i]
    attrs = moved.attributes[i] if moved.attributes else None
    blank: list[Attributes | None] = [None] * start
    return Contents([b""] * start + moved.bodies[i], None if attrs is None else blank + attrs)


# Reads the contents of a placed run: every body (and attributes) of its put, in order,
# given the place the shell gave (opaque to the engine: a segment, an offset in it, ...).
BodyReader = Callable[[Any], Contents]


class _Materialized(Protocol):
    """A message materialized out of a run (a ``state.QueuedMessage``: state.py imports
    this module, not the other way round)."""

    state: int


class RunRecord(msgspec.Struct, array_like=True, gc=False):
    """A run as a snapshot holds it. Fields are only ever appended."""

    seq: int
    id: int
    at_ms: int
    count: int
    next: int
    out: list[int]
    lengths: bytes  # the bodies' lengths, 4 bytes each, little-endian
    place: Any = None  # where the put's bodies are in the log (None: they are in ``bodies``)
    bodies: list[bytes] | None = None
    ids: bytes = b""  # each slot's id, 8 bytes little-endian; empty: id, id + 1, ...
    act: int = 0  # when its messages are ready, if later than their put (``at_ms``); 0: then
    acts: bytes = b""  # each slot's own activation time, 8 bytes little-endian (a spread run)
    with_attrs: bool = False  # its messages carry attributes (in the log with the bodies)
    attrs: list[Attributes | None] | None = None  # with ``bodies``: each message's attributes
    # A spread run as it is held (written instead of ``acts``: restored without a sort):
    base: int = 0  # its first time
    times: bytes = b""  # each slot's time less ``base``, 4 bytes little-endian (8 if wider)
    order: bytes = b""  # its slots in time order, 2 bytes little-endian (4 past 65,536)
    # the first slot whose body its place holds (a compaction wrote the slots from there on
    # again); -1: not written (an older snapshot): its ``next``, which is at or past it
    floor: int = -1
    # A FIFO queue's run: its groups' names, a msgpack array of them in bytes (one object,
    # not one a name: a restore makes each name once), and each slot's group, an index into
    # them (2 bytes little-endian); empty: not a FIFO run
    groups: bytes = b""
    group_of: bytes = b""
    # A client-id queue's run (``id`` is then 0): its ids' UTF-8 one after another, and where
    # each ends there (4 bytes little-endian); empty: server ids
    client_ids: bytes = b""
    id_ends: bytes = b""
    # ids all of one UTF-8 length (the common case: UUIDs, hex): that length, and no ends
    id_width: int = 0
    # Bodies updates changed (Patches): ``[slot, place]`` once the update's record is
    # placed, ``[slot, None, body]`` before; None: none
    patches: list[list[Any]] | None = None

    def malformed(self) -> str | None:
        """What is wrong with the record's arrays, if anything (a damaged snapshot)."""
        n = self.count
        if n < 1 or len(self.lengths) != 4 * n or len(self.ids) not in (0, 8 * n):
            return f"a run of {n} with {len(self.lengths)} bytes of lengths"
        if len(self.acts) not in (0, 8 * n):
            return f"a run of {n} with {len(self.acts)} bytes of times"
        if self.times and (
            len(self.times) not in (4 * n, 8 * n) or len(self.order) not in (2 * n, 4 * n)
        ):
            return f"a spread run of {n} with {len(self.times)} bytes of times"
        if any(not self.next < i < n for i in self.out) or not 0 <= self.next <= n:
            return f"a run of {n} with slots {self.out[:8]} out past {self.next}"
        if self.bodies is not None and len(self.bodies) != n:
            return f"a run of {n} with {len(self.bodies)} bodies"
        if self.attrs is not None and len(self.attrs) != n:
            return f"a run of {n} with {len(self.attrs)} attributes"
        if not all(_patch_fits(p, n) for p in self.patches or ()):
            return f"a run of {n} with malformed patches"
        if self.group_of:
            names = group_names(self.groups)
            if (
                names is None
                or len(self.group_of) != 2 * n
                or int(np.frombuffer(self.group_of, "<u2").max()) >= len(names)
            ):
                return f"a FIFO run of {n} with {len(self.group_of)} bytes of groups"
        return self._ids_malformed(n)

    def _ids_malformed(self, n: int) -> str | None:
        """:meth:`malformed` for a client-id run's packed ids."""
        if self.id_width and (self.id_ends or len(self.client_ids) != n * self.id_width):
            return f"a run of {n} with {len(self.client_ids)} bytes of ids {self.id_width} wide"
        if self.id_ends:
            ends = _little(_frombytes("I", self.id_ends)) if len(self.id_ends) == 4 * n else None
            if (
                ends is None
                or ends[-1] != len(self.client_ids)
                or any(b <= a for a, b in zip([0, *ends], ends, strict=False))
            ):
                return f"a run of {n} with {len(self.id_ends)} bytes of client id ends"
        return None


def _patch_fits(entry: Any, n: int) -> bool:
    """Whether ``entry`` is a patch of a run of ``n`` as RunRecord.patches holds them:
    ``[slot, place]`` (a place of five) or ``[slot, None, body]``."""
    if not isinstance(entry, list) or len(entry) not in (2, 3):
        return False
    slot, place = entry[0], entry[1]
    if type(slot) is not int or not 0 <= slot < n:
        return False
    if len(entry) == 3:
        return place is None and isinstance(entry[2], bytes)
    return (
        isinstance(place, list)
        and len(place) == 5
        and isinstance(place[0], str)
        and all(type(v) is int and 0 <= v < 1 << 63 for v in place[1:])
    )


class LoanRecord(msgspec.Struct, array_like=True, gc=False):
    """A return run (:meth:`Run.lend`) as a snapshot holds it: the run it lends from (its
    index in the snapshot's ``runs``), its slots there (``off``, ``count``), and what it
    adds to them."""

    run: int
    off: int
    count: int
    next: int
    out: list[int]
    act: int
    receive_count: int
    first_taken_ms: int
    # A scattered return run (``Run.scatter``; ``off``, ``next``, ``rc`` and ``first`` 0, and
    # ``out`` empty): each of its ``count`` messages' slot in the run (4 bytes
    # little-endian), time (8), receive count (4) and first take (8, ms)
    slots: bytes = b""
    times: bytes = b""
    receive_counts: bytes = b""
    first_takes: bytes = b""

    def malformed(self, runs: Sequence[RunRecord]) -> str | None:
        """What is wrong with the record against the snapshot's ``runs``, if anything."""
        n = self.count
        if not 0 <= self.run < len(runs) or n < 1 or self.off < 0:
            return f"a return run of {n} from run {self.run} of {len(runs)}"
        if self.slots:
            if (
                len(self.slots) != 4 * n
                or len(self.times) != 8 * n
                or len(self.receive_counts) != 4 * n
                or len(self.first_takes) != 8 * n
                or self.next
                or self.out
                or max(slots := _little(_frombytes("I", self.slots))) >= runs[self.run].count
                or len(set(slots)) != n  # one slot held twice: one message in two places
            ):
                return f"a scattered return run of {n} from a run of {runs[self.run].count}"
            return None
        if self.off + n > runs[self.run].count or not 0 <= self.next <= n:
            return f"a return run of {n} at slot {self.off} of a run of {runs[self.run].count}"
        if any(not self.next < i < n for i in self.out):
            return f"a return run of {n} with slots {self.out} out"
        return None


class Patches:
    """The bodies updates changed, of slots of one put's run (by slot in the put): each
    held in memory until the update's record is durable, then as that record's place in
    the log (the shell places it, as a put's), in arrays: 8 bytes for the segment's name
    (shared) and 36 for where (block offset and length, record number, block LSN) and
    which slot, instead of a message object. The run's contents are read with them
    (``QueueState.contents_of``); a compaction that writes the run's bodies again writes
    the changed ones, and they go (``QueueState._apply_moved``)."""

    __slots__ = ("held", "lens", "lsns", "offs", "segs", "seqs", "slots", "tokens")

    def __init__(self) -> None:
        self.held: dict[int, bytes] = {}  # not placed yet
        # the update each held one waits to be placed by (a number the state gives each
        # update: a body's identity would not do, CPython shares b"" and one-byte bodies)
        self.tokens: dict[int, int] = {}
        self.slots = array("I")
        self.segs: list[Any] = []
        self.offs = array("q")
        self.lens = array("q")
        self.seqs = array("q")
        self.lsns = array("q")

    def __len__(self) -> int:
        return len(self.held) + len(self.slots)

    def set(self, i: int, body: bytes, token: int) -> None:
        """Slot ``i``'s body is ``body`` now, by update ``token`` (held until :meth:`place`)."""
        self._unplace(i)
        self.held[i] = body
        self.tokens[i] = token

    def place(self, i: int, token: int, place: Sequence[Any]) -> None:
        """Update ``token``, which changed slot ``i``'s body, is durable at ``place``: read
        from there from now on (unless a later update, or a move, replaced it)."""
        if self.tokens.get(i) != token:
            return
        del self.held[i], self.tokens[i]
        self._append(i, place)

    def drop(self, i: int) -> None:
        """Slot ``i``'s message is gone: its body is never read again."""
        self._unplace(i)
        self.held.pop(i, None)
        self.tokens.pop(i, None)

    def _append(self, i: int, place: Sequence[Any]) -> None:
        self.slots.append(i)
        self.segs.append(place[0])
        self.offs.append(place[1])
        self.lens.append(place[2])
        self.seqs.append(place[3])
        self.lsns.append(place[4])

    def _unplace(self, i: int) -> None:
        try:
            k = self.slots.index(i)
        except ValueError:
            return
        for column in (self.slots, self.segs, self.offs, self.lens, self.seqs, self.lsns):
            del column[k]

    def places(self) -> Iterator[tuple[int, tuple[Any, ...]]]:
        """``(slot, place)`` of the placed ones."""
        for k, i in enumerate(self.slots):
            yield i, (self.segs[k], self.offs[k], self.lens[k], self.seqs[k], self.lsns[k])

    def bodies(self, read: BodyReader | None) -> Iterator[tuple[int, bytes]]:
        """``(slot, body)`` of each, placed ones read back through ``read``."""
        yield from self.held.items()
        for i, place in self.places():
            if read is None:
                raise RuntimeError("a placed patch, and no reader to read its body")
            yield i, read(place).bodies[0]

    def inline(self, read: Callable[[tuple[Any, ...]], bytes]) -> None:
        """Hold every body in memory again (``read``: a placed one's body)."""
        for i, place in list(self.places()):
            self.held[i] = read(place)  # no token: never placed again
            self._unplace(i)

    def record(self) -> list[list[Any]]:
        return [[i, list(place)] for i, place in self.places()] + [
            [i, None, body] for i, body in self.held.items()
        ]

    @classmethod
    def from_record(cls, entries: list[list[Any]]) -> Patches:
        patches = cls()
        for entry in entries:
            if entry[1] is None:
                patches.held[entry[0]] = entry[2]
            else:
                place = entry[1]
                patches._append(entry[0], [sys.intern(place[0]), *place[1:]])
        return patches


class Slots:
    """A set of slot numbers below a run's count, as a bitmap (1 bit a slot, made at the
    first add): a spread run hands its slots out in time order, not slot order, and a set
    of ints would cost ~50 B for each one handed out until the run is done."""

    __slots__ = ("bits", "n")

    def __init__(self, slots: Iterable[int] = ()) -> None:
        self.bits: bytearray | None = None
        self.n = 0
        for i in slots:
            self.add(i)

    def __contains__(self, i: int) -> bool:
        bits = self.bits
        return bits is not None and i >> 3 < len(bits) and bool(bits[i >> 3] >> (i & 7) & 1)

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __iter__(self) -> Iterator[int]:
        """The slots, in order."""
        bits = self.bits
        if bits is None or not self.n:
            return
        for byte_at, byte in enumerate(bits):
            if byte:
                for bit in range(8):
                    if byte >> bit & 1:
                        yield byte_at * 8 + bit

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Slots | set | frozenset):
            return set(self) == set(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def add(self, i: int) -> None:
        bits = self.bits
        if bits is None or i >> 3 >= len(bits):
            grown = bytearray(max(i >> 3, 15) + 1)
            if bits is not None:
                grown[: len(bits)] = bits
            self.bits = bits = grown
        if not bits[i >> 3] >> (i & 7) & 1:
            bits[i >> 3] |= 1 << (i & 7)
            self.n += 1

    def discard(self, i: int) -> None:
        if i in self:
            bits = self.bits
            assert bits is not None
            bits[i >> 3] &= ~(1 << (i & 7)) & 0xFF
            self.n -= 1

    def clear(self) -> None:
        self.bits, self.n = None, 0


class Run:
    """The messages of one put: ids ``id ..`` (increasing), arrival sequences ``seq ..``,
    all put at ``at_ms`` and ready at ``act`` (the same, or later: a *delayed* run, which is
    ``waiting`` until the state's clock reaches ``act``). Their bodies, and their attributes
    if they have any (``with_attrs``), are read back from the put's record.

    A *spread* run's slots each have a time of their own (``base`` plus ``acts``, all after
    the put): ``order`` lists its slots by time, ``woke`` how many of them have been
    reached, and ``act`` is the time of the next one. Its slots wake one time at a time, each
    materialized as a ready message; the run itself never becomes ready."""

    __slots__ = (
        "act",
        "acts",
        "at_ms",
        "attrs",
        "base",
        "bodies",
        "cends",
        "cids",
        "count",
        "cwidth",
        "first",
        "firsts",
        "floor",
        "gidx",
        "gnames",
        "id",
        "ids",
        "last_id",
        "left",
        "lengths",
        "lent",
        "loans",
        "mat",
        "next",
        "no",
        "off",
        "order",
        "out",
        "patches",
        "place",
        "rc",
        "rcs",
        "seq",
        "size",
        "slots",
        "src",
        "waiting",
        "with_attrs",
        "woke",
    )

    def __init__(
        self,
        seq: int,
        ids: list[int] | list[str],
        at_ms: int,
        bodies: list[bytes],
        act: int | None = None,
        acts: list[int] | None = None,
        attrs: list[Attributes | None] | None = None,
        groups: list[str] | None = None,
    ) -> None:
        self.seq = seq
        self.no = 0  # a client-id run's number in its state's list of them
        self.cids: bytes | None = None  # a client-id run's ids, packed (and where each ends,
        self.cends: array[int] | None = None  # unless they are all ``cwidth`` bytes long)
        self.cwidth = 0
        self.ids: array[int] | None = None
        if type(ids[0]) is str:
            packed = [str(mid).encode() for mid in ids]
            self.cids = b"".join(packed)
            width = len(packed[0])
            if len(self.cids) == width * len(packed) and all(len(p) == width for p in packed):
                self.cwidth = width
            else:
                self.cends = array("I", accumulate(len(p) for p in packed))
        else:
            ints = cast(list[int], ids)
            # consecutive ids (strictly increasing, so a span of count - 1) need no list
            self.ids = array("q", ints) if ints[-1] - ints[0] != len(ints) - 1 else None
        self.id: Any = ids[0]  # int, or a client id (str)
        self.last_id: Any = ids[-1]
        self.at_ms = at_ms
        self.act = at_ms if act is None else act
        self.waiting = False  # set by the state while the run is delayed
        self.acts: array[int] | None = None
        self.order: array[int] | None = None
        self.base = 0
        self.woke = 0
        if acts is not None:
            self._spread(acts)
        self.count = len(bodies)
        self.next = 0  # slots before it are materialized (or gone)
        self.out = Slots()  # slots at or after ``next`` materialized out of order
        self.left = self.count  # slots still spilled
        self.bodies: list[bytes] | None = bodies  # until placed
        # each message's attributes, until placed (None: none has any)
        self.attrs = attrs if attrs is not None and any(a is not None for a in attrs) else None
        self.with_attrs = self.attrs is not None
        self.place: Any = None
        self.lengths = _lengths([len(b) for b in bodies])
        self.size = sum(self.lengths)  # bytes of all its bodies
        # materialized messages still to be expired by retention with the run (the state's
        # arrival order holds the run, not them); gone ones are dropped from the front, and
        # swept by the state once they outnumber its live messages (QueueState._maybe_compact)
        self.mat: deque[_Materialized] = deque()
        self._no_loans()
        self.gnames: list[str] | None = None  # a FIFO run's groups, and each slot's
        self.gidx: array[int] | None = None
        if groups is not None:
            names: dict[str, int] = {}
            self.gidx = array("H", [names.setdefault(g, len(names)) for g in groups])
            self.gnames = list(names)

    def _no_loans(self) -> None:
        """A put's run: it lends nothing yet, and its place holds every body."""
        self.patches: Patches | None = None  # bodies updates changed
        self.src: Run | None = None  # a return run's: the put's run it lends from
        self.off = 0  # a return run's first slot in ``src``
        self.rc = 0  # a return run's messages' receive count
        self.first = 0  # a return run's messages' first take (ms)
        self.lent = 0  # a put's run's: its slots that return runs hold
        self.loans: list[Run] | None = None  # a put's run's: the return runs lending from it
        self.floor = 0  # the first slot whose body ``place`` holds (a compaction's copy)
        # a scattered return run's (``Run.scatter``): each slot's slot in ``src``, receive
        # count and first take
        self.slots: array[int] | None = None
        self.rcs: array[int] | None = None
        self.firsts: array[int] | None = None

    @classmethod
    def lend(cls, src: Run, off: int, count: int, act: int, rc: int, first: int) -> Run:
        """A *return run*: slots ``off .. off + count - 1`` of put run ``src``, released
        (their earlier messages gone) to be ready again at ``act``, having been received
        ``rc`` times, first at ``first``. Their bodies and attributes are ``src``'s (read
        through it: it stays placed while it lends), so a batch a consumer gives back costs
        one object, as its put did, not one per message. It waits, and wakes whole, as a
        delayed run does; its slots leave it as a run's do."""
        run = cls.__new__(cls)
        run.seq, run.at_ms, run.count = src.seq + off, src.at_ms, count
        run.id, run.last_id = src.mid(off), src.mid(off + count - 1)
        run.ids = None if src.ids is None else src.ids[off : off + count]
        run.cids, run.cends, run.cwidth, run.no = None, None, 0, 0  # lends nothing
        if src.cids is not None:  # a client-id run's: its slots' ids, read as its own
            width = src.cwidth
            if width:
                run.cids, run.cwidth = src.cids[off * width : (off + count) * width], width
            else:
                ends = cast("array[int]", src.cends)
                start = ends[off - 1] if off else 0
                run.cids = src.cids[start : ends[off + count - 1]]
                run.cends = array("I", [e - start for e in ends[off : off + count]])
        run.act, run.waiting = act, False
        run.acts, run.order, run.base, run.woke = None, None, 0, 0
        run.next, run.out, run.left = 0, Slots(), count
        run.bodies, run.attrs, run.place, run.with_attrs = None, None, None, src.with_attrs
        run.lengths, run.size, run.mat = _NO_LENGTHS, 0, _NO_MAT
        run.src, run.off, run.rc, run.first = src, off, rc, first
        run.lent, run.loans, run.floor = 0, None, 0
        run.slots, run.rcs, run.firsts = None, None, None
        run.patches = None  # a return run's are its put's
        run.gnames, run.gidx = None, None  # a FIFO run lends nothing (no return runs)
        src.lent += count
        if src.loans is None:
            src.loans = []
        src.loans.append(run)
        return run

    @classmethod
    def scatter(cls, src: Run) -> Run:
        """A *scattered* return run of put run ``src``, empty: the messages of ``src`` given
        back one or a few at a time (a release of too few that follow each other, a
        reschedule), each due at a time of its own, received as often as it was, first when
        it was. Each costs 14 bytes here (its slot in ``src``, 2; its time and first take
        as distances from the put, 4 each; its place in time order, 2; its receive count,
        2; each array made wider when a value needs it) instead of a message object;
        bodies and attributes are ``src``'s. It waits in the state's ``later`` as a spread
        run does, its slots woken one time at a time as ready messages, and it takes more
        (:meth:`add`) while it has slots left."""
        run = cls.lend(src, 0, 1, 0, 0, 0)  # then made empty: it holds what ``add`` gives it
        src.lent -= 1
        run.count = run.left = 0
        run.id = run.last_id = src.id
        run.ids, run.cids, run.cends, run.cwidth = None, None, None, 0
        run.slots = array("H" if src.count <= 1 << 16 else "I")
        run.base = src.at_ms  # times and first takes are held as distances from the put
        run.acts, run.order = array("I"), array("H")
        run.rcs, run.firsts = array("H"), array("I")  # a first take: its distance + 1 (0: none)
        run.waiting = True
        return run

    def add(self, i: int, act: int, rc: int, first: int) -> bool:
        """Slot ``i`` of this scattered return run's put run (materialized there) comes
        back due at ``act`` (after every time reached so far), received ``rc`` times, first
        at ``first``. True: its next time changed (the state's ``later`` needs an entry
        for the new one)."""
        before = self.act if self.left else None
        if self.count >= 2 * self.left + 32 or (self.count and not self.left):
            self._pack()  # most of what it held left it (or all: filled again)
        j, base = self.count, self.base
        self.acts = acts = _fit(cast("array[int]", self.acts), act - base)
        self.order = order = _fit(cast("array[int]", self.order), j)
        self.rcs = _fit(cast("array[int]", self.rcs), rc)
        held = first - base + 1 if first else 0
        self.firsts = _fit(cast("array[int]", self.firsts), held)
        slots = cast("array[int]", self.slots)
        slots.append(i)
        acts.append(act - base)
        self.rcs.append(rc)
        self.firsts.append(held)
        insort(order, j, lo=self.woke, key=lambda k: (acts[k], slots[k]))
        self.count += 1
        self.left += 1
        cast(Run, self.src).lent += 1
        self.act = base + acts[order[self.woke]]
        return self.act != before

    def _pack(self) -> None:
        """Only the slots still held, numbered again (in slot order, then time order)."""
        keep = list(self.spilled())
        old_slots, old_acts = cast("array[int]", self.slots), cast("array[int]", self.acts)
        rcs, firsts = cast("array[int]", self.rcs), cast("array[int]", self.firsts)
        slots = array(old_slots.typecode, [old_slots[j] for j in keep])
        acts = array(old_acts.typecode, [old_acts[j] for j in keep])
        self.slots, self.acts = slots, acts
        self.rcs = array(rcs.typecode, [rcs[j] for j in keep])
        self.firsts = array(firsts.typecode, [firsts[j] for j in keep])
        order = sorted(range(len(keep)), key=lambda k: (acts[k], slots[k]))
        self.order = array(cast("array[int]", self.order).typecode, order)
        self.count, self.next, self.out, self.woke = len(keep), 0, Slots(), 0
        if keep:
            self.act = self.base + acts[order[0]]

    @classmethod
    def scattered(cls, src: Run, r: LoanRecord) -> Run:
        """The scattered return run ``r`` holds (a snapshot's): its arrays made at once and
        sorted once, not a message at a time."""
        run = cls.scatter(src)
        base = run.base
        slots = list(_little(_frombytes("I", r.slots)))
        acts = [t - base for t in _little(_frombytes("q", r.times))]
        firsts = [f - base + 1 if f else 0 for f in _little(_frombytes("q", r.first_takes))]
        run.slots = _filled(cast("array[int]", run.slots), slots)
        run.acts = held = _filled(cast("array[int]", run.acts), acts)
        run.rcs = _filled(cast("array[int]", run.rcs), _little(_frombytes("I", r.receive_counts)))
        run.firsts = _filled(cast("array[int]", run.firsts), firsts)
        order = sorted(range(len(slots)), key=lambda k: (held[k], slots[k]))
        run.order = _filled(cast("array[int]", run.order), order)
        run.count = run.left = len(slots)
        src.lent += len(slots)
        run.act = base + held[order[0]]
        return run

    def live_loans(self) -> list[Run]:
        """The return runs still holding slots of this put's run (dead ones dropped)."""
        loans = self.loans
        if not loans:
            return []
        live = [loan for loan in loans if loan.left]
        if len(live) != len(loans):
            self.loans = live or None
        return live

    def lends(self, i: int) -> tuple[Run, int] | None:
        """The return run holding slot ``i`` of this put's run, and its slot there."""
        for loan in self.loans or ():
            slots = loan.slots
            if slots is not None:
                if loan.left:
                    j = -1
                    try:
                        while True:  # a slot given back again is in it again
                            j = slots.index(i, j + 1)
                            if loan.is_spilled(j):
                                return loan, j
                    except ValueError:
                        pass
                continue
            j = i - loan.off
            if 0 <= j < loan.count and loan.left and loan.is_spilled(j):
                return loan, j
        return None

    def needed_from(self) -> int:
        """The first slot whose body is still read: its own spilled ones', or a return
        run's (what a compaction copies from)."""
        first = self.next
        for loan in self.live_loans():
            slots = loan.slots
            if slots is None:
                first = min(first, loan.off + loan.next)
            else:
                first = min(first, min(slots[j] for j in loan.spilled()))
        return first

    def record_loan(self, index: int) -> LoanRecord:
        """This return run as a snapshot holds it, its put's run ``index``-th there (a
        scattered one: only the slots it still holds, numbered again)."""
        slots = self.slots
        if slots is None:
            return LoanRecord(
                index,
                self.off,
                self.count,
                self.next,
                list(self.out),
                self.act,
                self.rc,
                self.first,
            )
        keep = list(self.spilled())
        acts, rcs = cast("array[int]", self.acts), cast("array[int]", self.rcs)
        base = self.base
        return LoanRecord(
            index,
            0,
            len(keep),
            0,
            [],
            self.act,
            0,
            0,
            _little(array("I", [slots[j] for j in keep])).tobytes(),
            _little(array("q", [base + acts[j] for j in keep])).tobytes(),
            _little(array("I", [rcs[j] for j in keep])).tobytes(),
            _little(array("q", [self.first_of(j) for j in keep])).tobytes(),
        )

    def __lt__(self, other: object) -> bool:
        """Heap entries ``(time, seq, run)`` may tie on their first two with a dead entry
        (a return run whose slots all left it, and one made later from the same slots):
        never ordered by the run."""
        return False

    def __repr__(self) -> str:
        return (
            f"Run(seq={self.seq}, id={self.id}, count={self.count}, left={self.left}, "
            f"act={self.act})"
        )

    def _spread(self, acts: Sequence[int]) -> None:
        """Give the slots the times ``acts``: ``order`` from them, ``act`` the first.

        Held narrow: each time as its distance from the first (``base``), 4 bytes while
        the run spans less than 49 days (else 8), and ``order`` 2 bytes a slot while the
        run has at most 65,536 (a put has at most 1000): 6 bytes a slot, not 16."""
        base = min(acts)
        offsets = [a - base for a in acts]
        self.base = base
        self.acts = array("I" if max(offsets) < 1 << 32 else "q", offsets)
        order = sorted(range(len(offsets)), key=offsets.__getitem__)
        self.order = array("H" if len(order) <= 1 << 16 else "I", order)
        self.woke = 0
        self.act = acts[self.order[0]]

    @property
    def ref(self) -> int:
        """What a compaction's ``MoveBodies`` and ``BodiesMoved`` name the run by: its first
        id, or a client-id run's sequence number (a client id may begin two live runs: put
        again once its message left; a sequence number is the run's alone)."""
        return self.seq if self.cids is not None else cast(int, self.id)

    def group_of(self, i: int) -> str | None:
        """The FIFO group of slot ``i`` (None: not a FIFO queue's run)."""
        if self.gnames is None:
            return None
        assert self.gidx is not None
        return self.gnames[self.gidx[i]]

    def act_of(self, i: int) -> int:
        """When slot ``i`` is ready."""
        return self.act if self.acts is None else self.base + self.acts[i]

    def first_of(self, i: int) -> int:
        """When slot ``i``'s message was first taken (0: never)."""
        firsts = self.firsts
        if firsts is None:
            return self.first
        held = firsts[i]
        return self.base + held - 1 if held else 0

    def put_slot(self, i: int) -> int:
        """Slot ``i``'s slot in its put's run (a return run's are ``src``'s)."""
        return self.off + i if self.slots is None else self.slots[i]

    def seq_of(self, i: int) -> int:
        """Slot ``i``'s arrival sequence number."""
        return self.seq + i if self.slots is None else self.seq + self.slots[i]

    def is_spilled(self, i: int) -> bool:
        """Whether slot ``i`` is still in the run."""
        out = self.out
        return i >= self.next and (not out.n or i not in out)

    def due_slots(self, now_ms: int) -> list[int]:
        """A spread run's spilled slots whose time is at or before ``now_ms``, in time
        order; ``act`` moves on to the next spilled slot's time (None left: ``left`` is 0)."""
        acts, order = self.acts, self.order
        assert acts is not None
        assert order is not None
        k, n, due = self.woke, len(order), []
        limit = now_ms - self.base
        while k < n and acts[order[k]] <= limit:
            if self.is_spilled(order[k]):
                due.append(order[k])
            k += 1
        while k < n and not self.is_spilled(order[k]):
            k += 1  # materialized before its time (an update, a delete)
        self.woke = k
        if k < n:
            self.act = self.base + acts[order[k]]
        return due

    def unreached(self) -> int:
        """How many slots still spilled wait for their time: all of a waiting run's, but a
        spread FIFO run's only past ``woke`` (the slots reached stay in it, ready, in their
        groups)."""
        if not self.waiting:
            return 0
        if self.order is None:
            return self.left
        if self.left == self.count:  # untouched (a restore's common case): no walk
            return self.count - self.woke
        return sum(1 for _ in self.spilled_by_time())

    def reached(self) -> Iterator[int]:
        """A spread run's spilled slots whose time has come (a FIFO run's), in time order."""
        order = cast("array[int]", self.order)
        return self._spilled_in(0, self.woke if self.waiting else len(order))

    def _spilled_in(self, lo: int, hi: int) -> Iterator[int]:
        """The spilled slots of ``order[lo:hi]``, in that order."""
        order = cast("array[int]", self.order)
        for k in range(lo, hi):
            if self.is_spilled(order[k]):
                yield order[k]

    def spilled_by_time(self) -> Iterator[int]:
        """The slots still spilled, in time order (a spread run's ``order``; else slot
        order, which is time order too)."""
        if self.order is None:
            yield from self.spilled()
            return
        yield from self._spilled_in(self.woke, len(self.order))

    def mid(self, i: int) -> Any:
        """The id of slot ``i`` (an int; a str in a client-id queue's run)."""
        width = self.cwidth
        if width:
            return cast(bytes, self.cids)[i * width : (i + 1) * width].decode()
        ends = self.cends
        if ends is not None:
            return cast(bytes, self.cids)[ends[i - 1] if i else 0 : ends[i]].decode()
        if self.ids is not None:
            return self.ids[i]
        if self.slots is not None:
            return cast(Run, self.src).mid(self.slots[i])
        return self.id + i

    def slot(self, mid: int) -> int | None:
        """The slot of id ``mid`` if it is still spilled here."""
        ids = self.ids
        if ids is None:
            i: int = mid - self.id
        else:
            i = bisect_left(ids, mid)
            if i < self.count and ids[i] != mid:
                return None
        out = self.out
        if 0 <= i < self.count and i >= self.next and (not out.n or i not in out):
            return i
        return None

    def spilled_bytes(self) -> int:
        """About the bytes of the bodies still spilled, or lent (exact while they are all
        the same length): what compaction would write again."""
        return self.size * (self.left + self.lent) // self.count

    def spilled(self) -> Iterator[int]:
        """The slots still spilled, in order."""
        out = self.out
        if not out.n:
            yield from range(self.next, self.count)
            return
        for i in range(self.next, self.count):
            if i not in out:
                yield i

    def take_slot(self, i: int) -> None:
        """Slot ``i`` (spilled) is materialized."""
        self.left -= 1
        if i == self.next:
            n = i + 1
            out = self.out
            while n < self.count and out.n and n in out:
                out.discard(n)
                n += 1
            self.next = n
        else:
            self.out.add(i)
        if self.src is not None:
            self.src.lent -= 1

    def alive(self) -> bool:
        """Whether any message of the run is still in the queue (spilled, lent to a return
        run, or materialized); drops gone materialized ones from the front on the way."""
        if self.left or self.lent:
            return True
        mat = self.mat
        while mat and mat[0].state >= _GONE:
            mat.popleft()
        return bool(mat)

    def record(self) -> RunRecord:
        return RunRecord(
            self.seq,
            0 if self.cids is not None else self.id,
            self.at_ms,
            self.count,
            self.next,
            list(self.out),  # in order
            _little(array("I", self.lengths)).tobytes(),
            self.place,
            None if self.place is not None else self.bodies,
            b"" if self.ids is None else _little(self.ids).tobytes(),
            self.act if self.act != self.at_ms and self.acts is None else 0,
            b"",  # acts: a spread run writes base, times and order
            self.with_attrs,
            None if self.place is not None else self.attrs,
            self.base,
            b"" if self.acts is None else _little(self.acts).tobytes(),
            b"" if self.order is None else _little(self.order).tobytes(),
            self.floor,
            b"" if self.gnames is None else pack_names(self.gnames),
            b"" if self.gidx is None else _little(self.gidx).tobytes(),
            self.cids or b"",
            b"" if self.cends is None else _little(self.cends).tobytes(),
            self.cwidth,
            None if not self.patches else self.patches.record(),
        )

    @classmethod
    def from_record(cls, r: RunRecord) -> Run:
        run = cls.__new__(cls)
        run.seq, run.id, run.at_ms, run.count, run.next = r.seq, r.id, r.at_ms, r.count, r.next
        run.act = r.act or r.at_ms
        run.waiting = False  # the state restoring it knows (its clock against ``act``)
        run.acts, run.order, run.woke, run.base = None, None, 0, 0
        run.ids, run.slots = None, None
        run.no, run.cids, run.cends, run.cwidth = 0, None, None, 0
        if r.ids:
            run.ids = array("q")
            run.ids.frombytes(r.ids)
            run.ids = _little(run.ids)
        if r.id_ends or r.id_width:  # checked by decode_snapshot (RunRecord.malformed)
            run.cids, run.cwidth = r.client_ids, r.id_width
            if r.id_ends:
                run.cends = _little(_frombytes("I", r.id_ends))
            run.id = run.mid(0)
        run.last_id = run.mid(r.count - 1)
        run.out = Slots(r.out)
        run.left = r.count - r.next - len(run.out)
        run.place, run.bodies = r.place, r.bodies
        run.with_attrs, run.attrs = r.with_attrs, r.attrs
        run.lengths, run.size = _recorded_lengths(r.lengths)
        run.mat = deque()
        run._no_loans()
        run.floor = r.floor if r.floor >= 0 else r.next
        if r.patches:
            run.patches = Patches.from_record(r.patches)
        run.gnames, run.gidx = None, None
        if r.group_of:  # checked against ``groups`` by decode_snapshot (RunRecord.malformed)
            run.gnames = group_names(r.groups)
            run.gidx = _little(_frombytes("H", r.group_of))
        if r.times:  # widths checked by decode_snapshot (RunRecord.malformed)
            run.base = r.base
            run.acts = _little(_frombytes("I" if len(r.times) == 4 * r.count else "q", r.times))
            run.order = _little(_frombytes("H" if len(r.order) == 2 * r.count else "I", r.order))
            run.act = r.base + run.acts[run.order[0]]
            run.due_slots(-1)  # past the slots already gone (woken or changed)
        elif r.acts:  # as written before base, times and order
            acts = array("q")
            acts.frombytes(r.acts)
            run._spread(_little(acts))
            run.due_slots(-1)
        return run


_GONE = 3  # state.GONE (state.py imports this module)
_NO_LENGTHS: array[int] = array("H")  # a return run's: its bodies are its put's
_NO_MAT: Any = ()  # a return run's: what it materializes is held by its put's run


def pack_names(names: Sequence[str]) -> bytes:
    """FIFO group names as :attr:`RunRecord.groups` holds them: a msgpack array of them, in
    bytes (one object in a decoded snapshot, not one a name)."""
    return _names_encoder.encode(list(names))


def group_names(data: bytes) -> list[str] | None:
    """The names :func:`pack_names` packed (None: not such bytes, or none), decoded at C
    speed, one run's at a time."""
    try:
        names = _names_decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return names or None


_names_encoder = msgspec.msgpack.Encoder()
_names_decoder = msgspec.msgpack.Decoder(list[str])


_TOP = {"H": 0xFFFF, "I": 0xFFFFFFFF}  # the largest value of each narrow array type
_WIDER = {"H": "I", "I": "q"}


def _fit(values: array[int], value: int) -> array[int]:
    """``values``, or a wider copy if ``value`` does not fit its type."""
    top = _TOP.get(values.typecode)
    while top is not None and not 0 <= value <= top:
        values = array(_WIDER[values.typecode], values)
        top = _TOP.get(values.typecode)
    return values


def _filled(values: array[int], more: Sequence[int]) -> array[int]:
    """``values`` (empty) holding ``more``, made wider if one of them needs it."""
    if more:
        values = _fit(_fit(values, max(more)), min(more))
    values.fromlist(list(more))
    return values


def _frombytes(typecode: str, data: bytes) -> array[int]:
    values = array(typecode)
    values.frombytes(data)
    return values


def _length_code(longest: int) -> str:
    """The array type of bodies' lengths whose longest is ``longest``: 2 bytes each while
    they all fit (bodies under 64 KiB, the common case), else 4."""
    return "H" if longest < 1 << 16 else "I"


def _lengths(lengths: Sequence[int]) -> array[int]:
    """Bodies' lengths as an array of :func:`_length_code`'s width."""
    return array(_length_code(max(lengths, default=0)), lengths)


def _recorded_lengths(data: bytes) -> tuple[array[int], int]:
    """A record's bodies' lengths (4 bytes each, little-endian) as :func:`_lengths` holds
    them, and their sum: at C speed (numpy), as a 100M queue's restore reads 100M."""
    wide = np.frombuffer(data, dtype="<u4")
    if not len(wide):
        return array("H"), 0
    lengths = array(_length_code(int(wide.max())))
    lengths.frombytes(wide.astype(f"={lengths.typecode}").tobytes())
    return lengths, int(wide.sum(dtype=np.uint64))


def _little(values: array[int]) -> array[int]:
    """``values`` in little-endian order (the same array where that is the native one)."""
    if sys.byteorder == "little":
        return values
    swapped = array(values.typecode, values)
    swapped.byteswap()
    return swapped
