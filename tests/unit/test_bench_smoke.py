"""The benchmark harness still runs: its cheapest parts at tiny sizes. No timing is asserted; what is
checked is that the workload means what the figures say it means and that results are well formed."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import api, common, dcgm_scrape, eos, freshness, hotspots, probe, replay, replay_hour, report, run
from bench.joiner import Progress
from bench.joiner_baseline import same_samples
from bench.workload import NodeShape, cluster_events, gpu_uuid, node_name, pod_uid
from periscope.bus import topics
from periscope.core import engine
from periscope.core.model import GpuState, NodeTelemetry, PodAttribution
from periscope.devkit.embedded import BrokerError, resolve_binary
from periscope.devkit.workload import ClusterSpec
from services.api.view import View


def test_workload_attributes_every_gpu_to_its_own_pod() -> None:
    events = list(cluster_events(nodes=2, ticks=5))
    kinds = Counter(t.name for t, _ in events)
    assert kinds[topics.TELEMETRY.name] == 10
    assert kinds[topics.PODS.name] == 16
    st = {n: engine.new_state(n) for n in {ev.meta.node for _, ev in events}}
    outs = [o for _, ev in events for o in engine.apply(st[ev.meta.node], ev)]
    pods = {o.pod_uid: o for o in outs if isinstance(o, PodAttribution)}
    assert len(pods) == 16
    row = pods[pod_uid(1, 3)].rows[0]
    assert (row.gpu_uuid, row.sharing, row.share_basis) == (gpu_uuid(1, 3), "exclusive", "exclusive")
    assert "process" in row.sources and "checkpoint" in row.sources
    assert sum(s.counters.unattributed_samples for s in st.values()) == 0


def test_probe_shape_is_eight_gpus_and_sixty_four_processes(tmp_path: Path) -> None:
    fig, breakdown = probe.sample_cpu(tmp_path, ticks=2, repeats=1)
    assert fig.key == "probe_sample_cpu_ms_per_tick" and fig.value is not None and fig.value > 0
    assert (fig.setup["gpus"], fig.setup["processes"]) == (8, 64)
    assert breakdown["telemetry_bytes"] > 0


def test_dcgm_scrape_figures_map_every_device() -> None:
    figs = {f.key: f for f in dcgm_scrape.run(iters=1, repeats=1)}
    assert figs["probe_dcgm_scrape_mig_ms"].setup["devices_annotated"] == 56
    assert figs["probe_dcgm_scrape_ms"].setup["devices_annotated"] == 8
    assert figs["probe_dcgm_scrape_mig_ms"].baseline == "probe_dcgm_bare_split_mig_ms"


def test_replay_figures() -> None:
    figs = {f.key: f for f in replay.run(nodes=2, ticks=5, repeats=1)}
    assert figs["replay_device_samples_per_s"].setup["device_samples"] == 2 * 5 * 8
    assert all(f.value and f.value > 0 for f in figs.values())
    speed, mem = replay.steady_state(nodes=1, minutes=2, measure_min=1)
    assert speed.value and speed.value > 0
    assert mem.key == "joiner_bytes_per_row" and mem.setup["rows"] == 8 and mem.value and mem.value > 1000


def test_replay_hour_replays_every_published_sample_through_the_cli(tmp_path: Path) -> None:
    try:
        resolve_binary()
    except BrokerError as e:
        pytest.skip(f"no embedded broker: {e}")
    spec = ClusterSpec(nodes=2, gpus_per_node=4, duration_ms=60_000, pod_lifetime_ms=30_000, gap_ms=5000)
    figs, details = replay_hour.run(spec, tmp_path)
    by_key = {f.key: f for f in figs}
    speed = by_key["replay_hour_device_samples_per_s"]
    assert speed.value and speed.value > 0 and by_key["replay_hour_speedup_vs_realtime"].value
    setup = speed.setup
    assert setup["device_samples_replayed"] == spec.device_samples == 2 * 4 * 60
    assert setup["events_published"] == setup["events_replayed"] == details["publish"]["stored"]
    # GPU states are published on change or heartbeat: as many as the core alone emits over the same events.
    from periscope.core.model import GpuState
    from periscope.devkit.workload import generate
    from periscope.replay.runner import replay_events

    core_gpu = sum(isinstance(o, GpuState) for o in replay_events(generate(spec)).outputs)
    assert setup["output_by_kind"]["gpu"] == core_gpu and 0 < core_gpu <= spec.device_samples
    assert setup["gpus_with_owner"] == 8
    # Pods were replaced (same names, new UIDs); one created in the last seconds may have no sample yet.
    assert 8 < setup["pods_attributed"] <= setup["pods_published"]
    assert setup["output_bytes"] > 0 and not any(tmp_path.glob("*.json"))


def test_timeline_scan_agrees_with_the_parsed_document(tmp_path: Path) -> None:
    from periscope.devkit.workload import generate
    from periscope.replay.document import json_chunks, output_json
    from periscope.replay.runner import replay_events

    spec = ClusterSpec(nodes=1, gpus_per_node=2, duration_ms=20_000, xid_every_ms=5000)
    outputs = replay_events(generate(spec)).outputs
    items = [output_json(o) for o in outputs]
    doc = {"from": "a", "to": "b", "filters": {"pod": None}, "items": items,
           "stats": {"device_samples": spec.device_samples}}
    path = tmp_path / "t.json"
    path.write_text("".join(json_chunks(doc)))
    scan = replay_hour.scan_timeline(path)
    assert scan["items"] == len(items) and scan["stats"] == doc["stats"]
    assert scan["by_kind"] == dict(Counter(i["kind"] for i in items))
    assert scan["findings"] == dict(Counter(i["finding"] for i in items if i["kind"] == "finding"))
    assert scan["pods"] == len({i["pod_uid"] for i in items if i["kind"] == "attribution"}) > 0
    owned = {i["key"] for i in items if i["kind"] == "gpu" and i["owners"]}
    assert scan["gpus_with_owner"] == len(owned) == 2
    path.write_text("".join(json_chunks({**doc, "items": []})))
    assert replay_hour.scan_timeline(path)["items"] == 0


def test_api_view_copies_are_independent_nodes() -> None:
    t = api.template(history_min=3, shape=NodeShape())
    assert len(t.pods) == 8 and len(t.gpus) == 8
    # Each closing record delivers one closed window per row (as the joiner publishes), never the open one.
    assert t.closes and all(len(r.windows) == 1 for batch in t.closes for pa in batch for r in pa.rows)
    view = View()
    api.feed(view, range(3), t, NodeShape())
    assert view.row_count() == 24 and len(view.gpus) == 24
    # The last records carry no windows; the view kept the ones delivered before, once each.
    starts = [w.start_ms for w in view.windows(view.pod_row_keys(pod_uid(2, 5))[0])]
    assert len(starts) == len(t.closes) >= 2 and starts == sorted(set(starts))
    pa = view.pods[pod_uid(2, 5)]
    assert pa.rows[0].gpu_uuid == gpu_uuid(2, 5) and pa.node == node_name(2)
    g = view.gpus[gpu_uuid(1, 0)]
    assert isinstance(g, GpuState) and g.owners[0].pod_uid == pod_uid(1, 0)
    assert isinstance(next(iter(view.pods.values())), PodAttribution)


def test_incumbent_staleness_quantiles() -> None:
    assert freshness.incumbent_staleness(50) == pytest.approx(22.5)
    assert freshness.incumbent_staleness(99) == pytest.approx(42.0)
    assert freshness.incumbent_staleness(1) < freshness.incumbent_staleness(10) < 15


def test_joiner_rate_spans_the_polls_between_ten_and_ninety_percent() -> None:
    progress = Progress([])
    progress.marks = [(1.0, 5.0), (2.0, 20.0), (3.0, 60.0), (4.0, 95.0)]
    assert progress.rate(100) == (75.0 / 2.0, 2.0, 4.0)
    # One poll saw the count pass both 10% and 90% (alignment released most samples at once): the span
    # starts at the poll before, rather than timing nothing.
    progress.marks = [(1.0, 5.0), (2.0, 100.0)]
    assert progress.rate(100) == (95.0, 1.0, 2.0)
    progress.marks = [(1.0, 100.0)]
    rate, _, _ = progress.rate(100)
    assert rate != rate  # done by the first poll: nothing to time
    progress.origin = (0.5, 0.0)  # ... unless it is known when the workers started
    assert progress.rate(100) == (200.0, 0.5, 1.0)


def test_joiner_cpu_is_counted_up_to_the_samples_the_bare_loop_joined() -> None:
    # (samples counted, worker CPU s since listening) at each poll; the bare loop joined 99,600 of 100,000:
    # the rest wait for the lateness, released seconds later by the worker's tick.
    polled = [(40_000.0, 1.0), (99_000.0, 2.4), (99_616.0, 2.5), (100_000.0, 2.8)]
    assert same_samples(polled, 99_600) == 1e6 * 2.5 / 99_616
    assert same_samples(polled, 100_000) == 1e6 * 2.8 / 100_000
    assert same_samples(polled, 100_001) is None  # never got there: no figure
    assert same_samples([], 10) is None


def test_output_ages_split_by_whether_the_next_tick_came_on_schedule() -> None:
    published = {"a": [1_000, 2_001, 4_000, 5_000], "b": [1_000, 2_150]}
    sampled = [("a", 1_000, 1.1), ("a", 2_001, 2.1), ("a", 4_000, 1.2), ("a", 5_000, 1.0),
               ("b", 1_000, 1.3), ("real", 1_000, 1.4)]
    split = freshness.on_schedule(sampled, published)
    # a's 2,001 waited for a tick sent 1,999 ms later; a's last and the real probe's have no known next.
    assert split["synthetic_next_tick_late"] == {"p50_s": 2.1, "p99_s": 2.1, "max_s": 2.1, "samples": 1}
    assert split["synthetic_next_tick_on_schedule"]["samples"] == 3
    assert split["synthetic_next_tick_on_schedule"]["max_s"] == 1.3


def test_freshness_spans_split_samples_by_event_time() -> None:
    # Spans of 10 s from t=100 s: a sample just before the first counts in it, one after the last in that.
    assert freshness.by_span([99_500, 100_000, 109_999, 110_000, 125_000, 140_000], 100.0, 10.0, 3) == [
        0, 0, 0, 1, 2, 2]
    ages = {("p", 101_000): 1.0, ("p", 102_000): 3.0, ("p", 111_000): 2.0, ("q", 101_000): 9.0}
    published = {"m": [101_000, 102_000, 111_000, 112_000]}
    sampled = [("m", 101_000, 0.5), ("m", 111_000, 0.7)]
    spans = freshness.span_quantiles(ages, sampled, published, {"p"}, 100.0, 10.0, 2)
    # q is not a headline node; each span has its own samples.
    assert [s["samples"] for s in spans] == [2, 1]
    assert spans[0]["p99_s"] == 3.0 and spans[1]["p50_s"] == 2.0
    assert [s["output_topic_p99_s"] for s in spans] == [0.5, 0.7]


def test_percentile_sizes_and_profile_parsing() -> None:
    assert common.percentile([5, 1, 4, 2, 3], 50) == 3
    assert common.percentile(range(1, 101), 99) == 99
    assert common.deep_size([b"x" * 1000]) > 1000
    text = ("main (/x/site-packages/faust/a.py);step (/r/periscope/core/engine.py) 3\n"
            "main (/x/site-packages/faust/a.py) 1\n"
            "main (/x/site-packages/faust/a.py);EpollSelector.select (/x/lib/python3.11/selectors.py) 4\n")
    s = hotspots.summarize_collapsed(text)
    assert s["samples"] == 4 and s["waiting_pct"] == 50.0  # the loop's poll is waiting, not work
    assert s["self"][0] == {"function": "step (engine.py)", "pct": 75.0,
                            "callers": [{"via": "main (faust/a.py)", "pct": 75.0}]}
    assert hotspots.short("/x/venv/lib/python3.11/site-packages/faust/app.py") == "faust/app.py"
    first = next(ev for _, ev in cluster_events(1, 1) if isinstance(ev, NodeTelemetry))
    assert len(first.devices) == 8 and len(first.devices[0].processes) == 1


def test_run_writes_results_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results.json"
    assert run.main(["--quick", "--only", "replay", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["mode"] == "quick" and results["errors"] == {}
    assert results["brokers"] == {}  # no section went through a broker
    fig = results["figures"]["replay_device_samples_per_s"]
    assert results["replay_device_samples_per_s"] == fig["value"] and fig["goal"] and fig["setup"]
    assert fig["broker"] is None and fig["min"] == fig["max"] == fig["value"]
    for when in ("load_before", "load_after"):
        assert len(results["machine"][when]["load_average_1_5_15_min"]) == 3
    assert run.main(["--markdown", "--out", str(out)]) == 0
    md = capsys.readouterr().out
    assert "| `replay_device_samples_per_s` | none |" in md and "| figure | broker | value | same run |" in md
    assert "load average (1/5/15 min)" in md
    assert f"full setup in {out}." in md  # the file it was read from, not always bench/results.json
    assert "replay_device_samples_per_s" in report.table(results)


def test_broker_sections_run_on_the_embedded_broker_with_labelled_figures(tmp_path: Path) -> None:
    try:
        resolve_binary()
    except BrokerError as e:
        pytest.skip(f"no embedded broker: {e}")
    out = tmp_path / "results.json"
    try:
        assert run.main(["--quick", "--only", "probe", "--broker", "embedded", "--out", str(out)]) == 0
    finally:
        common.use_broker("embedded")
    results = json.loads(out.read_text())
    assert list(results["brokers"]) == ["embedded"] and results["errors"] == {}
    figs = results["figures"]
    # On the embedded broker a figure keeps its name; the in-process part does not depend on a broker.
    assert figs["probe_cpu_ms_per_tick"]["broker"] == "embedded"
    assert "publishing to the embedded broker" in figs["probe_cpu_ms_per_tick"]["brief"]
    assert figs["probe_sample_cpu_ms_per_tick"]["broker"] is None
    assert figs["probe_cpu_ms_per_tick"]["baseline"]["figure"] == "probe_sample_cpu_ms_per_tick"
    # One dcgm-exporter scrape's parse + map, against a bare line split of the same text.
    for suffix in ("", "_mig"):
        scrape = figs[f"probe_dcgm_scrape{suffix}_ms"]
        assert scrape["broker"] is None and scrape["value"] > 0
        assert scrape["baseline"]["figure"] == f"probe_dcgm_bare_split{suffix}_ms"
    assert not any(k.startswith("kafka_") for k in figs)


def test_figures_measured_on_kafka_are_named_for_it_and_set_beside_the_embedded_ones() -> None:
    bench = run.Bench(run.QUICK, Path("."))

    def joiner_figures(rate: float) -> list[common.Figure]:
        return [common.Figure("joiner_device_samples_per_s", rate, "device-samples/s", {},
                              runs=[rate, 2 * rate], baseline="raw_consume_device_samples_per_s"),
                common.Figure("raw_consume_device_samples_per_s", 10 * rate, "device-samples/s", {}),
                common.Figure("incumbent_staleness_p99_s", 42.0, "s", {})]

    for kind, rate in (("embedded", 100.0), ("kafka", 50.0)):
        bench.broker = kind
        bench.add(joiner_figures(rate))
    assert sorted(bench.figures) == [
        "incumbent_staleness_p99_s", "joiner_device_samples_per_s", "kafka_joiner_device_samples_per_s",
        "kafka_raw_consume_device_samples_per_s", "raw_consume_device_samples_per_s"]
    kafka = bench.figures["kafka_joiner_device_samples_per_s"]
    assert kafka.broker == "kafka" and kafka.baseline == "kafka_raw_consume_device_samples_per_s"
    assert bench.figures["incumbent_staleness_p99_s"].broker is None
    figs = {k: f.as_json() for k, f in bench.figures.items()}
    run.compared(figs)
    assert figs["kafka_joiner_device_samples_per_s"]["baseline"] == {
        "figure": "kafka_raw_consume_device_samples_per_s", "value": 500.0, "ratio": 0.1}
    on_kafka = figs["kafka_joiner_device_samples_per_s"]
    assert on_kafka["vs_embedded"] == {"figure": "joiner_device_samples_per_s", "value": 100.0, "ratio": 0.5}
    assert (on_kafka["min"], on_kafka["max"]) == (50.0, 100.0)
    md = report.markdown({"figures": figs, "brokers": {"embedded": "e", "kafka": "k"}})
    row = next(line for line in md.splitlines() if line.startswith("| `kafka_joiner_device_samples_per_s`"))
    assert "| Apache Kafka |" in row and "50.0-100.0 (n=2)" in row
    assert "embedded broker: `joiner_device_samples_per_s` 100.0 (0.5x)" in row
    # The Kafka figure follows its embedded twin.
    keys = report._keys({"figures": figs})
    assert keys.index("kafka_joiner_device_samples_per_s") == keys.index("joiner_device_samples_per_s") + 1


def test_broker_sections_run_once_per_broker_and_eos_on_kafka_only() -> None:
    steps = run._steps(["replay", "joiner", "eos"], ["embedded", "kafka"])
    assert steps == [("replay", None), ("joiner", "embedded"), ("joiner", "kafka"), ("eos", "kafka")]
    assert run._steps(["replay", "joiner", "eos"], ["embedded"]) == [("replay", None), ("joiner", "embedded")]


def test_eos_figures_pair_the_guarantees() -> None:
    def one(rate: float, cpu: float, p99: float, markers: int) -> dict[str, object]:
        return {"records_per_s": rate, "worker_cpu_us_per_record": cpu, "broker_cpu_us_per_record": 1.0,
                "worker_cpu_util": 0.9, "start_to_backlog_done_s": 5.0,
                "live": {"p50_s": p99 / 2, "p99_s": p99, "outputs_timed": 10},
                "output_topic": {"markers": 0}, "changelog_topic": {"markers": markers}}

    runs = {"at_least_once": [one(1000, 100, 0.2, 0), one(800, 120, 0.3, 0)],
            "exactly_once": [one(500, 200, 3.0, 40), one(600, 180, 2.0, 30)]}
    figs, _ = eos.figures(runs, nodes=2, ticks=3, expected=6, live_rate=5, live_s=1, shape=NodeShape())
    by_key = {f.key: f for f in figs}
    assert by_key["eos_cpu_ratio"].runs == [2.0, 1.5] and by_key["eos_cpu_ratio"].value == 1.75
    assert by_key["eos_rate_ratio"].runs == [0.5, 0.75]
    assert by_key["eos_exactly_once_live_p99_s"].value == 2.5
    assert by_key["eos_exactly_once_records_per_s"].baseline == "eos_at_least_once_records_per_s"
    markers = by_key["eos_exactly_once_records_per_s"].setup["transaction_markers"]
    assert markers["exactly_once"]["changelog_markers"] == [40, 30]


def test_run_rejects_an_unknown_section_or_broker(capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--only", "nope"]) == 2
    assert "unknown section 'nope'" in capsys.readouterr().err
    assert run.main(["--broker", "nope"]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_api_load_runs_once_per_broker() -> None:
    # /v1/owners replays the broker, so the API under load is measured on each broker.
    steps = run._steps(["api", "api_load"], ["embedded", "kafka"])
    assert steps == [("api", None), ("api_load", "embedded"), ("api_load", "kafka")]


def test_replay_hour_on_kafka_is_compared_with_the_same_work_in_memory_and_on_the_embedded_broker() -> None:
    bench = run.Bench(run.QUICK, Path("."))
    bench.add([common.Figure("replay_parallel_device_samples_per_s", 4000.0, "device-samples/s", {}),
               common.Figure("replay_one_process_device_samples_per_s", 5000.0, "device-samples/s", {})])

    def hour(parallel: float) -> list[common.Figure]:
        return [common.Figure("replay_hour_device_samples_per_s", parallel, "device-samples/s", {}),
                common.Figure("replay_hour_one_process_device_samples_per_s", parallel / 2,
                              "device-samples/s", {}),
                common.Figure("replay_hour_parallel_vs_one_process_ratio", 2.0, "x", {})]

    for kind, rate in (("embedded", 2000.0), ("kafka", 1000.0)):
        bench.broker = kind
        figures = hour(rate)
        bench.in_memory_baselines(figures)
        bench.add(figures)
    figs = {k: f.as_json() for k, f in bench.figures.items()}
    run.compared(figs)
    on_kafka = figs["kafka_replay_hour_device_samples_per_s"]
    assert on_kafka["broker"] == "kafka"
    assert on_kafka["baseline"] == {"figure": "replay_parallel_device_samples_per_s", "value": 4000.0,
                                    "ratio": 0.25}
    assert on_kafka["vs_embedded"] == {"figure": "replay_hour_device_samples_per_s", "value": 2000.0,
                                       "ratio": 0.5}
    assert figs["kafka_replay_hour_one_process_device_samples_per_s"]["baseline"]["figure"] == \
        "replay_one_process_device_samples_per_s"
    assert figs["replay_hour_device_samples_per_s"]["baseline"]["ratio"] == 0.5
    assert figs["kafka_replay_hour_parallel_vs_one_process_ratio"]["vs_embedded"]["ratio"] == 1.0
    keys = report._keys({"figures": figs})
    twin = keys.index("replay_hour_device_samples_per_s")
    assert keys.index("kafka_replay_hour_device_samples_per_s") == twin + 1


def test_the_readme_table_is_the_one_results_json_gives() -> None:
    """One place for each figure: the README's table is generated from bench/results.json, and every
    figure with a goal there is in it."""
    root = Path(__file__).resolve().parents[2]
    results = json.loads((root / "bench" / "results.json").read_text())
    readme = (root / "README.md").read_text()
    assert report.with_summary(readme, results) == readme, "stale: run `bench/run.py --readme`"
    listed = {base for base, _ in report.HEADLINES}
    goals = {k.removeprefix("kafka_") if f.get("broker") == "kafka" else k
             for k, f in results["figures"].items() if f.get("goal")}
    assert goals - listed == set()


def test_the_summary_sets_brokers_side_by_side_with_goals_and_runs(tmp_path: Path) -> None:
    later = {"date": "2026-12-01T10:00:00Z", "machine": {"cpu_model": "Intel(R) Xeon(R) Processor"},
             "source": {"commit": "abc1234"}}
    figs = {
        "joiner_device_samples_per_s": {
            "value": 21000.0, "unit": "device-samples/s", "broker": "embedded", "goal": ">= 20,000",
            "goal_met": True, "min": 20000.0, "max": 22000.0, "runs": [20000.0, 21000.0, 22000.0],
            "baseline": {"figure": "raw", "value": 42000.0, "ratio": 0.5}, "setup": {"run": later}},
        "kafka_joiner_device_samples_per_s": {
            "value": 19000.0, "unit": "device-samples/s", "broker": "kafka", "goal": ">= 20,000",
            "goal_met": False, "runs": [19000.0], "setup": {}},
        "freshness_output_topic_p99_s": {"value": 1.6, "unit": "s", "broker": "embedded",
                                         "goal": "p99 < 1.5 s", "goal_met": False, "setup": {}},
        "kafka_freshness_output_topic_p99_s": {"value": 1.2, "unit": "s", "broker": "kafka",
                                               "goal": "p99 < 1.5 s", "goal_met": True, "setup": {}},
        "api_bytes_per_row": {"value": 1900.0, "unit": "bytes/row", "broker": None, "goal": "<= 2 KiB",
                              "goal_met": True, "setup": {}},
    }
    results = {"date": "2026-11-28T00:00:00Z", "machine": {"cpu_model": "AMD EPYC"},
               "source": {"commit": "def5678"}, "figures": figs}
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in report.summary(results).splitlines()}
    joiner = rows["joiner throughput, one worker, 12 partitions"]
    assert "| 21,000 device-samples/s (20,000 / 21,000 / 22,000) | 19,000 device-samples/s |" in joiner
    assert "embedded: `raw` 42,000 (0.5x)" in joiner
    assert ">= 20,000: embedded: **met**; Apache Kafka: **not met**" in joiner
    # Each figure's own run where it was merged in from a later one, else the file's.
    assert joiner.endswith("| 2026-12-01, Intel Xeon, abc1234 · 2026-11-28, AMD EPYC, def5678 |")
    topic = rows["freshness p99 at the output topic (marker samples, next tick on time)"]
    assert "| 1.6 s | 1.2 s |" in topic
    assert "p99 < 1.5 s: embedded: **not met**; Apache Kafka: **met**" in topic
    assert "| 1,900 bytes/row (no broker) | — |" in rows["API memory per row (an hour of windows each)"]
    assert "replay in memory, one process" not in rows  # not measured: no row
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{report.README_BEGIN}\nold\n{report.README_END}\ntail\n")
    out = tmp_path / "results.json"
    out.write_text(json.dumps(results))
    assert run._write_readme(out, readme) == 0
    text = readme.read_text()
    assert text.startswith(f"# x\n{report.README_BEGIN}\n| what |")
    assert text.endswith(f"{report.README_END}\ntail\n")
    assert "old" not in text and report.with_summary(text, results) == text
    readme.write_text("# no markers\n")
    assert run._write_readme(out, readme) == 2 and readme.read_text() == "# no markers\n"


def test_a_section_run_again_is_merged_with_its_run_named() -> None:
    run_of = {"mode": "full", "machine": {"cpu_model": "AMD EPYC"}}
    old = {**run_of, "date": "2026-11-28T00:00:00Z", "source": {"commit": "aaa"}, "replay_x": 1.0,
           "joiner_x": 2.0, "figures": {"replay_x": {"value": 1.0, "setup": {}}, "joiner_x": {"value": 2.0}},
           "details": {"replay": 1, "joiner": 2}, "partial_runs": [{"date": "2026-11-29T00:00:00Z"}]}
    new = {**run_of, "date": "2026-11-30T00:00:00Z", "source": {"commit": "bbb"}, "sections": ["joiner"],
           "wall_s": 9.0, "errors": {}, "figures": {"joiner_x": {"value": 3.0, "setup": {"nodes": 50}}},
           "details": {"joiner": 3}}
    out = run.merged(old, new, "after the fetch change")
    assert out["joiner_x"] == 3.0 and out["replay_x"] == 1.0
    assert out["figures"]["joiner_x"]["setup"] == {"nodes": 50, "run": {
        "date": "2026-11-30T00:00:00Z", "mode": "full", "machine": {"cpu_model": "AMD EPYC"},
        "source": {"commit": "bbb"}}}
    assert out["figures"]["replay_x"] == {"value": 1.0, "setup": {}}  # untouched, the file's own run
    assert out["details"] == {"replay": 1, "joiner": 3}
    assert [r["date"][:10] for r in out["partial_runs"]] == ["2026-11-30", "2026-11-29"]
    assert out["partial_runs"][0]["figures"] == ["joiner_x"] and out["source"] == {"commit": "aaa"}
    assert out["partial_runs"][0]["note"] == "after the fetch change"
    assert old["figures"]["joiner_x"] == {"value": 2.0}  # the old results are not changed in place
    # The summary then names each figure's own run.
    assert report._run_of(out, out["figures"]["joiner_x"]) == "2026-11-30, AMD EPYC, bbb"
    assert report._run_of(out, out["figures"]["replay_x"]) == "2026-11-28, AMD EPYC, aaa"


def test_the_machine_speed_probe_samples_while_a_run_goes_on_and_stops_after() -> None:
    async def measured() -> common.MachineSpeed:
        async with common.MachineSpeed(every_s=0.01) as speed:
            await asyncio.sleep(0.3)  # the run it watches
        taken = len(speed.ms)
        await asyncio.sleep(0.05)
        assert len(speed.ms) == taken  # nothing sampled once the run is over
        return speed

    speed = asyncio.run(measured())
    assert len(speed.ms) >= 2 and all(ms > 0 for ms in speed.ms)
    s = speed.summary()
    assert s["fixed_work_ms_min"] <= s["fixed_work_ms_median"] <= s["fixed_work_ms_max"]
    assert common.MachineSpeed().summary()["fixed_work_ms_median"] is None  # never started: not measured
