"""The simulator's dcgm-exporter held to the real exporter's published format (the conformance fixture
tests/unit/data/corpus/dcgm/exporter.yaml): names, types, label set and order, units, MIG behaviour."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from periscope.sim.cluster.model import ClusterModel
from periscope.sim.dcgm import exposition_series, render
from periscope.sim.scenario import load_scenario

FIXTURE = Path(__file__).parent / "data" / "corpus" / "dcgm" / "exporter.yaml"
T_MS = 30_000


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    return yaml.safe_load(FIXTURE.read_text())


@pytest.fixture(scope="module")
def model() -> ClusterModel:
    return ClusterModel(load_scenario("demo"))


def text(model: ClusterModel, node: str) -> str:
    return render(exposition_series(node, model.usage(node, T_MS), model.holdings(T_MS, node)))


def samples(model: ClusterModel, node: str) -> list[Any]:
    return [s for fam in text_string_to_metric_families(text(model, node)) for s in fam.samples]


def test_names_types_and_help_are_the_counters_files(model: ClusterModel, facts: dict[str, Any]) -> None:
    families = list(text_string_to_metric_families(text(model, "gpu-a")))
    assert families
    for fam in families:
        assert fam.name in facts["fields"], fam.name
        assert fam.type == facts["fields"][fam.name][1]
        if fam.name in facts["help"]:
            assert fam.documentation == facts["help"][fam.name]


def test_labels_in_the_templates_order(model: ClusterModel, facts: dict[str, Any]) -> None:
    order = facts["labels"]["order"]
    for line in text(model, "gpu-a").splitlines():
        if line.startswith("#"):
            continue
        names = [kv.split("=", 1)[0] for kv in line[line.index("{") + 1 : line.index("}")].split('",')]
        fixed = [n for n in names if n in order]
        assert fixed == [n for n in order if n in fixed], line
        assert names[: len(fixed)] == fixed  # fixed labels first
        rest = names[len(fixed):]
        counters = [n for n in rest if n in facts["labels"]["label_counters"]]
        k8s = [n for n in rest if n not in counters]
        assert rest == counters + k8s and k8s == sorted(k8s)
        assert set(k8s) <= set(facts["labels"]["kubernetes"])
        assert {"gpu", "UUID", "device", "modelName", "Hostname"} <= set(names)


def test_units_prof_ratios_util_percent(model: ClusterModel, facts: dict[str, Any]) -> None:
    for node in ("gpu-a", "gpu-b", "gpu-c"):
        for s in samples(model, node):
            unit = facts["fields"][s.name][2]
            if unit == "ratio":
                assert 0.0 <= s.value <= 1.0, s
            if unit == "percent":
                assert 0.0 <= s.value <= 100.0
    # the whole A100 on gpu-a runs at 70 % at 30 s: percent for GPU_UTIL, a ratio for GR_ENGINE_ACTIVE
    whole = [s for s in samples(model, "gpu-a") if s.labels["gpu"] == "1"]
    util = {s.name: s.value for s in whole}
    assert util["DCGM_FI_DEV_GPU_UTIL"] == 70 and util["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.70)


def test_mig_series_per_instance_keyed_by_parent_and_gi(model: ClusterModel, facts: dict[str, Any]) -> None:
    gpu = model.gpus["gpu-a"][0]
    mig = [s for s in samples(model, "gpu-a") if "GPU_I_ID" in s.labels]
    assert {s.labels["UUID"] for s in mig} == {gpu.uuid}  # the parent, never MIG-...
    assert {s.labels["GPU_I_ID"] for s in mig} == {str(i.gi) for i in gpu.mig}
    per_field = [f for f, v in facts["fields"].items() if v[4] == "per-instance"]
    for f in per_field:
        assert {s.labels["GPU_I_ID"] for s in mig if s.name == f} == {str(i.gi) for i in gpu.mig}, f
    never = {f for f, v in facts["fields"].items() if v[4] == "never"}
    on_mig_gpu = [s for s in samples(model, "gpu-a") if s.labels["UUID"] == gpu.uuid]
    assert not [s for s in on_mig_gpu if s.name in never]  # no GPU_UTIL on MIG (nor on its parent)
    whole = {f for f, v in facts["fields"].items() if v[4] == "whole-gpu"}
    assert all("GPU_I_ID" not in s.labels for s in on_mig_gpu if s.name in whole)
    # each held instance carries its holder, and its activity is the holder's util as a ratio
    train = [s for s in mig if s.labels.get("pod") == "train-llm-0"]
    gr = {s.name: s.value for s in train}["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    assert gr == pytest.approx(0.92) and train[0].labels["GPU_I_PROFILE"] == "3g.40gb"


def test_shared_gpu_series_copied_per_holder(model: ClusterModel) -> None:
    util = [s for s in samples(model, "gpu-b") if s.name == "DCGM_FI_DEV_GPU_UTIL"]
    assert len(util) == 3 and len({s.value for s in util}) == 1  # the incumbent's copy per pod
