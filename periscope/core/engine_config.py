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
    lateness_ms: int = 1000  # how far behind the watermark a sample may arrive and still count
    history_ms: int = 3_600_000  # allocation history kept (XID owners "as of" the error)
    retention_ms: int = 3_600_000  # deleted pods' attribution kept this long
    changes: ChangeConfig = field(default_factory=ChangeConfig)  # what is worth publishing again
    # Streams a sample or an XID waits for (periscope.core.watermark); none: the watermark alone.
    align: frozenset[Stream] = frozenset()
    max_hold_ms: int = 600_000  # an aligned stream silent this long (event time) stops holding the others


DEFAULT_CONFIG = EngineConfig()
