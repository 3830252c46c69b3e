"""Where each number of a tumbling window sits when windows are kept flat (arrays of doubles, tuples).

A row keeps its windows in `array("d")` runs of `W` numbers (periscope.core.rows) and the API keeps them
as tuples that start in the same order (services.api.windows): `WindowStat`'s first fields, in order (a
row keeps its accounting apart, in periscope.core.accounting's ledger). Windows kept only for idle
detection hold `IW` numbers. The offsets are named here, once; the hot paths index with them.
"""

from __future__ import annotations

# A full window: WindowStat(start_ms, samples, util_sum, util_samples, fb_max_mib, power_sum_w).
START = 0
SAMPLES = 1
UTIL_SUM = 2
UTIL_SAMPLES = 3
FB_MAX = 4
POWER_SUM = 5
W = 6  # numbers per full window

# A window kept for idle detection only: its start and its utilization sums.
IDLE_START = 0
IDLE_UTIL_SUM = 1
IDLE_UTIL_SAMPLES = 2
IW = 3  # numbers per idle-only window
