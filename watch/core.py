"""One-shot watch bookkeeping: pure, no I/O, no asyncio.

A key has a version (grows on every change; a key never set is version 0) and a value. A
watcher is any hashable thing (a connection, a future): it *arms* a key with the version it
has seen; if the key is already past it, the answer is "fire now" and nothing is kept;
otherwise the arm is kept until the next change of the key, which fires every armed watcher
of that key exactly once and disarms them. Any number of changes between a watcher's arms
coalesce: it gets the newest state when it arms again.

Per (watcher, key) the table also remembers the last version delivered, so a watcher may arm
without naming a version ("since what you last sent me"). The cost of a change is the number
of watchers armed on that key — a key nobody watches costs nothing per watcher.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Generic, TypeVar

__all__ = ["KeyState", "WatchTable"]

W = TypeVar("W", bound=Hashable)


class KeyState:
    """A key's version and value (and a cache slot for its encodings)."""

    __slots__ = ("cache", "key", "value", "version")

    def __init__(self, key: str, version: int, value: Any) -> None:
        self.key = key
        self.version = version
        self.value = value
        self.cache: dict[str, bytes] = {}  # encodings of this state, made once per change

    def __repr__(self) -> str:
        return f"KeyState({self.key!r}, {self.version}, {self.value!r})"


class WatchTable(Generic[W]):
    """Keys, armed watchers and what each watcher was last given."""

    def __init__(self) -> None:
        self._keys: dict[str, KeyState] = {}
        self._armed: dict[str, dict[W, int]] = {}  # key -> {watcher: version it has}
        self._delivered: dict[W, dict[str, int]] = {}  # watcher -> {key: version delivered}

    # ------------------------------------------------------------------ keys

    def state(self, key: str) -> KeyState | None:
        """The known state of ``key`` (None if never learnt here)."""
        return self._keys.get(key)

    def version(self, key: str) -> int:
        state = self._keys.get(key)
        return state.version if state is not None else 0

    def publish(self, key: str, version: int, value: Any) -> tuple[KeyState, list[W]]:
        """Learn that ``key`` is at ``version`` with ``value``.

        Returns the key's state and the watchers to notify now (each disarmed, its delivered
        version recorded). A version not newer than the known one changes nothing.
        """
        state = self._keys.get(key)
        if state is not None and version <= state.version:
            return state, []
        state = KeyState(key, version, value)
        self._keys[key] = state
        armed = self._armed.pop(key, None)
        if not armed:
            return state, []
        fired = [w for w, seen in armed.items() if seen < version]
        for w, seen in armed.items():
            if seen >= version:  # a watcher that knows more than we do: keep it armed
                self._armed.setdefault(key, {})[w] = seen
        for w in fired:
            self._delivered.setdefault(w, {})[key] = version
        return state, fired

    def forget(self, key: str) -> None:
        """Drop the known state of a key nobody is armed on (e.g. a queue that went away)."""
        if key not in self._armed:
            self._keys.pop(key, None)

    def evict(self, key: str) -> list[W]:
        """Drop ``key`` altogether (it is answered elsewhere from now on): its state and its
        armed watchers, returned to be told so. What each was delivered stays (dropped with
        the watcher)."""
        self._keys.pop(key, None)
        return list(self._armed.pop(key, {}))

    # ------------------------------------------------------------------ watchers

    def arm(self, watcher: W, key: str, version: int | None = None) -> KeyState | None:
        """Arm ``key`` for ``watcher``, which has seen ``version`` (None: what it was last
        delivered here, or 0).

        Returns the state to deliver now when the key is already past that version (the
        watcher stays disarmed and the delivery is recorded); else None, and the watcher is
        armed (replacing an earlier arm of the same key).
        """
        if version is None:
            version = self._delivered.get(watcher, {}).get(key, 0)
        state = self._keys.get(key)
        if state is not None and state.version > version:
            self._disarm(watcher, key)
            self._delivered.setdefault(watcher, {})[key] = state.version
            return state
        self._armed.setdefault(key, {})[watcher] = version
        self._delivered.setdefault(watcher, {}).setdefault(key, version)
        return None

    def unwatch(self, watcher: W, key: str) -> bool:
        """Disarm ``key`` for ``watcher`` and forget what it was delivered. True if it was
        watching it."""
        known = self._delivered.get(watcher)
        was = known is not None and known.pop(key, None) is not None
        if known is not None and not known:
            del self._delivered[watcher]
        return self._disarm(watcher, key) or was

    def drop(self, watcher: W) -> int:
        """Forget ``watcher`` entirely (disconnect). Returns how many keys it watched."""
        known = self._delivered.pop(watcher, {})
        for key in known:
            self._disarm(watcher, key)
        return len(known)

    def _disarm(self, watcher: W, key: str) -> bool:
        armed = self._armed.get(key)
        if armed is None or watcher not in armed:
            return False
        del armed[watcher]
        if not armed:
            del self._armed[key]
        return True

    # ------------------------------------------------------------------ inspection

    def is_armed(self, watcher: W, key: str) -> bool:
        return watcher in self._armed.get(key, ())

    def armed_count(self, key: str) -> int:
        return len(self._armed.get(key, ()))

    def known_keys(self) -> list[str]:
        """Keys whose state is known here."""
        return list(self._keys)

    def armed_keys(self) -> list[str]:
        """Keys with at least one armed watcher."""
        return list(self._armed)

    def watched_keys(self, watcher: W) -> list[str]:
        """Keys ``watcher`` watches (armed or not)."""
        return list(self._delivered.get(watcher, ()))

    def count_keys(self, watcher: W) -> int:
        """How many keys ``watcher`` watches (armed or not)."""
        return len(self._delivered.get(watcher, ()))

    def delivered(self, watcher: W, key: str) -> int | None:
        return self._delivered.get(watcher, {}).get(key)

    def watchers(self) -> int:
        """How many watchers the table remembers anything about."""
        return len(self._delivered)

    def interested(self, key: str) -> bool:
        """Whether anyone is armed on ``key``."""
        return key in self._armed
