"""The benchmark results as a terminal table and as the README's markdown table."""

from __future__ import annotations

from typing import Any

# Headline figures first, in the order the README lists them.
ORDER = (
    "joiner_device_samples_per_s", "raw_consume_device_samples_per_s",
    "raw_consume_decode_device_samples_per_s", "joiner_vs_raw_ratio",
    "freshness_p50_s", "freshness_p99_s", "incumbent_staleness_p50_s", "incumbent_staleness_p99_s",
    "freshness_vs_incumbent_p50_ratio", "freshness_vs_incumbent_p99_ratio",
    "api_p50_ms", "api_p99_ms", "api_p99_ms_nodelay", "api_p50_ms_at_10k_rows", "api_p99_ms_at_10k_rows",
    "api_auth_p99_ratio", "api_auth_p99_ms", "api_auth_off_p99_ms",
    "replay_device_samples_per_s", "replay_core_only_device_samples_per_s",
    "replay_steady_device_samples_per_s", "replay_parallel_device_samples_per_s",
    "replay_one_process_device_samples_per_s", "replay_parallel_vs_one_process_ratio",
    "replay_hour_device_samples_per_s", "replay_hour_one_process_device_samples_per_s",
    "replay_hour_parallel_vs_one_process_ratio",
    "probe_cpu_ms_per_tick", "probe_sample_cpu_ms_per_tick",
    "joiner_bytes_per_row", "joiner_rss_bytes_per_row", "api_bytes_per_row",
)


def _keys(results: dict[str, Any]) -> list[str]:
    figs = results.get("figures", {})
    return [k for k in ORDER if k in figs] + sorted(k for k in figs if k not in ORDER)


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def _met(m: bool | None) -> str:
    return {True: "yes", False: "NO", None: ""}[m]


def table(results: dict[str, Any]) -> str:
    figs = results.get("figures", {})
    rows = [("figure", "value", "unit", "goal", "met")]
    for k in _keys(results):
        f = figs[k]
        rows.append((k, fmt(f["value"]), f["unit"], f["goal"] or "", _met(f["goal_met"])))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.rjust(w) if i == 1 else c.ljust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    m = results.get("machine", {})
    lines.append(f"\n{results.get('mode', '')} run, {results.get('date', '')}, {m.get('cpu_model', '')} "
                 f"({m.get('cpus', '?')} CPUs), Python {m.get('python', '')}")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: dict[str, Any]) -> str:
    figs = results.get("figures", {})
    m = results.get("machine", {})
    out = [
        f"Measured {results.get('date', '')[:10]} on {m.get('cpu_model', '?')}, {m.get('cpus', '?')} CPUs, "
        f"Python {m.get('python', '')} ({results.get('mode', '')} run, {results.get('wall_s', '?')} s). "
        f"Source {results.get('source', {}).get('commit', '?')}. "
        "Each figure is the median of its repeats; full setup in bench/results.json.",
        "",
        "| figure | value | goal | setup | what limits it |",
        "|---|---|---|---|---|",
    ]
    for k in _keys(results):
        f = figs[k]
        goal = f["goal"] or ""
        if f["goal_met"] is not None:
            goal = f"{goal} ({'met' if f['goal_met'] else 'not met'})"
        out.append(f"| `{k}` | {fmt(f['value'])} {f['unit']} | {_cell(goal)} | {_cell(f.get('brief', ''))} | "
                   f"{_cell(f.get('limit', ''))} |")
    return "\n".join(out)
