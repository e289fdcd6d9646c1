"""Replies: what a command gives back to its caller. Plain values, safe to send anywhere."""

from __future__ import annotations

from typing import Any

import msgspec

from actors.settings import QueueSettings

__all__ = [
    "BrowsePage",
    "Delivery",
    "Description",
    "ItemResult",
    "MessageView",
    "MoveTask",
    "PutResult",
    "StatsView",
]

# Per-item statuses of ack / release / touch (API.md) and of put.
OK, STALE_LEASE, NOT_FOUND = "ok", "stale_lease", "not_found"
CREATED, DUPLICATE = "created", "duplicate"


class PutResult(msgspec.Struct, array_like=True, frozen=True):
    """One message of a put: its id and whether it is new."""

    id: str
    status: str


class ItemResult(msgspec.Struct, array_like=True, frozen=True):
    """One item of ack / release / touch."""

    id: str
    status: str
    lease_expires_at_ms: int | None = None


class Delivery(msgspec.Struct, array_like=True, frozen=True):
    """A message handed out by ``take``, with the lease that now holds it."""

    id: str
    body: bytes
    activate_at_ms: int
    enqueued_at_ms: int
    receive_count: int
    lease: str
    lease_expires_at_ms: int
    attributes: dict[str, Any] | None
    group: str | None
    first_taken_ms: int


class MessageView(msgspec.Struct, array_like=True, frozen=True):
    """A message as ``peek`` and ``update`` show it."""

    id: str
    state: str
    body: bytes
    activate_at_ms: int
    enqueued_at_ms: int
    receive_count: int
    lease_expires_at_ms: int | None
    attributes: dict[str, Any] | None
    group: str | None


class BrowsePage(msgspec.Struct, array_like=True, frozen=True):
    """A page of a browse: messages in the state's order, and the cursor of the next page
    (None: no message follows the last one, for now)."""

    messages: list[MessageView]
    next: str | None


class StatsView(msgspec.Struct, frozen=True, kw_only=True):
    """Counts by state and ages, at ``now_ms``."""

    ready: int
    delayed: int
    reserved: int
    total: int
    oldest_ready_age_ms: int | None
    dead_lettered: int
    dead_letter_pending: int
    expired: int
    acked: int
    enqueued: int
    purged: int
    groups: int
    now_ms: int
    paused: bool = False


class Description(msgspec.Struct, frozen=True):
    """A queue: its name, settings and stats."""

    name: str
    settings: QueueSettings
    stats: StatsView


class KeyView(msgspec.Struct, array_like=True, frozen=True):
    """A watch key's state (version 0 and value None: never set)."""

    key: str
    version: int
    value: Any


# Statuses of a move task (the words of SQS's ListMessageMoveTasks).
RUNNING, CANCELLING = "RUNNING", "CANCELLING"
COMPLETED, CANCELLED, FAILED = "COMPLETED", "CANCELLED", "FAILED"
ACTIVE = (RUNNING, CANCELLING)


class MoveTask(msgspec.Struct, array_like=True, frozen=True):
    """A task that moves a queue's messages to another queue (a redrive of a dead-letter
    queue), as the queue keeps it. Also its snapshot record: fields are only ever appended."""

    task: str
    destination: str | None  # None: each message back to the queue it came from
    rate: int | None  # messages per second; None: as fast as the queues allow
    to_move: int  # ready messages when it started
    moved: int
    status: str
    started_at_ms: int
    reason: str | None = None  # why it failed
