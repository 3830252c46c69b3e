"""`periscope doctor`'s verdicts: one `Check` per source the probe needs, and the `DoctorReport` of all
of them (the kubelet checks in `doctor`, the NVML and /proc ones in `doctor_nvml` both build these)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "warn", "fail"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail")


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True, slots=True)
class DoctorReport:
    checks: tuple[Check, ...]
    inputs: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """The probe can work: nothing failed (warnings only cost detail)."""
        return all(c.status != "fail" for c in self.checks)

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for c in self.checks if c.status == s) for s in STATUSES}

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "summary": self.counts(),
            "checks": [c.to_json() for c in self.checks],
            "inputs": self.inputs,
        }
