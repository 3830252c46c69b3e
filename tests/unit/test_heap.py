"""periscope.heap: what a service's process asks of the garbage collector once started, and the pause
a replay takes."""

from __future__ import annotations

import gc
import platform
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


def test_the_trimmer_trims_once_work_goes_quiet_and_now_and_then_while_it_goes_on() -> None:
    calls: list[float] = []
    now = 0.0

    def trim() -> bool:
        calls.append(now)
        return True

    t = heap.Trimmer(every_s=60.0, trim=trim)
    assert not t.tick(now, 0)  # nothing done yet
    for work in (5, 10, 15):  # a backlog: batches on every tick
        now += 1
        assert not t.tick(now, work)
    now += 1
    assert t.tick(now, 15)  # the first quiet tick after it
    now += 1
    assert not t.tick(now, 15)  # still quiet, nothing new since
    for _ in range(120):  # live load: a batch on every tick, never a quiet one
        now += 1
        t.tick(now, t._seen + 1)
    assert calls == [4.0, 64.0, 124.0]
    assert t.trims == 3


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_hands_back_what_was_freed() -> None:
    held = [bytes(1024) + bytes([i % 256]) for i in range(50_000)]  # C heap, below the mmap threshold
    del held
    assert heap.trim()
