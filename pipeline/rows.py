"""Log events ⇄ typed rows: the schema of the ``evq`` data source's ``events`` view. Pure.

One row per message an event names (a put of 100 messages is 100 rows, ``item`` 0..99, each
with ``items`` = 100); an event that names no message is one row with ``item`` 0. Every
field of every event has a column, so :func:`events_from_rows` rebuilds the exact events:
that is what makes the archive a lossless copy of the history. A record of a shard log also
carries its ``lsn`` (its place in the log its shard's queues share); a version-1 record's is
null.

Besides events, the view has one ``segment`` row per segment object: what was read from it,
and where and why reading stopped early (``offset``, ``detail``). For a version-1 segment:
``queue``, ``seq`` (its first record), ``records`` valid of ``items`` the header announced.
For a shard-log segment: ``lsn`` (its first LSN; ``records`` valid records follow it), how
it ends (``end``: ``clean``, ``zeros``: preallocated space, ``torn``: a write that never
finished, ``damaged``), and ``queues``: JSON of the runs of records each queue has in its
valid blocks (``{"orders": [[41, 57]], …}``). Jobs use these rows to cut the history where
recovery would (:mod:`pipeline.chain`, :mod:`pipeline.walchain`) and to report damage.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import pyarrow as pa

from actors.core import events as ev
from pipeline.walchain import Ranges, WalMeta

__all__ = [
    "EVENTS_SCHEMA",
    "EVENT_TYPES",
    "SEGMENT",
    "EventRows",
    "Rows",
    "event_rows",
    "events_from_rows",
    "segment_row",
    "wal_segment_meta",
    "wal_segment_row",
]

SEGMENT = "segment"  # the type of a segment's meta row

# Event class → the ``type`` column (the event's own tag in the log).
EVENT_TYPES: dict[type, str] = {cls: cls.__struct_config__.tag for cls in ev.Event.__args__}
_CLASSES = {tag: cls for cls, tag in EVENT_TYPES.items()}

EVENTS_SCHEMA = pa.schema(
    [
        ("queue", pa.string()),
        ("seq", pa.int64()),  # the record's sequence number in its queue's history
        ("item", pa.int32()),  # position of this message in the event
        ("items", pa.int32()),  # messages the event names (segment rows: records announced)
        ("type", pa.string()),  # the event's tag: put, taken, acked, … or "segment"
        ("at_ms", pa.int64()),
        ("message_id", pa.string()),
        ("message_num", pa.int64()),  # the id when it is a (server-assigned) integer
        ("body", pa.binary()),
        ("body_bytes", pa.int64()),
        ("activate_at_ms", pa.int64()),
        ("deadline_ms", pa.int64()),
        ("lease", pa.int64()),
        ("idempotency_key", pa.string()),
        ("msg_group", pa.string()),
        ("attributes", pa.string()),  # JSON object
        ("arrival", pa.int64()),  # dlq: arrival sequence number of the dead letter
        ("detail", pa.string()),  # JSON: settings, writer epoch and nonce; damage reason
        ("object", pa.string()),  # the segment object the row comes from
        ("epoch", pa.int64()),  # that segment's writer epoch
        ("offset", pa.int64()),  # segment rows: byte offset where reading stopped
        ("records", pa.int64()),  # segment rows: valid records read
        ("lsn", pa.int64()),  # shard-log records: the record's LSN; segment rows: the first
        ("end", pa.string()),  # shard-log segment rows: clean, zeros, torn or damaged
        ("queues", pa.string()),  # shard-log segment rows: JSON, queue -> runs of records
    ]
)

_json = msgspec.json.Encoder()
# Events that name messages; every other event (created, settings, purged, writer, key and
# any later kind) is one row, ``items`` 0, with the whole event as JSON in ``detail``.
_MESSAGE_EVENTS = (
    ev.MessagesPut,
    ev.MessagesTaken,
    ev.MessagesAcked,
    ev.MessagesDeleted,
    ev.MessagesReleased,
    ev.LeasesExtended,
    ev.MessageUpdated,
    ev.DeadLettersRouted,
)
_event_decoder: msgspec.json.Decoder[ev.Event] = msgspec.json.Decoder(ev.Event)


class Rows:
    """Columns of ``schema`` being filled, row by row, then handed over as Arrow batches."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self.rows = 0

    def add(self, **values: Any) -> None:
        """One row; columns not given are null."""
        for name, column in self.columns.items():
            column.append(values.get(name))
        self.rows += 1

    def batch(self) -> pa.RecordBatch:
        """The rows so far as one Arrow record batch; starts over empty."""
        batch = pa.RecordBatch.from_pydict(self.columns, schema=self.schema)
        self.columns = {name: [] for name in self.schema.names}
        self.rows = 0
        return batch

    def to_pylist(self) -> list[dict[str, Any]]:
        """The rows so far as dicts (tests and the plain-Python path)."""
        names = self.schema.names
        return [dict(zip(names, r, strict=True)) for r in zip(*self.columns.values(), strict=True)]


class EventRows(Rows):
    """Rows of the events view (``bodies=False``: message bodies left out)."""

    def __init__(self, *, bodies: bool = True) -> None:
        super().__init__(EVENTS_SCHEMA)
        self.bodies = bodies


def _id_columns(mid: ev.MessageId) -> dict[str, Any]:
    if type(mid) is int:
        return {"message_id": str(mid), "message_num": mid}
    return {"message_id": mid}


def _event_rows(e: ev.Event) -> list[dict[str, Any]]:
    """The per-message columns of one event (without queue, seq, object)."""
    match e:
        case ev.MessagesPut():
            return [
                {
                    **_id_columns(it.id),
                    "body": it.body,
                    "body_bytes": len(it.body),
                    "activate_at_ms": it.activate_at_ms,
                    "idempotency_key": it.key,
                    "msg_group": it.group,
                    "attributes": None
                    if it.attributes is None
                    else _json.encode(it.attributes).decode(),
                }
                for it in e.items
            ]
        case ev.MessagesTaken():
            if not e.ids:  # still one row: it carries the deadline
                return [{"deadline_ms": e.deadline_ms}]
            return [
                {**_id_columns(mid), "lease": lease, "deadline_ms": e.deadline_ms}
                for mid, lease in zip(e.ids, e.leases, strict=True)
            ]
        case ev.MessagesAcked() | ev.MessagesDeleted():
            return [_id_columns(mid) for mid in e.ids]
        case ev.MessagesReleased():
            return [
                {**_id_columns(mid), "activate_at_ms": at}
                for mid, at in zip(e.ids, e.activate_at_ms, strict=True)
            ]
        case ev.LeasesExtended():
            return [
                {**_id_columns(mid), "deadline_ms": d}
                for mid, d in zip(e.ids, e.deadlines_ms, strict=True)
            ]
        case ev.MessageUpdated():
            row = {**_id_columns(e.id), "activate_at_ms": e.activate_at_ms}
            if e.body is not None:
                row.update(body=e.body, body_bytes=len(e.body))
            return [row]
        case ev.DeadLettersRouted():
            return [{"arrival": s} for s in e.seqs]
        case _:  # about the queue, not a message: the whole event as JSON, exactly
            return [{"detail": _json.encode(e).decode()}]


def event_rows(
    out: EventRows,
    queue: str,
    obj: str,
    epoch: int,
    first_seq: int,
    events: list[ev.Event],
    *,
    first_lsn: int | None = None,
) -> None:
    """Append the rows of a queue's records ``first_seq`` … (``events``, in order) read
    from object ``obj`` to ``out``; ``first_lsn``: the first one's LSN in a shard log."""
    add = out.add
    for offset, e in enumerate(events):
        rows = _event_rows(e)
        n = len(e.ids) if isinstance(e, ev.MessagesTaken) else len(rows)
        if not isinstance(e, _MESSAGE_EVENTS):
            n = 0
        if not rows:  # an event that names no message (an empty list) still has a row
            rows = [{}]
        tag = EVENT_TYPES[type(e)]
        lsn = None if first_lsn is None else first_lsn + offset
        for i, row in enumerate(rows):
            if not out.bodies:
                row.pop("body", None)
            add(
                queue=queue,
                seq=first_seq + offset,
                lsn=lsn,
                item=i,
                items=n,
                type=tag,
                at_ms=e.at_ms,
                object=obj,
                epoch=epoch,
                **row,
            )


def segment_row(
    out: EventRows,
    queue: str,
    obj: str,
    first_seq: int,
    *,
    epoch: int | None,
    announced: int | None,
    valid: int | None,
    offset: int | None = None,
    reason: str | None = None,
) -> None:
    """Append the meta row of one segment object (``valid`` None: nothing was readable)."""
    out.add(
        queue=queue,
        seq=first_seq,
        item=0,
        items=announced,
        type=SEGMENT,
        object=obj,
        epoch=epoch,
        offset=offset,
        records=valid,
        detail=reason,
    )


def wal_segment_row(out: EventRows, meta: WalMeta) -> None:
    """Append the meta row of one shard-log segment."""
    out.add(
        type=SEGMENT,
        item=0,
        object=meta.object,
        lsn=meta.first_lsn,
        epoch=meta.epoch,
        records=meta.records,
        end=meta.end,
        offset=meta.offset,
        detail=meta.reason,
        queues=_json.encode(meta.queues).decode(),
    )


def wal_segment_meta(row: dict[str, Any]) -> WalMeta:
    """The :class:`WalMeta` a shard-log segment row says."""
    ranges: Ranges = _ranges_decoder.decode(row["queues"] or "{}")
    return WalMeta(
        row["object"],
        row["lsn"],
        row["epoch"],
        row["records"],
        row["end"],
        row["offset"],
        row["detail"],
        ranges,
    )


_ranges_decoder = msgspec.json.Decoder(dict[str, list[tuple[int, int]]])


# ------------------------------------------------------------------ rows → events


def _mid(row: dict[str, Any]) -> ev.MessageId:
    num = row.get("message_num")
    return num if num is not None else row["message_id"]


def _rebuild(tag: str, at: int, rows: list[dict[str, Any]]) -> ev.Event:
    """One event from its rows (in item order)."""
    cls = _CLASSES[tag]
    items = rows if rows[0].get("items") else []
    if cls is ev.MessagesPut:
        return ev.MessagesPut(
            at,
            [
                ev.PutItem(
                    _mid(r),
                    r["body"],
                    r["activate_at_ms"],
                    r["idempotency_key"],
                    r["msg_group"],
                    None if r["attributes"] is None else msgspec.json.decode(r["attributes"]),
                )
                for r in items
            ],
        )
    if cls is ev.MessagesTaken:
        deadline = rows[0]["deadline_ms"]
        return ev.MessagesTaken(at, [_mid(r) for r in items], [r["lease"] for r in items], deadline)
    if cls in (ev.MessagesAcked, ev.MessagesDeleted):
        return cls(at, [_mid(r) for r in items])
    if cls is ev.MessagesReleased:
        return ev.MessagesReleased(
            at, [_mid(r) for r in items], [r["activate_at_ms"] for r in items]
        )
    if cls is ev.LeasesExtended:
        return ev.LeasesExtended(at, [_mid(r) for r in items], [r["deadline_ms"] for r in items])
    if cls is ev.DeadLettersRouted:
        return ev.DeadLettersRouted(at, [r["arrival"] for r in items])
    row = rows[0]
    if cls is ev.MessageUpdated:
        body = row["body"] if row.get("body_bytes") is not None else None
        return ev.MessageUpdated(at, _mid(row), body, row["activate_at_ms"])
    return _event_decoder.decode(row["detail"])


def events_from_rows(rows: Iterable[dict[str, Any]]) -> Iterator[tuple[str, int, ev.Event]]:
    """``(queue, seq, event)`` rebuilt from event rows (any order; segment rows ignored),
    in (queue, seq) order."""
    grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        if row["type"] != SEGMENT:
            grouped.setdefault((row["queue"], row["seq"]), []).append(row)
    for (queue, seq), group in sorted(grouped.items()):
        group.sort(key=lambda r: r["item"])
        yield queue, seq, _rebuild(group[0]["type"], group[0]["at_ms"], group)
