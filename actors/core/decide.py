"""decide(state, command) → events + reply. Reads the state, never changes it logically.

Everything nondeterministic a command needs (time, ids, leases) comes in as arguments and is
written into the events, so :meth:`QueueState.apply` replays them exactly. :func:`execute`
is the one-call form a shell uses: advance the clock, decide, apply.

Bad input raises a :class:`~actors.errors.QueueError` before any event exists, so a command
either happens whole or not at all. Per-item outcomes of batch commands (a stale lease in an
ack of 100) are statuses in the reply, not errors.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from actors.core import browse
from actors.core import commands as cmd
from actors.core import events as ev
from actors.core import replies as rp
from actors.core.fair import Fair, FairOrder
from actors.core.ids import IdSource
from actors.core.keys import validate_key
from actors.core.state import (
    ATTEMPT_WINDOW_MS,
    GONE,
    READY,
    RESERVED,
    STATE_NAMES,
    QueuedMessage,
    QueueState,
    allowance,
    rate_wait_ms,
)
from actors.errors import (
    BadRequest,
    Conflict,
    MessageNotFound,
    Moving,
    Overloaded,
    QueueExists,
    QueueNotFound,
    StaleLease,
    TaskNotFound,
    TooLarge,
)
from actors.settings import (
    MAX_BATCH,
    MAX_PUT_BYTES,
    MAX_VISIBILITY_TIMEOUT_MS,
    QueueSettings,
    validate_queue_name,
)

__all__ = ["Decision", "decide", "execute"]

Decision = tuple[list[ev.Event], Any]

_MAX_ID_LEN = 256
_MAX_ATTRIBUTES = 64
# A take hands out messages until their bodies would pass this (at least one message): its
# reply, and the frame and HTTP answer that carry it, stay bounded whatever ``max`` asks.
MAX_TAKE_BYTES = 64 * 1024 * 1024


def execute(state: QueueState, command: object, now_ms: int, ids: IdSource) -> Decision:
    """Advance ``state`` to ``now_ms``, decide ``command``, apply its events; return both.

    Raises:
        QueueError: the command is invalid for this state; nothing was applied.
    """
    now_ms = max(now_ms, state.clock_ms)
    state.advance(now_ms)
    if type(command) is cmd.Take and state.created and state.moving is None:
        # The taken messages' heap entries go stale the moment the event is applied below,
        # so there is no point in putting them back first.
        events, reply = _take(state, command, now_ms, ids, consume=True)
    else:
        events, reply = decide(state, command, now_ms, ids)
    for event in events:
        if event is events[0] and event.at_ms == now_ms:
            # Advanced to now_ms above, and deciding moved no time: apply's own advance
            # would find nothing due. Only for the first event: applying one may make a
            # transition due for the next.
            state.apply_advanced(event)
        else:
            state.apply(event)
    return events, reply


def decide(state: QueueState, command: object, now_ms: int, ids: IdSource) -> Decision:
    """The events ``command`` causes on ``state`` (advanced to ``now_ms``) and its reply.

    Raises:
        QueueError: the command is invalid for this state.
    """
    handler = _DECIDE.get(type(command))
    if handler is None:
        raise BadRequest(f"unknown command {type(command).__name__}")
    if not state.created and type(command) is not cmd.Create:
        raise QueueNotFound("no such queue", queue=state.name)
    if state.moving is not None and type(command) not in _WHILE_MOVING:
        _, to, generation = state.moving
        raise Moving(
            f"queue {state.name} is being handed to shard {to} (placement generation "
            f"{generation}); retry in a moment",
            queue=state.name,
            shard=to,
            generation=generation,
        )
    return handler(state, command, now_ms, ids)


# ------------------------------------------------------------------ queue-level


def _create(state: QueueState, c: cmd.Create, now: int, ids: IdSource) -> Decision:
    validate_queue_name(c.name, internal=True)
    c.settings.validate(c.name)
    if state.created:
        if state.settings != c.settings:
            raise QueueExists("the queue exists with other settings", queue=c.name)
        return [], False
    return [ev.QueueCreated(now, c.name, c.settings)], True


def _change_settings(state: QueueState, c: cmd.ChangeSettings, now: int, ids: IdSource) -> Decision:
    new = c.settings.validate(state.name)
    old = state.settings
    if (new.id_mode, new.fifo) != (old.id_mode, old.fifo):
        raise BadRequest("id_mode and fifo cannot change after creation")
    if new == old:
        return [], new
    return [ev.SettingsChanged(now, new)], new


def _patch_settings(state: QueueState, c: cmd.PatchSettings, now: int, ids: IdSource) -> Decision:
    fields = set(QueueSettings.__struct_fields__)
    unknown = sorted(set(c.changes) - fields)
    if unknown:
        raise BadRequest(f"unknown settings: {', '.join(unknown)}")
    merged = {**msgspec.structs.asdict(state.settings), **c.changes}
    try:  # settings are array-like: convert field values in order, with type checks
        new = msgspec.convert([merged[f] for f in QueueSettings.__struct_fields__], QueueSettings)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid settings: {exc}") from exc
    return _change_settings(state, cmd.ChangeSettings(new), now, ids)


def _describe(state: QueueState, c: cmd.Describe, now: int, ids: IdSource) -> Decision:
    _, stats = _stats(state, cmd.Stats(), now, ids)
    return [], rp.Description(state.name, state.settings, stats)


def _pause(state: QueueState, c: cmd.Pause, now: int, ids: IdSource) -> Decision:
    paused = c.paused
    if not isinstance(paused, bool):
        raise BadRequest("paused is true or false")
    return ([ev.QueuePaused(now, paused)] if paused != state.paused else []), paused


def _purge(state: QueueState, c: cmd.Purge, now: int, ids: IdSource) -> Decision:
    n = state.total
    return ([ev.QueuePurged(now)] if n else []), n


def _stats(state: QueueState, c: cmd.Stats, now: int, ids: IdSource) -> Decision:
    oldest = state.oldest_ready_ms()
    return [], rp.StatsView(
        ready=state.n_ready,
        delayed=state.n_delayed,
        reserved=state.n_reserved,
        total=state.total,
        oldest_ready_age_ms=None if oldest is None else now - oldest,
        dead_lettered=state.dead_lettered,
        dead_letter_pending=len(state.outbox),
        expired=state.expired_total,
        acked=state.acked_total,
        enqueued=state.enqueued_total,
        purged=state.purged_total,
        groups=len(state.groups),
        now_ms=now,
        paused=state.paused,
    )


def _confirm_dead_letters(
    state: QueueState, c: cmd.ConfirmDeadLetters, now: int, ids: IdSource
) -> Decision:
    routed = [seq for seq in dict.fromkeys(c.seqs) if seq in state.outbox]
    return ([ev.DeadLettersRouted(now, routed)] if routed else []), len(routed)


# ------------------------------------------------------------------ put


def _put(state: QueueState, c: cmd.Put, now: int, ids: IdSource) -> Decision:
    """A put. Server ids: one is drawn from the clock for the put's first new message
    (``max(candidate, last id + 1)``), the next ones follow it (+1 each), so a put's ids are
    consecutive and its run needs no list of them (runs.py)."""
    _check_batch(len(c.messages), "messages")
    s = state.settings
    if s.put_rate is not None and not c.redelivery:
        _check_put_rate(state, now, s.put_rate)
    if s.id_mode == "server" and not (c.redelivery or s.fifo or s.content_based_dedup):
        plain = _plain_put(state, c.messages, now, ids)
        if plain is not None:
            return plain
    return _any_put(state, c, now, ids)


def _any_put(state: QueueState, c: cmd.Put, now: int, ids: IdSource) -> Decision:
    """:func:`_put` of any messages into any queue."""
    s = state.settings
    server_ids = s.id_mode == "server"
    last_id = state.last_id
    drawn = False
    items: list[ev.PutItem] = []
    results: list[rp.PutResult] = []
    batch_ids: dict[ev.MessageId, bytes] = {}
    batch_keys: dict[str, ev.MessageId] = {}
    total = 0
    for m in c.messages:
        total += _checked_size(m.body, s)
        if total > MAX_PUT_BYTES:
            raise _put_too_large()
        activate = _activation(now, m.delay_ms, m.activate_at_ms, now + s.delay_ms, s)
        key = _dedup_key(m, s)
        known = _known_key(state, batch_keys, key)
        if known is not None:
            results.append(rp.PutResult(str(known), rp.DUPLICATE))
            continue
        group = _check_group(m, s)
        if m.attributes is not None:
            # a dead-letter copy carries four more: where and when it came from, and why
            # it failed
            _check_attributes(m.attributes, _MAX_ATTRIBUTES + (4 if c.redelivery else 0))
        if server_ids:
            if m.id is not None and not c.redelivery:
                raise BadRequest("this queue assigns ids (id_mode=server); omit 'id'")
            kept = _kept_id(state, batch_ids, m.id) if c.redelivery else None
            if kept is None:
                new_id = last_id + 1 if drawn else max(ids.next_id(now), last_id + 1)
                drawn = True
                last_id = new_id
                mid: ev.MessageId = new_id
            else:
                mid = kept
                last_id = max(last_id, kept)
            if c.redelivery:
                batch_ids[mid] = m.body
        else:
            mid = _client_id(m.id)
            if _client_duplicate(state, batch_ids, mid, m.body):
                results.append(rp.PutResult(mid, rp.DUPLICATE))
                continue
            batch_ids[mid] = m.body
        if key is not None:
            batch_keys[key] = mid
        items.append(ev.PutItem(mid, m.body, activate, key, group, m.attributes))
        results.append(rp.PutResult(str(mid), rp.CREATED))
    if items and not c.redelivery:
        _check_room(state, len(items))
    return ([ev.MessagesPut(now, items)] if items else []), results


def _plain_put(
    state: QueueState, messages: list[cmd.NewMessage], now: int, ids: IdSource
) -> Decision | None:
    """:func:`_put` of plain messages (a body and perhaps a delay or an activation time;
    no id, key, group or attributes) into a standard queue with server ids, the common
    case, in one loop with few per-message calls; None when a message is not plain (the
    general loop decides it all, with the same checks in the same order)."""
    s = state.settings
    most = s.max_message_bytes
    default = now + s.delay_ms
    retention = s.retention_ms
    total = 0
    ats: list[int] = []
    for m in messages:
        if (
            m.id is not None
            or m.idempotency_key is not None
            or m.group is not None
            or m.attributes is not None
        ):
            return None
        body = m.body
        if type(body) is not bytes or not body:
            _body_size(body)  # raises
        size = len(body)
        if size > most:
            _checked_size(body, s)  # raises
        total += size
        if total > MAX_PUT_BYTES:
            raise _put_too_large()
        delay, at = m.delay_ms, m.activate_at_ms
        if at is None:
            if delay is None:
                ats.append(default)
                continue
            if type(delay) is int and 0 <= delay < retention:
                ats.append(now + delay)
                continue
        ats.append(_activation(now, delay, at, default, s))  # the other cases, or raises
    n = len(messages)
    _check_room(state, n)
    first = max(ids.next_id(now), state.last_id + 1)
    item, result, created = ev.PutItem, rp.PutResult, rp.CREATED
    items = [item(first + i, m.body, ats[i]) for i, m in enumerate(messages)]
    results = [result(str(mid), created) for mid in range(first, first + n)]
    return [ev.MessagesPut(now, items)], results


def _put_too_large() -> TooLarge:
    return TooLarge(f"one put carries at most {MAX_PUT_BYTES} bytes of bodies")


def _check_put_rate(state: QueueState, now: int, rate: int) -> None:
    """Raises Overloaded while the queue's puts are past its put_rate (a put of several
    messages goes when one may: the next ones wait until the rate has caught up)."""
    if allowance(state.put_tat, now, rate) < 1:
        wait = rate_wait_ms(state.put_tat, now, rate)
        raise Overloaded(
            f"queue {state.name} takes {rate} puts a second (put_rate); retry in "
            f"{wait / 1000:.3f} s",
            queue=state.name,
            retry_after_ms=wait,
        )


def _check_room(state: QueueState, n: int) -> None:
    """Raises Overloaded when ``n`` more messages would pass the queue's max_messages."""
    limit = state.settings.max_messages
    if limit is not None and state.total + n > limit:
        raise Overloaded(
            f"queue {state.name} is full ({state.total} of max_messages {limit})",
            queue=state.name,
        )


def _kept_id(
    state: QueueState, batch_ids: dict[ev.MessageId, bytes], mid: str | None
) -> int | None:
    """The id a redelivered message keeps in a server-id queue: its own, when it is a
    server id (digits) that no message here or earlier in the batch has; else None (a new
    one is drawn: ids of different queues may collide)."""
    if mid is None or not mid.isascii() or not mid.isdigit() or len(mid) > 19:
        return None
    value = int(mid)
    if not 0 < value < 2**63 or state.holds(value) or value in batch_ids:
        return None
    return value


def _checked_size(body: object, s: QueueSettings) -> int:
    size = _body_size(body)
    if size > s.max_message_bytes:
        raise TooLarge(f"message body is {size} bytes; this queue takes {s.max_message_bytes}")
    return size


def _known_key(
    state: QueueState, batch_keys: dict[str, ev.MessageId], key: str | None
) -> ev.MessageId | None:
    """The id an idempotency key already stands for (in the window or earlier in the batch)."""
    if key is None:
        return None
    known = state.idem.get(key)
    return known[0] if known is not None else batch_keys.get(key)


def _client_duplicate(
    state: QueueState, batch_ids: dict[ev.MessageId, bytes], mid: str, body: bytes
) -> bool:
    """Whether client id ``mid`` is a retry of a message already there (same body).

    Raises:
        Conflict: the id exists with another body.
    """
    existing = state.messages.get(mid)
    if existing is None:
        existing = state.spilled_message(mid)  # held in a run (None at once when none is)
    earlier = existing.body if existing is not None else batch_ids.get(mid)
    if earlier is None:
        return False
    if earlier == body:
        return True
    raise Conflict(f"message {mid!r} exists with another body", id=mid)


def _body_size(body: object) -> int:
    if not isinstance(body, bytes):
        raise BadRequest("body must be bytes")
    if not body:
        raise BadRequest("body must not be empty")
    return len(body)


def _dedup_key(m: cmd.NewMessage, s: QueueSettings) -> str | None:
    key = m.idempotency_key
    if key is not None:
        if not isinstance(key, str) or not 0 < len(key) <= _MAX_ID_LEN:
            raise BadRequest(f"idempotency_key must be 1-{_MAX_ID_LEN} characters")
        return key
    if s.content_based_dedup:
        return "sha256:" + hashlib.sha256(m.body).hexdigest()
    return None


def _check_group(m: cmd.NewMessage, s: QueueSettings) -> str | None:
    group = m.group
    if group is None:
        if s.fifo:
            raise BadRequest("a FIFO queue needs a group on every message")
        return None
    if not isinstance(group, str) or not 0 < len(group) <= 128:
        raise BadRequest("group must be 1-128 characters")
    return group


def _check_attributes(attributes: object, limit: int = _MAX_ATTRIBUTES) -> None:
    if not isinstance(attributes, dict) or len(attributes) > limit:
        raise BadRequest(f"attributes must be a map of at most {_MAX_ATTRIBUTES} entries")
    for name in attributes:
        if not isinstance(name, str) or not 0 < len(name) <= 256:
            raise BadRequest("attribute names must be 1-256 characters")


def _client_id(mid: object) -> str:
    if mid is None:
        raise BadRequest("this queue takes ids from the client (id_mode=client); 'id' is missing")
    if not isinstance(mid, str) or not 0 < len(mid) <= _MAX_ID_LEN or not mid.isprintable():
        raise BadRequest(f"message ids are 1-{_MAX_ID_LEN} printable characters")
    return mid


def _activation(now: int, delay: int | None, at: int | None, default: int, s: QueueSettings) -> int:
    """The activation time a command asks for, checked against the queue's retention."""
    if delay is not None:
        if at is not None:
            raise BadRequest("give either a delay or an activation time, not both")
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise BadRequest("delay must be a non-negative number of seconds")
        at = now + delay
    elif at is None:
        return default
    elif isinstance(at, bool) or not isinstance(at, int):
        raise BadRequest("activate_at must be a time")
    if at - now >= s.retention_ms:
        raise BadRequest("activation time is beyond the queue's retention: it would never run")
    return at


def _check_batch(n: int, what: str) -> None:
    if not 1 <= n <= MAX_BATCH:
        raise BadRequest(f"{what} must hold 1-{MAX_BATCH} items, not {n}")


# ------------------------------------------------------------------ take


def _take(
    state: QueueState, c: cmd.Take, now: int, ids: IdSource, consume: bool = False
) -> Decision:
    limit = c.max
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BATCH:
        raise BadRequest(f"max must be 1-{MAX_BATCH}")
    attempt = c.attempt
    if attempt is not None:
        _check_attempt(attempt)
        again = _taken_again(state, attempt, now)
        if again is not None:
            return [], again
    if not c.mover:  # a move task's takes are an operator's: no pause, no limit holds them
        if state.paused:  # a retry above still gets what its first try took
            return [], []
        s = state.settings
        if s.max_in_flight is not None or s.take_rate is not None:
            limit = min(limit, state.take_room(now))
            if limit <= 0:
                return [], []
    deadline = now + _visibility(c.visibility_timeout_ms, state.settings)
    picked = _peek_ready(state, limit, consume)
    if not picked:
        return [], []
    leases = [ids.next_lease() for _ in picked]
    deliveries = [
        _delivery(m, m.receive_count + 1, lease, deadline, m.first_taken_ms or now)
        for m, lease in zip(picked, leases, strict=True)
    ]
    event = ev.MessagesTaken(now, [m.id for m in picked], leases, deadline, attempt)
    return [event], deliveries


def _delivery(
    m: QueuedMessage, receive_count: int, lease: int, deadline: int, first_taken_ms: int
) -> rp.Delivery:
    return rp.Delivery(
        str(m.id),
        m.body,
        m.activate_at_ms,
        m.enqueued_at_ms,
        receive_count,
        str(lease),
        deadline,
        m.attributes,
        m.group,
        first_taken_ms,
    )


MAX_ATTEMPT_LEN = 128
_ATTEMPT_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
)


def _check_attempt(attempt: object) -> None:
    """An attempt id is 1-128 of SQS's characters (letters, digits and punctuation)."""
    if (
        not isinstance(attempt, str)
        or not 0 < len(attempt) <= MAX_ATTEMPT_LEN
        or not set(attempt) <= _ATTEMPT_CHARS
    ):
        raise BadRequest(
            f"an attempt id is 1-{MAX_ATTEMPT_LEN} letters, digits or punctuation characters"
        )


def _taken_again(state: QueueState, attempt: str, now: int) -> list[rp.Delivery] | None:
    """The deliveries of the take that ``attempt`` names, again, when it is recent and each
    of its messages is still reserved under the lease and deadline it gave (None: take anew)."""
    found = state.attempts.get(attempt)
    if found is None:
        return None
    at, taken_ids, leases, deadline = found
    if now - at >= ATTEMPT_WINDOW_MS or deadline <= now:
        return None
    again = []
    for mid, lease in zip(taken_ids, leases, strict=True):
        m = state.messages.get(mid)
        if m is None or m.state != RESERVED or m.lease != lease or m.deadline_ms != deadline:
            return None  # acked, released, touched or expired since: not the same take
        again.append(_delivery(m, m.receive_count, lease, deadline, m.first_taken_ms or at))
    return again


def _peek_ready(state: QueueState, limit: int, consume: bool = False) -> list[QueuedMessage]:
    """The next ``limit`` messages ``take`` would hand out, in order: fewer when their bodies
    would pass :data:`MAX_TAKE_BYTES` (always at least one).

    The heap is left as it was, unless ``consume``: then the caller promises to reserve the
    messages at once, and their entries are not put back."""
    if state.fair is not None:
        return _peek_fair(state, state.fair, limit, consume)
    popped: list[tuple[int, int, QueuedMessage]] = []
    picked: list[QueuedMessage] = []
    seen: set[int] = set()
    fifo = state.settings.fifo
    size = 0
    for entry, m in _in_take_order(state):
        if m.seq not in seen:
            size += len(m.body)
            if size > MAX_TAKE_BYTES and picked:
                if entry is not None:
                    heapq.heappush(state.ready, entry)  # for the next take: a reply stays bounded
                break
            seen.add(m.seq)
            picked.append(m)
            if fifo:  # a run stopped at a message that would not fit ends the take
                size = _run_of_group(state, m, limit, picked, seen, size)
        if entry is not None:
            popped.append(entry)
        if len(picked) >= limit or size > MAX_TAKE_BYTES:
            break
    if not consume:
        for entry in popped:
            heapq.heappush(state.ready, entry)
    return picked


def _peek_fair(
    state: QueueState, fair: Fair[QueuedMessage], limit: int, consume: bool
) -> list[QueuedMessage]:
    """:func:`_peek_ready` for a fair queue (fair.py): its groups' heaps and the ready heap
    (messages without a group) walked in turn order; each entry goes back where it came from."""
    Heap = list[tuple[int, int, QueuedMessage]]
    popped: list[tuple[Heap, tuple[int, int, QueuedMessage]]] = []
    picked: list[QueuedMessage] = []
    seen: set[int] = set()
    size = 0
    walk = FairOrder(fair, _in_take_order(state), state.ready)
    refused = None
    for heap, entry, m in walk:
        if m.seq not in seen:
            size += len(m.body)
            if size > MAX_TAKE_BYTES and picked:
                refused = m
                if heap is not None and entry is not None:  # for the next take
                    heapq.heappush(heap, entry)
                break
            seen.add(m.seq)
            picked.append(m)
        if heap is not None and entry is not None:
            popped.append((heap, entry))
        if len(picked) >= limit:
            break
    walk.finish(consume, refused)
    if not consume:
        for heap, entry in popped:
            heapq.heappush(heap, entry)
    return picked


def _in_take_order(
    state: QueueState,
) -> Iterator[tuple[tuple[int, int, QueuedMessage] | None, QueuedMessage]]:
    """The ready messages in take order, each with its heap entry, popped (None: a spilled
    message, runs.py, merged in by its key; the take's event materializes it). Stale heap
    entries are dropped on the way: that changes nothing."""
    heap = state.ready
    pop = heapq.heappop
    spilled = state.spilled_after(None) if state.spilled else iter(())
    run_m = next(spilled, None)
    fifo = state.settings.fifo
    while True:
        while heap and not (_valid_ready(heap[0]) and (not fifo or _free_head(state, heap[0][2]))):
            pop(heap)
        if run_m is not None and (not heap or (run_m.activate_at_ms, run_m.seq) < heap[0][:2]):
            yield None, run_m
            run_m = next(spilled, None)
        elif heap:
            entry = pop(heap)
            yield entry, entry[2]
        else:
            return


def _free_head(state: QueueState, m: QueuedMessage) -> bool:
    """Whether FIFO message ``m`` is its group's head, with none of the group in flight (an
    entry for it may outlive that: a state rebuilt from the log keeps the entry a take
    consumed live)."""
    group = state.groups.get(m.group)
    if group is None or group.busy:
        return False
    for first in group.msgs:
        if first.state < GONE:
            return first is m
    return False


def _valid_ready(entry: tuple[int, int, QueuedMessage]) -> bool:
    m = entry[2]
    return m.state == READY and m.activate_at_ms == entry[0]


def _run_of_group(
    state: QueueState,
    head: QueuedMessage,
    limit: int,
    picked: list[QueuedMessage],
    seen: set[int],
    size: int,
) -> int:
    """After a FIFO group's ``head``, the ready messages that follow it in the group, in
    order, up to ``limit`` in all (as SQS hands out several messages of one group in a
    receive). The run ends at the first message that is not ready (a delayed one holds back
    those behind it), or whose body would pass :data:`MAX_TAKE_BYTES`: then the size
    returned is past it, and the take ends too. Returns the bodies' size."""
    for m in state.group_after(head):
        if len(picked) >= limit:
            return size
        if m.state >= GONE:
            continue  # left the group; dropped from its front later
        if m.state != READY:
            return size
        if size + len(m.body) > MAX_TAKE_BYTES:
            return MAX_TAKE_BYTES + 1
        seen.add(m.seq)
        picked.append(m)
        size += len(m.body)
    return size


def _visibility(vt: int | None, s: QueueSettings) -> int:
    if vt is None:
        return s.visibility_timeout_ms
    if isinstance(vt, bool) or not isinstance(vt, int) or not 0 <= vt <= MAX_VISIBILITY_TIMEOUT_MS:
        raise BadRequest(f"visibility_timeout must be 0-{MAX_VISIBILITY_TIMEOUT_MS // 1000} s")
    return vt


def _peek_ready_cmd(state: QueueState, c: cmd.PeekReady, now: int, ids: IdSource) -> Decision:
    if isinstance(c.max, bool) or not isinstance(c.max, int) or not 1 <= c.max <= MAX_BATCH:
        raise BadRequest(f"max must be 1-{MAX_BATCH}")
    return [], [_view(m) for m in _peek_ready(state, c.max)]


# ------------------------------------------------------------------ leases


def _lookup(state: QueueState, mid: object) -> QueuedMessage | None:
    """The live message with API id ``mid`` (a string), or None."""
    if type(mid) is not str:
        return None
    if state.settings.id_mode == "server":
        if len(mid) > 20 or not mid.isdigit() or not mid.isascii():
            return None
        key = int(mid)
        m = state.messages.get(key)
        return m if m is not None else state.spilled_message(key)  # None when no run holds it
    m = state.messages.get(mid)
    return m if m is not None else state.spilled_message(mid)


def _lease_status(
    state: QueueState, m: QueuedMessage | None, lease: object, lenient: bool, mid: object
) -> str:
    if m is None:
        return rp.STALE_LEASE if state.forced and _forced_out(state, mid) else rp.NOT_FOUND
    if m.state != RESERVED:
        return rp.STALE_LEASE
    if not lenient and (not isinstance(lease, str) or lease != str(m.lease)):
        return rp.STALE_LEASE
    return rp.OK


def _ack(state: QueueState, c: cmd.Ack, now: int, ids: IdSource) -> Decision:
    _check_batch(len(c.items), "items")
    if c.lenient:
        return _ack_lenient(state, c, now)
    acked: list[ev.MessageId] = []
    done: set[ev.MessageId] = set()
    results = []
    lookup = _lookup
    for item in c.items:  # the hottest loop after take: keep it flat
        m = lookup(state, item.id)
        if m is None:
            forced = state.forced and _forced_out(state, item.id)
            status = rp.STALE_LEASE if forced else rp.NOT_FOUND
        elif m.id in done:
            status = rp.NOT_FOUND
        elif m.state != RESERVED or item.lease != str(m.lease):
            status = rp.STALE_LEASE
        else:
            status = rp.OK
            acked.append(m.id)
            done.add(m.id)
        results.append(rp.ItemResult(item.id, status))
    return ([ev.MessagesAcked(now, acked)] if acked else []), results


def _ack_lenient(state: QueueState, c: cmd.Ack, now: int) -> Decision:
    """An ack whose leases may be old: a message held under the lease is acked, any other
    one that is still here is deleted (ready, delayed, or reserved by a later take)."""
    acked: list[ev.MessageId] = []
    deleted: list[ev.MessageId] = []
    done: set[ev.MessageId] = set()
    results = []
    for item in c.items:
        m = _lookup(state, item.id)
        if m is None or m.id in done:
            forced = m is None and state.forced and _forced_out(state, item.id)
            results.append(rp.ItemResult(item.id, rp.STALE_LEASE if forced else rp.NOT_FOUND))
            continue
        done.add(m.id)
        current = m.state == RESERVED and item.lease == str(m.lease)
        (acked if current else deleted).append(m.id)
        results.append(rp.ItemResult(item.id, rp.OK))
    events: list[ev.Event] = []
    if acked:
        events.append(ev.MessagesAcked(now, acked))
    if deleted:
        events.append(ev.MessagesDeleted(now, deleted))
    return events, results


def _release(state: QueueState, c: cmd.Release, now: int, ids: IdSource) -> Decision:
    _check_batch(len(c.items), "items")
    released: list[ev.MessageId] = []
    done: set[ev.MessageId] = set()
    times: list[int] = []
    reasons: list[str | None] = []
    results = []
    for item in c.items:
        when = _activation(now, item.delay_ms, item.activate_at_ms, now, state.settings)
        _check_reason(item.reason)
        m = _lookup(state, item.id)
        if m is not None and m.id in done:
            # Released by an earlier item: its lease has ended, or it went to the DLQ.
            limit = state.settings.max_receives
            gone = limit is not None and m.receive_count >= limit
            status = rp.NOT_FOUND if gone else rp.STALE_LEASE
        else:
            status = _lease_status(state, m, item.lease, c.lenient, item.id)
        if status == rp.OK and m is not None:  # OK implies m is not None
            released.append(m.id)
            done.add(m.id)
            times.append(when)
            reasons.append(item.reason)
        results.append(rp.ItemResult(item.id, status))
    if not released:
        return [], results
    said = reasons if any(r is not None for r in reasons) else None
    return [ev.MessagesReleased(now, released, times, said)], results


def _check_reason(reason: object) -> None:
    if reason is None:
        return
    if not isinstance(reason, str) or len(reason.encode()) > ev.MAX_REASON_BYTES:
        raise BadRequest(f"a release's reason is text of at most {ev.MAX_REASON_BYTES} bytes")


def _touch(state: QueueState, c: cmd.Touch, now: int, ids: IdSource) -> Decision:
    _check_batch(len(c.items), "items")
    touched: list[ev.MessageId] = []
    deadlines: list[int] = []
    results = []
    for item in c.items:
        deadline = now + _visibility(item.visibility_timeout_ms, state.settings)
        m = _lookup(state, item.id)
        status = _lease_status(state, m, item.lease, c.lenient, item.id)
        if status == rp.OK and m is not None:  # OK implies m is not None
            touched.append(m.id)
            deadlines.append(deadline)
            results.append(rp.ItemResult(item.id, status, deadline))
        else:
            results.append(rp.ItemResult(item.id, status))
    return ([ev.LeasesExtended(now, touched, deadlines)] if touched else []), results


# ------------------------------------------------------------------ single messages


def _require(state: QueueState, mid: str, lease: str | None) -> QueuedMessage:
    """The message ``mid``, checking the lease if it is reserved.

    Raises:
        MessageNotFound, Conflict (reserved, no lease), StaleLease (not its lease).
    """
    m = _lookup(state, mid)
    if m is None:
        raise MessageNotFound("no such message", id=str(mid))
    if m.state == RESERVED:
        if lease is None:
            raise Conflict("the message is reserved; its lease is required", id=mid)
        if lease != str(m.lease):
            raise StaleLease("the lease is not the message's current lease", id=mid)
    elif lease is not None:
        raise StaleLease("the message is not reserved; the lease has expired", id=mid)
    return m


def _update(state: QueueState, c: cmd.Update | cmd.Reschedule, now: int, ids: IdSource) -> Decision:
    body = getattr(c, "body", None)
    if body is None and c.delay_ms is None and c.activate_at_ms is None:
        raise BadRequest("nothing to change: give a body, a delay or an activation time")
    if body is not None:
        _checked_size(body, state.settings)
    when = None
    if c.delay_ms is not None or c.activate_at_ms is not None:
        when = _activation(now, c.delay_ms, c.activate_at_ms, now, state.settings)
    m = _require(state, c.id, c.lease)
    event = ev.MessageUpdated(now, m.id, body, when)
    return [event], _predict_view(m, event, now)


def _predict_view(m: QueuedMessage, e: ev.MessageUpdated, now: int) -> rp.MessageView:
    """The view of ``m`` once ``e`` is applied."""
    if e.activate_at_ms is None:
        view = _view(m)
        return view if e.body is None else _replace_body(view, e.body)
    state = "ready" if e.activate_at_ms <= now else "delayed"
    rc = 0 if m.state == RESERVED else m.receive_count
    return rp.MessageView(
        str(m.id),
        state,
        m.body if e.body is None else e.body,
        e.activate_at_ms,
        m.enqueued_at_ms,
        rc,
        None,
        m.attributes,
        m.group,
    )


def _replace_body(view: rp.MessageView, body: bytes) -> rp.MessageView:
    return rp.MessageView(
        view.id,
        view.state,
        body,
        view.activate_at_ms,
        view.enqueued_at_ms,
        view.receive_count,
        view.lease_expires_at_ms,
        view.attributes,
        view.group,
    )


def _view(m: QueuedMessage) -> rp.MessageView:
    return rp.MessageView(
        str(m.id),
        STATE_NAMES[m.state].value,
        m.body,
        m.activate_at_ms,
        m.enqueued_at_ms,
        m.receive_count,
        m.deadline_ms if m.state == RESERVED else None,
        m.attributes,
        m.group,
    )


def _peek(state: QueueState, c: cmd.Peek, now: int, ids: IdSource) -> Decision:
    m = _lookup(state, c.id)
    if m is None:
        raise MessageNotFound("no such message", id=str(c.id))
    return [], _view(m)


def _browse(state: QueueState, c: cmd.Browse, now: int, ids: IdSource) -> Decision:
    found, after = browse.page(state, c.state, c.limit, c.after)
    return [], rp.BrowsePage([_view(m) for m in found], after)


def _delete(state: QueueState, c: cmd.Delete, now: int, ids: IdSource) -> Decision:
    if c.force is not True:
        return [ev.MessagesDeleted(now, [_require(state, c.id, c.lease).id])], None
    m = _lookup(state, c.id)
    if m is None:
        raise MessageNotFound("no such message", id=str(c.id))
    return [ev.MessagesDeleted(now, [m.id], m.state == RESERVED)], None


def _forced_out(state: QueueState, mid: object) -> bool:
    """Whether ``mid`` is a reserved message an admin deleted, within its lease's time."""
    deadline = state.forced.get(mid) if type(mid) is str else None
    return deadline is not None and deadline > state.clock_ms


# ------------------------------------------------------------------ watch keys


def _checkpoint(state: QueueState, c: cmd.Checkpoint, now: int, ids: IdSource) -> Decision:
    return [ev.Checkpoint(now)], None


def _move_bodies(state: QueueState, c: cmd.MoveBodies, now: int, ids: IdSource) -> Decision:
    moved: list[int] = []
    named: set[int] = set()  # a run named twice is moved once
    firsts: list[int] = []
    bodies: list[list[bytes]] = []
    attrs: list[list[dict[str, Any] | None] | None] = []
    for first_id in c.ids:
        run = state.run_at(first_id)
        if run is None or run.place is None or run.seq in named:
            continue  # gone, or its bodies are not in the log yet, or named twice
        named.add(run.seq)
        first = run.needed_from()  # return runs read from it too
        moved.append(run.ref)
        firsts.append(first)
        contents = state.contents_of(run)
        bodies.append(contents.bodies[first:])
        attrs.append(None if contents.attrs is None else contents.attrs[first:])
    if not moved:
        return [], 0
    with_attrs = attrs if any(a is not None for a in attrs) else None
    event = ev.BodiesMoved(now, moved, firsts, bodies, with_attrs)
    return [event], sum(len(b) for b in bodies)


def _drop(state: QueueState, c: cmd.Drop, now: int, ids: IdSource) -> Decision:
    return [ev.QueueDeleted(now)], None


def _hand_over(state: QueueState, c: cmd.HandOver, now: int, ids: IdSource) -> Decision:
    if c.to < 0 or c.source < 0 or c.to == c.source or c.generation < 1:
        raise BadRequest(f"a handover from shard {c.source} to {c.to} at {c.generation}")
    return [ev.QueueHandedOver(now, c.source, c.to, c.generation)], None


def _take_over(state: QueueState, c: cmd.TakeOver, now: int, ids: IdSource) -> Decision:
    if state.moving is None:
        return [], None  # served already (a second call)
    return [ev.QueueTakenOver(now, c.source, c.generation)], None


# What a state being handed over still decides: taking it over (or back), and reading it.
_WHILE_MOVING = {cmd.TakeOver, cmd.Stats, cmd.Describe}


def _set_key(state: QueueState, c: cmd.SetKey, now: int, ids: IdSource) -> Decision:
    validate_key(c.key)
    version = state.keys.get(c.key, (0, None))[0] + 1
    return [ev.KeySet(now, c.key, version, c.value)], rp.KeyView(c.key, version, c.value)


def _get_key(state: QueueState, c: cmd.GetKey, now: int, ids: IdSource) -> Decision:
    validate_key(c.key)
    version, value = state.keys.get(c.key, (0, None))
    return [], rp.KeyView(c.key, version, value)


# ------------------------------------------------------------------ move tasks

MAX_MOVE_RATE = 500  # messages per second (SQS's limit for MaxNumberOfMessagesPerSecond)
_MAX_TASK_ID = 128


def _start_move(state: QueueState, c: cmd.StartMove, now: int, ids: IdSource) -> Decision:
    if not isinstance(c.task, str) or not 0 < len(c.task) <= _MAX_TASK_ID:
        raise BadRequest(f"a move task id is 1-{_MAX_TASK_ID} characters")
    rate = c.rate
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int) or not 1 <= rate <= MAX_MOVE_RATE
    ):
        raise BadRequest(f"the rate of a move task is 1-{MAX_MOVE_RATE} messages per second")
    if c.destination is not None:
        validate_queue_name(c.destination)
        if c.destination == state.name:
            raise BadRequest("a move task cannot move a queue's messages to itself")
    if state.active_move is not None:
        raise Conflict("a move task is running on this queue: one runs at a time", queue=state.name)
    if any(t.task == c.task for t in state.move_tasks):
        raise Conflict(f"move task {c.task!r} exists", queue=state.name)
    event = ev.MoveTaskStarted(now, c.task, c.destination, rate, state.n_ready)
    task = rp.MoveTask(c.task, c.destination, rate, state.n_ready, 0, rp.RUNNING, now)
    return [event], task


def _cancel_move(state: QueueState, c: cmd.CancelMove, now: int, ids: IdSource) -> Decision:
    active = state.active_move
    if active is None or active.task != c.task:
        if any(t.task == c.task for t in state.move_tasks):
            raise Conflict(f"move task {c.task!r} is not running", queue=state.name)
        raise TaskNotFound(f"no move task {c.task!r} on this queue", queue=state.name)
    if active.status == rp.CANCELLING:
        return [], active.moved
    return [ev.MoveTaskCancelling(now, c.task)], active.moved


def _list_moves(state: QueueState, c: cmd.ListMoves, now: int, ids: IdSource) -> Decision:
    return [], state.move_tasks[::-1]


def _move_progress(state: QueueState, c: cmd.MoveProgress, now: int, ids: IdSource) -> Decision:
    active = state.active_move
    if active is None or active.task != c.task or active.moved == c.moved:
        return [], None
    return [ev.MoveTaskProgressed(now, c.task, c.moved)], None


def _end_move(state: QueueState, c: cmd.EndMove, now: int, ids: IdSource) -> Decision:
    if c.status not in (rp.COMPLETED, rp.CANCELLED, rp.FAILED):
        raise BadRequest(f"a move task ends COMPLETED, CANCELLED or FAILED, not {c.status!r}")
    active = state.active_move
    if active is None or active.task != c.task:
        return [], None
    return [ev.MoveTaskEnded(now, c.task, c.status, c.reason)], None


_DECIDE: dict[type, Callable[[QueueState, Any, int, IdSource], Decision]] = {
    cmd.Create: _create,
    cmd.ChangeSettings: _change_settings,
    cmd.PatchSettings: _patch_settings,
    cmd.Describe: _describe,
    cmd.Put: _put,
    cmd.Take: _take,
    cmd.Ack: _ack,
    cmd.Release: _release,
    cmd.Touch: _touch,
    cmd.Update: _update,
    cmd.Reschedule: _update,
    cmd.Peek: _peek,
    cmd.PeekReady: _peek_ready_cmd,
    cmd.Browse: _browse,
    cmd.Delete: _delete,
    cmd.Purge: _purge,
    cmd.Pause: _pause,
    cmd.Stats: _stats,
    cmd.ConfirmDeadLetters: _confirm_dead_letters,
    cmd.SetKey: _set_key,
    cmd.GetKey: _get_key,
    cmd.Checkpoint: _checkpoint,
    cmd.MoveBodies: _move_bodies,
    cmd.Drop: _drop,
    cmd.HandOver: _hand_over,
    cmd.TakeOver: _take_over,
    cmd.StartMove: _start_move,
    cmd.CancelMove: _cancel_move,
    cmd.ListMoves: _list_moves,
    cmd.MoveProgress: _move_progress,
    cmd.EndMove: _end_move,
}
