"""Snapshots: a queue's whole state as one msgspec struct, and back.

A snapshot holds only logical state (messages with their state, lease and deadline; the
outbox; idempotency keys; counters; the clock). Indexes are rebuilt on restore, so a restored
state continues exactly like the state it was taken from. A spilling state's runs (runs.py)
are kept as runs: where their bodies are in the log, not the bodies.
"""

from __future__ import annotations

import heapq
import sys
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, cast

import msgspec
import numpy as np

from actors.core import events as ev
from actors.core import replies as rp
from actors.core.fair import Fair
from actors.core.idindex import MAX_RUNS, IdIndex
from actors.core.runs import LoanRecord, Run, RunRecord, Slots
from actors.core.state import DELAYED, READY, RESERVED, QueuedMessage, QueueState, transient
from actors.errors import DataError
from actors.settings import QueueSettings

__all__ = [
    "SNAPSHOT_VERSION",
    "Snapshot",
    "decode_snapshot",
    "encode_snapshot",
    "encode_snapshot_parts",
    "logical",
    "restore",
    "snapshot",
]

SNAPSHOT_VERSION = 1


class Snapshot(msgspec.Struct, array_like=True, gc=False):
    """The state of one queue. Fields are only ever appended (see events.py)."""

    version: int
    name: str
    settings: QueueSettings
    clock_ms: int
    next_seq: int
    last_id: int
    counters: list[int]  # dead_lettered, expired, acked, enqueued, purged
    messages: list[QueuedMessage]
    outbox: list[QueuedMessage]
    idem: list[tuple[str, ev.MessageId, int]]
    keys: list[tuple[str, int, Any]] = []  # watch keys of a key partition (appended field)
    move_tasks: list[rp.MoveTask] = []  # the queue's recent move tasks (appended field)
    runs: list[RunRecord] = []  # runs with spilled messages (appended field)
    # takes' attempt ids: (attempt, taken at, ids, leases, deadline), oldest first (appended)
    attempts: list[tuple[str, int, list[ev.MessageId], list[int], int]] = []
    loans: list[LoanRecord] = []  # return runs, lending from ``runs`` (appended field)
    # a client-id queue's id index (idindex.py): key, level, split, and the number of each
    # client-id run of ``runs`` in their order (-1: none); its buckets' tags and locations
    id_index: tuple[bytes, int, int, list[int]] | None = None  # (appended field)
    id_buckets: list[tuple[bytes, bytes]] = []  # (appended field)
    moving: tuple[int, int, int] | None = None  # handed over: from, to, generation (appended)
    paused: bool = False  # takes hand out nothing (appended)
    # reserved messages an admin deleted: (API id, when their lease would have ended)
    forced: list[tuple[str, int]] = []  # (appended)
    # a fair queue (fair.py): its turns so far, and (group, the turn it was last served at)
    # of each group with ready messages that was served
    fair_turn: int = 0  # (appended)
    fair: list[tuple[str, int]] = []  # (appended)


def _enc_hook(value: Any) -> Any:
    """An id index bucket's locations (``array('I')``): their bytes, little-endian."""
    if isinstance(value, array):
        if sys.byteorder != "little":
            value = array(value.typecode, value)
            value.byteswap()
        return value.tobytes()
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.msgpack.Decoder(Snapshot)


def snapshot(state: QueueState) -> Snapshot:
    """A snapshot of ``state``. It shares message objects: encode it before the state moves on."""
    runs = list(state.live_runs())
    id_index, id_buckets = _id_index(state, runs)
    return Snapshot(
        SNAPSHOT_VERSION,
        state.name,
        state.settings,
        state.clock_ms,
        state.next_seq,
        state.last_id,
        [
            state.dead_lettered,
            state.expired_total,
            state.acked_total,
            state.enqueued_total,
            state.purged_total,
        ],
        # a spilling state materializes messages out of arrival order
        sorted(state.messages.values(), key=_seq) if state.by_id else list(state.messages.values()),
        list(state.outbox.values()),
        [(key, mid, at) for key, (mid, at) in state.idem.items()],
        [(key, version, value) for key, (version, value) in state.keys.items()],
        list(state.move_tasks),
        [run.record() for run in runs],  # in put order
        [(attempt, *taken) for attempt, taken in state.attempts.items()],
        [loan.record_loan(i) for i, run in enumerate(runs) for loan in run.live_loans()],
        id_index,
        id_buckets,
        state.moving,
        state.paused,
        list(state.forced.items()),
        0 if state.fair is None else state.fair.turn,
        [] if state.fair is None else state.fair.lasts(),
    )


def _id_index(
    state: QueueState, runs: list[Run]
) -> tuple[tuple[bytes, int, int, list[int]] | None, list[Any]]:
    """A client-id queue's index as the snapshot holds it (its buckets the state's own
    arrays), and the number of each client-id run among ``runs``: a restore loads it as it
    is instead of hashing every id again."""
    index = state.cindex
    if index is None:
        return None, []
    key, level, split, _, buckets = index.record()
    cruns = state.cruns
    numbers = [
        run.no if run.no < len(cruns) and cruns[run.no] is run else -1
        for run in runs
        if run.cids is not None
    ]
    return (key, level, split, numbers), buckets


def logical(state: QueueState) -> Snapshot:
    """:func:`snapshot` with every run's messages as messages, bodies read: the same for
    equal queues however they are held (spilling or not)."""
    snap = snapshot(state)
    if not snap.runs:
        return msgspec.structs.replace(snap, id_index=None, id_buckets=[])
    messages = list(snap.messages)
    runs = [Run.from_record(r) for r in snap.runs]
    held = [(run, run) for run in runs]
    for r in snap.loans:
        held.append((_loan(runs[r.run], r), runs[r.run]))
    for run, put in held:
        contents = state.contents_of(put)
        for i in run.spilled():
            m = transient(run, i, contents)
            m.state = DELAYED if run.act_of(i) > snap.clock_ms else READY
            messages.append(m)
    messages.sort(key=_seq)
    return msgspec.structs.replace(
        snap, messages=messages, runs=[], loans=[], id_index=None, id_buckets=[]
    )


def encode_snapshot(snap: Snapshot) -> bytes:
    """msgpack bytes of a snapshot."""
    return _encoder.encode(snap)


def encode_snapshot_parts(
    snap: Snapshot, part_bytes: int = 1 << 20
) -> Iterator[bytes | memoryview]:
    """:func:`encode_snapshot`'s bytes in parts, its messages, outbox and runs about
    ``part_bytes`` of bodies (a run: of its arrays) at a time: a big queue's snapshot is
    compressed as it is encoded, never whole in memory."""
    fields = snap.__struct_fields__
    yield _array_header(len(fields))
    for name in fields:
        value = getattr(snap, name)
        weigh = _STREAMED.get(name)
        if weigh is None:
            yield _encoder.encode(value)
            continue
        yield _array_header(len(value))
        start = size = 0
        for i, item in enumerate(value):
            size += weigh(item)
            if size >= part_bytes or i == len(value) - 1:
                part = value[start : i + 1]
                # the part's own array header goes: its elements continue the whole list's
                yield memoryview(_encoder.encode(part))[_header_size(len(part)) :]
                start, size = i + 1, 0


def _message_bytes(m: QueuedMessage) -> int:
    return len(m.body) + 64


def _run_bytes(r: RunRecord) -> int:
    """About the bytes of a run's record (100M client ids: 1.7 GB of them in all)."""
    size = len(r.lengths) + len(r.ids) + len(r.client_ids) + len(r.id_ends) + len(r.times)
    size += len(r.order) + len(r.groups) + len(r.group_of) + 64
    if r.bodies is not None:
        size += sum(len(b) for b in r.bodies)
    return size


# the fields written in parts, and what each element weighs
_STREAMED: dict[str, Callable[[Any], int]] = {
    "messages": _message_bytes,
    "outbox": _message_bytes,
    "runs": _run_bytes,
    "id_buckets": lambda bucket: 2 * len(bucket[0]) + 16,
}


def _header_size(length: int) -> int:
    """Bytes of :func:`_array_header` for ``length`` elements."""
    return 1 if length < 16 else 3 if length < 1 << 16 else 5


def _array_header(length: int) -> bytes:
    """A msgpack array header (fixarray, array 16, array 32)."""
    if length < 16:
        return bytes([0x90 | length])
    if length < 1 << 16:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")


def decode_snapshot(data: bytes) -> Snapshot:
    """The snapshot in ``data``.

    Raises:
        DataError: not a snapshot of a version this code reads.
    """
    try:
        snap = _decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"undecodable snapshot: {exc}") from exc
    if snap.version != SNAPSHOT_VERSION:
        raise DataError(f"unknown snapshot version {snap.version}")
    for run in snap.runs:
        wrong = run.malformed()
        if wrong is not None:
            raise DataError(f"undecodable snapshot: {wrong}")
    for loan in snap.loans:
        wrong = loan.malformed(snap.runs)
        if wrong is not None:
            raise DataError(f"undecodable snapshot: {wrong}")
    return snap


def restore(snap: Snapshot) -> QueueState:
    """A state equal to the one the snapshot was taken from, indexes rebuilt.

    Raises:
        DataError: a run's client ids are not UTF-8 (a damaged snapshot).
    """
    try:
        return _restore(snap)
    except UnicodeDecodeError as exc:
        raise DataError(f"undecodable snapshot: a run's client ids: {exc}") from exc


def _restore(snap: Snapshot) -> QueueState:
    s = QueueState()
    s.name, s.settings, s.clock_ms = snap.name, snap.settings, snap.clock_ms
    s.next_seq, s.last_id = snap.next_seq, snap.last_id
    (s.dead_lettered, s.expired_total, s.acked_total, s.enqueued_total, s.purged_total) = (
        snap.counters
    )
    if s.settings.hands_out_fairly:
        s.fair = Fair(snap.fair_turn)
    for m in sorted(snap.messages, key=_seq):
        s.messages[m.id] = m
        _index(s, m)
    s.arrivals = deque(s.messages.values())
    if snap.runs:
        _restore_runs(s, snap)
        if any(run.patches for run in s.by_id):
            s.patching = 1  # patches to drop with their messages (QueueState._remove)
    if s.settings.fifo:
        _index_groups(s)
    if s.fair is not None:
        grouped = [m for m in s.messages.values() if m.state == READY and m.group is not None]
        s.fair.rebuild(grouped, dict(snap.fair))
    for heap in (s.ready, s.delayed, s.reserved):
        heapq.heapify(heap)
    s.outbox = {m.seq: m for m in snap.outbox}
    for key, mid, at in sorted(snap.idem, key=lambda e: e[2]):
        s.idem[key] = (mid, at)
        s.idem_order.append((at, key))
    s.keys = {key: (version, value) for key, version, value in snap.keys}
    s.move_tasks = list(snap.move_tasks)
    s.moving = snap.moving
    s.paused = snap.paused
    s.forced = dict(snap.forced)
    s.attempts = {a: (at, ids, leases, deadline) for a, at, ids, leases, deadline in snap.attempts}
    return s


def _restore_runs(s: QueueState, snap: Snapshot) -> None:
    """The snapshot's runs and return runs into ``s``: ready ones in take order, waiting
    ones in ``later``, a FIFO queue's in its groups, each counted."""
    s.by_id = _client_indexed(s, snap)
    held = list(s.by_id)
    for r in snap.loans:
        loan = _loan(s.by_id[r.run], r)
        held.append(loan)
        put = s.by_id[r.run]
        if put.cids is not None and snap.id_index is None:  # its ids, through the put's
            for j in loan.spilled():
                s.reindex(put, loan.put_slot(j), loan.mid(j))
    waiting_grouped = 0
    for run in held:
        if run.gnames is not None:  # a FIFO queue's: in its groups (_index_groups)
            s.grouped += run.left
            if run.acts is not None:  # a spread one: past the slots already reached
                run.waiting = True
                run.due_slots(s.clock_ms)
                late = run.unreached()
                if late:
                    s.later.append((run.act, run.seq, run))
                    waiting_grouped += late
                else:
                    run.waiting = False
            elif run.act > s.clock_ms:  # delayed still (a FIFO queue's delay)
                run.waiting = True
                s.later.append((run.act, run.seq, run))
                waiting_grouped += run.left
        elif run.acts is not None or run.act > s.clock_ms:  # a delayed run still waiting
            run.waiting = True
            s.later.append((run.act, run.seq, run))
            s.deferred += run.left
        else:
            s.runs.append(run)
            s.spilled += run.left
    if snap.id_index is not None:  # the loaded index holds what the runs hold, no less
        held_ids = sum(run.left for run in held if (run.src or run).cids is not None)
        if held_ids != len(s.cindex or ()):
            raise DataError(
                f"undecodable snapshot: its id index holds {len(s.cindex or ())} ids, "
                f"its runs {held_ids}"
            )
    s.runs.sort(key=_take_key)  # woken delayed runs after the ready runs put before them
    _relink(s)
    heapq.heapify(s.later)
    s.n_ready += s.spilled + s.grouped - waiting_grouped
    s.n_delayed += s.deferred + waiting_grouped
    s.arrivals = deque(heapq.merge(s.arrivals, s.by_id, key=_seq))


def _loan(put: Run, r: LoanRecord) -> Run:
    """The return run ``r`` holds, lending from ``put``."""
    if r.slots:
        return Run.scattered(put, r)
    loan = Run.lend(put, r.off, r.count, r.act, r.receive_count, r.first_taken_ms)
    loan.next, loan.out = r.next, Slots(r.out)
    loan.left = r.count - r.next - len(loan.out)
    put.lent -= r.count - loan.left
    return loan


def _runs(records: list[RunRecord]) -> list[Run]:
    """The runs of a snapshot, a FIFO queue's sharing one copy of each group's name: the
    names a run decodes are dropped before the next is made (millions of names alive at
    once would leave the allocator's memory fragmented after a restart)."""
    runs = []
    names = _Names()
    one = names.__getitem__  # the first copy of each name, looked up at C speed (map)
    for r in records:
        run = Run.from_record(r)
        if run.gnames is not None:
            run.gnames = list(map(one, run.gnames))
        runs.append(run)
    return runs


class _Names(dict[Any, Any]):
    """A table that holds each key it is asked for, the first copy (names) or the next
    number (:func:`_rests`)."""

    numbered = False

    def __missing__(self, key: Any) -> Any:
        value = self[key] = len(self) if self.numbered else key
        return value


def _client_indexed(s: QueueState, snap: Snapshot) -> list[Run]:
    """The snapshot's runs, a client-id queue's numbered and their ids indexed: the index
    loaded as the snapshot holds it, or (a snapshot without it) built again, all at once."""
    runs = _runs(snap.runs)
    held = [run for run in runs if run.cids is not None]
    if snap.id_index is not None:
        _load_index(s, held, snap.id_index, snap.id_buckets)
    elif held:
        count = sum(run.left for run in held)
        s.cindex = IdIndex.built(count, (_ids_of(run, s.number_run(run)) for run in held))
        if not count:
            s.cindex = None
    return runs


def _load_index(
    s: QueueState,
    held: list[Run],
    record: tuple[bytes, int, int, list[int]],
    buckets: list[tuple[bytes, bytes]],
) -> None:
    """The snapshot's id index into ``s``, each client-id run under its number again.

    Raises:
        DataError: the index does not fit the runs (a damaged snapshot).
    """
    key, level, split, numbers = record
    if len(numbers) != len(held):
        raise DataError(f"undecodable snapshot: {len(numbers)} run numbers for {len(held)} runs")
    top = max(numbers, default=-1) + 1
    if top > MAX_RUNS:
        raise DataError(f"undecodable snapshot: a client-id run numbered {top - 1}")
    cruns: list[Run | None] = [None] * top
    for run, no in zip(held, numbers, strict=True):
        if no >= 0:
            if cruns[no] is not None:
                raise DataError(f"undecodable snapshot: two client-id runs numbered {no}")
            run.no, cruns[no] = no, run
    s.cruns = cruns
    s.cfree = [no for no in range(top - 1, -1, -1) if cruns[no] is None]
    for run, no in zip(held, numbers, strict=True):
        if no < 0:
            s.number_run(run)
    try:
        index = IdIndex.loaded(key, level, split, buckets, top)
    except ValueError as exc:
        raise DataError(f"undecodable snapshot: {exc}") from exc
    s.cindex = index if index else None


def _ids_of(run: Run, no: int) -> tuple[list[str], int, list[int] | range]:
    """The ids ``run`` still holds, its number, and their slots."""
    slots: list[int] | range = range(run.next, run.count) if not run.out else list(run.spilled())
    width, packed = run.cwidth, cast(bytes, run.cids)
    if width and packed.isascii():  # the common case: sliced from one str, not decoded each
        text = packed.decode()
        return [text[i * width : (i + 1) * width] for i in slots], no, slots
    return [run.mid(i) for i in slots], no, slots


def _relink(s: QueueState) -> None:
    """Messages materialized out of a restored run are its again (``Run.mat``), as they were
    live: the run stays alive while they are in the queue (retention ends them with it, and
    they may be given back into it as a return run)."""
    for m in s.messages.values():  # in seq order
        found = s.holding(m.seq)
        if found is None:
            continue
        run, i = found
        if run.mid(i) == m.id and run.at_ms == m.enqueued_at_ms:
            if not run.mat:
                s.mat_runs.append(run)
            run.mat.append(m)
            s.in_mats += 1


def _index(s: QueueState, m: QueuedMessage) -> None:
    """Count ``m`` and add it to its heap (FIFO ready heads are added by _index_groups)."""
    if m.state == READY:
        s.n_ready += 1
        if not s.settings.fifo and (s.fair is None or m.group is None):  # fair: its group's
            s.ready.append((m.activate_at_ms, m.seq, m))
    elif m.state == DELAYED:
        s.n_delayed += 1
        s.delayed.append((m.activate_at_ms, m.seq, m))
    elif m.state == RESERVED:
        s.n_reserved += 1
        s.reserved.append((m.deadline_ms, m.seq, m))


def _index_groups(s: QueueState) -> None:
    """Each FIFO group's members in order: its messages, and the slots of runs (by
    sequence number); its head offered to take. A head still in a run (a state that
    held every head as a message never writes one) is materialized by the first
    ``advance``, once the state can read bodies."""
    groups = s.groups
    for m in s.messages.values():  # in seq order
        group = s.group_named(m.group)
        group.msgs.append(m)
        group.busy += m.state == RESERVED
    _rests(s, [run for run in s.by_id if run.gnames is not None and run.left])
    for group in groups.values():
        msgs = group.msgs
        if msgs and (not group.rest or msgs[0].seq < group.rest[0]):
            head = msgs[0]
            if head.state == READY and not group.busy:
                s.ready.append((head.activate_at_ms, head.seq, head))
        else:
            s.unheaded = True


_CHUNK = 1 << 23  # slots sorted into their groups at once: bounds a restore's extra memory


def _rests(s: QueueState, runs: list[Run]) -> None:
    """The slots ``runs`` still hold, into their groups' ``rest`` (groups made as needed), in
    order. 100M slots are most of a big FIFO queue's restore, so they are sorted by group at
    C speed (numpy, a chunk of runs at a time), not appended one by one."""
    numbers = _Names()
    numbers.numbered = True
    number = numbers.__getitem__  # a group's number, from its (shared) name
    seqs: list[np.ndarray] = []
    gids: list[np.ndarray] = []
    held = 0
    for run in runs:
        gidx = np.frombuffer(cast("array[int]", run.gidx), np.uint16)
        if run.out:
            slots = np.fromiter(run.spilled(), np.int64, run.left)
            of = gidx[slots]
        else:  # the common case: the slots from ``next`` on
            slots = np.arange(run.next, run.count, dtype=np.int64)
            of = gidx[run.next :]
        local = np.fromiter(map(number, cast(list[str], run.gnames)), np.int64)
        seqs.append(slots + run.seq)
        gids.append(local[of])
        held += len(slots)
        if held >= _CHUNK:
            _into_groups(s, numbers, seqs, gids)
            seqs, gids, held = [], [], 0
    if seqs:
        _into_groups(s, numbers, seqs, gids)


def _into_groups(
    s: QueueState, numbers: dict[str, int], seqs: list[np.ndarray], gids: list[np.ndarray]
) -> None:
    """Append each slot of ``seqs`` (in order) to the ``rest`` of its group, ``gids``."""
    of = np.concatenate(gids)
    # within a group, still in order; numpy sorts 16-bit keys stably by radix, in linear
    # time (6x faster than 64-bit keys at 8M slots, the most of a 100M queue's restore)
    keys = of.astype(np.uint16) if len(numbers) <= 1 << 16 else of
    order = np.argsort(keys, kind="stable")
    ordered = np.concatenate(seqs)[order]
    counts = np.bincount(of, minlength=len(numbers))
    names = list(numbers)
    ends = np.cumsum(counts).tolist()
    start = 0
    for k, end in enumerate(ends):
        if end > start:
            group = s.group_named(names[k])
            if group.name is not None:
                group.name = names[k]  # the runs' copy, one for all
            group.rest.frombytes(ordered[start:end].tobytes())
            start = end


def _seq(m: QueuedMessage | Run) -> int:
    return m.seq


def _take_key(run: Run) -> tuple[int, int]:
    return (run.act, run.seq)
