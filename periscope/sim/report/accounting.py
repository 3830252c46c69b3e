"""GPU-hours per namespace as `periscope usage` reported them, against the truth file, beside the
request x hours baseline (what OpenCost computes: one GPU per device requested, for as long as held).

`up --truth t.jsonl` runs `periscope usage --by namespace --format json` over the run's whole windows
before it stops its broker and keeps the answer as `t.usage.json` (periscope.sim.up.sampler.usage_path).
The truth is summed over the time of that answer's [from, to): a tick holds from its instant to the
next, and one cut by `from` or `to` counts for its part inside (Periscope charges each window the time
within it, whatever the phase of the probe's samples):
- allocated: each holder's `alloc_share` x tick (docs/accounting.md's definitions on the true usage);
- used: `used_share` x tick where the hardware shows utilization, and where it does not (MIG without
  profiling data) the allocated time is `unmeasured`, as Periscope must count it;
- idle: the ticks of a below-threshold run of one pod on one device that the idle verdict confirms
  (held for the idle window, mean utilization over it below the threshold), from the run's first tick;
  a run that began while the cluster waited, frozen, for the scenario to start (`prestart_ms`) also
  counts that wait once confirmed, as Periscope books a confirmed run from its first sample;
- request x hours: one per held device x tick.
An error is the difference over the namespace's true allocated GPU-hours, in percent (for allocated,
that is its relative error; for used, idle and unmeasured it does not blow up where the truth is near
zero), and a namespace is within tolerance when every error is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from periscope.contract.values import parse_time_ms
from periscope.sim.cluster.truth import Row, Truth

TOLERANCE_PCT = 1.0
NUMBERS = ("allocated", "used", "idle", "unmeasured")
_HOUR_MS = 3_600_000


@dataclass(slots=True)
class _Hours:
    allocated: float = 0.0
    used: float = 0.0
    idle: float = 0.0
    unmeasured: float = 0.0
    request: float = 0.0

    def get(self, k: str) -> float:
        v: float = getattr(self, k)
        return v


def _idle_ticks(series: list[tuple[int, Row]], window_ticks: int, threshold: float,
                prestart_ticks: int) -> tuple[dict[int, float], dict[int, float]]:
    """Tick -> idle device-equivalent ticks of it (a confirmed run's ticks); and tick -> a confirmed
    run's pre-start wait, booked whole at the tick the verdict came."""
    out: dict[int, float] = {}
    wait: dict[int, float] = {}
    if not series or not series[0][1]["util_observable"]:
        return out, wait
    first = series[0][0] - (prestart_ticks if series[0][0] == 0 else 0)
    utils: dict[int, float] = {k: float(r["util_pct"] or 0.0) for k, r in series}
    run: list[tuple[int, Row]] = []
    confirmed = False

    def verdict(k: int) -> bool:
        if k - first < window_ticks:
            return False
        # before the holding's first tick: the frozen pre-start state, the first tick's
        span = [utils.get(j, utils[series[0][0]]) for j in range(k - window_ticks + 1, k + 1)]
        return sum(span) / len(span) < threshold

    prev = None
    for k, r in series:
        low = utils[k] < threshold
        if not low or (prev is not None and k != prev + 1):
            run, confirmed = [], False
        prev = k
        if not low:
            continue
        run.append((k, r))
        if confirmed:
            out[k] = out.get(k, 0.0) + float(r["alloc_share"])
        elif verdict(k):
            confirmed = True
            for j, rr in run:
                out[j] = out.get(j, 0.0) + float(rr["alloc_share"])
            if run[0][0] == series[0][0] == 0 and prestart_ticks:
                wait[k] = wait.get(k, 0.0) + prestart_ticks * float(r["alloc_share"])
    return out, wait


def truth_hours(truth: Truth, from_ms: int, to_ms: int) -> dict[str, _Hours]:
    tick_h = truth.tick_ms / _HOUR_MS
    meta = truth.meta
    threshold = float(meta.get("idle_threshold_pct", 5.0))
    window_ticks = max(1, int(meta.get("idle_window_ms", 600_000)) // truth.tick_ms)
    prestart = int(meta.get("prestart_ms") or 0) // truth.tick_ms
    out: dict[str, _Hours] = {}
    series: dict[tuple[str, str], list[tuple[int, Row]]] = {}
    inside: dict[int, float] = {}  # tick -> the part of it inside [from, to)
    for k in sorted(truth.ticks):
        rows = truth.ticks[k]
        if not rows:
            continue
        at = int(next(iter(rows.values()))["at_ms"])
        part = max(0, min(at + truth.tick_ms, to_ms) - max(at, from_ms)) / truth.tick_ms
        if part:
            inside[k] = part
        for dev, r in rows.items():
            if not r["pod_uid"]:
                continue
            series.setdefault((r["pod_uid"], dev), []).append((k, r))
            if not part:
                continue
            h = out.setdefault(r["namespace"], _Hours())
            alloc = float(r.get("alloc_share") or 0.0)
            h.allocated += alloc * tick_h * part
            h.request += tick_h * part
            if r["util_observable"]:
                h.used += float(r.get("used_share") or 0.0) * tick_h * part
            else:
                h.unmeasured += alloc * tick_h * part
    for ticks in series.values():
        ns = ticks[0][1]["namespace"]
        run, wait = _idle_ticks(ticks, window_ticks, threshold, prestart)
        for k, n in run.items():
            if k in inside:
                out.setdefault(ns, _Hours()).idle += n * tick_h * inside[k]
        for k, n in wait.items():
            if k in inside:
                out.setdefault(ns, _Hours()).idle += n * tick_h
    return out


def _err(got: float, want: float, base: float) -> float | None:
    return round(100 * abs(got - want) / base, 3) if base > 0 else None


def compare(truth: Truth, usage: dict[str, Any], tolerance_pct: float = TOLERANCE_PCT) -> dict[str, Any]:
    """The accounting section of the report, from the truth and `periscope usage --format json`."""
    if usage.get("by") != "namespace":
        raise ValueError("usage file: not grouped by namespace")
    from_ms, to_ms = parse_time_ms(str(usage["from"])), parse_time_ms(str(usage["to"]))
    want = truth_hours(truth, from_ms, to_ms)
    got = {str(g["key"]): g for g in usage.get("groups") or []}
    out = []
    for ns in sorted(set(want) | set(got)):
        t, g = want.get(ns, _Hours()), got.get(ns, {})
        ours = {k: float(g.get(f"{k}_gpu_hours") or 0.0) for k in NUMBERS}
        base = t.allocated
        errors = {k: _err(ours[k], t.get(k), base) for k in NUMBERS}
        out.append({
            "namespace": ns,
            "truth": {k: round(t.get(k), 6) for k in NUMBERS},
            "periscope": ours,
            "error_pct": errors,
            "baseline": {"allocated": round(t.request, 6)},
            "baseline_error_pct": {"allocated": _err(t.request, t.allocated, base)},
            "ok": all(e is not None and e <= tolerance_pct for e in errors.values()),
        })
    return {"from": usage["from"], "to": usage["to"], "tolerance_pct": tolerance_pct, "namespaces": out,
            "ok": bool(out) and all(n["ok"] for n in out)}


def format_accounting(a: dict[str, Any]) -> list[str]:
    lines = ["", f"GPU-hours {a['from']} .. {a['to']} by namespace: truth / periscope usage (error, % of the "
             f"namespace's true allocation; tolerance {a['tolerance_pct']:g}%), and request x hours",
             f"{'namespace':16}" + "".join(f"{k:30}" for k in NUMBERS) + "request x hours baseline"]
    for n in a["namespaces"]:
        cells = []
        for k in NUMBERS:
            e = n["error_pct"][k]
            err = "n/a" if e is None else f"{e:g}%"
            cells.append(f"{n['truth'][k]:.4f} / {n['periscope'][k]:.4f} ({err})")
        be = n["baseline_error_pct"]["allocated"]
        mark = "" if n["ok"] else "  <-- off"
        lines.append(f"{n['namespace'][:15]:16}" + "".join(f"{c:30}" for c in cells)
                     + f"{n['baseline']['allocated']:.4f} ({'n/a' if be is None else f'{be:g}%'}){mark}")
    return lines
