"""How a process uses Python's cyclic garbage collector: settled once a long-running service has
started, paused while a replay builds its objects.

The collector runs a young-generation pass every 700 container allocations by default, and now and
then a full pass over every tracked object, including the tens of thousands a service creates once
at startup (modules, classes, Faust's services) and keeps for its life. The joiner allocates a few
container objects per device sample, nearly all freed by reference counting, so the default passes
cost it about a tenth of its CPU for cycles that are rare. `settle` is called once startup is done.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

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
