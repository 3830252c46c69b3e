"""The benchmark results as a terminal table and as the README's markdown table."""

from __future__ import annotations

from typing import Any

# Headline figures first, in the order the README lists them; a figure measured on Apache Kafka
# (`kafka_<name>`) follows its embedded-broker twin.
ORDER = (
    "joiner_device_samples_per_s", "raw_consume_device_samples_per_s",
    "raw_consume_decode_device_samples_per_s", "joiner_vs_raw_ratio",
    "joiner_worker_cpu_us_per_device_sample",
    "joiner_three_workers_device_samples_per_s", "joiner_scale_out_ratio",
    "freshness_p50_s", "freshness_p99_s", "incumbent_staleness_p50_s", "incumbent_staleness_p99_s",
    "freshness_vs_incumbent_p50_ratio", "freshness_vs_incumbent_p99_ratio", "outage_catch_up_s",
    "api_p50_ms", "api_p99_ms", "api_p99_ms_nodelay", "api_p50_ms_at_10k_rows", "api_p99_ms_at_10k_rows",
    "api_auth_p99_ratio", "api_auth_p99_ms", "api_auth_off_p99_ms",
    "replay_device_samples_per_s", "replay_core_only_device_samples_per_s",
    "replay_steady_device_samples_per_s", "replay_parallel_device_samples_per_s",
    "replay_one_process_device_samples_per_s", "replay_parallel_vs_one_process_ratio",
    "replay_hour_device_samples_per_s", "replay_hour_one_process_device_samples_per_s",
    "replay_hour_parallel_vs_one_process_ratio", "replay_hour_speedup_vs_realtime",
    "replay_hour_publish_records_per_s",
    "api_load_p99_ms", "api_load_without_owners_p99_ms", "api_load_max_ms", "api_load_requests_per_s",
    "api_load_share_429", "api_load_owners_share_429", "api_owners_burst_share_429",
    "api_owners_burst_max_ms",
    "probe_cpu_ms_per_tick", "probe_sample_cpu_ms_per_tick",
    "joiner_bytes_per_row", "joiner_rss_bytes_per_row", "api_bytes_per_row",
    "eos_at_least_once_records_per_s", "eos_exactly_once_records_per_s", "eos_rate_ratio",
    "eos_at_least_once_cpu_us_per_record", "eos_exactly_once_cpu_us_per_record", "eos_cpu_ratio",
    "eos_at_least_once_live_p99_s", "eos_exactly_once_live_p99_s",
)
BROKER_NAMES = {"embedded": "embedded", "kafka": "Apache Kafka", None: "none"}


def _keys(results: dict[str, Any]) -> list[str]:
    figs = results.get("figures", {})
    rank = {k: i for i, k in enumerate(ORDER)}

    def order(key: str) -> tuple[int, int, str]:
        base = key.removeprefix("kafka_") if figs[key].get("broker") == "kafka" else key
        return (rank.get(base, len(ORDER)), 0 if base == key else 1, base)

    return sorted(figs, key=order)


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


def _spread(f: dict[str, Any]) -> str:
    """min-max over the repeats, when there were several."""
    if len(f.get("runs", [])) < 2 or f.get("min") is None:
        return ""
    return f"{fmt(f['min'])}-{fmt(f['max'])} (n={len(f['runs'])})"


def _against(f: dict[str, Any]) -> str:
    """The same-run figures this one is compared with: its baseline, and for a figure measured on
    Apache Kafka the embedded broker's."""
    out = []
    for name, other in (("", f.get("baseline")), ("embedded broker: ", f.get("vs_embedded"))):
        if isinstance(other, dict):
            ratio = f" ({fmt(other['ratio'])}x)" if other.get("ratio") is not None else ""
            out.append(f"{name}`{other['figure']}` {fmt(other['value'])}{ratio}")
    return "; ".join(out)


def table(results: dict[str, Any]) -> str:
    figs = results.get("figures", {})
    rows = [("figure", "broker", "value", "min-max", "unit", "goal", "met")]
    for k in _keys(results):
        f = figs[k]
        rows.append((k, BROKER_NAMES.get(f.get("broker"), "?"), fmt(f["value"]), _spread(f), f["unit"],
                     f["goal"] or "", _met(f["goal_met"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i == 2 else c.ljust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    m = results.get("machine", {})
    lines.append(f"\n{results.get('mode', '')} run, {results.get('date', '')}, {m.get('cpu_model', '')} "
                 f"({m.get('cpus', '?')} CPUs), Python {m.get('python', '')}; {_load_line(m)}")
    return "\n".join(lines)


def _load_line(m: dict[str, Any]) -> str:
    before = (m.get("load_before") or {}).get("load_average_1_5_15_min")
    after = (m.get("load_after") or {}).get("load_average_1_5_15_min")
    if not before or not after:
        return "load not recorded"
    return (f"load average (1/5/15 min) {'/'.join(f'{x:g}' for x in before)} before, "
            f"{'/'.join(f'{x:g}' for x in after)} after")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: dict[str, Any], source: str = "bench/results.json") -> str:
    """The README table of `results`, read from the file named `source`."""
    figs = results.get("figures", {})
    m = results.get("machine", {})
    brokers = results.get("brokers") or {}
    out = [
        f"Measured {results.get('date', '')[:10]} on {m.get('cpu_model', '?')}, {m.get('cpus', '?')} CPUs, "
        f"Python {m.get('python', '')} ({results.get('mode', '')} run, {results.get('wall_s', '?')} s; "
        f"{_load_line(m)}). Source {results.get('source', {}).get('commit', '?')}. "
        "Each figure is the median of its repeats (min-max beside it when there were several), compared "
        f"with figures of the same run; full setup in {source}.",
        "",
        *(f"- {BROKER_NAMES.get(k, k)}: {v}" for k, v in brokers.items()),
        *([f"- Apache Kafka left out: {results['kafka_left_out']}"] if results.get("kafka_left_out") else []),
        "",
        "| figure | broker | value | same run | goal | setup | what limits it |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in _keys(results):
        f = figs[k]
        goal = f["goal"] or ""
        if f["goal_met"] is not None:
            goal = f"{goal} ({'met' if f['goal_met'] else 'not met'})"
        spread = _spread(f)
        value = f"{fmt(f['value'])} {f['unit']}" + (f" ({spread})" if spread else "")
        out.append(f"| `{k}` | {BROKER_NAMES.get(f.get('broker'), '?')} | {value} | {_cell(_against(f))} | "
                   f"{_cell(goal)} | {_cell(f.get('brief', ''))} | {_cell(f.get('limit', ''))} |")
    return "\n".join(out)


# The README's table: the figures a reader of the README asks about first, each with its embedded-broker
# and Apache Kafka values side by side. Every figure with a goal is here (tests/unit/test_bench_smoke.py),
# so no goal is met or missed out of the README's sight; bench/README.md has the rest.
HEADLINES = (
    ("joiner_device_samples_per_s", "joiner throughput, one worker, 12 partitions"),
    ("joiner_worker_cpu_us_per_device_sample", "joiner CPU per device sample"),
    ("joiner_vs_bare_loop_cpu_ratio_whole_backlog",
     "joiner CPU per device sample / a bare batched loop's, whole backlog"),
    ("joiner_vs_bare_loop_cpu_ratio", "the same between 10 % and 90 % of the samples joined"),
    ("joiner_vs_raw_ratio", "raw consume rate / joiner rate"),
    ("joiner_three_workers_device_samples_per_s", "joiner, three workers of one group"),
    ("freshness_p99_s", "freshness p99: sample on the GPU → visible in `/v1/pods`"),
    ("freshness_output_topic_p99_s", "freshness p99 at the output topic (marker samples, next tick on time)"),
    ("outage_catch_up_s", "catch-up after a 60 s broker outage"),
    ("replay_device_samples_per_s", "replay in memory, one process"),
    ("replay_parallel_device_samples_per_s", "replay in memory to the JSON document, a worker per CPU"),
    ("replay_hour_device_samples_per_s",
     "replay of 1 h of 50 nodes x 8 GPUs via broker + `periscope replay`"),
    ("probe_cpu_ms_per_tick", "probe CPU per tick (8 GPUs x 64 processes)"),
    ("probe_sample_cpu_ms_per_tick", "probe sampling alone, per tick"),
    ("probe_dcgm_scrape_ms", "one dcgm-exporter scrape, 8 GPUs"),
    ("probe_dcgm_scrape_mig_ms", "one dcgm-exporter scrape, 8 x 7 MIG instances"),
    ("api_p99_ms", "API `/v1/pods?node=`, `/v1/gpus?node=` p99, 100,000 rows"),
    ("api_p99_ms_nodelay", "the same with TCP_NODELAY"),
    ("api_auth_p99_ratio", "API p99 with access control on / off"),
    ("api_load_p99_ms", "API under load: 50 clients, auth on, 10,000 rows, p99"),
    ("api_load_without_owners_p99_ms", "the same, requests other than `/v1/owners`"),
    ("eos_cpu_ratio", "Faust `exactly_once` / `at_least_once`, CPU per record"),
    ("joiner_bytes_per_row", "joiner memory per pod-device row: what a worker holds after an hour"),
    ("joiner_rss_bytes_per_row", "joiner RSS per added pod-device row"),
    ("api_bytes_per_row", "API memory per row (an hour of windows each)"),
)
README_BEGIN = "<!-- bench summary: generated by `bench/run.py --readme` from bench/results.json -->"
README_END = "<!-- end of bench summary -->"


def _pair(results: dict[str, Any], base: str) -> list[tuple[str, dict[str, Any]]]:
    """(broker name, figure) for the figure `base` and its Apache Kafka twin, those measured."""
    figs = results.get("figures", {})
    return [(BROKER_NAMES.get(figs[k].get("broker"), "?"), figs[k]) for k in (base, "kafka_" + base)
            if k in figs]


def _run_of(results: dict[str, Any], f: dict[str, Any]) -> str:
    """When, on what and at which commit a figure was measured: its own run where it was merged in from
    a later one, else the file's."""
    setup = f.get("setup")
    run = setup.get("run") if isinstance(setup, dict) and isinstance(setup.get("run"), dict) else results
    cpu = str((run.get("machine") or {}).get("cpu_model", "?")).replace("(R)", "").replace(" Processor", "")
    return f"{str(run.get('date', '?'))[:10]}, {cpu}, {(run.get('source') or {}).get('commit', '?')}"


def _value(f: dict[str, Any]) -> str:
    spread = "" if len(f.get("runs", [])) < 2 or f.get("min") is None else \
        f" ({fmt(f['min'])} / {fmt(f['value'])} / {fmt(f['max'])})"
    return f"{fmt(f['value'])} {f['unit']}{spread}"


def _status(pair: list[tuple[str, dict[str, Any]]]) -> str:
    goals = {f["goal"] for _, f in pair if f.get("goal")}
    if not goals:
        return ""
    verdicts = [(b, f["goal_met"]) for b, f in pair if f.get("goal_met") is not None]
    said = {m for _, m in verdicts}
    if len(said) == 1:
        verdict = "**met**" if said.pop() else "**not met**"
    else:
        verdict = "; ".join(f"{b}: **{'met' if m else 'not met'}**" for b, m in verdicts)
    return f"{' / '.join(sorted(goals))}: {verdict}"


def summary(results: dict[str, Any]) -> str:
    """The README's table of `results`: the HEADLINES figures, median (min / median / max over the
    repeats), the same-run figure each is compared with, its goal and whether it is met, and the run."""
    out = ["| what | embedded broker | Apache Kafka | compared with, same run | goal | measured |",
           "|---|---|---|---|---|---|"]
    for base, label in HEADLINES:
        pair = _pair(results, base)
        if not pair:
            continue
        by = dict(pair)
        value = {b: _value(by[b]) if b in by else "—" for b in ("embedded", "Apache Kafka")}
        if "none" in by:  # measured without a broker: one value, in the first column
            value["embedded"] = f"{_value(by['none'])} (no broker)"
        against = "; ".join(f"{b}: {a}" if len(pair) > 1 else a
                            for b, f in pair if (a := _against({**f, "vs_embedded": None})))
        runs = " · ".join(dict.fromkeys(_run_of(results, f) for _, f in pair))
        out.append(f"| {label} | {_cell(value['embedded'])} | {_cell(value['Apache Kafka'])} | "
                   f"{_cell(against) or '—'} | {_cell(_status(pair)) or '—'} | {runs} |")
    return "\n".join(out)


def with_summary(readme: str, results: dict[str, Any]) -> str:
    """`readme` with the text between its summary markers replaced by `summary(results)`."""
    head, begin, rest = readme.partition(README_BEGIN)
    _, end, tail = rest.partition(README_END)
    if not begin or not end:
        raise ValueError(f"the README has no {README_BEGIN!r} ... {README_END!r} block")
    return f"{head}{README_BEGIN}\n{summary(results)}\n{README_END}{tail}"
