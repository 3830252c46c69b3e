"""Accuracy of a simulated run: what the API said at each tick against the ground truth.

Inputs: the truth file (`up --truth t.jsonl`) and the API snapshots `up` recorded beside it
(`t.api.jsonl`, one per tick, plus a final one with /v1/xid, /v1/policy, /v1/idle), or a single live
snapshot of a running API. A (tick, device) pair counts once the truth for it has been stable for
`allowance` ticks (the pipeline's convergence allowance).

The same numbers are computed for a name-join baseline, the way the incumbent exporter joins: it takes
PodResources' namespace/name for a device as of its last collection (`baseline_lag` ago), resolves it
to the pod of that name that exists at query time, copies the device's whole util to every pod
sharing it, and resolves XID owners at query time as well.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from periscope.contract.values import parse_time_ms
from periscope.sim.cluster.truth import Row, Truth

# The owner and usage scores, in the order the report lists them; idleness is a `Confusion` after them.
SCORES = ("owners", "shared_util", "exclusive_util", "reused_names", "xid_owners", "mig_util")


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _mean_max(values: list[float]) -> dict[str, float]:
    return {"mean": round(sum(values) / len(values), 2), "max": round(max(values), 2)}


@dataclass(slots=True)
class Score:
    right: int = 0
    total: int = 0
    errors: list[float] = field(default_factory=list)

    def add(self, ok: bool, error: float | None = None) -> None:
        self.total += 1
        self.right += int(ok)
        if error is not None and math.isfinite(error):
            self.errors.append(error)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"right": self.right, "total": self.total}
        out["share"] = _ratio(self.right, self.total)
        if self.errors:
            out["mean_error"], out["max_error"] = _mean_max(self.errors).values()
        return out


@dataclass(slots=True)
class Confusion:
    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    def add(self, said: bool, truth: bool) -> None:
        cell = ("tn", "fn", "fp", "tp")[2 * said + truth]
        setattr(self, cell, getattr(self, cell) + 1)

    def to_json(self) -> dict[str, Any]:
        return {"precision": _ratio(self.tp, self.tp + self.fp), "recall": _ratio(self.tp, self.tp + self.fn),
                **asdict(self)}


def parse_time(value: Any) -> int | None:
    """A time as the API writes it (RFC 3339) or as Unix ms; None when absent or unreadable."""
    if isinstance(value, int | float):
        return int(value)
    try:
        return parse_time_ms(value) if isinstance(value, str) and value else None
    except ValueError:
        return None


def _owners(t: Row) -> set[str]:
    return {t["pod_uid"]} if t["pod_uid"] else set()


@dataclass(frozen=True, slots=True)
class ReportOptions:
    allowance_ticks: int = 2
    baseline_lag_ms: int = 30_000  # dcgm-exporter's default collect interval
    tolerance_pct: float = 5.0
    recovery_ticks: int = 5


class _Baseline:
    """The name-join incumbent, replayed from the truth alone."""

    def __init__(self, truth: Truth, lag_ticks: int) -> None:
        self.truth, self.lag = truth, lag_ticks
        self._series: dict[tuple[str, str, int], float | None] = {}
        self.window_ticks = max(1, int(truth.meta.get("idle_window_ms", 600_000)) // truth.tick_ms)
        self.threshold = float(truth.meta.get("idle_threshold_pct", 5.0))

    def owner(self, device: str, tick: int) -> str | None:
        r = self.truth.row(tick - self.lag, device)
        return self.truth.current_uid(tick, r["namespace"], r["pod"]) if r and r["pod_uid"] else None

    def util(self, device: str, tick: int) -> float | None:
        r = self.truth.row(tick - self.lag, device)
        return None if r is None or r["pod_uid"] is None else r.get("gpu_util_pct")

    def _name_util(self, ns: str, pod: str, tick: int) -> float | None:
        key = (ns, pod, tick)  # memoised: each tick is asked for once per tick of the idle window
        if key not in self._series:
            vals = [float(r["gpu_util_pct"]) for r in self.truth.rows_at(tick - self.lag).values()
                    if (r["namespace"], r["pod"]) == (ns, pod) and r.get("gpu_util_pct") is not None]
            self._series[key] = sum(vals) / len(vals) if vals else None
        return self._series[key]

    def idle(self, ns: str, pod: str, tick: int) -> bool:
        samples = [self._name_util(ns, pod, j) for j in range(tick - self.window_ticks + 1, tick + 1)]
        got = [s for s in samples if s is not None]
        return len(got) >= self.window_ticks and sum(got) / len(got) < self.threshold


def gpu_views(snapshot: Row, truth: Truth) -> list[tuple[str, int, set[str]]]:
    """(device ID, as-of time, owner UIDs) for each device of each GPU in a snapshot. One GpuState
    carries its owners and its sample time from the same engine step, so the pair is consistent even
    while other outputs are still on their way to the API."""
    out = []
    for g in snapshot.get("gpus") or []:
        t = parse_time(g.get("sample_at"))
        if t is None:
            continue
        owners: dict[str, set[str]] = {}
        migs = [o for m in g.get("mig_devices") or [] for o in m.get("owners") or []]
        for o in [*(g.get("owners") or []), *migs]:
            owners.setdefault(str(o.get("device_id")), set()).add(str(o.get("pod_uid")))
        out += [(dev, t, owners.get(dev, set())) for dev in truth.gpu_devices.get(str(g.get("gpu_uuid")), ())]
    return out


def build_report(truth: Truth, snapshots: list[Row], opts: ReportOptions | None = None) -> Row:
    o = opts or ReportOptions()
    snaps = sorted((s for s in snapshots if s.get("kind") == "snapshot"), key=lambda s: s["at_ms"])
    final = next((s for s in reversed(snapshots) if s.get("kind") == "final"), None)
    allow, tol = o.allowance_ticks, o.tolerance_pct
    base = _Baseline(truth, max(0, round(o.baseline_lag_ms / truth.tick_ms)))
    # Idleness is decided per aggregation window, so its allowance grows by one window.
    idle_allow = allow + math.ceil(int(truth.meta.get("idle_bucket_ms", 0)) / truth.tick_ms)
    ours, theirs = {k: Score() for k in SCORES}, {k: Score() for k in SCORES}
    idle_ours, idle_theirs = Confusion(), Confusion()
    lags: list[float] = []
    examples: list[str] = []
    seen: set[tuple[Any, ...]] = set()  # each API state once, however many snapshots repeat it
    early: set[tuple[Any, ...]] = set()  # answers the simulator's lag made uncheckable
    for s in snaps:
        for dev, t_ms, got in gpu_views(s, truth):
            lags.append((int(s["at_ms"]) - t_ms) / truth.tick_ms)
            k = truth.tick_at(t_ms)
            if ("o", dev, k) in seen or (t := truth.settled_owner(k, dev, allow)) is None:
                continue
            if (behind := truth.behind(t_ms)) and truth.settled_owner(k, dev, allow + behind) is None:
                early.add(("o", dev, k))  # the hardware still showed the owner before the change
                continue
            seen.add(("o", dev, k))
            ours["owners"].add(got == (want := _owners(t)))
            if got != want:
                _example(examples, "owner", k, t, f"API says {sorted(got) or 'nobody'}")
            theirs["owners"].add(base.owner(dev, k) == t["pod_uid"])
        for r in (r for r in s.get("pods") or [] if r.get("active", True)):
            t_ms = parse_time(r.get("sample_at")) or parse_time(r.get("last_seen")) or 0
            k = truth.tick_at(t_ms)
            dev, uid = str(r.get("device_id")), r.get("pod_uid")
            t = truth.row(k, dev)
            if ("r", dev, uid, k) in seen or t is None or t["pod_uid"] != uid:
                continue  # a wrong owner is scored above
            util = t["util_observable"] and truth.stable(k, dev, allow, "pod_uid", "util_pct")
            idle = t["idle"] is not None and truth.stable(k, dev, idle_allow, "pod_uid", "idle")
            if (behind := truth.behind(t_ms)) and (
                    (util and not truth.stable(k, dev, allow + behind, "pod_uid", "util_pct"))
                    or (idle and not truth.stable(k, dev, idle_allow + behind, "pod_uid", "idle"))):
                early.add(("r", dev, uid, k))  # the hardware still showed an older usage
                continue
            seen.add(("r", dev, uid, k))
            if util:
                # A MIG slice's util is scored on its own (it needs the node's dcgm-exporter; the truth
                # marks it observable only then): the incumbent's GPU_UTIL has no series on MIG.
                keys = ["mig_util" if t["sharing"] == "mig" else
                        "shared_util" if t["sharing"] in ("time-slicing", "mps") else "exclusive_util"]
                if truth.first_uid[(t["namespace"], t["pod"])] != uid:
                    keys.append("reused_names")
                err = _err(r.get("util_pct"), t["util_pct"])
                b_err = _err(base.util(dev, k) if base.owner(dev, k) == uid else None, t["util_pct"])
                if err > tol:
                    _example(examples, "util", k, t, f"API says {r.get('util_pct')}")
                for scores, e in ((ours, err), (theirs, b_err)):
                    for key in keys:
                        scores[key].add(e <= tol, e)
            if idle:
                idle_ours.add(bool(r.get("idle")), bool(t["idle"]))
                idle_theirs.add(base.idle(t["namespace"], t["pod"], k), bool(t["idle"]))
    near_ms = (allow + 1) * truth.tick_ms  # an XID's time, from when the hardware showed it
    for x in truth.xids:
        want = {ow["pod_uid"] for ow in x["owners"]}
        if final is not None:  # the owner sets the API gave for this error: same GPU and code, near in time
            near = [{ow.get("pod_uid") for ow in i.get("owners") or []} for i in final.get("xid") or []
                    if (i.get("gpu_uuid"), i.get("code")) == (x["gpu_uuid"], x["code"])
                    and x["at_ms"] - near_ms <= (parse_time(i.get("at")) or 0)
                    <= truth.visible_ms(x["at_ms"]) + near_ms]
            ours["xid_owners"].add(want in near)
        q = truth.tick_at(x["at_ms"]) + base.lag  # the baseline resolves names when it is asked
        named = {truth.current_uid(q, ow["namespace"], ow["pod"]) for ow in x["owners"]}
        theirs["xid_owners"].add(named == want)

    def side(scores: dict[str, Score], idle: Confusion, **extra: Any) -> Row:
        return {**{k: v.to_json() for k, v in scores.items()}, "idle": idle.to_json(), **extra}

    return {
        "scenario": truth.meta.get("scenario"),
        "seed": truth.meta.get("seed"),
        "ticks": truth.last + 1,
        "tick_ms": truth.tick_ms,
        "snapshots": len(snaps),
        "allowance_ticks": allow,
        "baseline_lag_ms": o.baseline_lag_ms,
        "tolerance_pct": tol,
        "lag_ticks": _mean_max(lags) if lags else None,
        "simulator_behind": _behind(truth, len(early - seen)),
        "periscope": side(ours, idle_ours, examples=examples, policy=_policy(truth, final),
                          faults=_faults(truth, snaps, allow, o.recovery_ticks)),
        "baseline": side(theirs, idle_theirs),
    }


def _behind(truth: Truth, unscored: int) -> Row:
    """How far the simulator fell behind the clock, and the answers that could not be scored for it:
    sampled before their tick's state was in place where the truth changed in between (and not sampled
    again within that tick)."""
    late = [ms for ms in truth.late_ms() if ms > truth.tick_ms]
    return {"ticks": len(late), "max_ms": max(late, default=0), "unscored": unscored}


def _example(out: list[str], what: str, tick: int, t: Row, said: str, limit: int = 20) -> None:
    """The first wrong answers, for a human to start from."""
    if len(out) < limit:
        who = f"{t['namespace']}/{t['pod']} ({str(t['pod_uid'])[:8]})" if t["pod_uid"] else "nobody"
        truth = f"util {t['util_pct']}" if what == "util" else who
        out.append(f"tick {tick} {t['node']} {t['device_id']}: truth {truth}, {said}")


def _err(got: Any, want: Any) -> float:
    if not isinstance(got, int | float) or not isinstance(want, int | float):
        return math.inf
    return abs(float(got) - float(want))


def _policy(truth: Truth, final: Row | None) -> Row:
    expected = (((truth.meta.get("policy") or {}).get("components")) or {}) if final is not None else {}
    components = ((final or {}).get("policy") or {}).get("components") or []
    got = {c.get("name"): c.get("status") for c in components}
    mismatches = [
        {"component": k, "expected": v, "got": got.get(k)} for k, v in expected.items() if got.get(k) != v
    ]
    score = Score(right=len(expected) - len(mismatches), total=len(expected))
    return {**score.to_json(), "mismatches": mismatches}


def _faults(truth: Truth, snaps: list[Row], allow: int, limit: int) -> list[Row]:
    """Ticks from a fault's end until the API shows, for every GPU the fault touched, data newer than
    the fault with every owner right (timed at sampling, so the pipeline's lag is included)."""
    out = []
    for f in truth.faults:
        end, node = int(f["end_ms"]), f.get("node")
        at = next((int(s["at_ms"]) for s in snaps if _recovered(truth, s, node, end, allow)), None)
        ticks = None if at is None else math.ceil((at - end) / truth.tick_ms)
        out.append({"fault": f["fault"], "node": node, "at": f.get("at"), "end_ms": end,
                    "recovered_ticks": ticks, "ok": ticks is not None and ticks <= limit})
    return out


def _recovered(truth: Truth, snap: Row, node: str | None, end: int, allow: int) -> bool:
    if snap["at_ms"] < end:
        return False
    views = [v for v in gpu_views(snap, truth) if node is None or truth.devices.get(v[0]) == node]
    settled = ((got, truth.settled_owner(truth.tick_at(t_ms), dev, allow)) for dev, t_ms, got in views)
    return (bool(views) and all(t_ms >= end for _, t_ms, _ in views)
            and all(t is None or got == _owners(t) for got, t in settled))
