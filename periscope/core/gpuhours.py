"""GPU-hours reports: the accounting of published windows (periscope.core.accounting), summed per row,
grouped by a key and priced. `periscope usage` (from a replay) and the API's /v1/usage (from the
windows it holds) both build their answer here, so they agree to the last digit on the same windows.

A window counts toward a period when its start lies in [from, to). Groups: namespace, workload (the
pod's controller as the watcher recorded it: `namespace/Kind/name`, or `namespace/Pod/name` for a bare
pod), pod (by UID), node, gpu-model, or label:KEY (the pod's label value). A group whose key is
unknown (no label, no model known) has a null key in the document, as every unknown in the output
contract. The total is the sum of the groups, so they reconcile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from periscope.core.accounting import HOUR_MS
from periscope.core.model import WindowStat

GROUPINGS = ("namespace", "workload", "pod", "node", "gpu-model")
LABEL_PREFIX = "label:"
_MIB_PER_GIB = 1024.0


def check_grouping(by: str) -> str:
    """`by` if it is a grouping, else ValueError saying which are."""
    if by in GROUPINGS or (by.startswith(LABEL_PREFIX) and len(by) > len(LABEL_PREFIX)):
        return by
    raise ValueError(f"unknown grouping {by!r} (one of {', '.join(GROUPINGS)}, label:KEY)")


@dataclass(slots=True)
class Account:
    """Sums of window accounting, device-equivalent ms (see WindowStat); `cost` in price units."""

    gpu_ms: float = 0.0
    used_gpu_ms: float = 0.0
    idle_gpu_ms: float = 0.0
    unmeasured_gpu_ms: float = 0.0
    fb_mib_ms: float = 0.0
    energy_j: float = 0.0
    request_gpu_ms: float = 0.0
    cost: float = 0.0

    def add_window(self, w: WindowStat) -> None:
        self.gpu_ms += w.gpu_ms
        self.used_gpu_ms += w.used_gpu_ms
        self.idle_gpu_ms += w.idle_gpu_ms
        self.unmeasured_gpu_ms += w.unmeasured_gpu_ms
        self.fb_mib_ms += w.fb_mib_ms
        self.energy_j += w.energy_j
        self.request_gpu_ms += w.request_gpu_ms

    def priced(self, price_per_hour: float) -> Account:
        """This account with its cost: allocated GPU-hours x the price of a GPU-hour."""
        self.cost = self.gpu_ms / HOUR_MS * price_per_hour
        return self

    def add(self, o: Account) -> None:
        self.gpu_ms += o.gpu_ms
        self.used_gpu_ms += o.used_gpu_ms
        self.idle_gpu_ms += o.idle_gpu_ms
        self.unmeasured_gpu_ms += o.unmeasured_gpu_ms
        self.fb_mib_ms += o.fb_mib_ms
        self.energy_j += o.energy_j
        self.request_gpu_ms += o.request_gpu_ms
        self.cost += o.cost

    def to_json(self, priced: bool) -> dict[str, Any]:
        """The contract's numbers: hours, GiB-hours, Wh; efficiency = used over measured allocated."""
        measured = self.gpu_ms - self.unmeasured_gpu_ms
        return {
            "allocated_gpu_hours": _r(self.gpu_ms / HOUR_MS),
            "used_gpu_hours": _r(self.used_gpu_ms / HOUR_MS),
            "idle_gpu_hours": _r(self.idle_gpu_ms / HOUR_MS),
            "unmeasured_gpu_hours": _r(self.unmeasured_gpu_ms / HOUR_MS),
            "memory_gib_hours": _r(self.fb_mib_ms / _MIB_PER_GIB / HOUR_MS),
            "energy_wh": _r(self.energy_j / 3600.0),
            "efficiency": _r(self.used_gpu_ms / measured, 4) if measured > 1e-9 else None,
            "request_gpu_hours": _r(self.request_gpu_ms / HOUR_MS),
            "cost": _r(self.cost, 4) if priced else None,
        }


def _r(x: float, digits: int = 6) -> float:
    return round(x, digits) + 0.0  # + 0.0: never -0.0


@dataclass(frozen=True, slots=True)
class Subject:
    """Who and what a row's windows are about: enough for every grouping."""

    pod_uid: str
    namespace: str
    pod: str
    node: str
    gpu_uuid: str
    owner_kind: str = ""
    owner_name: str = ""
    gpu_model: str = ""
    labels: tuple[tuple[str, str], ...] = ()

    def key(self, by: str) -> str:
        if by == "namespace":
            return self.namespace
        if by == "workload":
            if self.owner_kind and self.owner_name:
                return f"{self.namespace}/{self.owner_kind}/{self.owner_name}"
            return f"{self.namespace}/Pod/{self.pod}"
        if by == "pod":
            return self.pod_uid
        if by == "node":
            return self.node
        if by == "gpu-model":
            return self.gpu_model
        want = by.removeprefix(LABEL_PREFIX)
        return next((v for k, v in self.labels if k == want), "")


@dataclass(slots=True)
class Group:
    key: str
    account: Account = field(default_factory=Account)
    pods: set[str] = field(default_factory=set)
    namespace: str = ""  # for a pod group
    pod: str = ""


def in_period(start_ms: int, from_ms: int, to_ms: int) -> bool:
    return from_ms <= start_ms < to_ms


def price_of(prices: Mapping[str, float] | None, model: str) -> float:
    """The price of a GPU-hour of `model` (0 without prices). A model the table does not name and no
    `default` for: KeyError naming it (callers check `unpriced` first)."""
    if prices is None:
        return 0.0
    if model in prices:
        return prices[model]
    return prices["default"]


def unpriced(prices: Mapping[str, float] | None, models: Iterable[str]) -> list[str]:
    """The GPU models the price table has no price for (none when it has a `default`)."""
    if prices is None or "default" in prices:
        return []
    return sorted({m for m in models if m not in prices})


def group(items: Iterable[tuple[Subject, Account]], by: str) -> list[Group]:
    """Sum per-row accounts into groups, sorted by key."""
    groups: dict[str, Group] = {}
    for subject, acct in items:
        k = subject.key(by)
        g = groups.get(k)
        if g is None:
            g = groups[k] = Group(k)
            if by == "pod":
                g.namespace, g.pod = subject.namespace, subject.pod
        g.account.add(acct)
        g.pods.add(subject.pod_uid)
    return [groups[k] for k in sorted(groups)]


def document(from_iso: str, to_iso: str, by: str, groups: list[Group], priced: bool,
             **extra: Any) -> dict[str, Any]:
    """The report as `periscope usage --format json` prints it and /v1/usage answers; the total is the
    sum of the groups (in group order)."""
    total = Account()
    for g in groups:
        total.add(g.account)
    out_groups = []
    for g in groups:
        item: dict[str, Any] = {"key": g.key or None}  # unknown (no namespace, model or label): null
        if by == "pod":
            item |= {"namespace": g.namespace, "pod": g.pod}
        out_groups.append({**item, **g.account.to_json(priced), "pods": len(g.pods)})
    pods = len({p for g in groups for p in g.pods})
    return {"from": from_iso, "to": to_iso, "by": by, "groups": out_groups,
            "total": {**total.to_json(priced), "pods": pods}, **extra}


@dataclass(slots=True)
class RowTally:
    """One row's windows in [from, to), each counted once: the engine publishes a row's windows in
    start order, and publishes one again (same start, whole) when the row came back within it, so a
    copy with the start held replaces it and an older start was counted already."""

    from_ms: int
    to_ms: int
    done: Account = field(default_factory=Account)
    last: WindowStat | None = None

    def add(self, w: WindowStat) -> None:
        if not in_period(w.start_ms, self.from_ms, self.to_ms):
            return
        last = self.last
        if last is None or w.start_ms >= last.start_ms:
            if last is not None and w.start_ms > last.start_ms:
                self.done.add_window(last)
            self.last = w

    def add_all(self, ws: Iterable[WindowStat]) -> None:
        for w in ws:
            self.add(w)

    def total(self) -> Account:
        out = Account()
        out.add(self.done)
        if self.last is not None:
            out.add_window(self.last)
        return out
