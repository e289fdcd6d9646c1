"""Queue settings: a frozen struct, stored in the queue's ``QueueCreated`` event.

Durations are integer milliseconds here; the native API speaks seconds and converts at the
gateway. Defaults are those of API.md. No environment is read here.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from actors.errors import BadRequest

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MAX_BATCH",
    "MAX_MESSAGE_BYTES_LIMIT",
    "MAX_PUT_BYTES",
    "LogSettings",
    "QueueSettings",
    "validate_queue_name",
]

MAX_BATCH = 1000
MAX_PUT_BYTES = 128 * 1024 * 1024  # one put's bodies together (one log record holds them)
DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
MAX_MESSAGE_BYTES_LIMIT = 64 * 1024 * 1024
MAX_VISIBILITY_TIMEOUT_MS = 12 * 3600 * 1000
MAX_RETENTION_MS = 365 * 24 * 3600 * 1000
MAX_IDEMPOTENCY_WINDOW_MS = 7 * 24 * 3600 * 1000
MAX_RECEIVES_LIMIT = 1000
MAX_MESSAGES_LIMIT = 1_000_000_000
MAX_RATE = 100_000  # messages per second, take_rate and put_rate
MAX_META_ENTRIES = 256
MAX_META_KEY_CHARS = 512
MAX_META_VALUE_CHARS = 65_536

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}(\.fifo)?")
RESERVED_PREFIX = "__evq"  # the server's own logs (e.g. watch-key partitions)


def validate_queue_name(name: object, *, internal: bool = False) -> str:
    """Return ``name`` if it is a valid queue name.

    ``internal``: also accept the names the server reserves for itself (``__evq…``).

    Raises:
        BadRequest: not 1-80 of ``A-Za-z0-9_-`` with an optional ``.fifo`` suffix, or a
            reserved name.
    """
    if not isinstance(name, str) or _QUEUE_NAME.fullmatch(name) is None:
        raise BadRequest(
            "queue names are 1-80 characters of A-Za-z0-9_- with an optional .fifo suffix",
            name=str(name)[:100],
        )
    if not internal and name.startswith(RESERVED_PREFIX):
        raise BadRequest(f"queue names starting with {RESERVED_PREFIX} are reserved", name=name)
    return name


class QueueSettings(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Per-queue settings. Schema evolution: append new fields at the end, with defaults."""

    id_mode: Literal["server", "client"] = "server"
    visibility_timeout_ms: int = 30_000
    max_receives: int | None = None
    dead_letter_queue: str | None = None
    retention_ms: int = 345_600_000
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    fifo: bool = False
    delay_ms: int = 0
    idempotency_window_ms: int = 900_000
    content_based_dedup: bool = False
    # What other APIs keep about the queue (the SQS API: tags, creation time, attributes
    # without an engine equivalent). Stored and replayed as given; the engine ignores it.
    meta: dict[str, str] | None = None
    max_messages: int | None = None  # puts beyond it are refused (Overloaded) until it drains
    # Limits that hold for the whole cluster (they are kept where the queue lives): messages
    # a second handed out by takes, and accepted by puts (a leaky bucket, a second's worth
    # at once); messages reserved at once. None: no limit.
    take_rate: int | None = None
    put_rate: int | None = None
    max_in_flight: int | None = None
    # A standard queue's messages handed out fairly across their groups (actors/core/fair.py):
    # one group's backlog does not hold back the others'.
    fair: bool = False

    @property
    def hands_out_fairly(self) -> bool:
        """Whether takes go round the groups (``fair``, which only a standard queue may be;
        validation refuses the pair, and a FIFO queue's groups are in order anyway)."""
        return self.fair and not self.fifo

    def validate(self, name: str) -> QueueSettings:
        """Check every field against its range and the queue name; return self.

        Raises:
            BadRequest: a field is out of range or contradicts the name.
        """
        if self.id_mode not in ("server", "client"):
            raise BadRequest("id_mode is 'server' or 'client'", field="id_mode")
        _check_range("visibility_timeout", self.visibility_timeout_ms, 0, MAX_VISIBILITY_TIMEOUT_MS)
        _check_range("retention", self.retention_ms, 1000, MAX_RETENTION_MS)
        _check_range("max_message_bytes", self.max_message_bytes, 1, MAX_MESSAGE_BYTES_LIMIT)
        _check_range("delay", self.delay_ms, 0, MAX_RETENTION_MS)
        _check_range("idempotency_window", self.idempotency_window_ms, 0, MAX_IDEMPOTENCY_WINDOW_MS)
        if self.max_receives is not None:
            _check_range("max_receives", self.max_receives, 1, MAX_RECEIVES_LIMIT)
        if self.dead_letter_queue is not None:
            validate_queue_name(self.dead_letter_queue)
            if self.dead_letter_queue == name:
                raise BadRequest("a queue cannot be its own dead-letter queue")
            if self.max_receives is None:
                raise BadRequest("dead_letter_queue needs max_receives")
        if self.fifo != name.endswith(".fifo"):
            raise BadRequest("FIFO queues, and only they, have names ending in .fifo")
        if self.content_based_dedup and not self.fifo:
            raise BadRequest("content_based_dedup is for FIFO queues")
        if not isinstance(self.fair, bool):
            raise BadRequest("fair is true or false", field="fair")
        if self.fair and self.fifo:
            raise BadRequest(
                "fair is for standard queues (a FIFO queue's groups are in order)", field="fair"
            )
        if self.meta is not None:
            _check_meta(self.meta)
        self._check_limits()
        return self

    def _check_limits(self) -> None:
        """max_messages, the rates and max_in_flight: a whole number in range, or None."""
        limits = {
            "max_messages": MAX_MESSAGES_LIMIT,
            "take_rate": MAX_RATE,
            "put_rate": MAX_RATE,
            "max_in_flight": MAX_MESSAGES_LIMIT,
        }
        for field, high in limits.items():
            if (value := getattr(self, field)) is not None:
                _check_range(field, value, 1, high)


def _check_range(field: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        unit = "" if field in ("max_message_bytes", "max_receives") else " ms"
        raise BadRequest(f"{field} must be between {low} and {high}{unit}", field=field)


def _check_meta(meta: object) -> None:
    if not isinstance(meta, dict) or len(meta) > MAX_META_ENTRIES:
        raise BadRequest(f"meta must be a map of at most {MAX_META_ENTRIES} entries", field="meta")
    for key, value in meta.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_META_KEY_CHARS:
            raise BadRequest(f"meta keys are 1-{MAX_META_KEY_CHARS} characters", field="meta")
        if not isinstance(value, str) or len(value) > MAX_META_VALUE_CHARS:
            raise BadRequest(
                f"meta values are strings of at most {MAX_META_VALUE_CHARS} characters",
                field="meta",
            )


class LogSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How a shard and its queues use the log (server-wide, not stored in the log)."""

    snapshot_every_records: int = 200_000
    snapshot_every_ms: int = 300_000
    # A queue of at least this many messages encodes its snapshots in a forked child
    # (actors/log/forked.py), its shard serving meanwhile; 0: every queue; -1: none
    # (250,000, the measured choice: loadtest/RESULTS.md, "Snapshots at depth").
    snapshot_fork_above: int = 250_000
    max_batch_bytes: int = 16 * 1024 * 1024
    # The shard log keeps at most about this many records behind its queues' snapshots:
    # past it, the queues that hold its oldest segment take snapshots (bounds recovery time).
    retain_records: int = 400_000
    segment_bytes: int = 16 * 1024 * 1024  # a local log's segment files
    # Pruned segments are archived first (actors/log/archive.py); kept this many days in
    # the archive (None: forever).
    archive: bool = True
    archive_retention_days: int | None = None
    segment_roll_ms: int = 300_000  # a local log's segment is closed after this long
    # Queues hold ready puts as runs whose bodies stay in the log (actors/core/runs.py); a
    # local log's bodies are read back through a cache of this many bytes of bodies.
    spill: bool = True
    body_cache_bytes: int = 16 * 1024 * 1024
    # The oldest segments, when only such bodies keep them, are compacted (those bodies
    # written again further on, then the segments go) once the segments' bytes are more
    # than this many times the bodies' (as put: the log compresses them). 0: never.
    compact_over: float = 1.5
    # An object store's shard copies its log's segments into this directory (its own
    # subdirectory per shard, emptied when the shard starts) and reads bodies back from it;
    # None: its runs keep their bodies in memory.
    segment_cache: str | None = None
