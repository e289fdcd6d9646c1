"""Group commit: a queue's events go to the store in batches, one segment per batch.

Appended events gather in the current batch. A batch goes out as one segment as soon as a
write slot is free (``max_in_flight`` writes may run at once, so an object store's latency
does not cap throughput); while all slots are busy, events keep gathering, so an idle writer
writes at once and a busy one writes bigger segments. Segments become durable in any order,
but batches are *released* strictly in sequence order: a batch's future resolves only when
it and every batch before it are durable.

Fencing: every segment is created with ``put_if_absent`` under the name of its first
sequence number. If the name is taken, the object that beat us decides what happened:

- a newer epoch wrote it → :class:`~actors.errors.Fenced`: this writer lost the queue;
- our own epoch wrote it → an earlier write that reported failure did land
  (:class:`OwnWriteLanded`); the owner must reload the log before going on;
- anything else → :class:`~actors.errors.DataError`.

After any failure the writer is *broken*: it starts no more writes, waits until the writes
already in flight have finished, then calls the owner's ``on_failed(failed, later)`` with the
failed batch and every later batch whose durability is not established (in flight when the
failure happened, or never attempted). The owner reloads the log to learn which of those
landed. Without an owner, all of them fail with the same error.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from actors.core.events import Event
from actors.errors import DataError, Fenced, QueueError, Unavailable
from actors.log import keys
from actors.log.codec import decode_segment_header, encode_payloads, encode_segment
from actors.log.store import KeyNotFound, ObjectStore

__all__ = ["Batch", "GroupCommitWriter", "OwnWriteLanded"]

log = logging.getLogger(__name__)

_JUNK_RETRIES = 4


class OwnWriteLanded(Unavailable):
    """A segment name we wanted holds a segment of our own epoch: a write reported as failed
    did happen. The log must be reloaded before this queue writes again."""

    code = "Unavailable"


class Batch:
    """Events that go to the store together as one segment."""

    __slots__ = ("entries", "first_seq", "future", "outcome", "payloads", "size", "waiters")

    def __init__(self, first_seq: int) -> None:
        self.first_seq = first_seq
        self.payloads: list[bytes] = []
        self.size = 0
        self.outcome: QueueError | bool | None = None  # None: not finished; True: durable
        self.waiters: list[asyncio.Future[None]] = []
        self.entries: list[Any] = []  # the owner's bookkeeping: commands riding on this batch

    @property
    def last_seq(self) -> int:
        """Sequence number of the last event in the batch."""
        return self.first_seq + len(self.payloads) - 1

    def wait(self) -> asyncio.Future[None]:
        """A future of its own for one waiter (cancelling it affects nobody else)."""
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        return fut

    def _settle(self, error: QueueError | None) -> None:
        for fut in self.waiters:
            if not fut.done():
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)
        self.waiters = []


FailureHandler = Callable[[Batch, list[Batch], QueueError], None]


class GroupCommitWriter:
    """Writes a queue's events as segments, batching whatever arrives during writes."""

    def __init__(
        self,
        store: ObjectStore,
        queue: str,
        epoch: int,
        next_seq: int,
        *,
        max_batch_bytes: int = 16 * 1024 * 1024,
        max_in_flight: int | None = None,
        on_durable: Callable[[Batch], None] | None = None,
        on_broken: Callable[[QueueError], None] | None = None,
        on_failed: FailureHandler | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.epoch = epoch
        self.next_seq = next_seq  # sequence number of the next appended event
        self.durable_seq = next_seq - 1  # every event up to here is durable and released
        self.max_batch_bytes = max_batch_bytes
        # How many segment writes may run at once: the store knows what suits it (a local
        # disk serialises directory fsyncs; an object store hides latency behind parallelism).
        self.max_in_flight = max_in_flight or getattr(store, "write_slots", 1)
        self.on_durable = on_durable
        self.on_broken = on_broken  # called at once when a write fails (stop deciding)
        self.on_failed = on_failed  # called once the writes in flight have finished
        self.failed: QueueError | None = None
        self.segments_written = 0
        self.bytes_written = 0
        self._gathering: list[Batch] = []
        self._in_flight: deque[Batch] = deque()  # started, not yet released; in seq order
        self._failed_batch: Batch | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pump_scheduled = False

    # ---------------------------------------------------------------- appending

    def append(self, events: Sequence[Event]) -> Batch:
        """Give ``events`` the next sequence numbers and queue them; return their batch.

        Raises:
            QueueError: the writer is broken (the error that broke it).
        """
        if self.failed is not None:
            raise self.failed
        payloads = encode_payloads(events)
        batch = self._gathering[-1] if self._gathering else None
        size = sum(map(len, payloads))
        if batch is None or (batch.payloads and batch.size + size > self.max_batch_bytes):
            batch = Batch(self.next_seq)
            self._gathering.append(batch)
        batch.payloads.extend(payloads)
        batch.size += size
        self.next_seq += len(payloads)
        self._idle.clear()
        if not self._pump_scheduled:
            # Start writing at the end of this loop iteration, not now: every append made
            # by callbacks already queued (e.g. all the waiters a durable batch just woke)
            # then rides in the same segment.
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)
        return batch

    async def append_and_wait(self, events: Sequence[Event]) -> int:
        """Append ``events`` and wait until they are durable; return the last sequence number.

        Raises:
            QueueError: the write failed (Unavailable, Fenced, DataError).
        """
        batch = self.append(events)
        last = self.next_seq - 1
        await batch.wait()
        return last

    def last_batch(self) -> Batch | None:
        """The batch that holds the newest appended event, if it is not released yet."""
        if self._gathering:
            return self._gathering[-1]
        return self._in_flight[-1] if self._in_flight else None

    @property
    def idle(self) -> bool:
        """Nothing gathered and nothing in flight."""
        return self._idle.is_set()

    async def drain(self) -> None:
        """Wait until everything appended so far is released (or the writer broke).

        Raises:
            QueueError: the writer is broken.
        """
        await self._idle.wait()
        if self.failed is not None:
            raise self.failed

    # ---------------------------------------------------------------- writing

    def _pump(self) -> None:
        """Start writes while there are gathered batches and free slots."""
        self._pump_scheduled = False
        while self._gathering and len(self._in_flight) < self.max_in_flight and not self.failed:
            batch = self._gathering.pop(0)
            self._in_flight.append(batch)
            task = asyncio.get_running_loop().create_task(self._write_one(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write_one(self, batch: Batch) -> None:
        try:
            await self._write(batch)
        except QueueError as exc:
            batch.outcome = exc
        except Exception as exc:  # a bug or an unexpected library error
            log.exception("queue %s: segment write crashed", self.queue)
            batch.outcome = Unavailable(f"segment write crashed: {exc!r}")
        else:
            batch.outcome = True
            self.segments_written += 1
        self._settle()

    def _settle(self) -> None:
        """Release finished batches in order; handle a failure once nothing is in flight."""
        flight = self._in_flight
        while flight and flight[0].outcome is not None and self.failed is None:
            batch = flight[0]
            if batch.outcome is True:
                flight.popleft()
                self.durable_seq = batch.last_seq
                batch._settle(None)
                if self.on_durable is not None:
                    self.on_durable(batch)
            else:
                self.failed = batch.outcome  # type: ignore[assignment]
                self._failed_batch = flight.popleft()
                if self.on_broken is not None:
                    self.on_broken(self.failed)  # type: ignore[arg-type]
        if self.failed is not None:
            if all(b.outcome is not None for b in flight):
                self._break()
            return
        self._pump()
        if not flight and not self._gathering:
            self._idle.set()

    def _break(self) -> None:
        """Every write has finished: hand the failure and everything after it to the owner."""
        failed, error = self._failed_batch, self.failed
        assert failed is not None
        assert error is not None
        later = [*self._in_flight, *self._gathering]
        self._in_flight.clear()
        self._gathering = []
        self._failed_batch = None
        if self.on_failed is not None:
            self.on_failed(failed, later, error)  # the owner sorts out its commands
        for b in [failed, *later]:
            b._settle(error)  # plain waiters (snapshots, append_and_wait) learn it too
        self._idle.set()

    async def _write(self, batch: Batch) -> None:
        data = encode_segment(self.epoch, batch.first_seq, batch.payloads)
        key = keys.segment_key(self.queue, batch.first_seq)
        for _ in range(_JUNK_RETRIES):
            if await self.store.put_if_absent(key, data) or await self._taken(key, data):
                self.bytes_written += len(data)
                return
        raise Unavailable(f"{key}: kept finding a fenced writer's segments there", key=key)

    async def _taken(self, key: str, data: bytes) -> bool:
        """Explain why ``key`` was taken (FORMAT.md, "Epochs and fencing"): True if the
        object is exactly ``data`` (the store retried our own create after a lost response),
        False if it was a fenced writer's leftover now set aside (write again); otherwise
        raise."""
        try:
            existing = await self.store.get(key)
            if existing == data:
                return True
            header = decode_segment_header(existing)
        except KeyNotFound:
            return False  # set aside meanwhile: write again
        except DataError as exc:
            raise DataError(f"{key} is taken by a damaged segment: {exc.message}") from exc
        if header.epoch > self.epoch:
            raise Fenced(
                f"queue {self.queue}: epoch {header.epoch} took over from epoch {self.epoch}",
                queue=self.queue,
                epoch=self.epoch,
                newer=header.epoch,
            )
        if header.epoch == self.epoch:
            raise OwnWriteLanded(f"{key}: a write reported as failed did land", key=key)
        # An older epoch above our claim: a fenced writer's late write. It was never
        # acknowledged (its writes before it failed first) and no reader will use it.
        log.warning("queue %s: setting aside %s of fenced epoch %d", self.queue, key, header.epoch)
        await self.store.put(keys.damaged_key(key, self.epoch), existing)
        await self.store.delete(key)
        return False
