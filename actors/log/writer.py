"""Group commit: a queue's events go to the store in batches, one segment per batch.

While one write is in flight, newly appended events gather in the next batch; when the write
completes, the whole gathered batch goes out as the next segment. An idle writer therefore
writes at once, a busy one writes bigger segments. Every batch has a future that resolves
when its segment is durable, or fails with the write's error.

Fencing: every segment is created with ``put_if_absent`` under the name of its first
sequence number. If the name is taken, the object that beat us decides what happened:

- a newer epoch wrote it → :class:`~actors.errors.Fenced`: this writer lost the queue;
- our own epoch wrote it → an earlier write that reported failure did land
  (:class:`OwnWriteLanded`); the owner must reload the log before going on;
- anything else → :class:`~actors.errors.DataError`.

After any failure the writer is *broken*: it writes nothing more, and the batches still
gathered are handed back to the owner (:meth:`GroupCommitWriter.unwritten`), who decides
what to redo once it has reloaded the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from actors.core.events import Event
from actors.errors import DataError, Fenced, QueueError, Unavailable
from actors.log import keys
from actors.log.codec import decode_segment_header, encode_payloads, encode_segment
from actors.log.store import KeyNotFound, ObjectStore, StoreError

__all__ = ["Batch", "GroupCommitWriter", "OwnWriteLanded"]

log = logging.getLogger(__name__)


class OwnWriteLanded(Unavailable):
    """A segment name we wanted holds a segment of our own epoch: a write reported as failed
    did happen. The log must be reloaded before this queue writes again."""

    code = "Unavailable"


class Batch:
    """Events that go to the store together as one segment."""

    __slots__ = ("entries", "first_seq", "future", "payloads", "size")

    def __init__(self, first_seq: int, loop: asyncio.AbstractEventLoop) -> None:
        self.first_seq = first_seq
        self.payloads: list[bytes] = []
        self.size = 0
        self.future: asyncio.Future[None] = loop.create_future()
        self.entries: list[Any] = []  # the owner's bookkeeping: commands riding on this batch

    @property
    def last_seq(self) -> int:
        """Sequence number of the last event in the batch."""
        return self.first_seq + len(self.payloads) - 1


class GroupCommitWriter:
    """Writes a queue's events as segments, batching whatever arrives during a write."""

    def __init__(
        self,
        store: ObjectStore,
        queue: str,
        epoch: int,
        next_seq: int,
        *,
        max_batch_bytes: int = 16 * 1024 * 1024,
        on_durable: Callable[[Batch], None] | None = None,
        on_failed: Callable[[Batch, QueueError], None] | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.epoch = epoch
        self.next_seq = next_seq  # sequence number of the next appended event
        self.durable_seq = next_seq - 1
        self.max_batch_bytes = max_batch_bytes
        self.on_durable = on_durable
        self.on_failed = on_failed
        self.failed: QueueError | None = None
        self.segments_written = 0
        self.bytes_written = 0
        self._gathering: list[Batch] = []
        self._in_flight: Batch | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()

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
            batch = Batch(self.next_seq, self._loop)
            self._gathering.append(batch)
        batch.payloads.extend(payloads)
        batch.size += size
        self.next_seq += len(payloads)
        if self._task is None:
            self._task = self._loop.create_task(self._flush_loop())
        return batch

    async def append_and_wait(self, events: Sequence[Event]) -> int:
        """Append ``events`` and wait until they are durable; return the last sequence number.

        Raises:
            QueueError: the write failed (Unavailable, Fenced, DataError).
        """
        batch = self.append(events)
        await asyncio.shield(batch.future)
        return batch.first_seq + len(events) - 1

    def last_batch(self) -> Batch | None:
        """The batch that holds the newest appended event, if it is not durable yet."""
        if self._gathering:
            return self._gathering[-1]
        return self._in_flight

    def unwritten(self) -> list[Batch]:
        """After a failure: the batches that were never attempted, oldest first."""
        batches, self._gathering = self._gathering, []
        return batches

    @property
    def idle(self) -> bool:
        """Nothing gathered and nothing in flight."""
        return not self._gathering and self._in_flight is None

    async def drain(self) -> None:
        """Wait until everything appended so far is durable (or the writer broke).

        Raises:
            QueueError: the writer is broken.
        """
        while self._task is not None:
            await asyncio.shield(self._task)
        if self.failed is not None:
            raise self.failed

    # ---------------------------------------------------------------- writing

    async def _flush_loop(self) -> None:
        try:
            while self._gathering and self.failed is None:
                batch = self._gathering.pop(0)
                self._in_flight = batch
                try:
                    await self._write(batch)
                except QueueError as exc:
                    self._fail(batch, exc)
                except Exception as exc:  # a bug or an unexpected library error
                    log.exception("queue %s: segment write crashed", self.queue)
                    self._fail(batch, Unavailable(f"segment write crashed: {exc!r}"))
                else:
                    self.durable_seq = batch.last_seq
                    self.segments_written += 1
                    if not batch.future.done():
                        batch.future.set_result(None)
                    if self.on_durable is not None:
                        self.on_durable(batch)
                finally:
                    self._in_flight = None
        finally:
            self._task = None

    def _fail(self, batch: Batch, exc: QueueError) -> None:
        """Break the writer: fail ``batch``; the owner may take the gathered batches back
        (``unwritten``) from its ``on_failed`` callback, whatever it leaves fails too."""
        self.failed = exc
        if self.on_failed is not None:
            self.on_failed(batch, exc)
        for b in [batch, *self.unwritten()]:
            if not b.future.done():
                b.future.set_exception(exc)
                b.future.exception()  # mark retrieved: waiters re-raise it themselves

    async def _write(self, batch: Batch) -> None:
        data = encode_segment(self.epoch, batch.first_seq, batch.payloads)
        key = keys.segment_key(self.queue, batch.first_seq)
        if not await self.store.put_if_absent(key, data):
            await self._taken(key, data)
        self.bytes_written += len(data)

    async def _taken(self, key: str, data: bytes) -> None:
        """Explain why ``key`` was taken, as an error (FORMAT.md, "Epochs and fencing").

        Returns normally when the object is exactly ``data``: the store retried our own
        create after a lost response and reported the retry's refusal."""
        try:
            existing = await self.store.get(key)
            if existing == data:
                return
            header = decode_segment_header(existing)
        except KeyNotFound:
            raise Unavailable(f"{key} was taken, then vanished") from None
        except DataError as exc:
            raise DataError(f"{key} is taken by a damaged segment: {exc.message}") from exc
        except StoreError:
            raise
        if header.epoch > self.epoch:
            raise Fenced(
                f"queue {self.queue}: epoch {header.epoch} took over from epoch {self.epoch}",
                queue=self.queue,
                epoch=self.epoch,
                newer=header.epoch,
            )
        if header.epoch == self.epoch:
            raise OwnWriteLanded(f"{key}: a write reported as failed did land", key=key)
        raise DataError(
            f"{key} holds epoch {header.epoch}, older than this writer's {self.epoch}", key=key
        )
