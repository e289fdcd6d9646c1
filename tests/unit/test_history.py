"""actors/history.py: a queue's samples a minute, the last hour of them, against a model
(a dict of minute → its last note) under any sequence of notes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.history import KEEP, MINUTE_MS, History, Sample

T0 = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE_MS  # a minute's start


def counts(n: int) -> tuple[int, int, int, int, int]:
    return (n, 2 * n, 3 * n, 4 * n, 5 * n)


def test_a_note_per_minute_and_the_counts_now_last() -> None:
    h = History()
    h.note(T0 + 5_000, *counts(1))
    h.note(T0 + 65_000, *counts(2))
    h.note(T0 + 66_000, *counts(3))  # the same minute: replaces its sample
    now = Sample(T0 + 130_000, *counts(9))
    assert h.view(now) == [
        Sample(T0 + 5_000, *counts(1)),
        Sample(T0 + 66_000, *counts(3)),
        now,
    ]


def test_only_the_last_hour_is_kept_and_shown() -> None:
    h = History()
    for m in range(KEEP + 30):
        h.note(T0 + m * MINUTE_MS, *counts(m))
    now = Sample(T0 + (KEEP + 30) * MINUTE_MS, *counts(0))
    shown = h.view(now)
    # the ring holds KEEP minutes; of them, those within the hour before now
    assert [s.ready for s in shown[:-1]] == list(range(31, KEEP + 30))
    assert shown[-1] == now
    later = Sample(now.at_ms + 2 * KEEP * MINUTE_MS, *counts(7))
    assert h.view(later) == [later]  # an hour with no commit: nothing but now


def test_a_view_before_any_note_is_now_alone() -> None:
    now = Sample(T0, *counts(4))
    assert History().view(now) == [now]


notes = st.lists(
    st.tuples(st.integers(0, 3 * KEEP * MINUTE_MS), st.integers(0, 10**12)), max_size=300
)


@given(notes, st.integers(0, 4 * KEEP * MINUTE_MS))
def test_the_view_is_the_model_s(steps: list[tuple[int, int]], later: int) -> None:
    h = History()
    model: dict[int, Sample] = {}  # minute -> its sample
    for offset, n in sorted(steps):  # a clock that does not go back
        at = T0 + offset
        h.note(at, *counts(n))
        model[at // MINUTE_MS] = Sample(at, *counts(n))
    kept = sorted(model)[-KEEP:]  # the ring's
    now = Sample(T0 + max([o for o, _ in steps], default=0) + later, *counts(1))
    floor = now.at_ms // MINUTE_MS - KEEP
    expected = [model[m] for m in kept if m > floor]
    assert h.view(now) == [*expected, now]
