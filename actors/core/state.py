"""The in-memory state of one queue: a fold of its events.

Indexes (see ``actors/core/README.md`` for the diagram):

- ``messages``: id → :class:`QueuedMessage`, in arrival order (never re-inserted);
- ``ready``: heap of ``(activate_at_ms, seq, msg)`` — what ``take`` hands out; in a FIFO queue
  only the head of each unblocked group is in it;
- ``delayed``: heap of ``(activate_at_ms, seq, msg)`` — becomes ready by time;
- ``reserved``: heap of ``(deadline_ms, seq, msg)`` — leases expire by time;
- ``arrivals``: messages in arrival order, for retention;
- ``groups``: FIFO group → :class:`Group` (messages in order, and whether one is reserved);
- ``idem``: idempotency key → (message id, put time), expiring after the window;
- ``outbox``: dead letters (by seq) waiting for the shell to hand them to the dead-letter queue;
- ``runs``: in a state that spills (``spill``), puts held as :class:`~actors.core.runs.Run`
  objects, their bodies in the log: the slots of the runs in ``runs`` count as ready messages
  and ``take`` reaches them in the same order (see runs.py). A put whose messages are all
  ready at one later time is a *delayed* run: it waits in ``later`` (a heap by activation
  time), its slots counted as delayed, and joins ``runs`` whole when its time comes.
  ``by_id`` holds every run in put order (ids increase), to find a message by id.
  ``arrivals`` holds a run where it would hold its messages.

Heaps are lazy: an entry is valid only while its message is still in that state with that
key; stale entries are skipped when they surface and swept when they outnumber live ones.

Mutation happens only in :meth:`QueueState.apply` (events) and :meth:`QueueState.advance`
(time). ``advance`` is a projection, not a change of history: the state at time *t* is
fully determined by the events and *t*, whatever the steps by which *t* was reached.
"""

from __future__ import annotations

import enum
import heapq
from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

import msgspec

from actors.core import events as ev
from actors.core import replies as rp
from actors.core.fair import Fair
from actors.core.idindex import MAX_RUNS, SLOT_BITS, IdIndex
from actors.core.runs import BodyReader, Contents, Patches, Run
from actors.settings import QueueSettings

__all__ = [
    "DEAD",
    "DELAYED",
    "GONE",
    "READY",
    "RESERVED",
    "Group",
    "MessageState",
    "Observer",
    "QueueState",
    "QueuedMessage",
    "transient",
]

# QueuedMessage.state values; small ints keep a message cheap. DEAD = in the outbox.
DELAYED, READY, RESERVED, GONE, DEAD = 0, 1, 2, 3, 4
_GIVEN = -1  # within one apply only: given back, not yet a message again or lent (live)

_COMPACT_SLACK = 4096
_REST_SLACK = 64  # a FIFO group's sequence numbers (and members) gone before it is swept

# A put of fewer messages is held as a run only once the queue holds RUN_DEPTH ready ones:
# a run costs more to build and to take from than the messages it holds, and only saves
# memory (and the bodies') while they wait.
RUN_MIN_PUT = 16
RUN_DEPTH = 10_000
# Released messages of one run that follow each other: a return run from this many (one
# object of ~300 B, against one each as messages; SQS consumers receive 10 at a time);
# fewer, due later, go into the run's scattered return run (14 B each: runs.py, Run.scatter).
RETURN_MIN = 4
MAX_MOVE_TASKS = 10  # move tasks a queue remembers (SQS lists the 10 most recent)
# How long a take's attempt id finds its messages again (SQS: ReceiveRequestAttemptId, 5
# minutes), and how many attempts a queue remembers at most (the oldest go first).
ATTEMPT_WINDOW_MS = 5 * 60 * 1000
MAX_ATTEMPTS = 10_000


class MessageState(enum.Enum):
    """The three states a client can see."""

    DELAYED = "delayed"
    READY = "ready"
    RESERVED = "reserved"


STATE_NAMES = {
    DELAYED: MessageState.DELAYED,
    READY: MessageState.READY,
    RESERVED: MessageState.RESERVED,
}


class QueuedMessage(msgspec.Struct, array_like=True, gc=False):
    """One message as the queue's state holds it (clients see a ``replies.MessageView``).
    Also its snapshot record: fields are only ever appended."""

    seq: int
    id: ev.MessageId
    body: bytes
    enqueued_at_ms: int
    activate_at_ms: int
    state: int
    receive_count: int = 0
    lease: int = 0
    deadline_ms: int = 0
    group: str | None = None
    attributes: dict[str, Any] | None = None
    first_taken_ms: int = 0

    def __lt__(self, other: object) -> bool:
        """Heap entries ``(time, seq, message)`` may tie on their first two: a stale entry of
        a message given back into a return run, and one of the message made from that slot
        again. Never ordered by the message itself."""
        return False


class Group:
    """A FIFO message group: its messages in order, and how many of them are reserved
    (``busy``). A take hands out a run of a group's ready messages at once; the group is
    blocked until none of them is in flight.

    In a state that spills, a group's members still held in runs are only their sequence
    numbers, ``rest[start:]`` (8 bytes each, in order); ``msgs`` holds its materialized
    members, in order too: the head always (:meth:`QueueState._head` materializes it when
    it becomes the head), those in flight, and any changed out of turn. A member is in one
    of the two; a sequence number whose slot has left its run otherwise (retention) is
    passed over."""

    __slots__ = ("busy", "gone", "msgs", "name", "rest", "start")

    def __init__(self, name: str | None = None) -> None:
        self.name = name  # the one copy runs' tables of groups share
        self.msgs: deque[QueuedMessage] = deque()
        self.busy = 0
        self.rest: array[int] = array("q")
        self.start = 0
        self.gone = 0  # members behind the head that left (still in ``msgs``)


class Observer(Protocol):
    """Told about the transitions the engine makes by itself — as time passes, or as the
    consequence of an event — for readers that narrate a log (the pipeline's timeline).
    Called synchronously; must not change the state."""

    def lease_expired(self, m: QueuedMessage) -> None:
        """``m``'s lease runs out at ``m.deadline_ms`` (called before it ends)."""

    def retention_expired(self, m: QueuedMessage, at_ms: int) -> None:
        """``m`` is removed for being past retention at ``at_ms`` (called before)."""

    def dead_lettered(self, m: QueuedMessage, lease_deadline_ms: int) -> None:
        """``m`` moved to the outbox because its last lease ran out at
        ``lease_deadline_ms`` (0: because it was released)."""

    def made_available(self, m: QueuedMessage) -> None:
        """``m`` became ready (at ``m.activate_at_ms``)."""


# A take's attempt (Take.attempt): (taken at, ids, leases, deadline).
Attempt = tuple[int, list[ev.MessageId], list[int], int]


class QueueState:
    """Everything one queue knows. Build it with ``QueueState()`` and apply events."""

    __slots__ = (
        "ack_waits",
        "acked_total",
        "arrivals",
        "attempts",
        "by_id",
        "cfree",
        "cindex",
        "clock_ms",
        "cruns",
        "dead_lettered",
        "deferred",
        "delayed",
        "enqueued_total",
        "expired_total",
        "fair",
        "forced",
        "grouped",
        "groups",
        "idem",
        "idem_order",
        "in_mats",
        "kept_runs",
        "keys",
        "last_id",
        "later",
        "mat_runs",
        "messages",
        "move_tasks",
        "moving",
        "n_delayed",
        "n_ready",
        "n_reserved",
        "name",
        "next_seq",
        "observer",
        "outbox",
        "patching",
        "paused",
        "purged_total",
        "put_tat",
        "read",
        "ready",
        "reserved",
        "return_min",
        "run_front",
        "run_min_put",
        "runs",
        "settings",
        "spill",
        "spilled",
        "take_tat",
        "transitions",
        "unheaded",
        "unpatched",
        "unplaced",
    )

    def __init__(self) -> None:
        self.name = ""
        self.settings = QueueSettings()
        self.clock_ms = 0
        self.next_seq = 1
        self.last_id = 0
        self.messages: dict[ev.MessageId, QueuedMessage] = {}
        self.ready: list[tuple[int, int, QueuedMessage]] = []
        self.delayed: list[tuple[int, int, QueuedMessage]] = []
        self.reserved: list[tuple[int, int, QueuedMessage]] = []
        self.arrivals: deque[QueuedMessage | Run] = deque()
        # Keyed by ``QueuedMessage.group``: decide gives every message of a FIFO queue a group,
        # but apply never raises on a logged event, so a message without one has a group too.
        self.groups: dict[str | None, Group] = {}
        self.idem: dict[str, tuple[ev.MessageId, int]] = {}
        self.idem_order: deque[tuple[int, str]] = deque()
        self.outbox: dict[int, QueuedMessage] = {}  # by seq
        self.n_ready = self.n_delayed = self.n_reserved = 0
        self.dead_lettered = self.expired_total = self.acked_total = 0
        self.enqueued_total = self.purged_total = 0
        self.keys: dict[str, tuple[int, Any]] = {}  # watch keys of a key partition
        self.move_tasks: list[rp.MoveTask] = []  # the newest last, at most MAX_MOVE_TASKS
        # Being handed to another shard: (from, to, the placement generation); the state
        # decides nothing but taking it over (decide.py) until QueueTakenOver.
        self.moving: tuple[int, int, int] | None = None
        self.paused = False  # takes hand out nothing (QueuePaused)
        # A fair queue's groups (fair.py): its grouped ready messages are in their groups'
        # heaps, not in ``ready``. None: not a fair queue.
        self.fair: Fair[QueuedMessage] | None = None
        # reserved messages an admin deleted (MessagesDeleted.forced): API id -> when their
        # lease would have ended; their holders' commands are stale until then
        self.forced: dict[str, int] = {}
        # take_rate and put_rate: when the messages taken (put) so far would have gone at the
        # rate (µs; a leaky bucket's "theoretical arrival time", allowance()); derived from
        # the events like the rest, not part of snapshots (a restart forgets the debt)
        self.take_tat = self.put_tat = 0
        # Takes with an attempt id (Take.attempt): id -> (taken at, ids, leases, deadline),
        # oldest first; forgotten ATTEMPT_WINDOW_MS after, or past MAX_ATTEMPTS.
        self.attempts: dict[str, Attempt] = {}
        self.transitions = 0  # time-driven transitions made by advance (not part of snapshots)
        self.observer: Observer | None = None  # not part of snapshots either
        # A shell's list to learn each acked message's time in the queue (ms from its put to
        # its ack), which it drains; None: nobody asks. Not part of snapshots.
        self.ack_waits: list[int] | None = None
        # Spilling (runs.py): set by a shell; like the observer, not part of snapshots.
        self.spill = False
        # Puts of fewer messages are runs only in a deep queue (RUN_MIN_PUT; tests of the
        # representation lower it); not part of snapshots.
        self.run_min_put = RUN_MIN_PUT
        # Released messages of one run, due at one later time, become a return run when at
        # least this many follow each other (Run.lend); not part of snapshots either.
        self.return_min = RETURN_MIN
        self.read: BodyReader | None = None  # reads a placed run's bodies back
        self.runs: list[Run] = []  # ready runs, in take order (and dead ones before run_front)
        self.run_front = 0
        self.spilled = 0  # slots of the ready runs
        self.later: list[tuple[int, int, Run]] = []  # delayed runs: (act, seq, run), a heap
        self.deferred = 0  # slots of the delayed runs
        self.by_id: list[Run] = []  # every run, in put (= id) order; dead ones swept
        self.unplaced: list[Run] = []  # new runs, for the shell to place once written
        # bodies updates changed in runs (Run.patches): (put's run, slot, update's token),
        # for the shell to place once the update is written (place_patch)
        self.unpatched: list[tuple[Run, int, int]] = []
        self.patching = 0  # the last update's token (0: no run was ever patched)
        self.in_mats = 0  # entries in the runs' lists of materialized messages, gone ones too
        # the runs whose lists of materialized messages (Run.mat) are not empty, for their
        # sweep (a run may be listed twice, or with an empty list: the sweep drops those)
        self.mat_runs: list[Run] = []
        self.grouped = 0  # slots of a FIFO queue's runs (all ready: never in ``runs``)
        self.kept_runs = 0  # runs ``by_id`` kept at its last sweep (a FIFO queue's)
        self.unheaded = False  # a restored FIFO group's head is still in a run
        # A client-id queue's runs: where each id they hold is (idindex.py), and the runs by
        # their number there (None: gone; ``cfree`` lists those numbers)
        self.cindex: IdIndex | None = None
        self.cruns: list[Run | None] = []
        self.cfree: list[int] = []  # numbers of runs gone, for new ones

    @property
    def active_move(self) -> rp.MoveTask | None:
        """The move task that is running or stopping, if any (at most one is)."""
        tasks = self.move_tasks
        if tasks and tasks[-1].status in rp.ACTIVE:
            return tasks[-1]
        return None

    def take_room(self, now_ms: int) -> int:
        """How many messages a take could get at ``now_ms`` (the state advanced to it): the
        ready ones, none while paused, fewer past ``max_in_flight`` or ``take_rate``."""
        if self.paused:
            return 0
        room = self.n_ready
        s = self.settings
        if s.max_in_flight is not None:
            room = min(room, s.max_in_flight - self.n_reserved)
        if s.take_rate is not None and room > 0:
            room = min(room, allowance(self.take_tat, now_ms, s.take_rate))
        return max(0, room)

    def take_wait_ms(self, now_ms: int) -> int | None:
        """When messages are ready and only ``take_rate`` holds them back: how long until
        it lets one go (None: it is not what holds them back)."""
        s = self.settings
        if s.take_rate is None or self.paused or not self.n_ready:
            return None
        if s.max_in_flight is not None and self.n_reserved >= s.max_in_flight:
            return None
        wait = rate_wait_ms(self.take_tat, now_ms, s.take_rate)
        return wait or None

    @property
    def created(self) -> bool:
        """Whether the queue's ``QueueCreated`` event has been applied."""
        return bool(self.name)

    # ---------------------------------------------------------------- events

    def apply(self, event: ev.Event) -> None:
        """Fold one logged event into the state. Never raises on an event ``decide`` made."""
        self.advance(event.at_ms)
        _APPLY[type(event)](self, event)

    def apply_advanced(self, event: ev.Event) -> None:
        """:meth:`apply` for a state already advanced to the event's time, with nothing
        applied since (the live path: advance, decide, apply)."""
        _APPLY[type(event)](self, event)

    def _apply_created(self, e: ev.QueueCreated) -> None:
        self.name = e.name
        self.settings = e.settings
        self._set_fair()

    def _apply_settings(self, e: ev.SettingsChanged) -> None:
        self.settings = e.settings
        self._set_fair()

    def _set_fair(self) -> None:
        """A queue that becomes fair moves its grouped ready messages into their groups
        (each served first: no group has had a turn yet); one that stops being fair moves
        them back into ``ready``."""
        fair = self.settings.hands_out_fairly
        if fair and self.fair is None:
            grouped = [
                e[2] for e in self.ready if e[2].group is not None and _valid(e, READY, _ACTIVATE)
            ]
            self.ready = [e for e in self.ready if e[2].group is None]
            heapq.heapify(self.ready)
            self.fair = Fair()
            self.fair.rebuild(grouped, {})
        elif not fair and self.fair is not None:
            for m in self.fair.ready():
                heapq.heappush(self.ready, (m.activate_at_ms, m.seq, m))
            self.fair = None

    def _apply_put(self, e: ev.MessagesPut) -> None:
        if self.settings.put_rate is not None:
            self.put_tat = spend(self.put_tat, e.at_ms, len(e.items), self.settings.put_rate)
        if self.spill and self._runnable(e):
            self._put_run(e)
            return
        at = e.at_ms
        seq = self.next_seq
        messages = self.messages
        arrivals_append = self.arrivals.append
        fifo = self.settings.fifo
        last_id = self.last_id
        for it in e.items:
            mid = it.id
            m = QueuedMessage(
                seq, mid, it.body, at, it.activate_at_ms, DELAYED, 0, 0, 0, it.group, it.attributes
            )
            seq += 1
            messages[mid] = m
            arrivals_append(m)
            if it.key is not None:
                self.idem[it.key] = (mid, at)
                self.idem_order.append((at, it.key))
            if type(mid) is int and mid > last_id:
                last_id = mid
            if fifo:
                self.group_named(it.group).msgs.append(m)
            self._schedule(m, it.activate_at_ms, at)
        self.next_seq = seq
        self.last_id = last_id
        self.enqueued_total += len(e.items)
        self._maybe_compact()

    def _apply_taken(self, e: ev.MessagesTaken) -> None:
        if self.settings.take_rate is not None:
            self.take_tat = spend(self.take_tat, e.at_ms, len(e.ids), self.settings.take_rate)
        at = e.at_ms
        deadline = e.deadline_ms
        messages = self.messages
        push = heapq.heappush
        reserved = self.reserved
        fifo = self.settings.fifo
        fair = self.fair
        served: list[str] = []
        n = 0
        read: list[Any] = [None, None]  # the last run read, and its contents: a take's
        for mid, lease in zip(e.ids, e.leases, strict=True):  # messages come a run at a time
            m = messages.get(mid)
            if m is None and (self.spilled or self.grouped):
                m = self._unspill(mid, offer=False, read=read)
            if m is None or m.state != READY:
                continue
            m.state = RESERVED
            m.receive_count += 1
            m.lease = lease
            m.deadline_ms = deadline
            if not m.first_taken_ms:
                m.first_taken_ms = at
            push(reserved, (deadline, m.seq, m))
            if fifo:
                self.groups[m.group].busy += 1
            elif fair is not None and m.group is not None:
                served.append(m.group)
            n += 1
        self.n_ready -= n
        self.n_reserved += n
        if fair is not None and served:  # each grouped one taken, in order: a turn (fair.py)
            fair.served(served)
        if e.attempt is not None:
            self._remember_attempt(e.attempt, e)

    def _remember_attempt(self, attempt: str, e: ev.MessagesTaken) -> None:
        attempts = self.attempts
        attempts.pop(attempt, None)  # the newest last: a retried take that took anew
        horizon = e.at_ms - ATTEMPT_WINDOW_MS
        while attempts:
            oldest = next(iter(attempts))
            if attempts[oldest][0] > horizon and len(attempts) < MAX_ATTEMPTS:
                break
            del attempts[oldest]
        attempts[attempt] = (e.at_ms, list(e.ids), list(e.leases), e.deadline_ms)

    def _apply_acked(self, e: ev.MessagesAcked) -> None:
        messages = self.messages
        waits = self.ack_waits
        for mid in e.ids:
            m = messages.get(mid)
            if m is not None and m.state == RESERVED:
                self._remove(m)
                self.acked_total += 1
                if waits is not None:
                    waits.append(e.at_ms - m.enqueued_at_ms)
        self._maybe_compact()

    def _apply_released(self, e: ev.MessagesReleased) -> None:
        at = e.at_ms
        returned: list[QueuedMessage] = []
        lends = self._gives_back()
        reasons = e.reasons
        for i, (mid, when) in enumerate(zip(e.ids, e.activate_at_ms, strict=True)):
            m = self.messages.get(mid)
            if m is not None and m.state == RESERVED:
                if reasons is not None and i < len(reasons) and reasons[i] is not None:
                    _failed(m, at, reasons[i])
                self._end_lease(m)
                if self._exhausted(m):
                    self._dead_letter(m)
                elif lends and when > at:
                    # in no state count until _give_back places it (and no longer reserved,
                    # should the event name it twice)
                    m.state, m.activate_at_ms = _GIVEN, when
                    returned.append(m)
                else:
                    self._schedule(m, when, at)
        if returned:
            self._give_back(returned, at)

    def _give_back(self, returned: list[QueuedMessage], at: int) -> None:
        """Messages given back at ``at`` (released due later, or their leases ran out), in
        no state count: those that are untouched slots of one put's run, due at one time,
        received as often, first at one time, and that follow each other, ``return_min`` or
        more, go back into a return run lending from it (runs.py, ``Run.lend``); other
        untouched ones due later into its scattered return run (``Run.scatter``); the rest
        are scheduled as messages."""
        lots: dict[tuple[int, int, int, int], list[tuple[int, QueuedMessage]]] = {}
        found: dict[int, Run] = {}  # the runs of the lots, by seq
        for m in returned:
            slot = self._slot_of(m)
            if slot is None:
                self._schedule(m, m.activate_at_ms, at)
                continue
            run, i = slot
            key = (run.seq, m.activate_at_ms, m.receive_count, m.first_taken_ms)
            lots.setdefault(key, []).append((i, m))
            found[run.seq] = run
        for (seq, act, rc, first), lot in lots.items():
            run = found[seq]
            lot.sort(key=_slot)
            contents: Contents | None = None
            start = 0
            for k in range(1, len(lot) + 1):
                if k < len(lot) and lot[k][0] == lot[k - 1][0] + 1:
                    continue
                span, start = lot[start:k], k
                if contents is None and (len(span) >= self.return_min or act > at):
                    contents = self._readable(run)
                if contents is None:
                    for _, m in span:
                        self._schedule(m, act, at)
                    continue
                self._lend_untouched(run, span, contents, act, rc, first, at)

    def _gives_back(self) -> bool:
        """Whether messages of runs go back into runs when they are given back (released
        due later, leases run out, rescheduled): a spilling standard queue's."""
        return bool(self.spill and self.observer is None and not self.settings.fifo and self.by_id)

    def _readable(self, run: Run) -> Contents | None:
        """``run``'s contents, to compare what is given back with (None: they cannot be read:
        the messages keep their own bodies, as messages)."""
        try:
            return self.contents_of(run)
        except Exception:  # the reader's I/O or a damaged block: no reason to fail a release
            return None

    def _lend_untouched(
        self,
        run: Run,
        span: list[tuple[int, QueuedMessage]],
        contents: Contents,
        act: int,
        rc: int,
        first: int,
        at: int,
    ) -> None:
        """``span`` (slots of ``run`` that follow each other) into return runs, split where a
        message was changed since its put (an update: it stays a message). Stretches too
        short for a return run of their own go into ``run``'s scattered one if they are due
        later (``Run.scatter``), else they stay messages."""
        bodies, attrs = contents
        part: list[tuple[int, QueuedMessage]] = []
        for i, m in [*span, (-1, None)]:
            untouched = m is not None and (
                m.body == bodies[i] and m.attributes == (None if attrs is None else attrs[i])
            )
            if untouched:
                part.append((i, cast(QueuedMessage, m)))
                continue
            if len(part) >= self.return_min and self._lend(run, part, act, rc, first, at):
                pass
            elif act > at:
                for k, kept in part:
                    self._scatter(run, k, kept, act)
            else:
                for _, kept in part:
                    self._schedule(kept, act, at)
            part = []
            if m is not None:
                self._schedule(m, act, at)  # changed since its put

    def _scatter(self, run: Run, i: int, m: QueuedMessage, act: int) -> None:
        """``m`` (slot ``i`` of ``run``, untouched, in no state count) leaves the state as a
        message for ``run``'s scattered return run, due at ``act`` (later than now)."""
        m.state = GONE
        del self.messages[m.id]
        if run.cids is not None:
            self.reindex(run, i, cast(str, m.id))
        loan = None
        for held in reversed(run.loans or ()):
            if held.slots is not None:  # its one: filled again once empty (Run.add)
                loan = held
                break
        if loan is None:
            loan = Run.scatter(run)
        if loan.add(i, act, m.receive_count, m.first_taken_ms):
            heapq.heappush(self.later, (loan.act, loan.seq, loan))
        self.deferred += 1
        self.n_delayed += 1

    def _slot_of(self, m: QueuedMessage) -> tuple[Run, int] | None:
        """The put's run and slot ``m`` was materialized from, while that run can lend it
        out again (its place holds the slot's body)."""
        found = self.holding(m.seq)
        if found is None:
            return None
        run, i = found
        if (
            not run.alive()  # else retention may have let it go: it must end the loans
            or i < run.floor
            or run.mid(i) != m.id
            or run.at_ms != m.enqueued_at_ms
            or m.group is not None
            or (m.attributes is not None and ev.FAILURES in m.attributes)  # not the slot's
            or (run.place is None and run.bodies is None)
            or (run.place is not None and self.read is None)
        ):
            return None
        return run, i

    def _lend(
        self,
        run: Run,
        span: list[tuple[int, QueuedMessage]],
        act: int,
        rc: int,
        first: int,
        at: int,
    ) -> bool:
        """``span``'s messages (slots of ``run``, in order, each after the last) leave the
        state as messages for one return run, which waits until ``act``, or is ready at
        once if that is ``at`` or before (leases that ran out). False: they cannot (ready
        at once, they would come before the last ready run in take order)."""
        ready = act <= at
        at_k = 0
        if ready:
            keys = (act, run.seq + span[0][0]), (act, run.seq + span[-1][0])
            found = self._ready_place(*keys)
            if found is None:
                return False
            at_k = found
        for i, m in span:
            m.state = GONE
            del self.messages[m.id]
            if run.cids is not None:
                self.reindex(run, i, cast(str, m.id))
        loan = Run.lend(run, span[0][0], len(span), act, rc, first)
        n = len(span)
        if ready:
            self.runs.insert(at_k, loan)
            self.spilled += n
            self.n_ready += n
        else:
            loan.waiting = True
            heapq.heappush(self.later, (act, loan.seq, loan))
            self.deferred += n
            self.n_delayed += n
        return True

    def _apply_touched(self, e: ev.LeasesExtended) -> None:
        for mid, deadline in zip(e.ids, e.deadlines_ms, strict=True):
            m = self.messages.get(mid)
            if m is not None and m.state == RESERVED:
                m.deadline_ms = deadline
                heapq.heappush(self.reserved, (deadline, m.seq, m))

    def _apply_updated(self, e: ev.MessageUpdated) -> None:
        if e.body is not None and self._patch(e.id, e.body) and e.activate_at_ms is None:
            return  # a spilled message's body: changed where it is, in its put's run
        m = self.find(e.id)
        if m is None:
            return
        if e.body is not None and m.body is not e.body:
            m.body = e.body
            self._patched_message(m, e.body, e.at_ms, e.activate_at_ms is None)
        if e.activate_at_ms is not None:
            if m.state == RESERVED:
                self._end_lease(m)
                m.receive_count = 0
            elif m.state == READY:
                self.n_ready -= 1
            else:
                self.n_delayed -= 1
            act, at = e.activate_at_ms, e.at_ms
            slot = None
            if act > at and self._gives_back():
                slot = self._slot_of(m)
            contents = None if slot is None else self._readable(slot[0])
            if slot is None or contents is None:
                self._schedule(m, act, at)
            else:  # untouched, due later: a reschedule costs no object (Run.scatter)
                span = [(slot[1], m)]
                self._lend_untouched(
                    slot[0], span, contents, act, m.receive_count, m.first_taken_ms, at
                )

    def _patch(self, mid: ev.MessageId, body: bytes) -> bool:
        """Spilled message ``mid``'s body is ``body`` now: a patch of its put's run (the
        slot stays where it is). False: ``mid`` is not spilled."""
        if mid in self.messages:
            return False
        found = self._run_of(mid)
        if found is None:
            return False
        run, i = found
        self._patch_slot(run.src or run, run.put_slot(i), body)
        return True

    def _patch_slot(self, put: Run, i: int, body: bytes) -> None:
        if put.patches is None:
            put.patches = Patches()
        self.patching += 1
        put.patches.set(i, body, self.patching)
        self.unpatched.append((put, i, self.patching))

    def _patched_message(self, m: QueuedMessage, body: bytes, at: int, back: bool) -> None:
        """Message ``m``'s body was changed to ``body``: if its put's run can lend it out
        again, the run's slot is patched too, so that given back (released, its lease run
        out) it goes back into the run as an untouched one; and with ``back`` (its time
        stays), a delayed one goes back now (into the run's scattered return run)."""
        slot = self._slot_of(m) if self._gives_back() else None
        if slot is None:
            return
        run, i = slot
        self._patch_slot(run, i, body)
        if not back or m.state != DELAYED or m.activate_at_ms <= at:
            return
        contents = self._readable(run)
        if contents is not None:
            self.n_delayed -= 1  # in no state count, as _lend_untouched wants it
            self._lend_untouched(
                run, [(i, m)], contents, m.activate_at_ms, m.receive_count, m.first_taken_ms, at
            )

    def place_patch(self, put: Run, i: int, token: int, place: object) -> None:
        """The shell wrote update ``token``, which changed the body of slot ``i`` of
        ``put``'s run: read from ``place`` from now on (not an event, as :meth:`place`).
        A run held in memory (a snapshot written before its put was durable) keeps its
        patches in memory too: a patch's place must never be before its run's, which the
        body floor and compaction count on (queue_actor.py ``spilled_floor``)."""
        if put.patches is not None and put.place is not None:
            put.patches.place(i, token, cast(Any, place))

    def _apply_deleted(self, e: ev.MessagesDeleted) -> None:
        if e.forced:
            self.forced = {k: d for k, d in self.forced.items() if d > e.at_ms}
        for mid in e.ids:
            m = self.find(mid)
            if m is not None:
                if e.forced and m.state == RESERVED:
                    self.forced[str(m.id)] = m.deadline_ms
                self._remove(m)
        self._maybe_compact()

    def _apply_purged(self, e: ev.QueuePurged) -> None:
        for m in self.messages.values():
            m.state = GONE
        self.purged_total += self.total
        self.messages = {}
        self.runs, self.run_front, self.spilled, self.grouped = [], 0, 0, 0
        self.cindex, self.cruns, self.cfree = None, [], []
        self.later, self.deferred, self.by_id, self.kept_runs = [], 0, [], 0
        self.ready, self.delayed, self.reserved = [], [], []
        self.arrivals = deque()
        self.mat_runs, self.in_mats = [], 0
        self.groups = {}
        if self.fair is not None:
            self.fair = Fair(self.fair.turn)
        self.n_ready = self.n_delayed = self.n_reserved = 0

    def _apply_dlq(self, e: ev.DeadLettersRouted) -> None:
        for seq in e.seqs:
            self.outbox.pop(seq, None)

    def _apply_paused(self, e: ev.QueuePaused) -> None:
        self.paused = e.paused

    def _apply_key(self, e: ev.KeySet) -> None:
        self.keys[e.key] = (e.version, e.value)

    def _apply_handed_over(self, e: ev.QueueHandedOver) -> None:
        self.moving = (e.source, e.to, e.generation)

    def _apply_taken_over(self, e: ev.QueueTakenOver) -> None:
        self.moving = None

    def _apply_writer(self, e: ev.WriterStarted | ev.Checkpoint) -> None:
        pass  # markers (fencing, checkpoints): only their timestamps (applied by advance) matter

    def _apply_moved(self, e: ev.BodiesMoved) -> None:
        # the same bodies, further on in the log: for the shell to place the runs again
        for k, (mid, first) in enumerate(zip(e.ids, e.firsts, strict=True)):
            run = self.run_at(mid)
            if run is not None:
                self._unlend_below(run, first)
                run.floor = first  # the copy holds the slots from there on
                if run.patches is not None:  # with the bodies updates changed
                    if run.bodies is not None:  # not placed (yet): the copy's, in memory
                        run.bodies = [*run.bodies[:first], *e.bodies[k]]
                    run.patches = None
                self.unplaced.append(run)

    def _unlend_below(self, run: Run, first: int) -> None:
        """Slots before ``first`` that a return run of ``run`` still holds become messages,
        their bodies read from the place they still have: the copy will not hold them. (The
        move was decided from the slots still read, so only a state that lends where the
        one that decided did not can hold any: a safeguard.)"""
        for loan in run.live_loans():
            low = [i for i in loan.spilled() if loan.put_slot(i) < first]
            if not low:
                continue
            contents = self.contents_of(loan)
            heap = self.delayed if loan.waiting else self.ready
            for i in low:
                m = self._materialize(loan, i, contents)
                loan.take_slot(i)
                heapq.heappush(heap, (m.activate_at_ms, m.seq, m))
            if loan.waiting:
                self.deferred -= len(low)
            else:
                self.spilled -= len(low)

    def _apply_move_started(self, e: ev.MoveTaskStarted) -> None:
        task = rp.MoveTask(e.task, e.destination, e.rate, e.to_move, 0, rp.RUNNING, e.at_ms)
        self.move_tasks = [*self.move_tasks[-(MAX_MOVE_TASKS - 1) :], task]

    def _update_move(self, task: str, **changes: Any) -> None:
        active = self.active_move
        if active is not None and active.task == task:
            self.move_tasks[-1] = msgspec.structs.replace(active, **changes)

    def _apply_move_progress(self, e: ev.MoveTaskProgressed) -> None:
        self._update_move(e.task, moved=e.moved)

    def _apply_move_cancelling(self, e: ev.MoveTaskCancelling) -> None:
        self._update_move(e.task, status=rp.CANCELLING)

    def _apply_move_ended(self, e: ev.MoveTaskEnded) -> None:
        self._update_move(e.task, status=e.status, reason=e.reason)

    def _apply_dropped(self, e: ev.QueueDeleted) -> None:
        kept = self.observer, self.ack_waits, self.spill, self.run_min_put, self.read
        return_min = self.return_min
        QueueState.__init__(self)  # a deleted queue is as if it never was
        self.observer, self.ack_waits, self.spill, self.run_min_put, self.read = kept
        self.return_min = return_min

    # ---------------------------------------------------------------- time

    def advance(self, now_ms: int) -> None:
        """Bring time-driven transitions up to ``now_ms``, in time order.

        Ties at the same millisecond resolve as retention, then lease expiry, then activation,
        so the outcome never depends on how often this is called.
        """
        if now_ms < self.clock_ms:
            now_ms = self.clock_ms  # time never goes backwards
        if self.unheaded:
            self._head_groups()
        never = now_ms + 1
        while True:
            t_ret = self._next_retention()
            if t_ret is None:
                t_ret = never
            t_res = self.reserved[0][0] if self.reserved else never
            t_del = self.delayed[0][0] if self.delayed else never
            t_run = self.later[0][0] if self.later else never
            t = min(t_ret, t_res, t_del, t_run)
            if t > now_ms:
                break
            self.transitions += 1
            if t == t_ret:
                self._expire_retention()
            elif t == t_res:
                self._expire_leases(t)
            elif t == t_del:
                _, _, m = heapq.heappop(self.delayed)
                if m.state == DELAYED and m.activate_at_ms == t:
                    self.n_delayed -= 1
                    m.state = READY
                    self.n_ready += 1
                    self._make_available(m)
            else:
                self._wake(t, heapq.heappop(self.later)[2])
        self._expire_idempotency(now_ms)
        self.clock_ms = now_ms
        self._maybe_compact()

    def next_due_ms(self) -> int | None:
        """When the next time-driven transition is due (``None``: nothing is pending).

        The answer may be early (a stale index entry), never late: a shell that sleeps until
        then and calls :meth:`advance` misses nothing.
        """
        self._drop_stale_tops()
        candidates = [self._next_retention()]
        if self.reserved:
            candidates.append(self.reserved[0][0])
        if self.delayed:
            candidates.append(self.delayed[0][0])
        if self.later:
            candidates.append(self.later[0][0])
        due = [c for c in candidates if c is not None]
        return min(due) if due else None

    def _next_retention(self) -> int | None:
        arrivals = self.arrivals
        while arrivals:
            head = arrivals[0]
            if isinstance(head, Run):
                if head.alive():
                    return head.at_ms + self.settings.retention_ms
            elif head.state < GONE:
                return head.enqueued_at_ms + self.settings.retention_ms
            arrivals.popleft()
        return None

    def _expire_retention(self) -> None:
        m = self.arrivals.popleft()
        if isinstance(m, Run):
            self._expire_run(m)
            return
        if self.observer is not None:
            self.observer.retention_expired(m, m.enqueued_at_ms + self.settings.retention_ms)
        self._remove(m)
        self.expired_total += 1

    def _expire_leases(self, t: int) -> None:
        """Every lease that runs out at ``t`` (a take's batch shares one deadline): its
        message is ready again, or dead-lettered. In a spilling state, the untouched
        messages of a run that follow each other go back into it as a return run, ready at
        once (runs.py, ``Run.lend``)."""
        reserved = self.reserved
        lends = self._gives_back()
        back: list[QueuedMessage] = []
        while reserved and reserved[0][0] == t:
            m = heapq.heappop(reserved)[2]
            if m.state != RESERVED or m.deadline_ms != t:
                continue  # a stale entry
            if not lends:
                self._expire_lease(m)
                continue
            self._end_lease(m)
            if self._exhausted(m):
                self._dead_letter(m, t)
            else:
                # in no state count until _give_back places it (and no longer reserved:
                # the heap may hold a second entry for it at this deadline, from a touch)
                m.state, m.activate_at_ms = _GIVEN, t
                back.append(m)
        if back:
            self.transitions += len(back) - 1  # one a message, as one at a time counts
            self._give_back(back, t)

    def _expire_lease(self, m: QueuedMessage) -> None:
        deadline = m.deadline_ms
        if self.observer is not None:
            self.observer.lease_expired(m)
        self._end_lease(m)
        if self._exhausted(m):
            self._dead_letter(m, deadline)
        else:
            self._schedule(m, deadline, deadline)

    def _expire_idempotency(self, now_ms: int) -> None:
        window = self.settings.idempotency_window_ms
        order = self.idem_order
        while order and order[0][0] + window <= now_ms:
            at, key = order.popleft()
            entry = self.idem.get(key)
            if entry is not None and entry[1] == at:
                del self.idem[key]

    # ---------------------------------------------------------------- helpers

    def _schedule(self, m: QueuedMessage, activate_at_ms: int, now_ms: int) -> None:
        """Put a message that is in no state count back as delayed or ready."""
        m.activate_at_ms = activate_at_ms
        if activate_at_ms <= now_ms:
            m.state = READY
            self.n_ready += 1
            self._make_available(m)
        else:
            m.state = DELAYED
            self.n_delayed += 1
            heapq.heappush(self.delayed, (activate_at_ms, m.seq, m))

    def _make_available(self, m: QueuedMessage) -> None:
        """A message just became ready: offer it to ``take`` unless its group holds it back."""
        if self.observer is not None:
            self.observer.made_available(m)
        if self.settings.fifo:
            group = self.groups[m.group]
            if group.busy or self._head(group) is not m:
                return
        elif self.fair is not None and m.group is not None:
            self.fair.push(m)
            return
        heapq.heappush(self.ready, (m.activate_at_ms, m.seq, m))

    def _end_lease(self, m: QueuedMessage) -> None:
        """A reserved message stops being reserved (its state is set by the caller)."""
        self.n_reserved -= 1
        m.lease = 0
        m.deadline_ms = 0
        if self.settings.fifo:
            group = self.groups[m.group]
            group.busy -= 1
            if not group.busy:
                # The group is free again. A head that came back while others of its run
                # were still in flight is offered now; ``m`` itself is offered (or removed)
                # by the caller.
                head = self._head(group)
                if head is not None and head is not m and head.state == READY:
                    heapq.heappush(self.ready, (head.activate_at_ms, head.seq, head))

    def _exhausted(self, m: QueuedMessage) -> bool:
        limit = self.settings.max_receives
        return limit is not None and m.receive_count >= limit

    def _dead_letter(self, m: QueuedMessage, lease_deadline_ms: int = 0) -> None:
        """Move a message whose lease just ended (no state count) to the outbox; the lease
        ran out at ``lease_deadline_ms`` (0: it was released)."""
        m.state = DEAD
        del self.messages[m.id]
        self.outbox[m.seq] = m
        self.dead_lettered += 1
        if self.settings.fifo:
            self._refresh_group(m)
        if self.observer is not None:
            self.observer.dead_lettered(m, lease_deadline_ms)

    def _remove(self, m: QueuedMessage) -> None:
        """Delete a live message from every index."""
        if m.state == READY:
            self.n_ready -= 1
        elif m.state == DELAYED:
            self.n_delayed -= 1
        elif m.state == RESERVED:
            self._end_lease(m)
        m.state = GONE
        del self.messages[m.id]
        if self.patching:  # its put's run may hold its body as a patch: never read again
            found = self.holding(m.seq)
            if found is not None and found[0].patches:
                found[0].patches.drop(found[1])
        if self.settings.fifo:
            self._refresh_group(m)

    def _refresh_group(self, gone: QueuedMessage) -> None:
        """After ``gone`` left its group: drop the empty group, or offer a new head."""
        group = self.groups[gone.group]
        msgs = group.msgs
        was_head = False
        while msgs and msgs[0].state >= GONE:
            was_head |= msgs.popleft() is gone
        if not was_head:
            # a message behind the head left: nothing changes for take; those gone are
            # swept once they are half of what the group holds as messages
            group.gone += 1
            if group.gone > _REST_SLACK and 2 * group.gone > len(msgs):
                group.msgs = deque(m for m in msgs if m.state < GONE)
                group.gone = 0
            return
        head = self._head(group)
        if head is None:
            del self.groups[gone.group]
        elif head.state == READY and not group.busy:
            heapq.heappush(self.ready, (head.activate_at_ms, head.seq, head))

    def _head(self, group: Group) -> QueuedMessage | None:
        """The first member of ``group`` still in the queue, materialized out of its run if
        it is still held in one (None: the group is empty)."""
        msgs = group.msgs
        while msgs and msgs[0].state >= GONE:
            msgs.popleft()
        rest = group.rest
        while group.start < len(rest) and (not msgs or rest[group.start] < msgs[0].seq):
            found = self._grouped_slot(rest[group.start])
            if found is not None:
                self._promote(*found)  # into ``msgs``, at its front
                break
            group.start += 1  # its slot left the run otherwise (retention)
        return msgs[0] if msgs else None

    def _head_groups(self) -> None:
        """Materialize every group's head still held in a run (a restored state); offer
        those (the others were offered by the restore)."""
        self.unheaded = False
        for name, group in list(self.groups.items()):
            msgs = group.msgs
            before = msgs[0] if msgs else None
            head = self._head(group)
            if head is None:
                del self.groups[name]
            elif head is not before and head.state == READY and not group.busy:
                heapq.heappush(self.ready, (head.activate_at_ms, head.seq, head))

    def holding(self, seq: int) -> tuple[Run, int] | None:
        """The put's run whose slots' sequence numbers take in ``seq``, and its slot (held
        there or not: the caller checks)."""
        by_id = self.by_id
        j = bisect_right(by_id, seq, key=_seq) - 1
        if j < 0:
            return None
        run = by_id[j]
        i = seq - run.seq
        return (run, i) if i < run.count else None

    def _grouped_slot(self, seq: int) -> tuple[Run, int] | None:
        """The FIFO run and slot holding sequence number ``seq``, while it does."""
        found = self.holding(seq)
        if found is not None and found[0].gnames is not None and found[0].is_spilled(found[1]):
            return found
        return None

    def group_named(self, name: str | None, names: list[str] | None = None, k: int = 0) -> Group:
        """The group ``name`` (made if it is new). ``names``: a run's table of groups, whose
        entry ``k`` is ``name``: it takes the group's copy of the name, one for all runs."""
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = Group(name)
        elif names is not None and group.name is not None:
            names[k] = group.name
        return group

    def _promote(self, run: Run, i: int, contents: Contents | None = None) -> QueuedMessage:
        """Slot ``i`` of FIFO run ``run`` as a ready message, in its group's ``msgs`` (its
        sequence number stays in ``rest`` when it leaves out of turn: passed over there)."""
        m = self._materialize(run, i, self.contents_of(run) if contents is None else contents)
        run.take_slot(i)
        self.grouped -= 1
        group = self.groups[m.group]
        rest, seq = group.rest, m.seq
        if group.start < len(rest) and rest[group.start] == seq:
            group.start += 1
            if group.start > _REST_SLACK and 2 * group.start > len(rest):
                del rest[: group.start]
                group.start = 0
        if m.state == DELAYED:  # of a FIFO run still waiting: ready at its time
            heapq.heappush(self.delayed, (m.activate_at_ms, m.seq, m))
        msgs = group.msgs
        if not msgs or seq < msgs[0].seq:
            msgs.appendleft(m)  # a new head
        elif seq > msgs[-1].seq:
            msgs.append(m)
        else:
            msgs.insert(bisect_left(msgs, seq, key=_seq), m)
        return m

    def group_after(self, head: QueuedMessage) -> Iterator[QueuedMessage]:
        """The members of ``head``'s group after it, in order: its materialized ones, and
        transient views of those still in runs (what a take reads; the take's event
        materializes them). Gone ones are passed over by the caller."""
        group = self.groups[head.group]
        msgs = iter(group.msgs)
        for m in msgs:
            if m is head:
                break
        if group.start >= len(group.rest):
            yield from msgs
            return
        yield from heapq.merge(msgs, self._rest_views(group), key=_seq)

    def _rest_views(self, group: Group) -> Iterator[QueuedMessage]:
        rest = group.rest
        last: Run | None = None
        contents: Contents | None = None
        for k in range(group.start, len(rest)):
            found = self._grouped_slot(rest[k])
            if found is None:
                continue
            run, i = found
            if run is not last:
                last, contents = run, self.contents_of(run)
            assert contents is not None
            yield transient(run, i, contents)

    def grouped_after(self, after: tuple[int, int] | None) -> Iterator[QueuedMessage]:
        """Transient views of the messages held in a FIFO queue's runs whose key
        ``(activate_at, seq)`` is past ``after``, in that order (for browse): runs in put
        order, merged where a put's time is earlier than the one before (the clock went
        back)."""
        stretches: list[list[Run]] = []
        spread: list[Run] = []  # their slots each at its own time, those reached (ready)
        for run in self.by_id:
            if not run.left or run.gnames is None:
                continue
            if run.acts is not None:
                spread.append(run)
                continue
            if run.waiting:
                continue  # a waiting FIFO run's are delayed (deferred_after)
            if after is not None and (run.act, run.seq + run.count - 1) <= after:
                continue
            if not stretches or run.act < stretches[-1][-1].act:
                stretches.append([])
            stretches[-1].append(run)
        keyed = heapq.merge(
            *(self._keys_of(stretch, after) for stretch in stretches),
            *(_reached_after(run, after) for run in spread),
        )
        read: dict[int, Contents] = {}
        for _, _, i, run in keyed:
            if id(run) not in read:
                read.clear()
                read[id(run)] = self.contents_of(run)
            yield transient(run, i, read[id(run)])

    @staticmethod
    def _keys_of(
        runs: list[Run], after: tuple[int, int] | None
    ) -> Iterator[tuple[int, int, int, Run]]:
        for run in runs:
            for i in run.spilled():
                if after is None or (run.act, run.seq + i) > after:
                    yield run.act, run.seq + i, i, run

    def _drop_stale_tops(self) -> None:
        for heap, state, key in (
            (self.ready, READY, _ACTIVATE),
            (self.delayed, DELAYED, _ACTIVATE),
            (self.reserved, RESERVED, _DEADLINE),
        ):
            while heap and not _valid(heap[0], state, key):
                heapq.heappop(heap)
        later = self.later
        while later and not _waits(later[0]):  # every slot gone, or a time passed over
            heapq.heappop(later)

    def _expire_run(self, run: Run) -> None:
        """Retention ends every message of ``run`` (all were put at once)."""
        if run.cids is not None:  # a client-id run: its ids leave the index (lent ones too)
            for held in [run, *run.live_loans()]:
                for i in held.spilled():
                    self._unindex(run, held.put_slot(i), held.mid(i))
            self._drop_client_run(run)
        for held in [run, *run.live_loans()]:  # its return runs share its put time
            n = held.left
            late = held.unreached() if held.gnames is not None else 0  # before they leave
            held.left, held.next = 0, held.count
            held.out.clear()
            if held.gnames is not None:
                self.grouped -= n  # their group's ``rest`` passes over them
                self.n_delayed -= late
                self.n_ready -= n - late
            elif held.waiting:
                self.deferred -= n
                self.n_delayed -= n
            else:
                self.spilled -= n
                self.n_ready -= n
            self.expired_total += n
        run.lent, run.loans = 0, None
        for m in run.mat:
            if m.state < GONE:
                self._remove(cast(QueuedMessage, m))
                self.expired_total += 1
        run.mat.clear()

    def _maybe_compact(self) -> None:
        """Sweep stale index entries once they outnumber the live ones."""
        if len(self.ready) > 2 * self.n_ready + _COMPACT_SLACK:
            self.ready = _sweep(self.ready, READY, _ACTIVATE)
        if len(self.delayed) > 2 * self.n_delayed + _COMPACT_SLACK:
            self.delayed = _sweep(self.delayed, DELAYED, _ACTIVATE)
        if len(self.reserved) > 2 * self.n_reserved + _COMPACT_SLACK:
            self.reserved = _sweep(self.reserved, RESERVED, _DEADLINE)
        if self.fair is not None:
            self.fair.maybe_sweep(self.n_ready)
        if len(self.later) > 2 * self.n_delayed + _COMPACT_SLACK:
            # stale entries of runs whose time moved (a scattered run takes one a reschedule);
            # a live entry has a delayed message at least (a FIFO queue's waiting runs count
            # theirs in n_delayed, not in deferred: against deferred, 10k of them made every
            # command sweep them all)
            later = list({id(e[2]): e for e in self.later if _waits(e)}.values())
            heapq.heapify(later)
            self.later = later
        if len(self.arrivals) > 2 * (len(self.messages) + len(self.by_id)) + _COMPACT_SLACK:
            self.arrivals = deque(m for m in self.arrivals if _live(m))
        if self.in_mats > 2 * len(self.messages) + _COMPACT_SLACK:
            self._sweep_mats()
        if self.run_front > _COMPACT_SLACK and 2 * self.run_front > len(self.runs):
            self.runs = [r for r in self.runs[self.run_front :] if r.left]
            self.run_front = 0
        live = len(self.runs) - self.run_front + len(self.later)
        if self.settings.fifo:
            live = max(live, self.kept_runs)  # a FIFO queue's runs are in neither
        if len(self.by_id) > 2 * live + _COMPACT_SLACK:
            self._sweep_runs()

    def _sweep_mats(self) -> None:
        """Materialized messages that are gone, held by runs behind one still alive
        (retention drops only the front's): swept like the heaps' stale entries, in the runs
        that hold any (``mat_runs``), not in every run (100k runs deferred for days made
        each sweep ~10 ms, one every 4096 messages taken)."""
        self.in_mats = 0
        kept = []
        for run in dict.fromkeys(self.mat_runs):
            if run.mat:
                run.mat = mat = deque(m for m in run.mat if m.state < GONE)
                if mat:
                    kept.append(run)
                    self.in_mats += len(mat)
        self.mat_runs = kept

    def _sweep_runs(self) -> None:
        """``by_id`` without its dead runs (a run is kept while a message of it may still be
        given back: runs.py, Run.lend)."""
        kept = []
        for r in self.by_id:
            if r.alive():
                kept.append(r)
            elif r.cids is not None:
                self._drop_client_run(r)
        self.by_id = kept
        self.kept_runs = len(kept)

    def oldest_ready_ms(self) -> int | None:
        """Activation time of the next message ``take`` would hand out."""
        while self.ready and not _valid(self.ready[0], READY, _ACTIVATE):
            heapq.heappop(self.ready)
        oldest = self.ready[0][0] if self.ready else None
        if self.fair is not None:
            grouped = self.fair.oldest()
            if grouped is not None and (oldest is None or grouped < oldest):
                oldest = grouped
        run = self.front_run()
        if run is not None and (oldest is None or run.act < oldest):
            return run.act
        return oldest

    # ---------------------------------------------------------------- runs (runs.py)

    @property
    def total(self) -> int:
        """Messages in the queue (not counting the outbox)."""
        return len(self.messages) + self.spilled + self.deferred + self.grouped

    def live_runs(self) -> Iterator[Run]:
        """Every put's run with slots still spilled (ready or delayed), lent to return runs,
        or materialized into messages still in the queue (they may be given back into it:
        its place stays readable), in put order (the order of their records in the log)."""
        return (run for run in self.by_id if run.alive())

    def _runnable(self, e: ev.MessagesPut) -> bool:
        """Whether a put can be held as a run: all its messages ready at once, either at
        the put or at one later time, or each at its own later time; server ids increasing
        past every run's; no observer (which wants each message). A FIFO queue's put is a
        run in the same three cases, each message with a group."""
        if self.observer is not None or not e.items:
            return False
        fifo = self.settings.fifo
        at = e.at_ms
        act = e.items[0].activate_at_ms
        later = act > at
        if later:
            depth = self.n_delayed
        elif act == at:
            runs = self.runs
            if runs and at < runs[-1].act:
                return False  # the clock went back: runs must be in take order
            depth = self.n_ready
        else:
            return False  # ready since before the put: not in a run's take order
        if len(e.items) < self.run_min_put and depth < RUN_DEPTH:
            return False  # a few messages into a shallow queue: taken soon, from memory
        client = self.settings.id_mode == "client"
        if client and (
            len(e.items) > 1 << SLOT_BITS or (len(self.cruns) >= MAX_RUNS and not self.cfree)
        ):
            return False  # beyond what the index's locations can name: messages
        last = self.by_id[-1].last_id if self.by_id and not client else 0
        clock = self.clock_ms
        for it in e.items:
            mid = it.id
            if (
                (type(mid) is str) != client
                or (not client and cast(int, mid) <= last)  # out of order (a redelivery)
                # each due later (not already, as when the clock went back: delayed runs
                # wake in time order), or all at the put
                or (it.activate_at_ms <= clock if later else it.activate_at_ms != act)
                or (it.group is None) == fifo
            ):
                return False
            if not client:
                last = mid
        return True

    def _put_run(self, e: ev.MessagesPut) -> None:
        items = e.items
        ids = [it.id for it in items]
        act = items[0].activate_at_ms
        bodies = [it.body for it in items]
        acts = [it.activate_at_ms for it in items]
        attrs = [it.attributes for it in items]
        groups = [cast(str, it.group) for it in items] if self.settings.fifo else None
        if acts.count(act) == len(acts):
            run = Run(self.next_seq, ids, e.at_ms, bodies, act, attrs=attrs, groups=groups)  # type: ignore[arg-type]
        else:  # a spread run: each slot at its own time
            run = Run(self.next_seq, ids, e.at_ms, bodies, acts=acts, attrs=attrs, groups=groups)  # type: ignore[arg-type]
        n = run.count
        self.by_id.append(run)
        self.arrivals.append(run)
        self.unplaced.append(run)
        for it in items:
            if it.key is not None:
                self.idem[it.key] = (it.id, e.at_ms)
                self.idem_order.append((e.at_ms, it.key))
        self.next_seq += n
        if run.cids is None:
            self.last_id = max(self.last_id, run.last_id)
        else:
            self._index_run(run, ids)
        self.enqueued_total += n
        if groups is not None:
            if run.act > e.at_ms:  # its members in their groups now, delayed until act
                run.waiting = True
                heapq.heappush(self.later, (run.act, run.seq, run))
            self._put_grouped(run)
        elif run.act > e.at_ms:
            run.waiting = True
            heapq.heappush(self.later, (run.act, run.seq, run))
            self.deferred += n
            self.n_delayed += n
        else:
            self.runs.append(run)
            self.spilled += n
            self.n_ready += n

    def _index_run(self, run: Run, ids: list[Any] | None = None) -> None:
        """A client-id run: numbered, and each of its ids still in it indexed (``ids``: all
        of them, at hand)."""
        index = self.cindex
        if index is None:
            index = self.cindex = IdIndex()
        no = self.number_run(run)
        if ids is not None:
            for i, mid in enumerate(ids):
                index.add(mid, no, i)
        else:
            for i in run.spilled():
                index.add(run.mid(i), no, i)

    def number_run(self, run: Run) -> int:
        """A client-id run's number in ``cruns`` (one a gone run had, or a new one)."""
        if self.cfree:
            run.no = no = self.cfree.pop()
            self.cruns[no] = run
        else:
            run.no = no = len(self.cruns)
            self.cruns.append(run)
        return no

    def _unindex(self, run: Run, i: int, mid: str) -> None:
        """Slot ``i`` of client-id run ``run`` (id ``mid``) leaves the run: and the index,
        which goes, buckets and all, once it holds nothing."""
        index = cast(IdIndex, self.cindex)  # it holds every slot still in a run
        index.remove(mid, run.no, i)
        if not index:
            self.cindex = None

    def reindex(self, run: Run, i: int, mid: str) -> None:
        """Slot ``i`` of client-id run ``run`` (id ``mid``) goes back into a return run of
        it: the index finds it through ``run`` again (``_client_slot``)."""
        index = self.cindex
        if index is None:
            index = self.cindex = IdIndex()
        index.add(mid, run.no, i)

    def _drop_client_run(self, run: Run) -> None:
        """A client-id run holds nothing more: no entry names it, its number can serve
        again (none to give back after ``unspill_all``)."""
        no = run.no
        if no < len(self.cruns) and self.cruns[no] is run:
            self.cruns[no] = None
            self.cfree.append(no)

    def _client_slot(self, mid: str) -> tuple[Run, int] | None:
        """The client-id run and slot holding ``mid``, while one does."""
        index = self.cindex
        if index is None:
            return None
        cruns = self.cruns
        for no, i in index.find(mid):
            run = cruns[no]
            if run is None or i >= run.count or run.mid(i) != mid:
                continue
            if run.is_spilled(i):
                return run, i
            if run.lent:  # given back into one of its return runs
                found = run.lends(i)
                if found is not None:
                    return found
        return None

    def _put_grouped(self, run: Run) -> None:
        """A FIFO queue's run: each slot joins its group's ``rest``; a group that had no
        member has a head now, materialized and offered to take."""
        n = run.count
        self.grouped += n
        if run.waiting:
            self.n_delayed += n
        else:
            self.n_ready += n
        names = cast(list[str], run.gnames)  # each group of the put once
        held: list[Group] = []
        fresh: list[Group] = []
        for k, name in enumerate(names):
            group = self.group_named(name, names, k)
            held.append(group)
            if self._head(group) is None:
                fresh.append(group)
        seq = run.seq
        for i, k in enumerate(cast("array[int]", run.gidx)):
            held[k].rest.append(seq + i)
        for group in fresh:
            head = self._head(group)  # a delayed one waits in the delayed heap (_promote)
            if head is not None and not group.busy and head.state == READY:
                heapq.heappush(self.ready, (head.activate_at_ms, head.seq, head))

    def _wake(self, t: int, run: Run) -> None:
        """Delayed ``run``'s time ``t`` came: its spilled slots are ready, after every ready
        run (whose times are all earlier: the clock has just reached this one's). A spread
        run's slots due at ``t`` are materialized as ready messages, and it waits on for
        its next slot's time."""
        if not _waits((t, run.seq, run)):
            return
        if run.gnames is not None:  # a FIFO run: its slots in their groups are ready now
            if run.acts is None:
                run.waiting = False
                self.n_delayed -= run.left
                self.n_ready += run.left
                return
            # a spread one: those due at ``t`` are, where they stand; it waits for the next
            n = len(run.due_slots(t))
            self.n_delayed -= n
            self.n_ready += n
            if run.woke < run.count:
                heapq.heappush(self.later, (run.act, run.seq, run))
            else:
                run.waiting = False
            return
        if run.acts is not None:
            due = run.due_slots(t)
            if due:
                contents = self.contents_of(run)
                for i in due:
                    m = self._materialize(run, i, contents)
                    m.state = READY
                    run.take_slot(i)
                    heapq.heappush(self.ready, (m.activate_at_ms, m.seq, m))
                n = len(due)
                self.deferred -= n
                self.n_delayed -= n
                self.n_ready += n
            if run.left:
                heapq.heappush(self.later, (run.act, run.seq, run))
            return
        run.waiting = False
        n = run.left
        if not n:
            return
        k = self._ready_place((run.act, run.seq), _last_key(run))
        if k is None:
            # Its slots would fall among a ready run's in take order, which only a return
            # run can, woken at the same time as another of the same put whose span covers
            # its own (slots taken from it, then given back): messages instead.
            contents = self.contents_of(run)
            for i in list(run.spilled()):
                m = self._materialize(run, i, contents)
                m.state = READY
                run.take_slot(i)
                heapq.heappush(self.ready, (m.activate_at_ms, m.seq, m))
            self.deferred -= n
            self.n_delayed -= n
            self.n_ready += n
            return
        self.deferred -= n
        self.n_delayed -= n
        self.spilled += n
        self.n_ready += n
        self.runs.insert(k, run)

    def _ready_place(self, first: tuple[int, int], last: tuple[int, int]) -> int | None:
        """Where in ``runs`` a run whose slots' keys go from ``first`` to ``last`` joins it,
        keeping it in take order: at its end, or before the ready runs whose slots come
        after all of its own (a run woken, or leases run out, at the time of ready runs of
        later puts); None if its slots would fall among a run's."""
        runs = self._trimmed_runs()
        if not runs or first > _last_key(runs[-1]):
            return len(runs)
        k = bisect_right(runs, first, lo=self.run_front, key=_last_key)
        after = runs[k]  # k < len(runs): the last run's last key is past ``first``
        return k if (after.act, after.seq) > last else None

    def _trimmed_runs(self) -> list[Run]:
        """``runs`` without the dead ones at its end: what a run joining it must come after
        (a state restored from a snapshot has no dead runs, and must decide the same)."""
        runs = self.runs
        while runs and not runs[-1].left:
            runs.pop()
        self.run_front = min(self.run_front, len(runs))
        return runs

    def place(self, run: Run, place: object) -> None:
        """The shell wrote ``run``'s put: its bodies are read back from ``place`` from now
        on (not an event: it changes where bodies are read from, not the queue)."""
        if run.left or run.lent or run.mat:
            run.place, run.bodies, run.attrs = place, None, None

    def contents_of(self, run: Run) -> Contents:
        """The bodies (and attributes) of ``run``'s put, in order (read back if it is
        placed); a return run's are its put's, its slot ``i`` there ``run.off + i``."""
        if run.src is not None:
            run = run.src
        if run.bodies is not None:
            contents = Contents(run.bodies, run.attrs)
        elif self.read is None:
            raise RuntimeError("a placed run, and no reader to read its bodies")
        else:
            contents = self.read(run.place)
        if run.patches:  # bodies updates changed
            bodies = list(contents.bodies)
            for i, body in run.patches.bodies(self.read):
                bodies[i] = body
            return Contents(bodies, contents.attrs)
        return contents

    def front_run(self) -> Run | None:
        """The first run with spilled slots: the next ones ``take`` reaches among runs."""
        runs, i = self.runs, self.run_front
        while i < len(runs) and not runs[i].left:
            i += 1
        self.run_front = i
        return runs[i] if i < len(runs) else None

    def run_at(self, first_id: int) -> Run | None:
        """The run ``first_id`` names (``Run.ref``: its first id, or a client-id run's
        sequence number), if it still holds spilled slots."""
        by_id = self.by_id
        if type(first_id) is not int:
            return None
        if self.settings.id_mode == "client":
            found = self.holding(first_id)
            if found is not None and found[1] == 0 and (found[0].left or found[0].lent):
                return found[0]
            return None
        i = bisect_right(by_id, first_id, key=_first_id) - 1
        if i >= 0 and by_id[i].id == first_id and (by_id[i].left or by_id[i].lent):
            return by_id[i]
        return None

    def _run_of(self, mid: object) -> tuple[Run, int] | None:
        """The run (a put's, or a return run) and slot holding id ``mid`` while it is
        spilled."""
        if type(mid) is str:
            return self._client_slot(mid)
        if type(mid) is not int or not (self.spilled or self.deferred or self.grouped):
            return None
        runs, i = self.runs, self.run_front
        if i < len(runs) and runs[i].id <= mid <= runs[i].last_id:
            run = runs[i]  # the front run, where takes are
            slot = run.slot(mid)
            if slot is not None:
                return run, slot
        by_id = self.by_id
        j = bisect_right(by_id, mid, key=_first_id) - 1
        if j < 0:
            return None
        run = by_id[j]
        slot = run.slot(mid)
        if slot is not None:
            return run, slot
        if not run.lent or not run.id <= mid <= run.last_id:
            return None
        if run.ids is None:
            i = mid - run.id
        else:
            i = bisect_left(run.ids, mid)
            if run.ids[i] != mid:
                return None
        return run.lends(i)

    def spilled_message(self, mid: object) -> QueuedMessage | None:
        """A transient view of spilled message ``mid`` (None: not spilled here). Reading it
        changes nothing; an event that changes it materializes it (:meth:`find`)."""
        found = self._run_of(mid)
        if found is None:
            return None
        run, i = found
        return transient(run, i, self.contents_of(run))

    def spilled_after(self, after: tuple[int, int] | None) -> Iterator[QueuedMessage]:
        """Transient views of the spilled messages whose ready key ``(activate_at, seq)``
        is past ``after``, in that order (the order ``take`` reaches them)."""
        runs = self.runs
        self.front_run()  # past the runs taken whole: a take starts where the last one ended
        lo = self.run_front
        if after is not None:
            lo = bisect_right(runs, after, lo=lo, key=_last_key)
        for j in range(lo, len(runs)):
            run = runs[j]
            if not run.left:
                continue
            contents = None
            for i in run.spilled():
                if after is not None and (run.act, run.seq + i) <= after:
                    continue
                if contents is None:
                    contents = self.contents_of(run)
                yield transient(run, i, contents)

    def deferred_after(self, after: tuple[int, int] | None) -> Iterator[QueuedMessage]:
        """Transient views of the delayed runs' spilled messages whose key ``(activate_at,
        seq)`` is past ``after``, in that order (the order they become ready)."""
        # by run: a return run may start at the slot of its put's run that waits too
        waiting = {id(entry[2]): entry[2] for entry in self.later if _waits(entry)}
        keyed = heapq.merge(*(_keys_after(run, after) for run in waiting.values()))
        read: dict[int, Contents] = {}
        for _, _, i, run in keyed:
            if id(run) not in read:
                read[id(run)] = self.contents_of(run)
            yield transient(run, i, read[id(run)])

    def holds(self, mid: ev.MessageId) -> bool:
        """Whether a message with id ``mid`` is in the queue."""
        return mid in self.messages or self._run_of(mid) is not None

    def find(self, mid: ev.MessageId) -> QueuedMessage | None:
        """The live message ``mid``, materialized out of its run if it was spilled."""
        m = self.messages.get(mid)
        if m is None:
            m = self._unspill(mid, offer=True)  # None at once when no run holds it
        return m

    def unspill_all(self) -> None:
        """Materialize every spilled message (bodies read back): the state no longer needs
        the log's bodies (a state that stops spilling, or leaves its log)."""
        for put in self.by_id:
            if put.gnames is not None and put.left:  # a FIFO run: into the groups
                contents = self.contents_of(put)
                for i in list(put.spilled()):
                    self._promote(put, i, contents)
            for run in [*put.live_loans(), put]:  # the loans read through their put's run
                if not run.left:
                    continue
                contents = self.contents_of(run)
                heap = self.delayed if run.waiting else self.ready
                for i in list(run.spilled()):
                    m = self._materialize(run, i, contents)
                    heap.append((m.activate_at_ms, m.seq, m))
                run.left, run.next = 0, run.count
                run.out.clear()
            put.place, put.bodies, put.attrs, put.lent, put.loans = None, None, None, 0, None
            put.patches = None
        heapq.heapify(self.ready)
        heapq.heapify(self.delayed)
        self.runs, self.run_front, self.spilled = [], 0, 0
        self.later, self.deferred, self.by_id = [], 0, []
        self.cindex, self.cruns, self.cfree = None, [], []
        for group in self.groups.values():
            group.rest, group.start = array("q"), 0
        self.spill = False

    def _unspill(
        self, mid: ev.MessageId, offer: bool, read: list[Any] | None = None
    ) -> QueuedMessage | None:
        """Materialize spilled message ``mid``: a delayed one into the delayed heap, a ready
        one into the ready heap if ``offer`` (a caller about to take it leaves it out).
        ``read``: the run last read and its contents, kept there across calls."""
        found = self._run_of(mid)
        if found is None:
            return None
        run, i = found
        if run.gnames is not None:
            m = self._promote(run, i)
            group = self.groups[m.group]
            if offer and not group.busy and self._head(group) is m:
                heapq.heappush(self.ready, (m.activate_at_ms, m.seq, m))
            return m
        if read is None:
            contents = self.contents_of(run)
        elif read[0] is run:
            contents = read[1]
        else:
            contents = read[1] = self.contents_of(run)
            read[0] = run
        m = self._materialize(run, i, contents)
        run.take_slot(i)
        if run.waiting:
            self.deferred -= 1
            heapq.heappush(self.delayed, (m.activate_at_ms, m.seq, m))
        else:
            self.spilled -= 1
            if offer:
                heapq.heappush(self.ready, (m.activate_at_ms, m.seq, m))
        return m

    def _materialize(self, run: Run, i: int, contents: Contents) -> QueuedMessage:
        """Slot ``i`` of ``run`` as a message of the state (ready, or delayed while the run
        waits; the caller indexes it and counts the slot out of the run)."""
        m = transient(run, i, contents)
        put = run if run.src is None else run.src
        if put.cids is not None:  # found in ``messages`` now
            self._unindex(put, run.put_slot(i), cast(str, m.id))
        if not put.mat:
            self.mat_runs.append(put)
        put.mat.append(m)
        self.in_mats += 1
        self.messages[m.id] = m
        return m


_ACTIVATE, _DEADLINE = 0, 1


def transient(run: Run, i: int, contents: Contents) -> QueuedMessage:
    """Slot ``i`` of ``run`` as a message, its body (and attributes) from ``contents`` (its
    put's: a return run's slot ``i`` is its put's ``run.off + i``)."""
    state = READY
    if run.waiting and (run.acts is None or run.base + run.acts[i] >= run.act):
        state = DELAYED  # not reached yet (a spread FIFO run's reached slots stay in it)
    attrs = contents.attrs
    slots = run.slots
    if slots is None:
        at, seq, rc, first = run.off + i, run.seq + i, run.rc, run.first
    else:  # a scattered return run's: each slot has its own
        at = slots[i]
        seq, rc, first = run.seq + at, cast("array[int]", run.rcs)[i], run.first_of(i)
    if run.cwidth or run.cends is not None or run.slots is not None:
        mid = run.mid(i)  # a client id, or a scattered slot's
    else:  # the common case inline (a take makes a view and a message of each)
        mid = run.id + i if run.ids is None else run.ids[i]
    gnames = run.gnames
    return QueuedMessage(
        seq,
        mid,
        contents.bodies[at],
        run.at_ms,
        run.act if run.acts is None else run.base + run.acts[i],
        state,
        rc,
        0,
        0,
        None if gnames is None else gnames[cast("array[int]", run.gidx)[i]],
        None if attrs is None else attrs[at],
        first,
    )


def _waits(entry: tuple[int, int, Run]) -> bool:
    """Whether an entry of ``QueueState.later`` is current: its run still waits, for
    that time."""
    run = entry[2]
    return run.waiting and run.left > 0 and run.act == entry[0]


def _keys_after(run: Run, after: tuple[int, int] | None) -> Iterator[tuple[int, int, int, Run]]:
    """``(activate_at, seq, slot, run)`` of a waiting run's spilled slots past ``after``, in
    key order (no two slots share a key: the run is never compared)."""
    for i in run.spilled_by_time():
        key = (run.act_of(i), run.seq_of(i))
        if after is None or key > after:
            yield (*key, i, run)


def _reached_after(run: Run, after: tuple[int, int] | None) -> Iterator[tuple[int, int, int, Run]]:
    """``(activate_at, seq, slot, run)`` of a spread FIFO run's spilled slots reached (ready)
    past ``after``, in key order."""
    for i in run.reached():
        key = (run.act_of(i), run.seq + i)
        if after is None or key > after:
            yield (*key, i, run)


def _first_id(run: Run) -> int:
    return cast(int, run.id)


def _seq(item: Run | QueuedMessage) -> int:
    return item.seq


def _slot(entry: tuple[int, QueuedMessage]) -> int:
    return entry[0]


def _last_key(run: Run) -> tuple[int, int]:
    return (run.act, run.seq + run.count - 1)


def _live(item: QueuedMessage | Run) -> bool:
    return item.alive() if isinstance(item, Run) else item.state < GONE


def _valid(entry: tuple[int, int, QueuedMessage], state: int, key: int) -> bool:
    m = entry[2]
    if m.state != state:
        return False
    return (m.activate_at_ms if key == _ACTIVATE else m.deadline_ms) == entry[0]


def _sweep(
    heap: list[tuple[int, int, QueuedMessage]], state: int, key: int
) -> list[tuple[int, int, QueuedMessage]]:
    """The valid entries of ``heap``, one per message, as a new heap."""
    live = list({e[1]: e for e in heap if _valid(e, state, key)}.values())
    heapq.heapify(live)
    return live


RATE_BURST_US = 1_000_000  # a rate limit lets a second's worth go at once


def allowance(tat_us: int, now_ms: int, rate: int) -> int:
    """How many messages a rate limit of ``rate`` a second lets go at ``now_ms``, its
    bucket at ``tat_us`` (see ``spend``)."""
    now = now_ms * 1000
    return max(0, (now + RATE_BURST_US - max(tat_us, now)) // (1_000_000 // rate))


def spend(tat_us: int, now_ms: int, n: int, rate: int) -> int:
    """The bucket once ``n`` messages went at ``now_ms``: each moves it on by the time one
    takes at the rate, from now if it was behind (a leaky bucket, GCRA)."""
    return max(tat_us, now_ms * 1000) + n * (1_000_000 // rate)


def rate_wait_ms(tat_us: int, now_ms: int, rate: int) -> int:
    """How long until the rate limit lets one message go (0: now)."""
    now = now_ms * 1000
    wait_us = max(tat_us, now) + (1_000_000 // rate) - (now + RATE_BURST_US)
    return max(0, -(-wait_us // 1000))


def _failed(m: QueuedMessage, at: int, reason: str | None) -> None:
    """``m`` failed at ``at`` for ``reason``: kept with its last ones, in its attributes (a
    new map: the old one may be shared)."""
    attributes = dict(m.attributes or {})
    before = attributes.get(ev.FAILURES)
    kept = list(before[-(ev.KEPT_FAILURES - 1) :]) if isinstance(before, list) else []
    attributes[ev.FAILURES] = [*kept, [at, reason]]
    m.attributes = attributes


_APPLY: dict[type, Callable[[QueueState, Any], None]] = {
    ev.QueueCreated: QueueState._apply_created,
    ev.SettingsChanged: QueueState._apply_settings,
    ev.MessagesPut: QueueState._apply_put,
    ev.MessagesTaken: QueueState._apply_taken,
    ev.MessagesAcked: QueueState._apply_acked,
    ev.MessagesReleased: QueueState._apply_released,
    ev.LeasesExtended: QueueState._apply_touched,
    ev.MessageUpdated: QueueState._apply_updated,
    ev.MessagesDeleted: QueueState._apply_deleted,
    ev.QueuePurged: QueueState._apply_purged,
    ev.DeadLettersRouted: QueueState._apply_dlq,
    ev.WriterStarted: QueueState._apply_writer,
    ev.KeySet: QueueState._apply_key,
    ev.QueueDeleted: QueueState._apply_dropped,
    ev.Checkpoint: QueueState._apply_writer,
    ev.QueueHandedOver: QueueState._apply_handed_over,
    ev.QueueTakenOver: QueueState._apply_taken_over,
    ev.MoveTaskStarted: QueueState._apply_move_started,
    ev.MoveTaskProgressed: QueueState._apply_move_progress,
    ev.MoveTaskCancelling: QueueState._apply_move_cancelling,
    ev.MoveTaskEnded: QueueState._apply_move_ended,
    ev.BodiesMoved: QueueState._apply_moved,
    ev.QueuePaused: QueueState._apply_paused,
}
