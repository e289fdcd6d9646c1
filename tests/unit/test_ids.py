"""The production id source: time-ordered message ids that two queues rarely share."""

from __future__ import annotations

import random

from actors.ids import RandomIds


def test_ids_sort_by_their_millisecond() -> None:
    ids = RandomIds(random.Random(1))
    earlier = [ids.next_id(1_700_000_000_000) for _ in range(100)]
    later = [ids.next_id(1_700_000_000_001) for _ in range(100)]
    assert max(earlier) < min(later)
    assert all(i >> 20 == 1_700_000_000_000 for i in earlier)


def test_two_sources_of_the_same_millisecond_rarely_collide() -> None:
    a, b = RandomIds(random.Random(1)), RandomIds(random.Random(2))
    now = 1_700_000_000_000
    pairs = [(a.next_id(now), b.next_id(now)) for _ in range(1000)]
    assert sum(x == y for x, y in pairs) <= 1
    assert len({x for x, _ in pairs}) > 990  # spread over 2**19 values


def test_leases_are_positive_63_bit_tokens() -> None:
    ids = RandomIds(random.Random(3))
    leases = [ids.next_lease() for _ in range(1000)]
    assert all(0 < x < 2**63 for x in leases)
    assert len(set(leases)) == 1000
