"""A queue's history as rows, folded by the engine itself. Pure: no I/O, no clock.

The log records commands' events, not what time does: a message becoming ready, a lease
running out, retention removing a message, a message dead-lettered when its last lease
expires. Those follow from the events' timestamps (``QueueState.advance``). Rather than a
second implementation of those rules, :class:`Timeline` feeds the events to the engine's own
:class:`~actors.core.state.QueueState` and listens to the transitions it makes as its
:class:`~actors.core.state.Observer`.

Rows (``TIMELINE_SCHEMA``), by ``type``:

- per message: ``put``, ``taken``, ``acked``, ``released``, ``touched``, ``updated``,
  ``deleted``, ``purged``, ``dropped`` (its queue was deleted), ``lease_expired``,
  ``retention_expired``, ``dead_lettered`` (``state`` says why: ``release`` or ``lease``),
  ``dead_letter_routed``; ``baseline`` for each message already there when the history
  starts (a snapshot), ``present`` for each message still there at the end (``state``:
  delayed, ready, reserved, dead = waiting for the dead-letter queue). A message is
  ``(queue, incarnation, arrival)``: a queue deleted and created again numbers its
  arrivals from 1 again;
- ``left`` / ``joined`` around a ``pruned`` row: the log's clean-up removed records while
  they were being read; the history goes on from the snapshot that covers them;
- exceptions: ``orphan`` (an event names a message the history does not have in that
  state), ``vanished`` / ``appeared`` (a snapshot lacks a message the history has, or has
  one it does not), ``counters`` (a snapshot's counters differ from the history's);
- per queue: ``sample`` (depth by state and the oldest ready message's age at the end of
  every minute in which something happened), ``final`` (the engine's own stats at the end
  and the queue's settings, as JSON in ``detail``), ``damage`` (what the reader discarded;
  a shard log's damage that names no queue has a null ``queue``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pyarrow as pa

from actors.core import commands as cmd
from actors.core import events as ev
from actors.core.decide import decide
from actors.core.ids import SequentialIds
from actors.core.snapshot import Snapshot
from actors.core.state import DEAD, DELAYED, READY, RESERVED, QueuedMessage, QueueState
from actors.log import keys
from actors.status import Discarded
from pipeline.rows import Rows

__all__ = ["MINUTE_MS", "TIMELINE_SCHEMA", "Timeline", "TimelineRows", "damage_rows"]

MINUTE_MS = 60_000
SOURCE_QUEUE = cmd.SOURCE_QUEUE  # attributes a dead-letter copy carries (actors/shard.py)
SOURCE_ID = cmd.SOURCE_ID

TIMELINE_SCHEMA = pa.schema(
    [
        ("queue", pa.string()),
        ("seq", pa.int64()),  # the record that caused the row (null: time or the reader)
        ("at_ms", pa.int64()),
        ("type", pa.string()),
        ("message_id", pa.string()),
        ("arrival", pa.int64()),  # the message's arrival number in its queue: its identity
        ("incarnation", pa.int32()),  # 0; 1 once the queue was deleted and created again; …
        ("receive_count", pa.int32()),
        ("enqueued_at_ms", pa.int64()),
        ("first_taken_ms", pa.int64()),
        ("state", pa.string()),
        ("idempotency_key", pa.string()),
        ("source_queue", pa.string()),
        ("source_id", pa.string()),
        ("body_bytes", pa.int64()),
        ("ready", pa.int64()),
        ("delayed", pa.int64()),
        ("reserved", pa.int64()),
        ("dead_pending", pa.int64()),
        ("oldest_ready_age_ms", pa.int64()),
        ("detail", pa.string()),
        ("object", pa.string()),
        ("offset", pa.int64()),
        ("records", pa.int64()),
    ]
)
_STATE_NAMES = {DELAYED: "delayed", READY: "ready", RESERVED: "reserved", DEAD: "dead"}
_json = msgspec.json.Encoder()


class TimelineRows(Rows):
    """Rows of the timeline view."""

    def __init__(self) -> None:
        super().__init__(TIMELINE_SCHEMA)


def _tracked(state: QueueState, timeline: Timeline) -> QueueState:
    """``state``, telling ``timeline`` about the transitions time makes."""
    state.observer = timeline
    return state


class Timeline:
    """Folds one queue's events through the engine and writes its rows to ``out``."""

    def __init__(self, queue: str, out: TimelineRows) -> None:
        self.queue = queue
        self.out = out
        self.state = _tracked(QueueState(), self)
        self.seq: int | None = None  # the record being applied
        self.at_ms = 0  # its time
        self._minute: int | None = None  # a minute with activity, not sampled yet
        self.incarnation = 0  # deletions seen: arrival numbers start over after each
        # by event type; each handler takes events of its type
        self._handlers: dict[type, Callable[[Any], None]] = {
            ev.MessagesPut: self._put,
            ev.MessagesTaken: self._taken,
            ev.MessagesAcked: self._acked,
            ev.MessagesReleased: self._released,
            ev.LeasesExtended: self._touched,
            ev.MessageUpdated: self._updated,
            ev.MessagesDeleted: self._deleted,
            ev.QueuePurged: self._purged,
            ev.DeadLettersRouted: self._routed,
            ev.QueueDeleted: self._dropped,
        }

    # ---------------------------------------------------------------- input

    def start(self, state: QueueState, seq: int) -> None:
        """Begin from a snapshot's state (covering records up to ``seq``)."""
        self.state = _tracked(state, self)
        self.seq = seq
        at = state.clock_ms
        for m in [*state.messages.values(), *state.outbox.values()]:
            self._row("baseline", m, at, seq=seq, state=_STATE_NAMES.get(m.state))

    def apply(self, seq: int, event: ev.Event) -> None:
        """Apply record ``seq`` (records must come in order)."""
        at = max(event.at_ms, self.state.clock_ms)  # the engine never goes back in time
        self._reach(at)
        self.seq, self.at_ms = seq, at
        handler = self._handlers.get(type(event))
        if handler is None:
            self.state.apply(event)
        else:
            handler(event)
        self.activity(at)

    def check(self, key: str, snap: Snapshot, restored: QueueState, *, gap: bool = False) -> None:
        """Compare a snapshot with the history so far and go on from the snapshot (what
        recovery would use).

        Without ``gap`` the snapshot covers exactly the records applied: every difference is
        an exception (``vanished``, ``appeared``, ``counters``). With ``gap`` records between
        the two were pruned while reading: differences are what happened unseen (``left``:
        gone without a trace in what was read; ``joined``: came in unseen)."""
        self._reach(snap.clock_ms)
        self.seq = None
        self.state.advance(snap.clock_ms)
        mine = _by_arrival(self.state)
        theirs = _by_arrival(restored)
        gone, new = ("left", "joined") if gap else ("vanished", "appeared")
        for arrival in sorted(mine.keys() - theirs.keys()):
            self._row(gone, mine[arrival], snap.clock_ms, detail=key)
        for arrival in sorted(theirs.keys() - mine.keys()):
            self._row(new, theirs[arrival], snap.clock_ms, detail=key)
        ours, other = _counters(self.state), _counters(restored)
        if gap:
            self.seq = snap_seq = keys.seq_of(key)
            self.state = _tracked(restored, self)
            self.out.add(
                queue=self.queue, seq=snap_seq, at_ms=snap.clock_ms, type="pruned", object=key
            )
            self.activity(snap.clock_ms)
            return
        if ours != other:
            self.out.add(
                queue=self.queue,
                seq=self.seq,
                at_ms=snap.clock_ms,
                type="counters",
                object=key,
                detail=_json.encode({"history": ours, "snapshot": other}).decode(),
            )
        if mine.keys() != theirs.keys() or ours != other:
            self.state = _tracked(restored, self)

    def damage(self, discarded: list[Discarded]) -> None:
        """Report what the reader discarded."""
        damage_rows(self.out, self.queue, discarded)

    def finish(self, as_of_ms: int) -> None:
        """Bring time to ``as_of_ms`` (not before the last event) and write the end rows."""
        at = max(as_of_ms, self.state.clock_ms)
        self._reach(at)
        self.seq = None
        self.state.advance(at)
        if self._minute is not None:
            self._sample(at)
        for m in [*self.state.messages.values(), *self.state.outbox.values()]:
            self._row("present", m, at, state=_STATE_NAMES.get(m.state))
        self.out.add(queue=self.queue, at_ms=at, type="final", detail=_stats_json(self.state, at))

    # ---------------------------------------------------------------- time

    def activity(self, at_ms: int) -> None:
        """Something changed at ``at_ms``: its minute gets a sample."""
        self._minute = at_ms // MINUTE_MS

    def _reach(self, at_ms: int) -> None:
        """Let time run up to (not including) ``at_ms``'s minute, sampling each minute in
        which something happened on the way."""
        target = at_ms // MINUTE_MS
        state = self.state
        while True:
            if self._minute is not None and self._minute < target:
                end = (self._minute + 1) * MINUTE_MS - 1
                self.seq = None
                state.advance(end)
                self._sample(end)
                self._minute = None
            due = state.next_due_ms()
            if due is None or due // MINUTE_MS >= target:
                return
            self.seq = None
            state.advance(due)  # transitions call activity(); a stale entry just goes away
            if self._minute is None and state.next_due_ms() == due:
                return  # nothing moved (cannot happen; never loop on it)

    def _sample(self, at_ms: int) -> None:
        s = self.state
        oldest = s.oldest_ready_ms()
        self.out.add(
            queue=self.queue,
            at_ms=at_ms,
            type="sample",
            ready=s.n_ready,
            delayed=s.n_delayed,
            reserved=s.n_reserved,
            dead_pending=len(s.outbox),
            oldest_ready_age_ms=None if oldest is None else max(0, at_ms - oldest),
        )

    # ---------------------------------------------------------------- transitions

    def made_available(self, m: QueuedMessage) -> None:
        """The engine makes a message ready."""
        self.activity(m.activate_at_ms)

    def lease_expired(self, m: QueuedMessage) -> None:
        """The engine ends a lease at its deadline."""
        self._row("lease_expired", m, m.deadline_ms, seq=None)
        self.activity(m.deadline_ms)

    def retention_expired(self, m: QueuedMessage, at_ms: int) -> None:
        """The engine removes a message past retention."""
        self._row("retention_expired", m, at_ms, seq=None, state=_STATE_NAMES.get(m.state))
        self.activity(at_ms)

    def dead_lettered(self, m: QueuedMessage, lease_deadline_ms: int) -> None:
        """The engine moves a message to the outbox (dead-letter queue next), because its
        last lease ran out at ``lease_deadline_ms`` (0: because it was released)."""
        by_lease = lease_deadline_ms > 0
        at = lease_deadline_ms if by_lease else self.at_ms
        seq = None if by_lease else self.seq
        self._row("dead_lettered", m, at, seq=seq, state="lease" if by_lease else "release")

    def _row(self, kind: str, m: QueuedMessage, at_ms: int, **extra: Any) -> None:
        attributes = m.attributes
        source_queue = source_id = None
        if attributes:
            source_queue, source_id = attributes.get(SOURCE_QUEUE), attributes.get(SOURCE_ID)
        values = {
            "queue": self.queue,
            "seq": self.seq,
            "at_ms": at_ms,
            "type": kind,
            "message_id": str(m.id),
            "arrival": m.seq,
            "incarnation": self.incarnation,
            "receive_count": m.receive_count,
            "enqueued_at_ms": m.enqueued_at_ms,
            "first_taken_ms": m.first_taken_ms or None,
            "source_queue": source_queue,
            "source_id": source_id,
            "body_bytes": len(m.body),
        }
        values.update(extra)
        self.out.add(**values)

    def _orphan(self, kind: str, mid: object) -> None:
        self.out.add(
            queue=self.queue,
            seq=self.seq,
            at_ms=self.at_ms,
            type="orphan",
            message_id=str(mid),
            detail=kind,
        )

    # ---------------------------------------------------------------- events

    def _in_state(self, kind: str, ids: list[ev.MessageId], state: int) -> list[QueuedMessage]:
        """The messages an event names that are in ``state``; the others are orphans."""
        found = []
        messages = self.state.messages
        for mid in ids:
            m = messages.get(mid)
            if m is None or m.state != state:
                self._orphan(kind, mid)
            else:
                found.append(m)
        return found

    def _put(self, e: ev.MessagesPut) -> None:
        self.state.apply(e)
        messages = self.state.messages
        at = self.at_ms
        for it in e.items:
            self._row("put", messages[it.id], at, idempotency_key=it.key)

    def _taken(self, e: ev.MessagesTaken) -> None:
        self.state.advance(self.at_ms)  # messages may become ready just now
        taken = self._in_state("taken", e.ids, READY)
        self.state.apply(e)
        for m in taken:
            self._row("taken", m, self.at_ms)

    def _acked(self, e: ev.MessagesAcked) -> None:
        self.state.advance(self.at_ms)
        acked = self._in_state("acked", e.ids, RESERVED)
        self.state.apply(e)
        for m in acked:
            self._row("acked", m, self.at_ms)

    def _released(self, e: ev.MessagesReleased) -> None:
        self.state.advance(self.at_ms)
        released = self._in_state("released", e.ids, RESERVED)
        for m in released:  # before apply: a release may dead-letter it
            self._row("released", m, self.at_ms)
        self.state.apply(e)

    def _touched(self, e: ev.LeasesExtended) -> None:
        self.state.advance(self.at_ms)
        touched = self._in_state("touched", e.ids, RESERVED)
        self.state.apply(e)
        for m in touched:
            self._row("touched", m, self.at_ms)

    def _updated(self, e: ev.MessageUpdated) -> None:
        self.state.advance(self.at_ms)
        m = self.state.messages.get(e.id)
        if m is None:
            self._orphan("updated", e.id)
        self.state.apply(e)
        if m is not None:
            self._row("updated", m, self.at_ms)

    def _deleted(self, e: ev.MessagesDeleted) -> None:
        self.state.advance(self.at_ms)
        found = []
        for mid in e.ids:
            m = self.state.messages.get(mid)
            if m is None:
                self._orphan("deleted", mid)
            else:
                found.append(m)
        for m in found:
            self._row("deleted", m, self.at_ms, state=_STATE_NAMES.get(m.state))
        self.state.apply(e)

    def _purged(self, e: ev.QueuePurged) -> None:
        self.state.advance(self.at_ms)
        for m in list(self.state.messages.values()):
            self._row("purged", m, self.at_ms, state=_STATE_NAMES.get(m.state))
        self.state.apply(e)

    def _dropped(self, e: ev.QueueDeleted) -> None:
        """The queue was deleted: its messages go with it; a new one may start."""
        self.state.advance(self.at_ms)
        for m in [*self.state.messages.values(), *self.state.outbox.values()]:
            self._row("dropped", m, self.at_ms, state=_STATE_NAMES.get(m.state))
        self.state.apply(e)
        self.incarnation += 1

    def _routed(self, e: ev.DeadLettersRouted) -> None:
        self.state.advance(self.at_ms)
        outbox = self.state.outbox
        for arrival in e.seqs:
            m = outbox.get(arrival)
            if m is None:
                self.out.add(
                    queue=self.queue,
                    seq=self.seq,
                    at_ms=self.at_ms,
                    type="orphan",
                    arrival=arrival,
                    detail="dlq",
                )
            else:
                self._row("dead_letter_routed", m, self.at_ms)
        self.state.apply(e)


def damage_rows(out: TimelineRows, queue: str | None, discarded: list[Discarded]) -> None:
    """``damage`` rows: what the reader discarded of ``queue``'s history (None: of a shard
    log, naming no queue)."""
    for d in discarded:
        out.add(
            queue=queue,
            type="damage",
            object=d.object,
            offset=d.offset,
            records=d.records,
            detail=d.reason,
        )


def _by_arrival(state: QueueState) -> dict[int, QueuedMessage]:
    return {m.seq: m for m in [*state.messages.values(), *state.outbox.values()]}


def _counters(state: QueueState) -> list[int]:
    return [
        state.next_seq,
        state.enqueued_total,
        state.acked_total,
        state.dead_lettered,
        state.expired_total,
        state.purged_total,
    ]


def _stats_json(state: QueueState, at_ms: int) -> str:
    """The engine's own stats reply for ``state`` at ``at_ms`` and the queue's settings, as
    one JSON object (the settings under ``"settings"``)."""
    settings = msgspec.structs.asdict(state.settings)
    if state.created:
        _, view = decide(state, cmd.Stats(), at_ms, SequentialIds())
        return _json.encode({**msgspec.structs.asdict(view), "settings": settings}).decode()
    # A history that starts without the queue's creation (and no snapshot): counts only.
    counts = {
        "ready": state.n_ready,
        "delayed": state.n_delayed,
        "reserved": state.n_reserved,
        "total": len(state.messages),
    }
    return _json.encode({**counts, "settings": settings}).decode()
