"""Commands: what a client asks of one queue. Imperative names, the native API's verbs.

Commands are plain data, validated by :mod:`actors.core.decide`. Times are integer ms;
ids and leases are the strings the API shows. They form a tagged union (``Command``), so a
batch of them travels as msgpack between the gateway and the shards.
"""

from __future__ import annotations

from typing import Any

import msgspec

from actors.core import events as ev
from actors.settings import QueueSettings

__all__ = [
    "FAILURES",
    "PROVENANCE",
    "SENT_AT",
    "SOURCE_ID",
    "SOURCE_QUEUE",
    "Ack",
    "Browse",
    "CancelMove",
    "ChangeSettings",
    "Checkpoint",
    "Command",
    "ConfirmDeadLetters",
    "Create",
    "Delete",
    "Drop",
    "EndMove",
    "GetKey",
    "HandOver",
    "LeaseRef",
    "ListMoves",
    "MoveBodies",
    "MoveProgress",
    "NewMessage",
    "Pause",
    "Peek",
    "PeekReady",
    "Purge",
    "Put",
    "Release",
    "ReleaseItem",
    "Reschedule",
    "SetKey",
    "StartMove",
    "Stats",
    "Take",
    "TakeOver",
    "Touch",
    "TouchItem",
    "Update",
]

Body = bytes

# Attributes a message moved from another queue carries (``Put.redelivery``): the queue it
# came from, its id there, and when it was first put (ms; kept over further moves).
SOURCE_QUEUE = "evq.source_queue"
SOURCE_ID = "evq.source_id"
SENT_AT = "evq.sent_at"
PROVENANCE = (SOURCE_QUEUE, SOURCE_ID, SENT_AT)
FAILURES = ev.FAILURES  # a message's last failure reasons (ReleaseItem.reason)


class NewMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One message of a put. ``delay_ms`` and ``activate_at_ms`` are mutually exclusive."""

    body: Body
    id: str | None = None
    delay_ms: int | None = None
    activate_at_ms: int | None = None
    idempotency_key: str | None = None
    group: str | None = None
    attributes: dict[str, Any] | None = None


class Create(msgspec.Struct, frozen=True, tag=True):
    """Create the queue. The first command of every queue."""

    name: str
    settings: QueueSettings


class ChangeSettings(msgspec.Struct, frozen=True, tag=True):
    """Replace the queue's settings (``id_mode`` and ``fifo`` cannot change)."""

    settings: QueueSettings


class PatchSettings(msgspec.Struct, frozen=True, tag=True):
    """Change some settings, named as in QueueSettings (``id_mode``/``fifo`` cannot change)."""

    changes: dict[str, Any]


class Describe(msgspec.Struct, frozen=True, tag=True):
    """The queue's name, settings and stats."""


class Put(msgspec.Struct, frozen=True, tag=True):
    """Put 1-1000 messages.

    ``redelivery``: the messages come from another queue (dead letters, or a move back from
    a dead-letter queue): they keep their ids (a server-id queue keeps a server id that no
    message of its own has, and draws a new one otherwise), instead of being refused."""

    messages: list[NewMessage]
    redelivery: bool = False


class Take(msgspec.Struct, frozen=True, tag=True):
    """Reserve up to ``max`` ready messages, each under a fresh lease.

    ``attempt`` (SQS's ``ReceiveRequestAttemptId``): a take retried with the same attempt
    within ``ATTEMPT_WINDOW_MS`` of the one that reserved messages gets those same messages
    and leases again, as long as none of them was acked, released, touched or let go since
    (a caller whose answer was lost would otherwise leave them reserved for nobody).

    A paused queue's takes get nothing, except a move task's (``mover``: an operator's
    redrive of a paused dead-letter queue still moves its messages)."""

    max: int = 1
    visibility_timeout_ms: int | None = None
    attempt: str | None = None  # appended
    mover: bool = False  # appended


class LeaseRef(msgspec.Struct, frozen=True):
    """A message id and the lease a client holds on it."""

    id: str
    lease: str


class ReleaseItem(msgspec.Struct, frozen=True, kw_only=True):
    """Give a reserved message back, optionally with a new activation time and why it
    failed (``reason``: at most ``MAX_REASON_BYTES`` of UTF-8; the message keeps its last
    ``KEPT_FAILURES``)."""

    id: str
    lease: str
    delay_ms: int | None = None
    activate_at_ms: int | None = None
    reason: str | None = None


class TouchItem(msgspec.Struct, frozen=True, kw_only=True):
    """Extend a lease by the queue's (or the given) visibility timeout from now."""

    id: str
    lease: str
    visibility_timeout_ms: int | None = None


class Ack(msgspec.Struct, frozen=True, tag=True):
    """Delete reserved messages whose leases are current.

    ``lenient``: each lease is one the caller held once, not necessarily the current one
    (the SQS face, whose signed receipt handles prove it): the message is deleted whatever
    its state, as SQS deletes a message by the handle of an earlier receive."""

    items: list[LeaseRef]
    lenient: bool = False


class Release(msgspec.Struct, frozen=True, tag=True):
    """Return reserved messages to the queue (``lenient``: as for :class:`Ack`, a reserved
    message is released whoever holds its current lease)."""

    items: list[ReleaseItem]
    lenient: bool = False


class Touch(msgspec.Struct, frozen=True, tag=True):
    """Extend leases (``lenient``: as for :class:`Release`)."""

    items: list[TouchItem]
    lenient: bool = False


class Update(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Change a message's body and/or activation time.

    On a reserved message the lease is required. Changing the activation time of a reserved
    message ends its lease and starts its receive count again (periodic work reschedules)."""

    id: str
    lease: str | None = None
    body: Body | None = None
    delay_ms: int | None = None
    activate_at_ms: int | None = None


class Reschedule(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Change a message's activation time (an :class:`Update` without a body)."""

    id: str
    lease: str | None = None
    delay_ms: int | None = None
    activate_at_ms: int | None = None


class Peek(msgspec.Struct, frozen=True, tag=True):
    """Look at one message by id without changing anything."""

    id: str


class PeekReady(msgspec.Struct, frozen=True, tag=True):
    """Look at the next ``max`` ready messages without reserving them."""

    max: int = 1


class Browse(msgspec.Struct, frozen=True, tag=True):
    """Look at the messages in one state (``ready``, ``delayed`` or ``reserved``), a page
    of up to ``limit`` at a time, without changing anything. ``after`` is the cursor a page
    gave as its ``next`` (None: from the start). Order and cursor: ``actors/core/browse.py``."""

    state: str = "ready"
    limit: int = 100
    after: str | None = None


class Delete(msgspec.Struct, frozen=True, tag=True):
    """Delete one message; a reserved one needs its lease, unless ``force`` (an admin's:
    its lease holder's next ack is answered ``stale_lease``)."""

    id: str
    lease: str | None = None
    force: bool = False


class Purge(msgspec.Struct, frozen=True, tag=True):
    """Delete every message in the queue."""


class Stats(msgspec.Struct, frozen=True, tag=True):
    """Counts by state and ages."""


class ConfirmDeadLetters(msgspec.Struct, frozen=True, tag=True):
    """The shell delivered these dead letters (or dropped them: no dead-letter queue).

    Dead letters are named by arrival sequence (``Message.seq``): a client id can be reused
    while an earlier message with that id still waits in the outbox."""

    seqs: list[int]


class SetKey(msgspec.Struct, frozen=True, tag=True):
    """Set an application watch key (on a key partition, see ``actors.keyspace``): its
    version becomes one more than before."""

    key: str
    value: Any


class GetKey(msgspec.Struct, frozen=True, tag=True):
    """An application watch key's version and value (version 0, value None: never set)."""

    key: str


class Checkpoint(msgspec.Struct, frozen=True, tag=True):
    """Record nothing but a marker, so that one more snapshot of an idle queue covers it all
    (the shard log is pruned behind two snapshots; shard-internal)."""


class MoveBodies(msgspec.Struct, frozen=True, tag=True):
    """Write the bodies still spilled in the runs whose first messages are ``ids`` again
    (``BodiesMoved``), so that their old segment can go (shard-internal: compaction)."""

    ids: list[int]  # Run.ref: first ids, a client-id queue's runs' sequence numbers


class StartMove(msgspec.Struct, frozen=True, tag=True):
    """Start a task that moves the queue's ready messages to ``destination`` (None: each
    back to the queue it was dead-lettered from), at most ``rate`` per second. The queue's
    shell runs it (``actors/moves.py``); one runs at a time."""

    task: str
    destination: str | None = None
    rate: int | None = None


class CancelMove(msgspec.Struct, frozen=True, tag=True):
    """Ask the running move task ``task`` to stop."""

    task: str


class ListMoves(msgspec.Struct, frozen=True, tag=True):
    """The queue's recent move tasks, newest first."""


class MoveProgress(msgspec.Struct, frozen=True, tag=True):
    """The running move task has moved ``moved`` messages (shell-internal)."""

    task: str
    moved: int


class EndMove(msgspec.Struct, frozen=True, tag=True):
    """The move task ended (shell-internal): COMPLETED, CANCELLED or FAILED, with why."""

    task: str
    status: str
    reason: str | None = None


class HandOver(msgspec.Struct, frozen=True, tag=True):
    """End the queue's life on this shard: shard ``to`` holds it from placement generation
    ``generation`` on (shard-internal: a handover; the state serves nothing more).
    ``source``: this shard."""

    source: int
    to: int
    generation: int


class TakeOver(msgspec.Struct, frozen=True, tag=True):
    """Serve the queue, handed over by shard ``source`` (on ``source`` itself: take it back,
    the handover called off; shard-internal)."""

    source: int
    generation: int


class Pause(msgspec.Struct, frozen=True, tag=True):
    """Pause the queue's takes (``paused``) or resume them; the reply is whether the queue
    is paused now. Idempotent: pausing a paused queue writes nothing."""

    paused: bool = True


class Drop(msgspec.Struct, frozen=True, tag=True):
    """End the queue's history (its deletion; shard-internal: ``DELETE /v1/queues/{name}``)."""


Command = (
    Create
    | ChangeSettings
    | PatchSettings
    | Describe
    | Put
    | Take
    | Ack
    | Release
    | Touch
    | Update
    | Reschedule
    | Peek
    | PeekReady
    | Browse
    | Delete
    | Purge
    | Stats
    | ConfirmDeadLetters
    | SetKey
    | GetKey
    | Checkpoint
    | MoveBodies
    | Drop
    | HandOver
    | TakeOver
    | StartMove
    | CancelMove
    | ListMoves
    | MoveProgress
    | EndMove
    | Pause
)
