"""periscope.heap.settle: what a service's process asks of the garbage collector once started."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from periscope import heap


@pytest.fixture
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_settle_keeps_what_exists_out_of_later_passes_and_spaces_young_ones(collector: None) -> None:
    kept = [[] for _ in range(1000)]  # containers alive when the service has started
    middle, old = gc.get_threshold()[1:]
    heap.settle()
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, middle, old)


def test_settle_collects_startup_garbage_before_freezing(collector: None) -> None:
    class Cycle:
        pass

    a = Cycle()
    a.me = a  # type: ignore[attr-defined]
    ref = weakref.ref(a)
    del a  # garbage that only the collector frees; frozen, it would live on
    heap.settle()
    assert ref() is None
