"""``wal/LAYOUT``: the shard count the shard logs of a store were written with.

A queue's records go to the log of the shard its name hashes to among ``count`` shards
(:func:`actors.log.shard_recovery.placement`), so a log read with another count would give
its queues to the wrong shards. The first server to open a store writes the count it runs
with; every later start either runs with that count (the default) or is refused, and
:func:`actors.reshard.reshard` is the one way to change it: it snapshots every queue, which
makes the shard logs unnecessary, removes them and writes the new count.

The layout also keeps the highest epoch written to the logs it replaced: a shard log started
afresh claims epochs above it, so a late write of an incarnation from before the change is
still recognised as fenced (FORMAT.md, "Fencing").
"""

from __future__ import annotations

import msgspec

from actors.errors import DataError
from actors.log import keys
from actors.log.store import KeyNotFound, ObjectStore

__all__ = [
    "Layout",
    "LayoutMismatch",
    "check_layout",
    "claim_layout",
    "read_layout",
    "settle_layout",
    "settled_count",
    "write_layout",
]

LAYOUT_FORMAT = 2


class Layout(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What ``wal/LAYOUT`` holds (JSON)."""

    format: int = LAYOUT_FORMAT
    shards: int
    epoch_floor: int = 0  # new shard logs claim epochs above this
    # Set while a change of the shard count is under way: the logs are being removed (every
    # queue has a snapshot of all its records), then ``shards`` becomes this.
    resharding_to: int | None = None


class LayoutMismatch(DataError):
    """The store's shard logs were written with another shard count."""

    code = "LayoutMismatch"


_decoder = msgspec.json.Decoder(Layout)


async def read_layout(store: ObjectStore) -> Layout | None:
    """The store's layout (None: none was written yet).

    Raises:
        DataError: ``wal/LAYOUT`` does not decode, or is of an unknown format.
        StoreError: the store failed.
    """
    try:
        data = await store.get(keys.LAYOUT)
    except KeyNotFound:
        return None
    try:
        layout = _decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{keys.LAYOUT} does not decode: {exc}") from exc
    if layout.format != LAYOUT_FORMAT:
        raise DataError(f"{keys.LAYOUT}: format {layout.format} is not readable by this version")
    if layout.shards < 1 or (layout.resharding_to is not None and layout.resharding_to < 1):
        raise DataError(f"{keys.LAYOUT}: a shard count below 1")
    return layout


async def write_layout(store: ObjectStore, layout: Layout) -> None:
    """Write (replace) the store's layout."""
    await store.put(keys.LAYOUT, msgspec.json.encode(layout) + b"\n")


async def settled_count(store: ObjectStore, count: int) -> int:
    """The shard count to open the store's logs with: the placement map's once a live
    resize (``evq shards resize``) wrote one, else ``count`` (a shard's spawn-time count is
    older than a resize that ran since). The layout follows the map: a resize that stopped
    between writing the map and the layout left it behind.

    Raises:
        DataError: the layout or the map does not decode.
        StoreError: the store failed.
    """
    from actors.log.placement import read_placement  # the map's module reads the layout's keys

    layout = await read_layout(store)
    if layout is None or layout.resharding_to is not None:
        return count
    placed = await read_placement(store, layout.shards)
    if placed.generation == 0:
        return count
    if placed.count != layout.shards:
        await write_layout(store, msgspec.structs.replace(layout, shards=placed.count))
    return placed.count


async def claim_layout(store: ObjectStore, count: int) -> int:
    """Make sure the store's layout is ``count`` shards (writing it if there is none yet,
    before any shard log): return the epoch floor. Every shard runs this before it opens its
    log, so no shard log exists without a layout.

    Raises:
        LayoutMismatch: the logs were written with another count.
        DataError: the layout does not decode.
        StoreError: the store failed.
    """
    layout = await read_layout(store)
    if layout is None:
        fresh = Layout(shards=count)
        if await store.put_if_absent(keys.LAYOUT, msgspec.json.encode(fresh) + b"\n"):
            return 0
        layout = await read_layout(store)  # another process wrote it first
    return check_layout(layout, count)


def check_layout(layout: Layout | None, count: int) -> int:
    """The epoch floor for shard logs opened with ``count`` shards under ``layout``.

    Raises:
        LayoutMismatch: the logs were written with another count, or a change of the count
            was interrupted.
    """
    if layout is None:
        return 0
    if layout.resharding_to is not None:
        raise LayoutMismatch(
            f"a change of the shard count from {layout.shards} to {layout.resharding_to} was "
            f"interrupted; run `evq reshard --shards {layout.resharding_to}` to finish it",
            shards=layout.shards,
        )
    if layout.shards != count:
        raise LayoutMismatch(
            f"the shard logs were written with {layout.shards} shard(s), not {count}: start with "
            f"--shards {layout.shards} (the default), or change the count with "
            f"`evq reshard --shards {count}` while the server is stopped",
            shards=layout.shards,
        )
    return layout.epoch_floor


async def settle_layout(store: ObjectStore, asked: int | None, default: int) -> int:
    """The shard count to serve ``store`` with: ``asked`` if given, else the stored count,
    else ``default``; a store without a layout gets one.

    Raises:
        LayoutMismatch: ``asked`` is not the stored count (or a change was interrupted).
        DataError: shard logs exist without a layout.
    """
    layout = await read_layout(store)
    if layout is None and await store.list(keys.WAL_ROOT):
        # A gateway starting beside this one may have claimed the layout and started its
        # shards since the read above: the layout is written before any shard log, so a
        # second read after the listing sees it if the logs are theirs.
        layout = await read_layout(store)
        if layout is None:
            raise DataError(
                f"shard logs under {keys.WAL_ROOT} but no {keys.LAYOUT}: the shard count they "
                f"were written with is unknown"
            )
    if layout is None:
        count = asked or default
        await claim_layout(store, count)
        return count
    stored = await settled_count(store, layout.shards)
    if stored != layout.shards:
        layout = msgspec.structs.replace(layout, shards=stored)
    count = stored if asked is None else asked
    check_layout(layout, count)
    return count
