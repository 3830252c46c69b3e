"""periscope.heap: what a service's process asks of the garbage collector once started, and the pause
a replay takes."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

from periscope import heap
from periscope.heap import paused_gc


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


def test_paused_gc_nests_across_threads_and_restores_the_collector() -> None:
    assert gc.isenabled()
    inner = threading.Event()
    release = threading.Event()

    def other() -> None:
        with paused_gc():
            inner.set()
            release.wait(5)

    with paused_gc():
        assert not gc.isenabled()
        t = threading.Thread(target=other)
        t.start()
        inner.wait(5)
    assert not gc.isenabled()  # the other thread's replay is still running
    release.set()
    t.join()
    assert gc.isenabled()


@pytest.mark.skipif(not heap.give_back(), reason="the C library has no malloc_trim (not glibc)")
def test_give_back_returns_the_pages_a_peak_freed_below_blocks_still_in_use() -> None:
    # Blocks above pymalloc's size go to the C allocator; keeping every 64th alive leaves the rest of
    # the heap free but not at its top, where free() alone would give it back.
    blocks = [bytes(2048) + i.to_bytes(4, "little") for i in range(20_000)]
    kept = blocks[::64]
    del blocks
    before = heap.resident_bytes()
    assert before is not None
    assert heap.give_back()
    after = heap.resident_bytes()
    assert after is not None
    assert before - after > 20 * 2**20  # of about 40 MiB freed
    assert all(len(b) == 2052 for b in kept)  # what is in use stays
