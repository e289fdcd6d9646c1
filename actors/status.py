"""What a shard says of itself: whether it has recovered its queues, what recovery found (in
each queue's snapshots and in the shard's log), and what it has written since. Plain
structs: the gateway, the dashboard and ``/metrics`` read them without importing the shard.
"""

from __future__ import annotations

import msgspec

__all__ = ["Discarded", "LogWrites", "RecoveryReport", "ShardReport", "ShardStatus"]


class Discarded(msgspec.Struct, frozen=True):
    """An object (or its tail) that recovery did not use, and why."""

    object: str
    offset: int  # byte offset of the first byte not used (0: the whole object)
    records: int | None  # records not used (None: unknown, e.g. a damaged header)
    reason: str


class RecoveryReport(msgspec.Struct, kw_only=True):
    """What a recovery used, what it discarded, and how long it took."""

    queue: str
    epoch: int = 0  # the incarnation that recovered (set by the caller)
    snapshot: str | None = None
    snapshot_seq: int = 0
    segments_replayed: int = 0
    records_replayed: int = 0
    last_seq: int = 0
    discarded: list[Discarded] = msgspec.field(default_factory=list)
    duration_ms: int = 0

    @property
    def clean(self) -> bool:
        """Nothing was discarded."""
        return not self.discarded


class ShardReport(msgspec.Struct, kw_only=True):
    """What the opening of a shard's log found in the log itself (each queue's own findings
    are in its :class:`RecoveryReport`)."""

    shard: int
    epoch: int = 0
    segments: int = 0
    records: int = 0
    queues: int = 0
    discarded: list[Discarded] = msgspec.field(default_factory=list)
    repaired: list[str] = msgspec.field(default_factory=list)  # torn tails cut, for people
    duration_ms: int = 0

    @property
    def clean(self) -> bool:
        """Nothing acknowledged was discarded."""
        return not self.discarded


class LogWrites(msgspec.Struct):
    """What a shard has written to its log since it started (commits are blocks)."""

    blocks: int = 0
    records: int = 0
    bytes: int = 0  # of the records
    segments: int = 0  # segments the log holds now (not yet pruned)


class ShardStatus(msgspec.Struct):
    """Whether a shard has recovered its queues, and what recovery found (in each queue's
    snapshots and own version-1 segments, and in the shard's log)."""

    index: int
    ready: bool
    queues: int
    recovering: int
    reports: list[RecoveryReport]
    failed: dict[str, str]
    log: ShardReport | None = None
    writes: LogWrites | None = None
    # Appended with defaults: a gateway and shards of different versions still agree.
    log_failed: str | None = None  # why the log is not written any more (a failed fsync)
    disk_full: str | None = None  # why puts are refused (the log's disk is full)
    generation: int = 0  # of the placement map the shard serves by
    count: int = 0  # that map's shard count (0: a shard of an older version)
    span: int = 0  # the shards that map needs running (past the count: a shrink drains them)
    queue_changes: int = 0  # queues created or deleted by this incarnation (sys:queues)
