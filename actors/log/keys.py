"""Object names of the log (FORMAT.md, "Object names"). Pure."""

from __future__ import annotations

from actors.errors import DataError

__all__ = [
    "ARCHIVE_MARKERS",
    "ARCHIVE_ROOT",
    "archive_day",
    "archive_key",
    "archive_marker_key",
    "damaged_key",
    "is_wal_segment",
    "log_prefix",
    "queue_of",
    "queue_prefix",
    "report_key",
    "segment_key",
    "seq_of",
    "snapshot_key",
    "snapshot_prefix",
    "unarchived",
    "wal_damaged_key",
    "wal_prefix",
    "wal_report_key",
    "wal_segment_key",
]

ROOT = "queues/"
WAL_ROOT = "wal/"
LAYOUT = f"{WAL_ROOT}LAYOUT"  # the shard count the logs under wal/ were written with
ARCHIVE_ROOT = "archive/"
ARCHIVE_MARKERS = f"{ARCHIVE_ROOT}shards/"
_SEQ_WIDTH = 20
_DAY_WIDTH = 8  # YYYYMMDD


def queue_prefix(queue: str) -> str:
    """Prefix of every object of ``queue``."""
    return f"{ROOT}{queue}/"


def log_prefix(queue: str) -> str:
    """Prefix of the queue's segments."""
    return f"{ROOT}{queue}/log/"


def snapshot_prefix(queue: str) -> str:
    """Prefix of the queue's snapshots."""
    return f"{ROOT}{queue}/snap/"


def segment_key(queue: str, first_seq: int) -> str:
    """Name of the segment whose first record is ``first_seq``."""
    return f"{ROOT}{queue}/log/{first_seq:0{_SEQ_WIDTH}d}.seg"


def snapshot_key(queue: str, seq: int) -> str:
    """Name of the snapshot covering records up to ``seq``."""
    return f"{ROOT}{queue}/snap/{seq:0{_SEQ_WIDTH}d}.snap"


def damaged_key(key: str, epoch: int) -> str:
    """Where recovery of incarnation ``epoch`` moves the damaged object ``key``."""
    queue = queue_of(key)
    name = key.rsplit("/", 1)[-1]
    return f"{ROOT}{queue}/damaged/{name}.{epoch}"


def report_key(queue: str, epoch: int) -> str:
    """The recovery report of incarnation ``epoch``."""
    return f"{ROOT}{queue}/reports/{epoch:010d}.json"


def wal_prefix(shard: int) -> str:
    """Prefix of shard ``shard``'s log (format version 2: the log its queues share)."""
    return f"{WAL_ROOT}{shard:04d}/"


def wal_segment_key(shard: int, first_lsn: int) -> str:
    """Name of the shard log segment whose first record is ``first_lsn``."""
    return f"{WAL_ROOT}{shard:04d}/{first_lsn:0{_SEQ_WIDTH}d}.seg"


def is_wal_segment(key: str) -> bool:
    """Whether ``key`` names a segment of a shard log (not a report, lock or damaged copy)."""
    if not key.startswith(WAL_ROOT) or not key.endswith(".seg") or "/" in key[len(WAL_ROOT) + 5 :]:
        return False
    try:
        seq_of(key)
    except DataError:
        return False
    return True


def wal_report_key(shard: int, epoch: int) -> str:
    """The recovery report of the shard's incarnation ``epoch``."""
    return f"{WAL_ROOT}{shard:04d}/reports/{epoch:010d}.json"


def wal_damaged_key(key: str, epoch: int) -> str:
    """Where recovery of incarnation ``epoch`` keeps a copy of the damaged segment ``key``."""
    head, _, name = key.rpartition("/")
    return f"{head}/damaged/{name}.{epoch}"


def seq_of(key: str) -> int:
    """The sequence number in a segment or snapshot name.

    Raises:
        DataError: the name is not a segment or snapshot name.
    """
    name = key.rsplit("/", 1)[-1]
    stem, _, suffix = name.partition(".")
    if (
        suffix not in ("seg", "snap")
        or len(stem) != _SEQ_WIDTH
        or not (stem.isascii() and stem.isdigit())
    ):
        raise DataError(f"not a log object name: {key!r}")
    return int(stem)


def queue_of(key: str) -> str:
    """The queue a log object belongs to.

    Raises:
        DataError: the key is not under ``queues/<queue>/``.
    """
    if not key.startswith(ROOT) or key.count("/") < 2:
        raise DataError(f"not a queue object: {key!r}")
    return key[len(ROOT) :].split("/", 1)[0]


def archive_key(key: str, day: str) -> str:
    """Where the archive keeps object ``key`` archived on ``day`` (YYYYMMDD, UTC)."""
    return f"{ARCHIVE_ROOT}{day}/{key}"


def archive_day(key: str) -> str | None:
    """The day an archived object was archived (None: not an archive key)."""
    if not key.startswith(ARCHIVE_ROOT):
        return None
    day, sep, rest = key[len(ARCHIVE_ROOT) :].partition("/")
    if not sep or not rest or len(day) != _DAY_WIDTH or not (day.isascii() and day.isdigit()):
        return None
    return day


def unarchived(key: str) -> str:
    """The key an object had in the live log (an archive key less its ``archive/<day>/``);
    any other key as it is."""
    day = archive_day(key)
    return key if day is None else key[len(ARCHIVE_ROOT) + _DAY_WIDTH + 1 :]


def archive_marker_key(shard: int) -> str:
    """The object that says shard ``shard`` archives its log (written before its first
    archived segment, after the baselines of its queues)."""
    return f"{ARCHIVE_MARKERS}{shard:04d}"
