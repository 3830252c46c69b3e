"""How a process uses its memory: Python's cyclic garbage collector settled once a long-running service
has started and paused while a replay builds its objects; the C heap's free pages handed back once a
burst of work is over.

The collector runs a young-generation pass every 700 container allocations by default, and now and
then a full pass over every tracked object, including the tens of thousands a service creates once
at startup (modules, classes, Faust's services) and keeps for its life. The joiner allocates a few
container objects per device sample, nearly all freed by reference counting, so the default passes
cost it about a tenth of its CPU for cycles that are rare. `settle` is called once startup is done.

Fetched records, their decompressed batches and encoded outputs are C allocations (bytes over 512
bytes), freed at once but kept by the C allocator for reuse: a worker that caught up on a backlog
would hold its peak of them for its life, and its RSS would say more about the backlog it once read
than about the state it holds. `Trimmer` hands them back (glibc's malloc_trim) when a burst of work
ends, and at most once a minute while work goes on.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

YOUNG_THRESHOLD = 10_000  # container allocations between young-generation passes (default 700)


def settle() -> None:
    """Collect what startup left, keep the survivors out of later passes, and run young passes less
    often (the older generations' thresholds stay, counted in young passes as before)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


_paused_lock = threading.Lock()
_paused_depth = 0
_was_enabled = False


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector (nests, and is thread-safe). A replay builds millions of
    long-lived, acyclic objects, and each full collection walks all of them: a third of a replay's
    time, for nothing to collect. Reference counting still frees everything as usual."""
    global _paused_depth, _was_enabled
    with _paused_lock:
        if _paused_depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused_depth += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused_depth -= 1
            if _paused_depth == 0 and _was_enabled:
                gc.enable()


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        fn: Callable[[int], int] = ctypes.CDLL(name).malloc_trim  # glibc only (musl has none)
    except (OSError, AttributeError, TypeError):
        return None
    return fn


def trim() -> bool:
    """Hand the C heap's free pages back to the operating system; False where the C library cannot."""
    fn = _malloc_trim()
    return fn is not None and bool(fn(0))


TRIM_EVERY_S = 60.0  # while work goes on without a quiet tick


class Trimmer:
    """When to `trim`, told on each tick how much work the process has done so far: on the first
    quiet tick after work (a backlog read, a burst), else at most every `every_s` while work goes on;
    never when nothing was done since the last time."""

    def __init__(self, every_s: float = TRIM_EVERY_S, trim: Callable[[], bool] = trim) -> None:
        self.every_s = every_s
        self._trim = trim
        self._seen = 0  # work done as of the previous tick
        self._trimmed = 0  # work done as of the last trim
        self._at: float | None = None  # when the last trim (or the first tick) was
        self.trims = 0

    def tick(self, now: float, work: int) -> bool:
        if self._at is None:
            self._at = now
        quiet = work == self._seen
        self._seen = work
        if work == self._trimmed or not (quiet or now - self._at >= self.every_s):
            return False
        self._trimmed, self._at = work, now
        self.trims += 1
        return self._trim()
