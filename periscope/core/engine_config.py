"""The engine's knobs: windows and idle detection, lateness, history kept, what is worth publishing,
event-time alignment across a node's input streams."""

from __future__ import annotations

from dataclasses import dataclass, field

from periscope.core.changes import ChangeConfig
from periscope.core.rows import RowConfig
from periscope.core.watermark import Stream


@dataclass(frozen=True, slots=True)
class EngineConfig:
    rows: RowConfig = field(default_factory=RowConfig)
    # How far behind the watermark a sample may arrive and still count. A little under the probes' 1 s
    # tick: a sample is joined when the node's next tick arrives, also when that tick's clock reading
    # came a few ms early (at exactly 1 s, about a quarter of samples waited a second tick).
    lateness_ms: int = 900
    history_ms: int = 3_600_000  # allocation history kept (XID owners "as of" the error)
    retention_ms: int = 3_600_000  # deleted pods' attribution kept this long
    changes: ChangeConfig = field(default_factory=ChangeConfig)  # what is worth publishing again
    # Streams a sample or an XID waits for (periscope.core.watermark); none: the watermark alone.
    align: frozenset[Stream] = frozenset()
    max_hold_ms: int = 600_000  # an aligned stream silent this long (event time) stops holding the others


DEFAULT_CONFIG = EngineConfig()
