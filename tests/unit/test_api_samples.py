"""Builders of joiner outputs for the API tests, and checks that the samples say what the tests assume."""

from __future__ import annotations

from dataclasses import replace

from periscope.core.model import (
    AttributionRow,
    Finding,
    GpuState,
    Meta,
    MigRef,
    MigState,
    NodeEvent,
    OperandStatus,
    Owner,
    PodAttribution,
    PolicyEvent,
    WindowStat,
    XidRef,
)
from services.api.view import View

T0 = 1_795_320_306_789  # 2026-11-22T04:05:06.789Z
T0_TEXT = "2026-11-22T04:05:06.789Z"
MIN = 60_000
GPU_A0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
GPU_A1 = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
GPU_B0 = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
MIG_B0 = "MIG-bbbbbbbb-0000-4000-8000-00000000000a"


def row(device_id: str = GPU_A0, container: str = "cuda", **kw: object) -> AttributionRow:
    base = AttributionRow(
        container=container,
        device_id=device_id,
        gpu_uuid=str(kw.pop("gpu_uuid", device_id.split("::")[0])),
        sharing="exclusive",
        share_basis="exclusive",
        util_pct=80.0,
        fb_used_mib=2048.0,
        power_w=250.0,
        first_seen_ms=T0 - 30 * MIN,
        last_seen_ms=T0,
        sources=("checkpoint", "podresources"),
        sample_ms=T0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def pod(
    uid: str,
    ns: str = "ml",
    name: str = "train-0",
    node: str = "gpu-a",
    *rows: AttributionRow,
    as_of: int = T0,
    **kw: object,
) -> PodAttribution:
    base = PodAttribution(
        pod_uid=uid,
        namespace=ns,
        pod=name,
        node=node,
        rows=tuple(rows) or (row(),),
        owner_kind="ReplicaSet",
        owner_name="train-7486d6bbb5",
        phase="Running",
        created_ms=T0 - 31 * MIN,
        as_of_ms=as_of,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def owner(uid: str, ns: str = "ml", name: str = "train-0", device_id: str = GPU_A0) -> Owner:
    return Owner(pod_uid=uid, namespace=ns, pod=name, container="cuda", device_id=device_id)


def gpu(
    uuid: str, node: str = "gpu-a", index: int = 0, *owners: Owner, as_of: int = T0, **kw: object
) -> GpuState:
    base = GpuState(
        node=node,
        gpu_uuid=uuid,
        model="NVIDIA A100-SXM4-80GB",
        index=index,
        util_pct=80.0,
        fb_used_mib=2048.0,
        fb_total_mib=81920.0,
        power_w=250.0,
        temp_c=61.0,
        owners=tuple(owners),
        sample_ms=as_of,
        as_of_ms=as_of,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def xid(
    gpu_uuid: str, at: int, code: int = 79, *owners: Owner, node: str = "gpu-a", mig: MigRef | None = None
) -> Finding:
    return Finding(
        kind="xid-owner",
        key=gpu_uuid,
        node=node,
        at_ms=at,
        id=f"xid/{gpu_uuid}/{at}/{code}",
        gpu_uuid=gpu_uuid,
        mig=mig,
        xid_code=code,
        owners=tuple(owners),
        message=f"XID {code} on {gpu_uuid}",
    )


def idle_windows(pct: float, n: int = 30, end: int = T0) -> tuple[WindowStat, ...]:
    """n one-minute windows ending at `end`, 60 samples each at `pct` % utilization, a whole GPU held
    (idle below 5 %), 1 GiB and 100 W."""
    start = end - end % MIN
    return tuple(
        WindowStat(start - i * MIN, 60, pct * 60, 60, 1024.0, 60 * 100.0, gpu_ms=MIN,
                   used_gpu_ms=pct / 100 * MIN, idle_gpu_ms=MIN if pct < 5 else 0.0, fb_mib_ms=1024.0 * MIN,
                   energy_j=6000.0, request_gpu_ms=MIN, alloc_basis="exclusive")
        for i in reversed(range(n))
    )


def meta(t: int, node: str = "") -> Meta:
    return Meta(node=node, source="kube-watcher", epoch=1, seq=t, time_ms=t)


def sample_view() -> View:
    """Two nodes: an exclusive busy pod, an idle pod, a MIG pod, a deleted pod, XIDs, policy."""
    v = View()
    busy = pod("uid-busy", "ml", "train-0", "gpu-a", row(GPU_A0))
    idle = pod(
        "uid-idle",
        "ml",
        "notebook-0",
        "gpu-a",
        row(
            GPU_A1,
            util_pct=1.0,
            idle=True,
            idle_since_ms=T0 - 20 * MIN,
            avg_util_pct=1.0,
            wasted_gpu_hours=20 / 60,
            windows=idle_windows(1.0),
        ),
    )
    mig = pod(
        "uid-mig",
        "infer",
        "serve-0",
        "gpu-b",
        row(
            MIG_B0,
            gpu_uuid=GPU_B0,
            sharing="mig",
            util_pct=None,
            mig=MigRef(MIG_B0, "1g.10gb", 2, 0),
            gpu_fraction=1 / 7,
        ),
    )
    gone = pod(
        "uid-gone",
        "ml",
        "train-0",
        "gpu-a",
        row(GPU_A0, active=False, util_pct=None),
        phase="Succeeded",
        deleted_ms=T0 - 40 * MIN,
        as_of=T0 - 40 * MIN,
    )
    for p in (busy, idle, mig, gone):
        v.apply(p)
    v.apply(gpu(GPU_A0, "gpu-a", 0, owner("uid-busy"), last_xid=XidRef(79, T0 - 5 * MIN)))
    v.apply(gpu(GPU_A1, "gpu-a", 1, owner("uid-idle", name="notebook-0", device_id=GPU_A1), util_pct=1.0))
    v.apply(
        gpu(
            GPU_B0,
            "gpu-b",
            0,
            sharing="mig",
            mig_devices=(
                MigState(
                    MIG_B0, "1g.10gb", 2, 0, 512.0, 9856.0, (owner("uid-mig", "infer", "serve-0", MIG_B0),)
                ),
            ),
        )
    )
    v.apply(xid(GPU_A0, T0 - 5 * MIN, 79, owner("uid-busy")))
    v.apply(xid(GPU_A0, T0 - 50 * MIN, 48, owner("uid-gone")))
    v.apply(
        xid(
            GPU_B0,
            T0 - MIN,
            94,
            owner("uid-mig", "infer", "serve-0", MIG_B0),
            node="gpu-b",
            mig=MigRef(MIG_B0, "1g.10gb", 2, 0),
        )
    )
    v.apply(
        PolicyEvent(
            meta=meta(T0 - MIN),
            crd="installed",
            name="cluster-policy",
            state="notReady",
            namespace="gpu-operator",
            components=(("dcgmExporter", False), ("devicePlugin", True)),
            operands=(OperandStatus("nvidia-device-plugin-daemonset", "devicePlugin", True, 2, 1, 1),),
        )
    )
    for n in ("gpu-a", "gpu-b"):
        v.apply(NodeEvent(meta=meta(T0 - MIN, n), name=n, labels=(("nvidia.com/gpu.present", "true"),)))
    return v


def test_sample_times_are_what_the_tests_assume() -> None:
    from periscope.contract.values import parse_time_ms, rfc3339

    assert rfc3339(T0) == T0_TEXT
    assert parse_time_ms(T0_TEXT) == T0


def test_sample_view_holds_every_kind_of_output() -> None:
    v = sample_view()
    assert v.row_count() == 4 and len(v.pods) == 4 and len(v.gpus) == 3
    assert len(v.xid_keys()) == 3 and v.policy is not None and set(v.nodes) == {"gpu-a", "gpu-b"}
    assert v.as_of_ms == T0
