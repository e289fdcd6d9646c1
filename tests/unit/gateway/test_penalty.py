"""gateway/penalty.py, pure: offences per address, the bans they earn, and the bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.penalty import Penalties

PEERS = ["10.0.0.1", "10.0.0.2", "192.168.1.9", "::1", "not an address"]


def test_the_limit_within_the_window_refuses_the_address_for_the_ban() -> None:
    p = Penalties(limit=3, window_s=10, ban_s=5)
    assert p.offend("10.0.0.1", "malformed", 0.0) is None
    assert p.offend("10.0.0.1", "too_slow", 1.0) is None
    assert p.refused("10.0.0.1", 1.0) == 0
    assert p.offend("10.0.0.1", "malformed", 2.0) == 5  # the third within 10 s
    assert p.refused("10.0.0.1", 3.0) == 2.0 + 5 - 3.0
    assert p.refused("10.0.0.2", 3.0) == 0  # only that address
    assert p.refused("10.0.0.1", 7.0) == 0  # the ban is over
    assert p.offences == {"malformed": 2, "too_slow": 1}
    assert (p.bans, p.refusals) == (1, 1)


def test_offences_spread_wider_than_the_window_never_refuse() -> None:
    p = Penalties(limit=3, window_s=10, ban_s=5)
    for i in range(50):
        assert p.offend("10.0.0.1", "malformed", i * 6.0) is None
    assert p.bans == 0


def test_bans_that_follow_each_other_double_up_to_the_longest_then_start_again() -> None:
    p = Penalties(limit=1, window_s=10, ban_s=10, max_ban_s=60)
    now, bans = 0.0, []
    for _ in range(5):
        ban = p.offend("10.0.0.1", "malformed", now)
        assert ban is not None
        bans.append(ban)
        now += ban + 1  # offends again just after each ban
    assert bans == [10, 20, 40, 60, 60]
    assert p.offend("10.0.0.1", "malformed", now + 61 + 60) == 10  # quiet for max_ban_s


def test_offences_during_a_ban_do_not_lengthen_it() -> None:
    p = Penalties(limit=2, window_s=10, ban_s=5)
    p.offend("10.0.0.1", "malformed", 0.0)
    assert p.offend("10.0.0.1", "malformed", 0.5) == 5
    for t in (1.0, 1.1, 1.2, 1.3):  # e.g. requests already on connections taken before
        assert p.offend("10.0.0.1", "malformed", t) is None
    assert p.refused("10.0.0.1", 5.6) == 0


def test_trusted_proxies_and_a_limit_of_zero_are_never_refused() -> None:
    p = Penalties.of(1, 10, exempt=["10.0.0.0/8", "::1"])
    assert p.offend("10.1.2.3", "malformed", 0) is None
    assert p.offend("::1", "malformed", 0) is None
    assert p.offend("192.168.1.9", "malformed", 0) == 10
    never = Penalties.of(0, 10)
    assert all(never.offend("10.0.0.1", "malformed", i) is None for i in range(100))
    assert never.offences == {"malformed": 100}  # still counted (the metrics)


def test_an_unknown_peer_is_counted_never_refused() -> None:
    p = Penalties(limit=1)
    assert p.offend(None, "malformed", 0) is None
    assert p.offences == {"malformed": 1}
    assert not p.peers


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.sampled_from(PEERS), st.floats(0, 30), st.booleans()), max_size=200
    ),
    limit=st.integers(1, 6),
    window=st.floats(0.5, 20),
    ban=st.floats(0.5, 20),
    max_peers=st.integers(1, 4),
)
def test_any_sequence_keeps_the_bounds(
    events: list[tuple[str, float, bool]],
    limit: int,
    window: float,
    ban: float,
    max_peers: int,
) -> None:
    """Bans last from ban_s to max_ban_s; only an address with ``limit`` offences within a
    window (of at most window_s) gets one; at most max_peers addresses are remembered."""
    p = Penalties(limit=limit, window_s=window, ban_s=ban, max_ban_s=4 * ban, max_peers=max_peers)
    now = 0.0
    seen: dict[str, list[float]] = {}
    for peer, step, offends in events:
        now += step
        if not offends:
            assert p.refused(peer, now) >= 0
            continue
        earned = p.offend(peer, "malformed", now)
        times = seen.setdefault(peer, [])
        times.append(now)
        if earned is not None:
            assert ban <= earned <= 4 * ban
            assert p.refused(peer, now) == pytest.approx(earned)
            recent = [t for t in times if now - t < window]
            assert len(recent) >= limit
            times.clear()  # a new window starts at a ban
        assert len(p.peers) <= max_peers
    assert p.offences.get("malformed", 0) == sum(1 for _, _, o in events if o)


def test_an_address_that_goes_on_connecting_while_refused_is_silenced_for_its_ban() -> None:
    p = Penalties(limit=1, ban_s=10, silence_after=3, max_silenced=1)
    assert p.offend("10.0.0.1", "malformed", 0) == 10
    assert p.offend("10.0.0.2", "malformed", 0) == 10
    for t in (1, 2):
        p.refused("10.0.0.1", t)
    assert p.silenced(2) == {}
    p.refused("10.0.0.1", 3)
    assert p.silenced(4) == {"10.0.0.1": 6}
    for t in (1, 2, 3):  # as many from another address: past max_silenced, 429s only
        p.refused("10.0.0.2", t)
    assert p.silenced(4) == {"10.0.0.1": 6}
    assert p.silenced(10) == {}  # the ban is over
    assert p.offend("10.0.0.1", "malformed", 11) == 20  # a new ban: refusals count afresh
    p.refused("10.0.0.1", 12)
    assert p.silenced(12) == {}
