"""/metrics series for alerts and pipeline panels: active findings, source health, XID times, data age."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from periscope.core.findings import health_findings
from periscope.core.model import Finding, SourceHealth
from services.api.findings_series import FindingsCollector
from services.api.status import ConsumerStatus
from services.api.view import View
from tests.unit.test_api_metrics import scrape
from tests.unit.test_api_samples import GPU_A0, GPU_B0, MIG_B0, T0, sample_view


def collect(view: View) -> dict[str, list[Sample]]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FindingsCollector(view))
    out: dict[str, list[Sample]] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def with_findings(*findings: Finding) -> View:
    v = sample_view()
    for f in findings:
        v.apply(f)
    return v


def test_active_findings_are_counted_by_kind_and_node_with_zeros() -> None:
    unattributed = Finding(
        kind="unattributed-usage", key=GPU_A0, node="gpu-a", at_ms=T0, id=f"unattributed/{GPU_A0}"
    )
    cleared = Finding(kind="idle", key="uid-x", node="gpu-b", at_ms=T0, id="idle/uid-x", active=False)
    m = collect(with_findings(unattributed, cleared))
    got = {(s.labels["kind"], s.labels["node"]): s.value for s in m["periscope_findings_active"]}
    kinds = {"idle", "unattributed-usage", "ambiguous-join", "source-health"}  # XIDs are events
    assert set(got) == {(k, n) for k in kinds for n in ("gpu-a", "gpu-b")}
    assert got[("unattributed-usage", "gpu-a")] == 1 and got[("idle", "gpu-b")] == 0
    assert sum(got.values()) == 1


def test_source_health_names_source_and_state_per_node() -> None:
    health = [
        SourceHealth("checkpoint", "corrupt", "checksum mismatch"),
        SourceHealth("podresources", "absent", "no socket"),
        SourceHealth("dra", "disabled"),  # a choice, not a fault
    ]
    m = collect(with_findings(*health_findings("gpu-b", T0, health)))
    got = {(s.labels["node"], s.labels["source"], s.labels["state"]) for s in m["periscope_source_unhealthy"]}
    assert got == {("gpu-b", "checkpoint", "corrupt"), ("gpu-b", "podresources", "absent")}
    active = {(s.labels["kind"], s.labels["node"]): s.value for s in m["periscope_findings_active"]}
    assert active[("source-health", "gpu-b")] == 2 and active[("source-health", "gpu-a")] == 0


def test_xid_times_carry_the_owner_at_the_time() -> None:
    m = collect(sample_view())
    got = {
        (s.labels["gpu_uuid"], s.labels["code"], s.labels["pod_uid"]): s.value
        for s in m["periscope_xid_last_timestamp_seconds"]
    }
    assert got == {
        (GPU_A0, "79", "uid-busy"): (T0 - 5 * 60_000) / 1000,
        (GPU_A0, "48", "uid-gone"): (T0 - 50 * 60_000) / 1000,
        (GPU_B0, "94", "uid-mig"): (T0 - 60_000) / 1000,
    }


async def test_the_app_exports_them_with_mig_layout_and_allocation_rows() -> None:
    m = await scrape(sample_view(), ConsumerStatus(group_id="g"))
    assert "periscope_api_data_age_seconds" in m and "periscope_findings_active" in m
    (mig,) = m["periscope_gpu_mig_owners"]
    assert mig.labels["gpu_uuid"] == GPU_B0 and mig.labels["mig_profile"] == "1g.10gb"
    assert (mig.labels["gi"], mig.labels["ci"], mig.value) == ("2", "0", 1.0)
    allocated = {s.labels["pod_uid"]: s for s in m["periscope_pod_gpu_allocated"]}
    assert set(allocated) == {"uid-busy", "uid-idle", "uid-mig"}  # active rows, util known or not
    assert allocated["uid-mig"].labels["device_id"] == MIG_B0
