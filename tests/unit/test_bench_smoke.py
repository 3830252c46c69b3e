"""The benchmark harness still runs: its cheapest parts at tiny sizes. No timing is asserted; what is
checked is that the workload means what the figures say it means and that results are well formed."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import api, common, freshness, hotspots, probe, replay, replay_hour, report, run
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


def test_percentile_sizes_and_profile_parsing() -> None:
    assert common.percentile([5, 1, 4, 2, 3], 50) == 3
    assert common.percentile(range(1, 101), 99) == 99
    assert common.deep_size([b"x" * 1000]) > 1000
    text = ("main (/x/site-packages/faust/a.py);step (/r/periscope/core/engine.py) 3\n"
            "main (/x/site-packages/faust/a.py) 1\n")
    s = hotspots.summarize_collapsed(text)
    assert s["samples"] == 4
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
    fig = results["figures"]["replay_device_samples_per_s"]
    assert results["replay_device_samples_per_s"] == fig["value"] and fig["goal"] and fig["setup"]
    assert run.main(["--markdown", "--out", str(out)]) == 0
    md = capsys.readouterr().out
    assert "| `replay_device_samples_per_s` |" in md and "| figure | value | goal |" in md
    assert "replay_device_samples_per_s" in report.table(results)


def test_run_rejects_an_unknown_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--only", "nope"]) == 2
    assert "unknown section 'nope'" in capsys.readouterr().err
