"""The materialized view: replace-by-key, idempotent, never regresses, indexes stay right."""

from __future__ import annotations

from dataclasses import replace

from periscope.core.model import NodeEvent, PolicyEvent
from services.api import compact
from services.api.view import View
from tests.unit.test_api_samples import (
    GPU_A0,
    GPU_A1,
    GPU_B0,
    MIN,
    T0,
    gpu,
    meta,
    owner,
    pod,
    row,
    sample_view,
    xid,
)


def test_pod_state_replaces_the_pods_rows() -> None:
    v = View()
    assert v.apply(pod("u1", "ml", "a", "gpu-a", row(GPU_A0), row(GPU_A1), as_of=T0))
    assert [k[4] for k in v.row_keys()] == [GPU_A0, GPU_A1]
    # The next full state holds only one device: the other row must disappear, not linger.
    assert v.apply(pod("u1", "ml", "a", "gpu-a", row(GPU_A1, util_pct=3.0), as_of=T0 + 1000))
    keys = v.row_keys()
    assert [k[4] for k in keys] == [GPU_A1]
    assert v.row(keys[0])[1].util_pct == 3.0
    assert v.row_keys(node="gpu-a") == keys and v.row_keys(namespace="ml") == keys


def test_older_or_duplicate_states_are_ignored() -> None:
    v = View()
    new = pod("u1", as_of=T0 + 1000)
    old = pod("u1", "ml", "a", "gpu-a", row(GPU_A1), as_of=T0)
    assert v.apply(new)
    assert not v.apply(new)  # at-least-once delivery: same record again
    assert not v.apply(old)  # a replica reading from offset 0 sees history after newer states
    # The view holds a packed copy of the newer state (windows kept apart).
    assert v.pods["u1"] == compact.unpack_pod(compact.pod(new)) == new
    assert [k[4] for k in v.row_keys()] == [GPU_A0]

    g_new, g_old = gpu(GPU_A0, as_of=T0 + 1000), gpu(GPU_A0, util_pct=1.0, as_of=T0)
    assert v.apply(g_new) and not v.apply(g_old) and not v.apply(g_new)
    assert v.gpus[GPU_A0].util_pct == 80.0


def test_applying_in_any_order_converges_on_the_newest_state() -> None:
    states = [pod("u1", "ml", "a", "gpu-a", row(GPU_A0, util_pct=float(i)), as_of=T0 + i) for i in range(5)]
    a, b = View(), View()
    for s in states:
        a.apply(s)
    for s in reversed(states + states):
        b.apply(s)
    assert a.pods == b.pods and a.row_keys() == b.row_keys()
    assert a.row(a.row_keys()[0])[1].util_pct == 4.0


def test_pod_moving_node_or_namespace_leaves_the_old_index() -> None:
    v = View()
    v.apply(pod("u1", "ml", "a", "gpu-a", as_of=T0))
    assert len(v.row_keys(node="gpu-a")) == 1
    v.apply(pod("u1", "prod", "a", "gpu-b", as_of=T0 + 1))
    assert v.row_keys(node="gpu-a") == [] and v.row_keys(namespace="ml") == []
    assert len(v.row_keys(node="gpu-b")) == 1 and len(v.row_keys(namespace="prod")) == 1


def test_rows_sort_by_namespace_pod_uid_container_device() -> None:
    v = View()
    v.apply(pod("u3", "b", "x", "n1", row("GPU-2", "c2"), row("GPU-1", "c2"), row("GPU-9", "c1")))
    v.apply(pod("u2", "a", "y", "n1"))
    v.apply(pod("u1", "b", "x", "n2"))  # same name as u3 (reused), other UID
    got = [(k[0], k[1], k[2], k[3], k[4]) for k in v.row_keys()]
    assert got == sorted(got)
    assert [k[2] for k in got] == ["u2", "u1", "u3", "u3", "u3"]
    assert [k[4] for k in got[2:]] == ["GPU-9", "GPU-1", "GPU-2"]


def test_sorted_slices_are_rebuilt_after_a_change() -> None:
    v = View()
    v.apply(pod("u1", "ml", "a", "gpu-a"))
    assert len(v.row_keys()) == 1 and len(v.row_keys(node="gpu-a")) == 1  # now cached
    v.apply(pod("u2", "ml", "b", "gpu-a"))
    assert len(v.row_keys()) == 2 and len(v.row_keys(node="gpu-a")) == 2
    assert len(v.row_keys(namespace="ml", node="gpu-a")) == 2
    assert v.row_keys(namespace="ml", node="gpu-b") == [] and v.row_keys(node="nope") == []


def test_gpu_keys_sort_by_node_index_uuid_and_follow_moves() -> None:
    v = sample_view()
    assert v.gpu_keys() == [("gpu-a", 0, GPU_A0), ("gpu-a", 1, GPU_A1), ("gpu-b", 0, GPU_B0)]
    assert v.gpu_keys("gpu-b") == [("gpu-b", 0, GPU_B0)]
    v.apply(gpu(GPU_A1, "gpu-b", 3, as_of=T0 + 1))
    assert v.gpu_keys("gpu-a") == [("gpu-a", 0, GPU_A0)]
    assert v.gpu_keys("gpu-b") == [("gpu-b", 0, GPU_B0), ("gpu-b", 3, GPU_A1)]


def test_findings_upsert_by_id_and_never_regress() -> None:
    v = View()
    f = xid(GPU_A0, T0, 79, owner("u1"))
    assert v.apply(f) and not v.apply(f)
    cleared = replace(f, active=False, at_ms=T0 + MIN)
    assert v.apply(cleared)
    assert not v.apply(f)  # the older, still-active copy must not come back
    assert v.findings[f.id].active is False
    assert v.xid_keys() == [(T0 + MIN, "gpu-a", GPU_A0, f.id)]


def test_xid_keys_are_in_time_order() -> None:
    v = sample_view()
    ats = [k[0] for k in v.xid_keys()]
    assert ats == sorted(ats) and len(ats) == 3


def test_latest_policy_and_node_events_win() -> None:
    v = View()
    p1 = PolicyEvent(meta=meta(T0), crd="installed", name="cluster-policy", state="ready")
    p0 = replace(p1, meta=meta(T0 - 1), state="notReady")
    assert v.apply(p1) and not v.apply(p0)
    assert v.policy is not None and v.policy.state == "ready"
    n1 = NodeEvent(meta=meta(T0, "gpu-a"), name="gpu-a", unschedulable=True)
    assert v.apply(n1) and not v.apply(replace(n1, meta=meta(T0 - 1, "gpu-a"), unschedulable=False))
    assert v.nodes["gpu-a"].unschedulable


def test_unknown_objects_are_ignored() -> None:
    v = View()
    assert not v.apply(object())
    assert v.as_of_ms == 0 and v.row_count() == 0


def test_100k_rows_node_filter_and_gpus_answer_correctly() -> None:
    v = View()
    nodes, per_pod = 500, 4
    for i in range(25_000):
        node = f"node-{i % nodes:03d}"
        rows = [row(f"GPU-{i % nodes:03d}-{d}", "cuda") for d in range(per_pod)]
        v.apply(pod(f"uid-{i:05d}", f"ns-{i % 7}", f"pod-{i:05d}", node, *rows))
    for n in range(nodes):
        for d in range(per_pod):
            v.apply(gpu(f"GPU-{n:03d}-{d}", f"node-{n:03d}", d))
    assert v.row_count() == 100_000
    keys = v.row_keys(node="node-042")
    assert len(keys) == 25_000 // nodes * per_pod
    assert {v.row(k)[0].node for k in keys} == {"node-042"}
    assert keys == sorted(keys)
    both = v.row_keys(node="node-042", namespace="ns-3")
    assert both == [k for k in keys if k[0] == "ns-3"] and both
    assert len(v.gpu_keys()) == nodes * per_pod
    assert v.gpu_keys("node-042") == [("node-042", d, f"GPU-042-{d}") for d in range(per_pod)]
    # An update touches one pod; the node slice reflects it on the next read.
    v.apply(pod("uid-00042", "ns-0", "pod-00042", "node-042", row("GPU-042-0"), as_of=T0 + 1))
    assert len(v.row_keys(node="node-042")) == len(keys) - (per_pod - 1)
    assert v.row_count() == 100_000 - (per_pod - 1)


def test_evict_forgets_only_what_is_over_and_old() -> None:
    v = sample_view()
    old_gpu = gpu("GPU-vanished", "gpu-c", 0, as_of=T0 - 50 * MIN)
    v.apply(old_gpu)
    v.apply(NodeEvent(meta=meta(T0 - 50 * MIN, "gpu-c"), name="gpu-c", deleted=True))
    v.apply(replace(xid(GPU_A0, T0 - 45 * MIN, 31), id="cleared", kind="idle", active=False))
    assert v.row_keys(node="gpu-a") and v.xid_keys()  # caches built before eviction
    n = v.evict(T0 - 30 * MIN)
    # uid-gone (released, 40 min old), the vanished GPU, the 50-min-old XID, the cleared finding, the
    # deleted node; active pods, fresh GPUs, recent XIDs stay.
    assert n == 5
    assert set(v.pods) == {"uid-busy", "uid-idle", "uid-mig"} and "GPU-vanished" not in v.gpus
    assert [k[2] for k in v.row_keys(node="gpu-a")] == ["uid-idle", "uid-busy"]
    assert [k[0] for k in v.xid_keys()] == [T0 - 5 * MIN, T0 - MIN]
    assert "cleared" not in v.findings and "gpu-c" not in v.nodes
    assert v.gpu_keys("gpu-c") == [] and v.evict(T0 - 30 * MIN) == 0
