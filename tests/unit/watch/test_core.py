"""The pure watch bookkeeping: table tests and a stateful model check (hypothesis)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from watch.core import WatchTable


def test_arming_behind_fires_now_and_keeps_nothing() -> None:
    t: WatchTable[str] = WatchTable()
    t.publish("k", 3, "three")
    state = t.arm("a", "k", 1)
    assert state is not None
    assert (state.version, state.value) == (3, "three")
    assert not t.is_armed("a", "k")
    assert t.delivered("a", "k") == 3


def test_one_notification_per_arm_and_coalescing() -> None:
    t: WatchTable[str] = WatchTable()
    t.publish("k", 1, "v1")
    assert t.arm("a", "k", 1) is None
    _, fired = t.publish("k", 2, "v2")
    assert fired == ["a"]
    _, fired = t.publish("k", 3, "v3")
    assert fired == []  # disarmed until it asks again
    t.publish("k", 4, "v4")
    state = t.arm("a", "k")  # "since what you last sent me" = 2 → newest at once
    assert state is not None
    assert (state.version, state.value) == (4, "v4")


def test_a_key_never_set_is_version_zero_and_waits() -> None:
    t: WatchTable[str] = WatchTable()
    assert t.version("nothing") == 0
    assert t.arm("a", "nothing") is None
    assert t.is_armed("a", "nothing")
    _, fired = t.publish("nothing", 1, {"x": 1})
    assert fired == ["a"]


def test_old_or_equal_versions_change_nothing() -> None:
    t: WatchTable[str] = WatchTable()
    t.publish("k", 5, "five")
    t.arm("a", "k")
    t.arm("b", "k", 5)
    assert t.publish("k", 5, "other")[1] == []
    assert t.publish("k", 4, "older")[1] == []
    assert t.state("k").value == "five"  # type: ignore[union-attr]
    assert t.is_armed("b", "k")


def test_a_watcher_ahead_of_the_table_stays_armed() -> None:
    t: WatchTable[str] = WatchTable()
    assert t.arm("a", "k", 9) is None  # knows version 9 from elsewhere; we know nothing yet
    _, fired = t.publish("k", 9, "nine")
    assert fired == []
    assert t.is_armed("a", "k")
    _, fired = t.publish("k", 10, "ten")
    assert fired == ["a"]


def test_unwatch_and_drop_forget_everything() -> None:
    t: WatchTable[str] = WatchTable()
    for key in ("k1", "k2", "k3"):
        assert t.arm("a", key) is None
    t.arm("b", "k1")
    assert sorted(t.watched_keys("a")) == ["k1", "k2", "k3"]
    assert t.unwatch("a", "k2")
    assert not t.unwatch("a", "k2")
    assert t.publish("k2", 1, "x")[1] == []
    assert t.drop("a") == 2
    assert t.watchers() == 1
    assert t.publish("k1", 1, "x")[1] == ["b"]
    assert t.armed_keys() == []


def test_an_evicted_key_hands_back_its_armed_watchers_and_forgets_its_state() -> None:
    t: WatchTable[str] = WatchTable()
    t.publish("moved", 5, "five")
    t.publish("kept", 1, "one")
    assert t.arm("a", "moved", 5) is None
    assert t.arm("b", "moved", 5) is None
    assert t.arm("b", "kept", 1) is None
    assert sorted(t.evict("moved")) == ["a", "b"]
    assert (t.state("moved"), t.interested("moved")) == (None, False)
    assert sorted(t.known_keys()) == ["kept"]
    assert t.is_armed("b", "kept")
    assert t.evict("moved") == []  # nothing left to hand back
    # learnt again from its new home: a lower version is news here now
    assert t.publish("moved", 3, "three")[0].version == 3


def test_many_connect_disconnect_cycles_leave_nothing_behind() -> None:
    t: WatchTable[int] = WatchTable()
    for i in range(10_000):
        t.arm(i, "hot")
        t.arm(i, f"k{i % 7}")
        t.drop(i)
    assert t.watchers() == 0
    assert t.armed_keys() == []


class WatchModel(RuleBasedStateMachine):
    """The table against a plain model: what each watcher has, and every delivery."""

    KEYS = ("a", "b", "c")
    WATCHERS = (1, 2, 3, 4)

    def __init__(self) -> None:
        super().__init__()
        self.table: WatchTable[int] = WatchTable()
        self.versions = dict.fromkeys(self.KEYS, 0)
        self.values: dict[str, object] = {}
        self.armed: dict[tuple[int, str], int] = {}  # (w, key) -> version it has
        self.has: dict[tuple[int, str], int] = {}  # last version delivered / known
        self.deliveries: list[tuple[int, str, int]] = []

    def _deliver(self, w: int, key: str, seen: int, version: int, value: object) -> None:
        assert version == self.versions[key], "only the newest state is ever delivered"
        assert value == self.values[key]
        assert version > seen, "never a state the watcher already has"
        self.deliveries.append((w, key, version))
        self.has[(w, key)] = version

    @rule(key=st.sampled_from(KEYS), step=st.integers(-1, 3), value=st.integers())
    def publish(self, key: str, step: int, value: int) -> None:
        version = self.versions[key] + step
        state, fired = self.table.publish(key, version, value)
        if step <= 0:
            assert fired == []
            return
        self.versions[key] = version
        self.values[key] = value
        expect = sorted(w for (w, k), seen in self.armed.items() if k == key and seen < version)
        assert sorted(fired) == expect, "every armed watcher fires once, nobody else"
        for w in fired:
            seen = self.armed.pop((w, key))
            self._deliver(w, key, seen, state.version, state.value)

    @rule(
        w=st.sampled_from(WATCHERS),
        key=st.sampled_from(KEYS),
        version=st.none() | st.integers(0, 8),
    )
    def arm(self, w: int, key: str, version: int | None) -> None:
        seen = self.has.get((w, key), 0) if version is None else version
        state = self.table.arm(w, key, version)
        known = self.versions[key] if key in self.values else 0
        if known > seen:
            assert state is not None, "a watcher behind is answered at once"
            self.armed.pop((w, key), None)
            self._deliver(w, key, seen, state.version, state.value)
        else:
            assert state is None
            self.armed[(w, key)] = seen
            self.has.setdefault((w, key), seen)

    @rule(w=st.sampled_from(WATCHERS), key=st.sampled_from(KEYS))
    def unwatch(self, w: int, key: str) -> None:
        self.table.unwatch(w, key)
        self.armed.pop((w, key), None)
        self.has.pop((w, key), None)

    @precondition(lambda self: self.has)
    @rule(w=st.sampled_from(WATCHERS))
    def drop(self, w: int) -> None:
        self.table.drop(w)
        for pair in [p for p in self.has if p[0] == w]:
            del self.has[pair]
        for pair in [p for p in self.armed if p[0] == w]:
            del self.armed[pair]

    @invariant()
    def armed_sets_agree(self) -> None:
        for key in self.KEYS:
            expect = {w for (w, k) in self.armed if k == key}
            assert {w for w in self.WATCHERS if self.table.is_armed(w, key)} == expect
            assert self.table.armed_count(key) == len(expect)

    @invariant()
    def nobody_armed_is_behind(self) -> None:
        for (_, key), seen in self.armed.items():
            if key in self.values:
                assert seen >= self.versions[key]


WatchModel.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_watch_model = WatchModel.TestCase
