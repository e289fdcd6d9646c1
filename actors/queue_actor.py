"""One queue as a running thing: what it does between commands, by itself. A plain asyncio
class.

The split of a shard, one sentence each: a command's life (admitted, decided, appended,
released once durable) is :mod:`actors.flow`'s; which queues exist and the log's life are the
shard's (:mod:`actors.shard`); what one queue does between commands is this module's — its
alarm, its waiting (long-poll) takes, routing its dead letters and running its move task, its
snapshots, and placing its runs in the log once the log holds them. The flow tells a queue
of its events as they are decided (:meth:`QueueActor.decided`) and once durable
(:meth:`QueueActor.durable`); the queue's own commands (snapshot markers, dead-letter
confirmations, moves) go through the flow like everyone's (:meth:`QueueActor.execute`).

Commands run one at a time, in arrival order (the event loop is the serial command stream):
each is decided and applied at once, so the next command sees its effects.

The queue does not own the log: its host (the shard, :class:`QueueHost`) does, and handles
failed writes for all of its queues at once (it reads the log again and hands each queue its
recovered state, then decides again every command that was waiting behind the failed write).

An alarm is set for the engine's next due transition (activation, lease expiry, retention);
when it goes off the queue advances its clock and wakes whoever waits for changes. There is
no periodic scan, and a change moves the alarm only when it brings the next transition
forward (a busy queue does not wake a timer on every write).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from actors.clock import Clock
from actors.core import commands as cmd
from actors.core.events import (
    BodiesMoved,
    Checkpoint,
    DeadLettersRouted,
    KeySet,
    MessagesAcked,
    MessagesDeleted,
    MessagesPut,
    MessagesReleased,
    MessagesTaken,
    MessageUpdated,
    QueuePaused,
    QueuePurged,
)
from actors.core.ids import IdSource
from actors.core.runs import Contents, Run
from actors.core.state import QueuedMessage, QueueState
from actors.errors import Moving, NotReady, QueueError, Unavailable
from actors.flow import Entry, Flow
from actors.history import NOTE_EVERY_MS, History, Sample
from actors.log import keys
from actors.log.bodies import Bodies, place_of
from actors.log.forked import can_fork, encode_forked, one_child
from actors.log.shardlog import Batch, ShardLog
from actors.log.snapshots import encode_state, prune_legacy, prune_snapshots, write_snapshot
from actors.log.store import ObjectStore
from actors.metrics import QueueCounters, QueueMetrics
from actors.moves import run_move
from actors.settings import MAX_BATCH, LogSettings

__all__ = ["RELOAD_WAIT_S", "DeadLetterRouter", "QueueActor", "QueueHost"]

log = logging.getLogger(__name__)

# How long a command waits for its shard to read its log again after a failed write (a
# blip takes milliseconds; a store that keeps failing takes as long as it fails) before it
# is refused with Unavailable, undecided.
RELOAD_WAIT_S = 5.0
MOVE_BYTES = 4 * 1024 * 1024  # bodies per BodiesMoved record, at most about
UNKNOWN_FLOOR = 1  # where a snapshot of before this process reads bodies from: anywhere

# Hands dead letters of a queue to its dead-letter queue; must be idempotent per message.
DeadLetterRouter = Callable[[str, str, list[QueuedMessage]], Awaitable[None]]


class QueueHost(Protocol):
    """What a queue needs of the shard that hosts it."""

    store: ObjectStore
    clock: Clock
    ids: IdSource
    log_settings: LogSettings
    wal: ShardLog  # the shard's log now (a new one after each reload)
    log_ready: asyncio.Event  # clear while the shard reloads its log after a failed write
    bodies: Bodies | None  # reads spilled bodies back (None: runs keep them in memory)

    async def route_dead_letters(
        self, source: str, target: str, letters: list[QueuedMessage]
    ) -> None:
        """Put dead letters into ``target`` idempotently. Raises: QueueError."""
        ...

    async def redeliver(self, target: str, messages: list[cmd.NewMessage]) -> None:
        """Put messages moved from another queue into ``target`` (``Put.redelivery``).

        Raises:
            QueueError: ``target`` does not exist (QueueNotFound) or cannot be reached.
        """
        ...

    def snapshot_taken(self, queue: QueueActor) -> None:
        """``queue`` has a new snapshot (the log may be prunable)."""
        ...

    @property
    def flow(self) -> Flow:
        """Runs the queue's own commands, as everyone's (actors/flow.py)."""
        ...


class QueueListener(Protocol):
    """Told of a queue's durable changes (the shard's key table: ``queue:`` keys)."""

    def cares(self, queue: QueueActor) -> bool:
        """Whether a change of ``queue`` matters now; when not, it is not told."""
        ...

    def queue_changed(self, queue: QueueActor) -> None:
        """``queue`` may have new counts."""
        ...


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


class QueueActor:
    """A queue that serves commands durably through its host's log."""

    # Slots: a shard touches hundreds of queues per second, each once per commit; a queue's
    # fields then sit in the object itself, not in a dict of their own.
    __slots__ = (
        "_alarm",
        "_alarm_ms",
        "_background",
        "_history_next",
        "_last_batch",
        "_mover",
        "_placing",
        "_rearm",
        "_router",
        "_snapshot_due_ms",
        "_snapshot_due_seq",
        "_snapshot_floors",
        "_snapshot_idle",
        "_snapshotting",
        "_takers",
        "counters",
        "durable_seq",
        "history",
        "host",
        "legacy",
        "listener",
        "log_bytes",
        "log_commits",
        "name",
        "next_seq",
        "snapshot_at_ms",
        "snapshot_bytes",
        "snapshots",
        "state",
        "stopped",
    )

    def __init__(
        self,
        name: str,
        host: QueueHost,
        state: QueueState,
        next_seq: int,
        *,
        snapshots: list[int] | None = None,
        legacy: bool = False,
    ) -> None:
        self.name = name
        self.host = host
        self.state = spilling(state, host, name)
        self.next_seq = next_seq  # the sequence number of this queue's next event
        self.durable_seq = next_seq - 1
        self.snapshots = sorted(snapshots or [])  # its snapshots' sequence numbers
        self.snapshot_bytes = 0  # the size of the last snapshot object this process wrote
        self.legacy = legacy  # version-1 segments of its own remain (pruned behind snapshots)
        # Told of durable changes, when it cares: a durable write of a busy queue nobody
        # waits on or watches skips the telling (it happens for every queue of every write).
        self.listener: QueueListener | None = None
        self.counters = QueueCounters()
        self.history: History | None = None  # made at the first commit (actors/history.py)
        self._history_next = 0  # from when a commit notes the counts again
        state.ack_waits = []  # time in queue of each ack, drained into counters.in_queue
        self.log_bytes = 0
        self.log_commits = 0
        self._last_batch: Batch | None = None  # the newest unreleased batch with our events
        self.stopped: QueueError | None = None  # why it serves nothing any more (None: it serves)
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_ms = 0  # when the alarm goes off (the due time it was set for)
        self._rearm = True  # a change may bring the next transition forward
        self._background: set[asyncio.Task[Any]] = set()
        self._snapshotting = False
        self._snapshot_idle = asyncio.Event()  # set while no snapshot is being written
        self._snapshot_idle.set()
        self.snapshot_at_ms = host.clock.now_ms()
        self._snapshot_due_seq = 0
        self._snapshot_due_ms = 0
        self._snapshot_due()
        # The tasks routing the outbox and running the move task, while they run. A task is
        # running until its coroutine has returned (done() at once, no gap for a change to
        # fall into) or was cancelled, even before it started (a flag raised in the
        # coroutine was not raised yet; one lowered in a done callback lowered a newer one's).
        self._router: asyncio.Future[Any] | None = None
        self._mover: asyncio.Future[Any] | None = None
        self._takers: deque[asyncio.Future[bool]] = deque()  # long-poll takes, oldest first
        # runs (and patches: Run.patches) placed once durable
        self._placing: deque[tuple[Batch, int, Any, Any]] = deque()
        # the lowest LSN each kept snapshot's runs read bodies from (0: none)
        self._snapshot_floors = self._floors_unknown(self.snapshots)

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Set the alarm; the queue serves from now on."""
        self._changed()

    async def close(self, *, snapshot: bool = True) -> None:
        """Stop taking commands, wait for the writes in flight, snapshot, stop the timer."""
        if self.stopped is None:
            self.stopped = NotReady(f"queue {self.name} is shutting down", queue=self.name)
        self._wake_takers(len(self._takers))  # they retry, see stopped, and fail
        batch = self._last_batch
        with contextlib.suppress(QueueError):
            if batch is not None:
                await batch.wait()
            if (
                snapshot
                and self.host.wal.failed is None
                and self.durable_seq
                not in (
                    0,
                    *self.snapshots[-1:],
                )
            ):
                await self.snapshot()
        await self._stop_tasks()

    async def _stop_tasks(self) -> None:
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, QueueError):
                await task

    def stop(self, error: QueueError) -> None:
        """Serve nothing more (the shard lost its log): waiting takes end with ``error``."""
        self.stopped = error
        self._wake_takers(len(self._takers))

    @property
    def epoch(self) -> int:
        """The shard log's epoch (this incarnation of the shard)."""
        return self.host.wal.epoch

    # ---------------------------------------------------------------- commands

    async def execute(self, command: object) -> Any:
        """Run one command; return its reply once it is durable.

        Raises:
            QueueError: the command's own error, or Unavailable / Fenced / NotReady.
        """
        [result] = await self.execute_many([command])
        if isinstance(result, QueueError):
            raise result
        return result

    async def execute_many(self, commands: list[object]) -> list[Any]:
        """Run commands in order in one go; each result is a reply or a QueueError.

        Raises:
            QueueError: the queue stopped serving (Fenced, NotReady).
        """
        return await self.host.flow.execute_many(self, commands)

    async def wait_ready(self) -> None:
        """Until the queue may decide (its shard's log works).

        Raises:
            QueueError: the queue stopped serving, or its log was not back within
                ``RELOAD_WAIT_S`` (Unavailable).
        """
        ready = self.host.log_ready
        while True:
            if self.stopped is not None:
                raise self.stopped
            if ready.is_set():
                return
            try:
                # The reload after a failed write lasts as long as the store fails: bounded,
                # so a client gets an answer it can act on, not a timeout of its own.
                async with asyncio.timeout(RELOAD_WAIT_S):
                    await ready.wait()
            except TimeoutError:
                raise Unavailable(
                    f"queue {self.name}: its log is being read again after a failed write; "
                    "nothing was done, retry",
                    queue=self.name,
                ) from None

    @property
    def last_batch(self) -> Batch | None:
        """The newest batch holding this queue's events that is not released yet."""
        return self._last_batch

    def decided(self, events: list[Any], reply: Any, batch: Batch, size: int) -> None:
        """The flow appended ``events`` (decided now, ``size`` bytes of records) to ``batch``:
        count them, note where their runs go, and let waiting takes decide into the same
        write (their replies still wait for it: a consumer's wait costs one durable write,
        not two)."""
        self._count(events, reply)
        self._rearm = self._rearm or _may_bring_forward(events)
        self._last_batch = batch
        self.log_bytes += size
        if self.state.unplaced or self.state.unpatched:
            self._to_place(events, batch)
        self.next_seq += len(events)
        if self._takers and (ready := self._takeable()):
            self._wake_takers(ready)

    def durable(self, batch: Batch, last_seq: int, now_ms: int) -> None:
        """``batch``, which holds this queue's events up to ``last_seq``, is durable (with
        all before it); the shard's clock said ``now_ms``. Called for every queue of every
        commit: kept lean."""
        self.durable_seq = last_seq
        self.log_commits += 1
        if now_ms >= self._history_next:  # every NOTE_EVERY_MS at most: one compare else
            self._note_history(now_ms)
        if self._last_batch is batch:
            self._last_batch = None
        if self._placing:
            self._place()
        listener = self.listener
        if (
            self._rearm
            or self._takers
            or self.state.outbox
            or (not _running(self._mover) and self.state.active_move is not None)
            or (listener is not None and listener.cares(self))
        ):
            self._changed()
        if last_seq >= self._snapshot_due_seq or now_ms >= self._snapshot_due_ms:
            self._maybe_snapshot(now_ms)

    def reloaded(self, state: QueueState, next_seq: int, snapshots: list[int]) -> None:
        """The shard read its log again after a failed write: this is what is durable."""
        state.ack_waits = []
        self.state = spilling(state, self.host, self.name)
        self.next_seq = next_seq
        self.durable_seq = next_seq - 1
        self.snapshots = snapshots
        self._placing.clear()
        self._snapshot_floors = self._floors_unknown(snapshots)
        self._snapshot_due()
        self._last_batch = None
        self._rearm = True
        self._changed()

    # ---------------------------------------------------------------- runs

    def _to_place(self, events: list[Any], batch: Batch) -> None:
        """The runs the events just made (a put) or moved (compaction) go in the log with
        ``batch``: placed there once it is durable (without a reader, their bodies stay in
        memory)."""
        runs, patches = self.state.unplaced, self.state.unpatched
        if self.host.bodies is not None:
            if runs:
                i, event = next((i, e) for i, e in enumerate(events) if type(e) in _WITH_BODIES)
                for run in runs:
                    self._placing.append((batch, self.next_seq + i, event, run))
            if patches:  # a body an update changed: where the update's record is
                found = next(
                    ((i, e) for i, e in enumerate(events) if type(e) is MessageUpdated), None
                )
                if found is not None:  # (an Update's one event)
                    for patch in patches:
                        self._placing.append((batch, self.next_seq + found[0], found[1], patch))
        runs.clear()
        patches.clear()

    def _place(self) -> None:
        placing, bodies = self._placing, self.host.bodies
        while placing and placing[0][0].released is None:  # durable, with all before it
            batch, seq, event, run = placing.popleft()
            if type(run) is tuple:  # a patch: (put's run, slot, update's token)
                at = (batch.segment, batch.offset, batch.length, seq, batch.first_lsn)
                put, i, token = run
                self.state.place_patch(put, i, token, at)
                continue
            place = place_of(
                batch.segment, batch.offset, batch.length, seq, batch.first_lsn, event, run.ref
            )
            if bodies is not None and run.left and run.bodies is not None:
                contents = Contents(run.bodies, run.attrs)
                bodies.keep(self.name, place, contents, run.size)  # read by the next takes
            self.state.place(run, place)

    def bodies_in(self, segments: set[str]) -> int:
        """About the bytes of the bodies this queue still reads from ``segments`` (O(1) a
        run: a shard at 100M messages holds 100k runs)."""
        return sum(run.spilled_bytes() for run in self._runs_in(segments))

    def _runs_in(self, segments: set[str]) -> list[Run]:
        return [
            run
            for run in self.state.live_runs()
            if run.place is not None and run.place[0] in segments
        ]

    async def move_bodies(self, segments: set[str]) -> int:
        """Write the bodies this queue still reads from ``segments`` again, further on in the
        log (``BodiesMoved``, ``MOVE_BYTES`` a record at most), then take snapshots until
        neither kept one reads from them; return how many were written.

        Raises:
            QueueError: the log or the store failed (what was moved stays moved).
        """
        moved, chunk, size = 0, [], 0
        for run in self._runs_in(segments):  # one pass: a run gone meanwhile is skipped
            chunk.append(run.ref)
            size += run.spilled_bytes()
            if size >= MOVE_BYTES:
                moved += await self.execute(cmd.MoveBodies(chunk))
                chunk, size = [], 0
        if chunk:
            moved += await self.execute(cmd.MoveBodies(chunk))
        if moved:
            await self.checkpoint(self.next_seq - 1)
        return moved

    def _floors_unknown(self, snapshots: list[int]) -> dict[int, int]:
        """Floors for snapshots written before this process read its log: it does not know
        where their runs read bodies from, so they keep the whole log (LSN 1) until two new
        snapshots replace them (the prune asks for them: :meth:`reads_old_bodies`). Without
        a reader, runs keep their bodies and no snapshot reads any (0)."""
        return dict.fromkeys(snapshots, UNKNOWN_FLOOR if self.host.bodies is not None else 0)

    def reads_no_bodies(self, seq: int) -> None:
        """Snapshot ``seq`` holds every body it needs (a handover's: the source inlined
        them), so it keeps no segment of this shard's log."""
        if seq in self._snapshot_floors:
            self._snapshot_floors[seq] = 0

    @property
    def floors_unknown(self) -> bool:
        """Whether a kept snapshot is from before this process (:meth:`_floors_unknown`)."""
        return UNKNOWN_FLOOR in self._snapshot_floors.values()

    def reads_old_bodies(self, end_lsn: int) -> bool:
        """Whether a kept snapshot reads bodies from before ``end_lsn`` while the state no
        longer does (they were taken or moved since): new snapshots would let it go."""
        floors = [f for f in self._snapshot_floors.values() if f]
        now = spilled_floor(self.state)
        return bool(floors) and min(floors) < end_lsn and not (now and now < end_lsn)

    @property
    def body_floor(self) -> int | None:
        """The lowest LSN whose block holds bodies this queue may still read back, from its
        state or from a snapshot recovery may restore (None: none). The shard keeps the
        segments from there on."""
        floors = [f for f in self._snapshot_floors.values() if f]
        now = spilled_floor(self.state)
        if now:
            floors.append(now)
        return min(floors) if floors else None

    # ---------------------------------------------------------------- figures

    def _count(self, events: list[Any], reply: Any) -> None:
        counters = self.counters
        for event in events:
            kind = type(event)
            if kind is MessagesTaken:
                counters.taken += len(event.ids)
                for delivery in reply:
                    counters.receives.observe(delivery.receive_count)
            elif kind is MessagesReleased:
                counters.released += len(event.ids)
            elif kind is MessagesAcked:
                waits = self.state.ack_waits
                if waits:
                    observe = counters.in_queue.observe
                    for ms in waits:
                        observe(ms / 1000)
                    waits.clear()

    def observe_durable(self, entry: Entry, now: float) -> None:
        """Time from the command's arrival until its events were durable."""
        self.counters.durable.observe(now - entry.started)

    def metrics(self) -> QueueMetrics:
        """This queue's figures now (for /metrics)."""
        s, c = self.state, self.counters
        now = self.host.clock.now_ms()
        oldest = s.oldest_ready_ms()
        return QueueMetrics(
            queue=self.name,
            ready=s.n_ready,
            delayed=s.n_delayed,
            reserved=s.n_reserved,
            oldest_ready_age_s=None if oldest is None else max(0, now - oldest) / 1000,
            enqueued=s.enqueued_total,
            acked=s.acked_total,
            dead_lettered=s.dead_lettered,
            expired=s.expired_total,
            purged=s.purged_total,
            taken=c.taken,
            released=c.released,
            receives=c.receives,
            durable=c.durable,
            log_bytes=self.log_bytes,
            log_segments=self.log_commits,
            snapshot_age_s=(now - self.snapshot_at_ms) / 1000 if self.snapshot_at_ms else None,
            recovery_s=self._recovery_s(),
            in_queue=c.in_queue,
            spilled=s.spilled + s.deferred + s.grouped,
            paused=int(s.paused),
        )

    def _note_history(self, now_ms: int) -> None:
        """The counts after this commit, for the history (the minute's sample, until a
        later commit of the minute notes them again)."""
        history = self.history
        if history is None:
            history = self.history = History()
        history.note(now_ms, *self._counts())
        self._history_next = now_ms + NOTE_EVERY_MS

    def history_view(self) -> list[Sample]:
        """The counts a minute at a time over the last hour, and now (actors/history.py)."""
        now = Sample(self.host.clock.now_ms(), *self._counts())
        return [now] if self.history is None else self.history.view(now)

    def _counts(self) -> tuple[int, int, int, int, int]:
        """What a history sample holds besides its time (actors/history.py's Sample)."""
        s = self.state
        return s.n_ready, s.n_delayed, s.n_reserved, s.enqueued_total, s.acked_total

    def _recovery_s(self) -> float:
        """How long the last recovery of this queue's shard took (0: none reported)."""
        report = getattr(self.host, "report", None)  # the shard's ShardReport, once it has one
        return report.duration_ms / 1000 if report is not None else 0.0

    # ---------------------------------------------------------------- time and changes

    def _changed(self) -> None:
        """The durable state changed: move the alarm (when the change may bring the next
        transition forward), wake waiting takes, route dead letters, tell listeners."""
        if self._rearm or self._alarm is None:
            self._rearm = False
            self._arm()
        if self._takers and (ready := self._takeable()):
            self._wake_takers(ready)
        # Running means its task is, not a flag its coroutine raises when it first runs: two
        # changes in one turn of the loop spawned two routes of the same letters, each put
        # twice (CI, 2026-11-30).
        if self.state.outbox and not _running(self._router) and self.stopped is None:
            self._router = self._spawn(self._route_dead_letters())
        if (
            not _running(self._mover)
            and self.stopped is None
            and self.state.active_move is not None
        ):
            self._mover = self._spawn(self._run_move())
        if self.listener is not None:
            self.listener.queue_changed(self)

    def _takeable(self) -> int:
        """How many ready messages a take would get now: none while the queue is paused
        (its waiting takes sleep on; resuming is a change that wakes them), fewer past its
        max_in_flight (an ack is a change that wakes them) or its take_rate (they wake when
        the rate lets one go: ``take``)."""
        state = self.state
        if state.paused:
            return 0
        s = state.settings
        if s.max_in_flight is None and s.take_rate is None:
            return state.n_ready
        return state.take_room(max(self.host.clock.now_ms(), state.clock_ms))

    def _wake_takers(self, count: int) -> None:
        """Wake up to ``count`` waiting takes, oldest first (no herd on every change)."""
        while self._takers and count > 0:
            fut = self._takers.popleft()
            if not fut.done():
                fut.set_result(True)
                count -= 1

    async def take(self, command: cmd.Take, wait_s: float = 0.0) -> list[Any]:
        """Take messages; with ``wait_s``, wait up to that long for some to be ready.

        Raises:
            QueueError: as :meth:`execute`.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        waited = False
        while True:
            try:
                taken = await self.execute(command)
            except Moving:
                if waited:  # handed to another shard while it waited: an empty answer
                    return []
                raise
            remaining = deadline - loop.time()
            if taken or remaining <= 0:
                return taken
            if self._takeable() and self.stopped is None:
                # A put became durable while this take's empty answer waited for an earlier
                # write: the wake-up already went by. Look again instead of sleeping.
                await asyncio.sleep(0)
                continue
            fut: asyncio.Future[bool] = loop.create_future()
            self._takers.append(fut)
            now_ms = max(self.host.clock.now_ms(), self.state.clock_ms)
            held = self.state.take_wait_ms(now_ms)  # only the take_rate holds them back
            if held is not None:
                remaining = min(remaining, held / 1000)
            alarm = loop.call_later(remaining, _resolve, fut, False)
            waited = True
            try:
                await fut
            finally:
                alarm.cancel()
                if not fut.done():
                    fut.cancel()

    def _arm(self) -> None:
        """Set the alarm for the next due transition, unless it goes off before that."""
        if self.stopped is not None:
            return
        due = self.state.next_due_ms()
        if due is None or (self._alarm is not None and self._alarm_ms <= due):
            return  # nothing due, or the alarm comes first (it sets itself again then)
        if self._alarm is not None:
            self._alarm.cancel()
        delay = max(0.0, (due - self.host.clock.now_ms()) / 1000)
        self._alarm = asyncio.get_running_loop().call_later(delay, self._ring)
        self._alarm_ms = due

    def _ring(self) -> None:
        """The alarm went off: bring time-driven transitions up to now; set it again. (While
        the shard reads its log again it stays off: the reload sets it.)"""
        self._alarm = None
        if not self.host.log_ready.is_set() or self.stopped is not None:
            return
        before = self.state.transitions
        self.state.advance(self.host.clock.now_ms())
        if self.state.transitions != before:
            self._changed()
        else:
            self._arm()

    async def _route_dead_letters(self) -> None:
        """Hand the outbox to the dead-letter queue until it is empty, retrying with backoff
        while that queue is unreachable (its shard recovering or restarting): a dead letter
        must not wait for this queue's next change to move on."""
        delay = 0.2
        while self.state.outbox and self.stopped is None:
            # At most a put's worth at a time: an outbox grown past it (letters that
            # waited for an unreachable queue) once failed as one put, at every retry.
            letters = list(itertools.islice(self.state.outbox.values(), MAX_BATCH))
            target = self.state.settings.dead_letter_queue
            try:
                if target is not None:
                    await self.host.route_dead_letters(self.name, target, letters)
                await self.execute(cmd.ConfirmDeadLetters([m.seq for m in letters]))
                delay = 0.2
            except Exception as exc:
                # Any failure, not only a QueueError: a Ray call to a shard that died
                # raised out of here once and stranded the outbox until the queue's next
                # change, for ever if the failure came back each time (the campaign
                # during resizes, loadtest/RESULTS.md).
                if self.stopped is not None:
                    return
                log.warning(
                    "queue %s: dead-letter routing failed (%s); retrying in %.1fs",
                    self.name,
                    exc if isinstance(exc, QueueError) else repr(exc),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _run_move(self) -> None:
        """Run the queue's move task (actors/moves.py) until it ends or the queue stops."""
        try:
            await run_move(self, self.host.redeliver)
        except QueueError as exc:  # the queue itself stopped serving: a restart runs it on
            log.info("queue %s: move task paused: %s", self.name, exc)

    # ---------------------------------------------------------------- snapshots

    def _maybe_snapshot(self, now_ms: int) -> None:
        if self._snapshotting or self.stopped is not None or self.state.moving is not None:
            return
        settings = self.host.log_settings
        since = self.durable_seq - (self.snapshots[-1] if self.snapshots else 0)
        due_by_time = now_ms - self.snapshot_at_ms >= settings.snapshot_every_ms
        if since >= settings.snapshot_every_records or (since > 0 and due_by_time):
            self._spawn(self._snapshot_in_background())

    def _snapshot_due(self) -> None:
        """When :meth:`durable` should look at snapshotting next (by record, by time)."""
        settings = self.host.log_settings
        base = self.snapshots[-1] if self.snapshots else 0
        self._snapshot_due_seq = base + settings.snapshot_every_records
        self._snapshot_due_ms = self.snapshot_at_ms + settings.snapshot_every_ms

    async def _snapshot_in_background(self) -> None:
        try:
            await self.snapshot()
        except QueueError as exc:  # the log stays valid without it; the next one will retry
            log.error("queue %s: snapshot failed: %s", self.name, exc)

    async def settled(self) -> None:
        """Once every event decided so far is durable.

        Raises:
            QueueError: the write failed.
        """
        batch = self._last_batch
        if batch is not None:
            await batch.wait()

    async def snapshot(self, *, final: bool = False) -> str | None:
        """Write a snapshot of the state as of the last decided event, once that is durable,
        verify it, and prune what it makes unnecessary; return its key (None: not written).
        ``final`` (a handover's): after any being written, and the key even if one of that
        record was written already; not read back (the shard taking the queue over reads it
        at once) and nothing pruned (that shard prunes as it takes its own).

        Raises:
            QueueError: the log or the store failed.
        """
        if final:
            await self._snapshot_idle.wait()
            seq = self.next_seq - 1
            if seq in self.snapshots:
                return keys.snapshot_key(self.name, seq)
        if self._snapshotting:
            return None
        self._snapshotting = True
        self._snapshot_idle.clear()
        try:
            if self._forks():
                async with one_child():  # the state is read once it is this queue's turn
                    encoded = await self._encode(forked=True)
            else:
                encoded = await self._encode(forked=False)
            if encoded is None:
                return None
            seq, floor, data = encoded
            batch = self._last_batch
            if batch is not None:
                await batch.wait()
            store = self.host.store
            key = await write_snapshot(store, self.name, seq, data, verify=not final)
            if key is None:
                return None
            self.snapshot_at_ms = self.host.clock.now_ms()
            self.snapshot_bytes = len(data)
            kept = sorted({*self.snapshots, seq})
            # a queue that leaves: its new shard prunes (it lists the snapshots)
            self.snapshots = kept if final else await prune_snapshots(store, self.name, kept)
            self._snapshot_floors[seq] = floor
            self._snapshot_floors = {s: self._snapshot_floors.get(s, 0) for s in self.snapshots}
            self._snapshot_due()
            if self.legacy and not final:
                self.legacy = await prune_legacy(store, self.name, self.snapshots)
            self.host.snapshot_taken(self)
            return key
        finally:
            self._snapshotting = False
            self._snapshot_idle.set()

    def _forks(self) -> bool:
        """Whether this queue's snapshot is encoded in a forked child: a big queue
        (``LogSettings.snapshot_fork_above``), whose encoding would stop the shard."""
        above = self.host.log_settings.snapshot_fork_above
        return 0 <= above <= self.state.total and can_fork()

    async def _encode(self, *, forked: bool) -> tuple[int, int, bytes] | None:
        """The snapshot of the state as it is now: its record, its spilled floor and its
        object (None: nothing new to snapshot). ``forked``: encoded in a child, the shard
        serving meanwhile (here after all when the child cannot be made)."""
        seq = self.next_seq - 1
        if seq == 0 or seq in self.snapshots:
            return None
        state, epoch = self.state, self.host.wal.epoch
        floor = spilled_floor(state)
        if forked:
            try:
                child = encode_forked(lambda: encode_state(state, epoch, seq))
            except OSError as exc:  # nothing changed yet: encoded here
                log.error("queue %s: no child for its snapshot (%s): encoded here", self.name, exc)
            else:
                started = time.perf_counter()
                data = await child
                log.info(
                    "queue %s: snapshot of record %d (%d messages, %d bytes) encoded in a "
                    "child in %.2f s",
                    self.name,
                    seq,
                    state.total,
                    len(data),
                    time.perf_counter() - started,
                )
                return seq, floor, data
        return seq, floor, encode_state(state, epoch, seq)

    async def checkpoint(self, upto: int) -> None:
        """Take snapshots until both kept ones cover record ``upto`` (so the shard log up to
        it can go); a marker record first when the newest snapshot already covers the last
        record (an idle queue cannot take a second snapshot of the same record).

        Raises:
            QueueError: the log or the store failed.
        """
        for _ in range(4):  # two, and two more if others being written covered less
            if self.snapshot_floor >= upto or self.stopped is not None:
                return
            await self._snapshot_idle.wait()  # one being written already may not cover it
            if self.snapshots and self.snapshots[-1] == self.next_seq - 1:
                await self.execute(cmd.Checkpoint())
            await self.snapshot()

    @property
    def snapshot_floor(self) -> int:
        """The sequence number that both kept snapshots cover (the shard log may drop this
        queue's records up to it; a damaged newest snapshot falls back to the older one)."""
        return self.snapshots[-2] if len(self.snapshots) >= 2 else 0

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task


def _running(task: asyncio.Future[Any] | None) -> bool:
    return task is not None and not task.done()


# Events after which the next time-driven transition can only be as late as before or later:
# acks and deletions remove work; a put of messages ready at once adds retention work no
# earlier than its queue's oldest message's (an alarm is set whenever anything is due).
_NEVER_SOONER = frozenset(
    {
        MessagesAcked,
        MessagesDeleted,
        QueuePurged,
        KeySet,
        DeadLettersRouted,
        Checkpoint,
        BodiesMoved,
        QueuePaused,
    }
)


def spilling(state: QueueState, host: QueueHost, name: str) -> QueueState:
    """``state`` set up to spill as the host's settings say, reading bodies back through
    the host's reader (a state restored with runs by a host that does not spill gets its
    messages back)."""
    state.read = host.bodies.reader(name) if host.bodies is not None else None
    state.spill = host.log_settings.spill
    # what a state made by another path left to place (a v1 log's replay places nothing):
    # those runs and patches keep their bodies in memory; the next put's record is not theirs
    state.unplaced.clear()
    state.unpatched.clear()
    if not state.spill and state.by_id:
        state.unspill_all()
    return state


def spilled_floor(state: QueueState) -> int:
    """The lowest LSN of a block ``state``'s runs read bodies from (0: none)."""
    floor = 0
    for run in state.live_runs():
        if run.place is not None:
            lsn = int(run.place[4])
            if len(run.place) == 5:
                # placed by its put: runs placed so are in log order, moved ones later
                return lsn if not floor else min(floor, lsn)
            floor = lsn if not floor else min(floor, lsn)
    return floor


_WITH_BODIES = (MessagesPut, BodiesMoved)


def _may_bring_forward(events: list[Any]) -> bool:
    """Whether ``events`` may bring the queue's next time-driven transition forward."""
    for event in events:
        kind = type(event)
        if kind is MessagesPut:
            if any(item.activate_at_ms > event.at_ms for item in event.items):
                return True
        elif kind not in _NEVER_SOONER:
            return True
    return False
