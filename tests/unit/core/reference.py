"""A deliberately naive reference model of one queue, for the model tests.

No heaps, no indexes, no laziness: every question is answered by scanning every message,
and time is advanced by repeatedly finding the earliest due transition among all messages.
It shares nothing with the engine but the settings struct and the id/lease sources, so a
bug in the engine's indexes cannot hide in here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from actors.settings import QueueSettings


@dataclass
class RMsg:
    id: int | str
    body: bytes
    seq: int
    enqueued_at: int
    activate_at: int
    state: str  # delayed | ready | reserved
    group: str | None
    receive_count: int = 0
    lease: str | None = None
    deadline: int = 0
    attributes: dict[str, object] | None = None


@dataclass
class Reference:
    settings: QueueSettings
    clock: int = 0
    msgs: list[RMsg] = field(default_factory=list)  # live messages, arrival order
    outbox: list[RMsg] = field(default_factory=list)
    idem: dict[str, tuple[int | str, int]] = field(default_factory=dict)
    next_seq: int = 1
    last_id: int = 0
    dead_lettered: int = 0
    expired: int = 0
    acked: int = 0
    take_bytes: int = 64 * 1024 * 1024  # a take stops before the body that would pass it
    paused: bool = False  # takes get nothing
    # a fair queue: the turn each group was last served at (none: not since it was last
    # without a ready message), and the turns taken
    fair_last: dict[str, int] = field(default_factory=dict)
    fair_turn: int = 0

    # ------------------------------------------------------------- time

    def advance(self, now: int) -> None:
        now = max(now, self.clock)  # a deadline at ``now`` has passed
        while True:
            due = []
            for m in self.msgs:
                due.append((m.enqueued_at + self.settings.retention_ms, 0, m.seq, m))
                if m.state == "reserved":
                    due.append((m.deadline, 1, m.seq, m))
                elif m.state == "delayed":
                    due.append((m.activate_at, 2, m.seq, m))
            if not due:
                break
            t, kind, _, m = min(due, key=lambda d: d[:3])
            if t > now:
                break
            if kind == 0:
                self.msgs.remove(m)
                self.expired += 1
            elif kind == 1:
                self._back(m, m.deadline, m.deadline)
            else:
                self._ready(m)
        window = self.settings.idempotency_window_ms
        self.idem = {k: v for k, v in self.idem.items() if v[1] + window > now}
        self.clock = now

    def _back(self, m: RMsg, activate_at: int, now: int) -> None:
        """End the lease of ``m``; dead-letter it if it had its last receive."""
        m.lease, m.deadline = None, 0
        limit = self.settings.max_receives
        if limit is not None and m.receive_count >= limit:
            self.msgs.remove(m)
            self.outbox.append(m)
            self.dead_lettered += 1
            return
        m.activate_at = activate_at
        if activate_at <= now:
            self._ready(m)
        else:
            m.state = "delayed"

    def _ready(self, m: RMsg) -> None:
        """``m`` becomes ready; in a fair queue, a group with no other ready message forgets
        its turn."""
        group = m.group
        if self.settings.fair and group is not None:
            others = [x for x in self.msgs if x is not m and x.group == group]
            if not any(x.state == "ready" for x in others):
                self.fair_last.pop(group, None)
        m.state = "ready"

    # ------------------------------------------------------------- queries

    def find(self, mid: str) -> RMsg | None:
        for m in self.msgs:
            if str(m.id) == mid:
                return m
        return None

    def takeable(self) -> list[RMsg]:
        ready = [m for m in self.msgs if m.state == "ready"]
        if self.settings.fifo:
            heads = []
            for group in {m.group for m in self.msgs}:
                members = [m for m in self.msgs if m.group == group]
                if members[0].state == "ready" and all(x.state != "reserved" for x in members):
                    heads.append(members[0])
            ready = heads
        return sorted(ready, key=lambda m: (m.activate_at, m.seq))

    @staticmethod
    def key(m: RMsg) -> tuple[int, int]:
        """Where a message stands in the listing of its state (browse)."""
        return (m.deadline if m.state == "reserved" else m.activate_at, m.seq)

    def browse(
        self, state: str, limit: int, after: tuple[int, int] | None
    ) -> tuple[list[RMsg], tuple[int, int] | None]:
        """The messages in ``state`` past ``after`` in key order, up to ``limit``; and the
        key to continue after (None: nothing follows)."""
        found = sorted(
            (m for m in self.msgs if m.state == state and (after is None or self.key(m) > after)),
            key=self.key,
        )
        more = len(found) > limit
        return found[:limit], self.key(found[limit - 1]) if more else None

    def stats(self) -> dict[str, int | None]:
        takeable = self.takeable()
        return {
            "ready": sum(m.state == "ready" for m in self.msgs),
            "delayed": sum(m.state == "delayed" for m in self.msgs),
            "reserved": sum(m.state == "reserved" for m in self.msgs),
            "total": len(self.msgs),
            "oldest_ready_age_ms": self.clock - takeable[0].activate_at if takeable else None,
            "dead_lettered": self.dead_lettered,
            "dead_letter_pending": len(self.outbox),
            "expired": self.expired,
            "acked": self.acked,
        }

    # ------------------------------------------------------------- commands

    def put(
        self, now: int, messages: list[dict[str, object]], new_id: object
    ) -> list[tuple[str, str]] | str:
        """Results, or the name of the error the whole command fails with."""
        results: list[tuple[str, str]] = []
        staged: list[RMsg] = []
        keys = dict(self.idem)
        drawn = False
        for spec in messages:
            body = spec["body"]
            assert isinstance(body, bytes)
            key = spec.get("key")
            if key is None and self.settings.content_based_dedup:
                key = "sha256:" + hashlib.sha256(body).hexdigest()
            if key is not None and key in keys:
                results.append((str(keys[key][0]), "duplicate"))
                continue
            if self.settings.id_mode == "server":
                # one id drawn per put, for its first new message; the others follow it
                mid: int | str = self.last_id + 1 if drawn else max(new_id(), self.last_id + 1)  # type: ignore[operator]
                drawn = True
                self.last_id = mid  # type: ignore[assignment]
            else:
                mid = str(spec["id"])
                same = [m for m in self.msgs + staged if m.id == mid]
                if same:
                    if same[0].body != body:
                        return "Conflict"
                    results.append((mid, "duplicate"))
                    continue
            delay = spec.get("delay", 0)
            activate = spec.get("activate_at", now + delay)  # type: ignore[operator]
            m = RMsg(mid, body, 0, now, activate, "delayed", spec.get("group"))  # type: ignore[arg-type]
            m.attributes = spec.get("attributes")  # type: ignore[assignment]
            staged.append(m)
            if key is not None:
                keys[key] = (mid, now)  # type: ignore[assignment]
            results.append((str(mid), "created"))
        for m in staged:
            m.seq = self.next_seq
            self.next_seq += 1
            m.state = "delayed"
            self.msgs.append(m)
            if m.activate_at <= now:
                self._ready(m)
        self.idem = keys
        return results

    def runs(self) -> list[RMsg]:
        """What take hands out, in order: in a FIFO queue, each takeable group head followed
        by the ready messages right behind it in its group."""
        heads = self.takeable()
        if self.settings.fair:
            return self.fair_order(len(heads))[0]
        if not self.settings.fifo:
            return heads
        out: list[RMsg] = []
        for head in heads:
            members = [m for m in self.msgs if m.group == head.group]
            for m in members:
                if m.state != "ready":
                    break
                out.append(m)
        return out

    def fair_order(self, n: int) -> tuple[list[RMsg], list[str | None]]:
        """A fair queue's first ``n`` ready messages in take order, and whose turn each is:
        each time, the first ready message (by activation, then arrival) of whoever has the
        smallest (turn last served, its first message's activation, arrival), where a message
        without a group is a tenant of its own that was never served."""
        last = dict(self.fair_last)
        turn = self.fair_turn
        ready = [m for m in self.msgs if m.state == "ready"]
        out: list[RMsg] = []
        while ready and len(out) < n:
            firsts: dict[object, RMsg] = {}
            for m in sorted(ready, key=lambda m: (m.activate_at, m.seq)):
                firsts.setdefault(m.seq if m.group is None else m.group, m)
            m = min(
                firsts.values(),
                key=lambda m: (
                    0 if m.group is None else last.get(m.group, 0),
                    m.activate_at,
                    m.seq,
                ),
            )
            out.append(m)
            ready.remove(m)
            if m.group is not None:
                turn += 1
                last[m.group] = turn
        return out, [m.group for m in out]

    def take(self, now: int, limit: int, vt: int | None) -> list[RMsg]:
        if self.paused:
            return []
        picked: list[RMsg] = []
        size = 0
        for m in self.runs()[:limit]:
            if picked and size + len(m.body) > self.take_bytes:
                break
            picked.append(m)
            size += len(m.body)
        if self.settings.fair:
            for m in picked:
                if m.group is not None:
                    self.fair_turn += 1
                    self.fair_last[m.group] = self.fair_turn
        deadline = now + (self.settings.visibility_timeout_ms if vt is None else vt)
        for m in picked:
            m.state = "reserved"
            m.receive_count += 1
            m.deadline = deadline
        return picked

    def lease_status(self, mid: str, lease: str, lenient: bool = False) -> tuple[str, RMsg | None]:
        """Whether ``lease`` holds ``mid``; ``lenient``: any lease holds a reserved message."""
        m = self.find(mid)
        if m is None:
            return "not_found", None
        if m.state != "reserved" or (m.lease != lease and not lenient):
            return "stale_lease", None
        return "ok", m

    def ack(self, items: list[tuple[str, str]], lenient: bool = False) -> list[str]:
        """``lenient``: a message still here is deleted whatever its state and lease."""
        out = []
        for mid, lease in items:
            status, m = self.lease_status(mid, lease)
            if m is not None:
                self.msgs.remove(m)
                self.acked += 1
            elif lenient and self.find(mid) is not None:
                self.msgs.remove(self.find(mid))  # type: ignore[arg-type]
                status = "ok"
            out.append(status)
        return out

    def release(
        self, now: int, items: list[tuple[str, str, int]], lenient: bool = False
    ) -> list[str]:
        out = []
        for mid, lease, delay in items:
            status, m = self.lease_status(mid, lease, lenient)
            if m is not None:
                self._back(m, now + delay, now)
            out.append(status)
        return out

    def touch(
        self, now: int, items: list[tuple[str, str, int]], lenient: bool = False
    ) -> list[tuple[str, int | None]]:
        out: list[tuple[str, int | None]] = []
        for mid, lease, vt in items:
            status, m = self.lease_status(mid, lease, lenient)
            if m is not None:
                m.deadline = now + vt
                out.append((status, m.deadline))
            else:
                out.append((status, None))
        return out

    def require(self, mid: str, lease: str | None) -> RMsg | str:
        m = self.find(mid)
        if m is None:
            return "MessageNotFound"
        if m.state == "reserved":
            if lease is None:
                return "Conflict"
            if lease != m.lease:
                return "StaleLease"
        elif lease is not None:
            return "StaleLease"
        return m

    def update(
        self, now: int, mid: str, lease: str | None, body: bytes | None, delay: int | None
    ) -> RMsg | str:
        m = self.require(mid, lease)
        if isinstance(m, str):
            return m
        if body is not None:
            m.body = body
        if delay is not None:
            if m.state == "reserved":
                m.lease, m.deadline, m.receive_count = None, 0, 0
            m.activate_at = now + delay
            if m.activate_at <= now:
                self._ready(m)
            else:
                m.state = "delayed"
        return m

    def delete(self, mid: str, lease: str | None) -> str | None:
        m = self.require(mid, lease)
        if isinstance(m, str):
            return m
        self.msgs.remove(m)
        return None

    def pause(self, paused: bool) -> bool:
        self.paused = paused
        return paused

    def purge(self) -> int:
        n = len(self.msgs)
        self.msgs = []
        return n

    def confirm_dead_letters(self) -> int:
        n = len(self.outbox)
        self.outbox = []
        return n
