"""Findings that hold while a condition lasts (idle, unattributed usage, ambiguous joins, source health).

The book remembers which are active, emits a finding when it appears or materially changes, and emits
it once more with active=False when the condition clears. XID findings are one-shot and not kept here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from operator import attrgetter

from periscope.core.model import Finding, SourceHealth

# States that leave part of the truth missing. "disabled" is a choice (a feature gate, an operand
# turned off on purpose), not a fault, so it is not reported.
UNHEALTHY = frozenset({"absent", "corrupt", "unavailable", "error"})


def health_findings(node: str, t_ms: int, health: Iterable[SourceHealth]) -> list[Finding]:
    """One finding per probe source that is not healthy (first report of a source wins)."""
    out: dict[str, Finding] = {}
    for h in health:
        if h.state in UNHEALTHY and h.source not in out:
            detail = f": {h.detail}" if h.detail else ""
            out[h.source] = Finding(
                kind="source-health", key=node, node=node, at_ms=t_ms, id=f"source-health/{node}/{h.source}",
                message=f"{h.source} {h.state}{detail}",
            )
    return [out[k] for k in sorted(out)]


# Fields that move every tick do not make a finding "changed"; the others, as one tuple (compared for
# every active finding on every sample: a tuple from C, not a copy of the finding).
_MOVING = frozenset({"at_ms", "wasted_gpu_hours", "avg_util_pct"})
_material = attrgetter(*(f.name for f in fields(Finding) if f.name not in _MOVING))


@dataclass(slots=True)
class FindingBook:
    active_by_id: dict[str, Finding] = field(default_factory=dict)

    def reconcile(self, current: list[Finding], t_ms: int) -> list[Finding]:
        out: list[Finding] = []
        seen: set[str] = set()
        for f in sorted(current, key=lambda x: x.id):
            seen.add(f.id)
            old = self.active_by_id.get(f.id)
            if old is None or _material(old) != _material(f):
                self.active_by_id[f.id] = f
                out.append(f)
        for fid in sorted(set(self.active_by_id) - seen):
            old = self.active_by_id.pop(fid)
            out.append(replace(old, active=False, at_ms=t_ms))
        return out

    def active(self) -> list[Finding]:
        return [self.active_by_id[k] for k in sorted(self.active_by_id)]
