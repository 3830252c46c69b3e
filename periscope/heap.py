"""How a process uses Python's cyclic garbage collector: settled once a long-running service has
started, paused while a replay builds its objects; and the free memory it gives back after a peak.

The collector runs a young-generation pass every 700 container allocations by default, and now and
then a full pass over every tracked object, including the tens of thousands a service creates once
at startup (modules, classes, Faust's services) and keeps for its life. The joiner allocates a few
container objects per device sample, nearly all freed by reference counting, so the default passes
cost it about a tenth of its CPU for cycles that are rare. `settle` is called once startup is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import cast

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


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to call
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return cast(Callable[[int], int], trim)


_TRIM = _malloc_trim()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """This process's resident set size (Linux), or None where /proc does not tell."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def give_back() -> bool:
    """Hand the C allocator's free pages back to the system (glibc's malloc_trim): what a peak freed
    inside its heaps, which free() keeps wherever a block still in use sits above it. A joiner that
    caught up on a backlog holds some 5 MB of such pages per 2,000 nodes (decoded batches, outputs
    waiting to be published) for good otherwise. False where the C library has no such call."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
