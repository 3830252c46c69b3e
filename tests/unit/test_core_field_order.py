"""The core builds its per-sample objects positionally (rows.ROW_FIELDS says why); each such call site
names the field order it passes, and that order must be the dataclass's own. A field added to, moved in
or removed from one of these types fails here, pointing at the call site to update."""

from __future__ import annotations

import dataclasses

import pytest

from periscope.core import rows, usage, views
from periscope.core.model import AttributionRow, GpuState, PodAttribution

SITES = [
    (AttributionRow, rows.ROW_FIELDS, "periscope.core.rows.RowState.to_row"),
    (PodAttribution, views.POD_FIELDS, "periscope.core.views.pod_attribution"),
    (GpuState, views.GPU_FIELDS, "periscope.core.views.gpu_states"),
    (usage.Usage, usage.USAGE_FIELDS, "periscope.core.usage.single_usage"),
]


@pytest.mark.parametrize(("cls", "order", "site"), SITES, ids=[c.__name__ for c, _, _ in SITES])
def test_positional_call_sites_follow_the_field_order(cls: type, order: tuple[str, ...], site: str) -> None:
    names = tuple(f.name for f in dataclasses.fields(cls))
    assert names == order, f"{cls.__name__}'s fields changed: update the positional call in {site}"


def test_to_row_puts_each_value_in_its_field() -> None:
    """Every value `to_row` passes lands in the field of the same name (distinct values throughout)."""
    from periscope.core.model import DcgmProfile, MigRef

    r = rows.RowState(pod_uid="uid", namespace="ns", pod="p", container="c", device_id="dev", gpu_uuid="gpu",
                      mig=MigRef("MIG-x", "1g.10gb", 1, 2), first_seen_ms=11, unresolved="why")
    r.usage = usage.Usage(1.5, 2.5, 3.5, "mps", "process", 0.25, True,
                          DcgmProfile(sm_active_pct=4.5, sm_occupancy_pct=5.5, tensor_active_pct=6.5,
                                      dram_active_pct=7.5), False)
    r.active, r.idle, r.last_seen_ms, r.sources, r.idle_since_ms = True, False, 12, ("checkpoint",), 0
    r.avg_util_pct, r.sample_ms = 8.5, 13
    row = r.to_row()
    assert dataclasses.asdict(row) == dataclasses.asdict(AttributionRow(
        container="c", device_id="dev", gpu_uuid="gpu", sharing="mps", share_basis="process",
        mig=MigRef("MIG-x", "1g.10gb", 1, 2), util_pct=1.5, fb_used_mib=2.5, power_w=3.5, active=True,
        idle=False, first_seen_ms=11, last_seen_ms=12, sources=("checkpoint",), idle_since_ms=0,
        avg_util_pct=8.5, wasted_gpu_hours=0.0, gpu_fraction=0.25, windows=(), sample_ms=13,
        unresolved="why", sm_active_pct=4.5, sm_occupancy_pct=5.5, tensor_active_pct=6.5, dram_active_pct=7.5,
    ))


def test_a_sample_without_processes_keeps_every_other_field() -> None:
    from periscope.core.model import DcgmProfile, DeviceSample, Meta, MigRef, NodeTelemetry, ProcessSample

    busy = DeviceSample("MIG-1", "GPU-1", 3, MigRef("MIG-1", "1g.10gb", 1, 2), 1.5, 2.5, 3.5, 4.5, 5.5, 6.5,
                        True, (ProcessSample(7, "uid", "cid", "guaranteed", 1.0, 2.0, 3.0),), "err",
                        DcgmProfile(sm_active_pct=7.5))
    idle = DeviceSample("GPU-2", index=1, util_pct=0.0)
    tel = NodeTelemetry(Meta("n", "probe/n", 1, 2, 3), (busy, idle))
    got = tel.without_processes()
    assert got == dataclasses.replace(tel, devices=(dataclasses.replace(busy, processes=()), idle))
    assert got.devices[1] is idle and got.without_processes() is got
