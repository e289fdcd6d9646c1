"""Events: what happened to a queue. The tagged union below *is* the log's record schema.

Every event carries ``at_ms``, the queue's clock when it was decided. Time-driven transitions
(delayed → ready, lease expiry, retention expiry, dead-lettering after the last lease expired)
are not events: :meth:`QueueState.advance` derives them from these timestamps, so replaying
the same events gives the same state.

Schema evolution (also in ``actors/log/FORMAT.md``):

1. Events are array-like: fields are encoded by position. New fields are only ever appended,
   always with a default, so old records decode with the default and old readers ignore
   nothing they need (they would fail on an unknown tag, never silently).
2. Fields are never removed, reordered or retyped; a field that is no longer used keeps its
   place and its default.
3. A new kind of event gets a new tag. Tags are never reused.
4. A change that cannot follow these rules bumps the segment format version, and the old
   decoder is kept (see FORMAT.md).
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.settings import QueueSettings

__all__ = [
    "FAILURES",
    "KEPT_FAILURES",
    "MAX_REASON_BYTES",
    "BodiesMoved",
    "Checkpoint",
    "DeadLettersRouted",
    "Event",
    "LeasesExtended",
    "MessageId",
    "MessageUpdated",
    "MessagesAcked",
    "MessagesDeleted",
    "MessagesPut",
    "MessagesReleased",
    "MessagesTaken",
    "MoveTaskCancelling",
    "MoveTaskEnded",
    "MoveTaskProgressed",
    "MoveTaskStarted",
    "PutItem",
    "QueueCreated",
    "QueueDeleted",
    "QueueHandedOver",
    "QueuePaused",
    "QueuePurged",
    "QueueTakenOver",
    "SettingsChanged",
    "WriterStarted",
    "decode_event",
    "encode_event",
]

MessageId = int | str
Body = bytes

# The attribute holding a message's last failures, ``[[at_ms, reason], …]``, oldest first
# (``MessagesReleased.reasons``): an attribute, so that snapshots keep it and a dead letter
# carries it into its dead-letter queue with the rest.
FAILURES = "evq.failures"
KEPT_FAILURES = 5  # a message keeps its last five reasons
MAX_REASON_BYTES = 1024


class PutItem(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One new message: its id, body and activation time, as decided."""

    id: MessageId
    body: Body
    activate_at_ms: int
    key: str | None = None
    group: str | None = None
    attributes: dict[str, Any] | None = None


class _Base(msgspec.Struct, array_like=True, frozen=True, gc=False, tag_field="t"):
    # Each event repeats ``frozen=True``: msgspec inherits it anyway, but a type checker reads
    # it per class (PEP 681) and would otherwise take the events for mutable.
    at_ms: int


class QueueCreated(_Base, frozen=True, tag="created"):
    """The queue exists from now on with these settings."""

    name: str
    settings: QueueSettings


class SettingsChanged(_Base, frozen=True, tag="settings"):
    """New settings for the queue."""

    settings: QueueSettings


class MessagesPut(_Base, frozen=True, tag="put"):
    """New messages, in arrival order."""

    items: list[PutItem]


class MessagesTaken(_Base, frozen=True, tag="taken"):
    """Messages reserved under fresh leases (``leases[i]`` for ``ids[i]``) until ``deadline_ms``;
    ``attempt``: the take's attempt id (``Take.attempt``), so that a retry finds them."""

    ids: list[MessageId]
    leases: list[int]
    deadline_ms: int
    attempt: str | None = None  # appended


class MessagesAcked(_Base, frozen=True, tag="acked"):
    """Reserved messages acknowledged with their current lease: deleted."""

    ids: list[MessageId]


class MessagesReleased(_Base, frozen=True, tag="released"):
    """Reserved messages given back, active again at ``activate_at_ms[i]``; ``reasons[i]``
    why it failed, if the release said (None: no release of the event did)."""

    ids: list[MessageId]
    activate_at_ms: list[int]
    reasons: list[str | None] | None = None  # appended


class LeasesExtended(_Base, frozen=True, tag="touched"):
    """Leases extended to new deadlines."""

    ids: list[MessageId]
    deadlines_ms: list[int]


class MessageUpdated(_Base, frozen=True, tag="updated"):
    """A message's body and/or activation time changed (``None``: unchanged).

    A new activation time on a reserved message ends its lease and resets its receive count."""

    id: MessageId
    body: Body | None = None
    activate_at_ms: int | None = None


class MessagesDeleted(_Base, frozen=True, tag="deleted"):
    """Messages deleted by id; ``forced``: by an admin, without the lease of a reserved one
    (its holder's commands are answered ``stale_lease`` until the lease would have ended)."""

    ids: list[MessageId]
    forced: bool = False  # appended


class QueuePurged(_Base, frozen=True, tag="purged"):
    """Every message in the queue deleted."""


class WriterStarted(_Base, frozen=True, tag="writer", omit_defaults=True):
    """A new incarnation of the queue's writer took over the log (fencing; no state change).

    ``nonce`` makes every claim unique, so two incarnations claiming in the same millisecond
    never mistake the other's claim for their own landed write."""

    epoch: int
    nonce: int = 0


class DeadLettersRouted(_Base, frozen=True, tag="dlq"):
    """Dead letters, by arrival sequence, handed to the dead-letter queue (or dropped)."""

    seqs: list[int]


class QueueDeleted(_Base, frozen=True, tag="dropped"):
    """The queue was deleted: its history ends here (shard logs, FORMAT.md). A later
    ``QueueCreated`` of the same name starts a new queue whose records continue the numbering."""


class MoveTaskStarted(_Base, frozen=True, tag="move_started"):
    """A task started to move this queue's ready messages to ``destination`` (None: each
    back to the queue it was dead-lettered from), ``rate`` per second at most."""

    task: str
    destination: str | None
    rate: int | None
    to_move: int


class MoveTaskProgressed(_Base, frozen=True, tag="move_progress"):
    """The move task has moved ``moved`` messages so far."""

    task: str
    moved: int


class MoveTaskCancelling(_Base, frozen=True, tag="move_cancelling"):
    """The move task was asked to stop."""

    task: str


class MoveTaskEnded(_Base, frozen=True, tag="move_ended"):
    """The move task ended: COMPLETED, CANCELLED or FAILED (with the reason)."""

    task: str
    status: str
    reason: str | None = None


class Checkpoint(_Base, frozen=True, tag="checkpoint"):
    """No change: a record that lets one more snapshot of an idle queue cover everything the
    queue has in the shard log, so the log can be pruned behind two snapshots."""


class QueueHandedOver(_Base, frozen=True, tag="handed_over"):
    """The queue's last record on this shard's log: shard ``to`` holds it from generation
    ``generation`` of the placement map on (a handover: actors/log/placement.py). The state
    serves nothing more until a ``QueueTakenOver``."""

    source: int  # this shard
    to: int
    generation: int


class QueueTakenOver(_Base, frozen=True, tag="taken_over"):
    """The queue serves again, on the shard whose log holds this record: the handover from
    shard ``source`` is complete (on that shard itself: called off)."""

    source: int
    generation: int


class BodiesMoved(_Base, frozen=True, tag="moved"):
    """No change to the queue: the bodies of messages it still holds in runs, written again
    further on in the log so that the segment their put was in can go (compaction,
    actors/core/runs.py). ``bodies[i]`` are the bodies of the run whose first message is
    ``ids[i]``, from its slot ``firsts[i]`` on; ``attributes[i]`` their attributes, if that
    run's messages carry any (None: no run's do; an entry None: that run's do not)."""

    ids: list[int]  # Run.ref: first ids, a client-id queue's runs' sequence numbers
    firsts: list[int]
    bodies: list[list[Body]]
    attributes: list[list[dict[str, Any] | None] | None] | None = None  # appended


class QueuePaused(_Base, frozen=True, tag="paused"):
    """Takes hand out nothing from now on (``paused``), or again (not ``paused``); puts,
    acks and every other command go on as before."""

    paused: bool


class KeySet(_Base, frozen=True, tag="key"):
    """An application watch key took a new version and value (key partitions only)."""

    key: str
    version: int
    value: Any


Event = (
    QueueCreated
    | SettingsChanged
    | MessagesPut
    | MessagesTaken
    | MessagesAcked
    | MessagesReleased
    | LeasesExtended
    | MessageUpdated
    | MessagesDeleted
    | QueuePurged
    | DeadLettersRouted
    | WriterStarted
    | KeySet
    | QueueDeleted
    | Checkpoint
    | MoveTaskStarted
    | MoveTaskProgressed
    | MoveTaskCancelling
    | MoveTaskEnded
    | BodiesMoved
    | QueueHandedOver
    | QueueTakenOver
    | QueuePaused
)

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Event] = msgspec.msgpack.Decoder(Event)


def encode_event(event: Event) -> bytes:
    """msgpack bytes of one event."""
    return _encoder.encode(event)


def decode_event(data: bytes) -> Event:
    """The event encoded in ``data``.

    Raises:
        msgspec.DecodeError: not a valid event (callers wrap it into ``DataError``).
    """
    return _decoder.decode(data)
