"""runs.Slots, the bitmap a run keeps its out-of-order slots in, against a plain set."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.core.runs import Slots

ops = st.lists(
    st.tuples(st.sampled_from(["add", "discard", "clear"]), st.integers(0, 2000)), max_size=200
)


@given(ops=ops, probes=st.lists(st.integers(0, 2100), max_size=30))
def test_slots_behave_as_a_set_of_slot_numbers(
    ops: list[tuple[str, int]], probes: list[int]
) -> None:
    slots, model = Slots(), set()
    for op, i in ops:
        if op == "add":
            slots.add(i)
            model.add(i)
        elif op == "discard":
            slots.discard(i)
            model.discard(i)
        else:
            slots.clear()
            model.clear()
        assert len(slots) == len(model)
        assert bool(slots) == bool(model)
    assert list(slots) == sorted(model)  # iterated in order
    assert [p in slots for p in probes] == [p in model for p in probes]
    assert slots == model
    assert Slots(sorted(model)) == slots


def test_a_bitmap_of_a_thousand_slots_half_out_is_small() -> None:
    slots = Slots(range(0, 1000, 2))
    assert len(slots) == 500
    assert slots.bits is not None
    assert len(slots.bits) <= 125
    assert Slots().bits is None  # nothing until the first add
