"""How a long-running service's process uses Python's cyclic garbage collector.

The collector runs a young-generation pass every 700 container allocations by default, and now and
then a full pass over every tracked object, including the tens of thousands a service creates once
at startup (modules, classes, Faust's services) and keeps for its life. The joiner allocates a few
container objects per device sample, nearly all freed by reference counting, so the default passes
cost it about a tenth of its CPU for cycles that are rare. `settle` is called once startup is done.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000  # container allocations between young-generation passes (default 700)


def settle() -> None:
    """Collect what startup left, keep the survivors out of later passes, and run young passes less
    often (the older generations' thresholds stay, counted in young passes as before)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
