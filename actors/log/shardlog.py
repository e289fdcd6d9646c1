"""Group commit for a whole shard: the events of all its queues go to one log, one block per
commit (FORMAT.md, "Shard log").

Appended events gather in the current batch, grouped by queue. A batch goes out as one block
as soon as a write slot is free (``device.write_slots``: one for a local file, several for an
object store, whose latency would otherwise cap throughput); while all slots are busy, events
keep gathering, so an idle shard writes at once and a busy one writes bigger blocks. Blocks
become durable in any order, but batches are *released* strictly in log order: a batch's
waiters resume only when it and every batch before it are durable.

After any failure the log is *broken*: it starts no more writes, waits until the writes in
flight have finished, then calls the owner's ``on_failed(failed, later, error)`` with the
failed batch and every later batch whose durability is not established. The owner reads the
log again to learn which of those landed. Without an owner, all of them fail with the error.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Literal

import msgspec

from actors.core.events import Event
from actors.errors import QueueError, Unavailable
from actors.log.device import LogDevice
from actors.log.wal import encode_raw_block, encode_record

__all__ = ["Batch", "FailureHandler", "ShardLog"]

log = logging.getLogger(__name__)


class Batch:
    """Events of one or more queues that go to the log together as one block."""

    __slots__ = (
        "count",
        "entries",
        "first_lsn",
        "groups",
        "length",
        "offset",
        "outcome",
        "released",
        "segment",
        "size",
        "waiters",
    )

    def __init__(self) -> None:
        # queue -> [queue, first seq, records]: the block's body as it is encoded, each
        # record a msgspec.Raw of encode_record's bytes
        self.groups: dict[str, list[Any]] = {}
        self.count = 0
        self.size = 0
        self.first_lsn = 0  # set when the batch goes out
        self.segment = ""  # the segment it went to, once durable
        self.offset = 0  # and where the block is in it
        self.length = 0  # (the block's bytes)
        # None: not finished; True: durable; else the error that failed the write
        self.outcome: QueueError | Literal[True] | None = None
        # Set once waiters have been told: None (released: it and all before it are durable)
        # or the error that failed it. Unset (False) before that.
        self.released: QueueError | bool | None = False
        self.waiters: list[asyncio.Future[None]] = []
        self.entries: list[Any] = []  # the owner's bookkeeping: commands riding on this batch

    def last_seq(self, queue: str) -> int:
        """The sequence number of ``queue``'s last event in this batch (0: none)."""
        group = self.groups.get(queue)
        return group[1] + len(group[2]) - 1 if group is not None else 0

    def wait(self) -> asyncio.Future[None]:
        """A future of its own for one waiter (cancelling it affects nobody else); done at
        once if the batch was released or failed already."""
        fut = asyncio.get_running_loop().create_future()
        if self.released is None:
            fut.set_result(None)
        elif isinstance(self.released, QueueError):
            fut.set_exception(self.released)
        else:
            self.waiters.append(fut)
        return fut

    def _settle(self, error: QueueError | None) -> None:
        self.released = error
        for fut in self.waiters:
            if not fut.done():
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)
        self.waiters = []


FailureHandler = Callable[[Batch, list[Batch], QueueError], None]


class ShardLog:
    """Writes the events of a shard's queues as blocks, batching what arrives during writes."""

    def __init__(
        self,
        device: LogDevice,
        epoch: int,
        next_lsn: int,
        *,
        max_batch_bytes: int = 16 * 1024 * 1024,
        on_durable: Callable[[Batch], None] | None = None,
        on_broken: Callable[[QueueError], None] | None = None,
        on_failed: FailureHandler | None = None,
    ) -> None:
        self.device = device
        self.epoch = epoch
        self.next_lsn = next_lsn  # LSN of the next block's first record
        self.durable_lsn = next_lsn - 1  # every record up to here is durable and released
        self.max_batch_bytes = max_batch_bytes
        self.max_in_flight = device.write_slots
        self.on_durable = on_durable
        self.on_broken = on_broken  # called at once when a write fails (stop deciding)
        self.on_failed = on_failed  # called once the writes in flight have finished
        self.failed: QueueError | None = None
        self.appended_bytes = 0  # the size of the records of the last append
        self.blocks_written = 0
        self.bytes_written = 0
        self._gathering: list[Batch] = []
        self._in_flight: deque[Batch] = deque()  # started, not yet released; in LSN order
        self._failed_batch: Batch | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pump_scheduled = False
        # A device that writes before it returns (a local file): blocks go out from the pump
        # itself, one after the other, not from a task each.
        self._write_now: Callable[[int, int, bytes], tuple[str, int]] | None = getattr(
            device, "write_now", None
        )
        self._pumping = False

    # ---------------------------------------------------------------- appending

    def append(self, queue: str, first_seq: int, events: Sequence[Event]) -> Batch:
        """Queue ``events`` of ``queue``, numbered from ``first_seq``; return their batch.

        Raises:
            QueueError: the log is broken (the error that broke it).
        """
        if self.failed is not None:
            raise self.failed
        raw = msgspec.Raw
        records = [raw(encode_record(e)) for e in events]
        size = sum(map(len, records))
        batch = self._gathering[-1] if self._gathering else None
        if batch is None or (batch.count and batch.size + size > self.max_batch_bytes):
            batch = Batch()
            self._gathering.append(batch)
        group = batch.groups.get(queue)
        if group is None:
            batch.groups[queue] = [queue, first_seq, records]
        else:
            assert group[1] + len(group[2]) == first_seq, "a queue's events arrive in order"
            group[2].extend(records)
        batch.count += len(records)
        batch.size += size
        self.appended_bytes = size
        self._idle.clear()
        if not self._pump_scheduled:
            # Start writing two turns of the loop from now, not now: every append made by
            # callbacks already queued rides in this block — all the commands of a frame,
            # and the long-poll takes a put wakes (their tasks resume in the next turn), so a
            # put and the take it serves share one write.
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)
        return batch

    def _next_turn(self) -> None:
        asyncio.get_running_loop().call_soon(self._pump)

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
        """Wait until everything appended so far is released (or the log broke).

        Raises:
            QueueError: the log is broken.
        """
        await self._idle.wait()
        if self.failed is not None:
            raise self.failed

    # ---------------------------------------------------------------- writing

    def _pump(self) -> None:
        """Start writes while there are gathered batches and free slots."""
        if self._pumping:
            return  # called from _settle while _pump_now writes: it goes on
        self._pump_scheduled = False
        if self._write_now is not None:
            self._pump_now(self._write_now)
            return
        while self._gathering and len(self._in_flight) < self.max_in_flight and not self.failed:
            batch = self._out()
            task = asyncio.get_running_loop().create_task(self._write_one(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _pump_now(self, write: Callable[[int, int, bytes], tuple[str, int]]) -> None:
        """Write the batches gathered so far, each durable before the next, releasing each
        as it lands. Events appended meanwhile (by the released commands' callbacks) gather
        for the next pump, as they would while a write is in flight (each append schedules
        it: the flag was cleared as this pump began)."""
        self._pumping = True
        try:
            for _ in range(len(self._gathering)):
                if self.failed is not None or not self._gathering:
                    break
                batch = self._out()
                try:
                    block = self._encode(batch)
                    batch.segment, batch.offset = write(self.epoch, batch.first_lsn, block)
                except Exception as exc:
                    self._failed_write(batch, exc)
                else:
                    self._landed(batch, block)
                self._settle()
        finally:
            self._pumping = False

    def _out(self) -> Batch:
        """The oldest gathered batch, numbered and in flight."""
        batch = self._gathering.pop(0)
        batch.first_lsn = self.next_lsn
        self.next_lsn += batch.count
        self._in_flight.append(batch)
        return batch

    async def _write_one(self, batch: Batch) -> None:
        try:
            block = self._encode(batch)
            batch.segment, batch.offset = await self.device.write(
                self.epoch, batch.first_lsn, block
            )
        except Exception as exc:
            self._failed_write(batch, exc)
        else:
            self._landed(batch, block)
        self._settle()

    def _encode(self, batch: Batch) -> bytes:
        groups = list(batch.groups.values())
        block = encode_raw_block(self.epoch, batch.first_lsn, groups, batch.count)
        batch.length = len(block)
        return block

    def _landed(self, batch: Batch, block: bytes) -> None:
        batch.outcome = True
        self.blocks_written += 1
        self.bytes_written += len(block)

    def _failed_write(self, batch: Batch, exc: Exception) -> None:
        if isinstance(exc, QueueError):
            batch.outcome = exc
        else:  # a bug or an unexpected library error
            log.error("shard log %s: block write crashed", self.device, exc_info=exc)
            batch.outcome = Unavailable(f"block write crashed: {exc!r}")

    def _settle(self) -> None:
        """Release finished batches in order; handle a failure once nothing is in flight."""
        flight = self._in_flight
        while flight and self.failed is None:
            batch = flight[0]
            outcome = batch.outcome
            if outcome is None:
                break  # still being written
            if outcome is True:
                flight.popleft()
                self.durable_lsn = batch.first_lsn + batch.count - 1
                batch._settle(None)
                if self.on_durable is not None:
                    self.on_durable(batch)
            else:
                self.failed = outcome
                self._failed_batch = flight.popleft()
                if self.on_broken is not None:
                    self.on_broken(outcome)
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
            b._settle(error)  # plain waiters (snapshots) learn it too
        self._idle.set()
