"""Packed allocation repeats behave as the sorted list of keys they replace."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from periscope.core.repeats import Repeats

KEYS = st.tuples(st.integers(0, 2**45), st.integers(0, 2**45), st.integers(0, 2**40))


@settings(max_examples=100, deadline=None)
@given(st.lists(KEYS, max_size=40), KEYS)
def test_repeats_are_a_sorted_set_whatever_the_insertion_order(keys: list[tuple[int, int, int]],
                                                                probe: tuple[int, int, int]) -> None:
    r = Repeats()
    for k in dict.fromkeys(keys):
        r.add(k)
    want = sorted(set(keys))
    assert list(r) == want and len(r) == len(want)
    assert all(k in r for k in want) and (probe in r) == (probe in want)
    assert Repeats.from_text(r.to_text()) == r and list(Repeats.from_text(r.to_text())) == want
    after = r.split_after(probe)
    assert list(r) == [k for k in want if k <= probe] and after == [k for k in want if k > probe]


def test_in_order_repeats_take_a_few_bytes_each() -> None:
    r = Repeats((1_790_000_000_000 + 5000 * i, 1_789_999_000_000, 7 * i) for i in range(720))
    assert len(r.to_text()) < 720 * 6
    assert (1_790_000_000_000 + 5000 * 719, 1_789_999_000_000, 7 * 719) in r


def test_a_truncated_packed_form_is_refused() -> None:
    text = Repeats([(5, 1, 1), (10, 1, 2)]).to_text()
    with pytest.raises(ValueError):
        Repeats.from_text(Repeats([(5, 1, 1)]).to_text()[:-4] + "AA==")
    assert list(Repeats.from_text(text)) == [(5, 1, 1), (10, 1, 2)]
