"""`periscope report`'s inputs and output: JSON-lines files or a live API in, a table of scores out."""

from __future__ import annotations

from pathlib import Path

import httpx

from periscope.sim.cluster.truth import read_truth
from periscope.sim.report.accounting import format_accounting
from periscope.sim.report.score import SCORES, Row, parse_time
from periscope.sim.up.sampler import api_get, final_row


def read_jsonl(path: str | Path) -> list[Row]:
    return list(read_truth(path))


def live_snapshots(api: str, timeout_s: float = 10.0) -> list[Row]:
    """One snapshot of a running API, dated by its newest GPU sample, plus the final endpoints."""
    with httpx.Client(base_url=api.rstrip("/"), timeout=timeout_s) as client:
        pods, gpus = api_get(client, "/v1/pods?active=true")[0], api_get(client, "/v1/gpus")[0]
        at = max((parse_time(g.get("sample_at")) or 0 for g in gpus), default=0)
        final = final_row(client, at)
    return [{"kind": "snapshot", "at_ms": at, "pods": pods, "gpus": gpus}, final]


def _pct(score: Row) -> str:
    if not score.get("total"):
        return "n/a"
    text = f"{100 * score['share']:.1f}% ({score['right']}/{score['total']})"
    if "mean_error" in score:
        text += f", mean err {score['mean_error']:g}"
    return text


def _pr(c: Row) -> str:
    if c["precision"] is None and c["recall"] is None:
        return "n/a"
    return " / ".join("n/a" if v is None else f"{v:.2f}" for v in (c["precision"], c["recall"]))


def _lag(lag: Row | None) -> str:
    if lag is None:
        return ""
    return f" (the API trails real time by {lag['mean']:g} ticks on average, {lag['max']:g} at most)"


def format_report(r: Row) -> str:
    p, b = r["periscope"], r["baseline"]
    lag = r["baseline_lag_ms"] / 1000
    lines = [
        f"periscope report: scenario {r['scenario']} (seed {r['seed']}), {r['ticks']} ticks of "
        f"{r['tick_ms'] / 1000:g}s, {r['snapshots']} API snapshots, {r['allowance_ticks']}-tick allowance",
        "owners are checked at each GPU's sample time, usage at each row's" + _lag(r["lag_ticks"]),
        "",
        f"{'':34}{'periscope':34}name-join baseline ({lag:g}s lag)",
    ]
    tol = f"within ±{r['tolerance_pct']:g}"
    labels = ("owner right (tick x device)", f"shared-GPU util {tol}", f"exclusive util {tol}",
              "reused name, new pod's usage", "XID owner at error time",
              f"MIG-slice util {tol}")  # in the order of SCORES
    rows = [(label, _pct(p[key]), _pct(b[key])) for label, key in zip(labels, SCORES, strict=True)]
    rows += [("idle precision / recall", _pr(p["idle"]), _pr(b["idle"])),
             ("policy statuses", _pct(p["policy"]), "n/a")]
    lines += [f"{a:34}{c:34}{d}" for a, c, d in rows]
    if (behind := r.get("simulator_behind")) and (behind["ticks"] or behind["unscored"]):
        lines.append(f"  not scored: {behind['unscored']} answers sampled before the simulator had their "
                     f"tick in place (over a tick late at {behind['ticks']} ticks, "
                     f"{behind['max_ms'] / 1000:g}s at most: a loaded machine)")
    lines += [f"  wrong: {line}" for line in p.get("examples") or []]
    lines += [f"  policy {m['component']}: expected {m['expected']}, API says {m['got']}"
              for m in p["policy"]["mismatches"]]
    for f in p["faults"]:
        where = f" on {f['node']}" if f["node"] else ""
        n = f["recovered_ticks"]
        took = "not recovered" if n is None else f"recovered in {n} ticks"
        lines.append(f"fault {f['fault']}{where} at {f['at']}: {took}{'' if f['ok'] else '  <-- too slow'}")
    if r.get("accounting"):
        lines += format_accounting(r["accounting"])
    return "\n".join(lines)
