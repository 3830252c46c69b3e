"""MPS in the core: memory-weighted split without per-process util, and the control daemon never
counted as a consumer of the GPU."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from periscope.core.model import NodeInput, PodEvent
from periscope.core.mps import is_mps_daemon
from tests.unit.core_builders import alloc, dev, gpu, inventory, node_labels, pod, pr, proc, tel, uid
from tests.unit.test_core_engine import S, findings, last_pod, run

MPS = {"nvidia.com/gpu.sharing-strategy": "mps"}


def daemon_pod(n: int, t: int) -> PodEvent:
    ev = pod(n, "nvidia-device-plugin-mps-control-daemon-x7k2p", t, ns="gpu-operator")
    info = replace(ev.pod, owner_kind="DaemonSet", owner_name="nvidia-device-plugin-mps-control-daemon")
    return replace(ev, pod=info)


def mps_node(n: int, strategy: dict[str, str] = MPS) -> list[NodeInput]:
    g = gpu(0)
    events: list[NodeInput] = [inventory(), node_labels(0, **strategy)]
    events += [pod(i, f"p{i}", 0) for i in range(1, n + 1)]
    events.append(alloc(S, *(pr("ml", f"p{i}", (f"{g}::{i - 1}",)) for i in range(1, n + 1))))
    return events


def test_mps_without_per_process_util_splits_util_and_power_by_memory() -> None:
    g = gpu(0)
    procs = (proc(10, uid(1), None, 3000.0), proc(11, uid(2), None, 1000.0), proc(12, uid(2), None, None))
    _, outs = run([*mps_node(3), tel(2 * S, dev(g, 80.0, fb=4100.0, power=200.0, procs=procs))])
    a, b, c = (last_pod(outs, uid(n)).rows[0] for n in (1, 2, 3))
    assert {r.share_basis for r in (a, b, c)} == {"memory-weighted"}
    assert (a.util_pct, b.util_pct, c.util_pct) == (60.0, 20.0, 0.0)
    assert (a.power_w, b.power_w, c.power_w) == (150.0, 50.0, 0.0)
    assert (a.fb_used_mib, b.fb_used_mib, c.fb_used_mib) == (3000.0, 1000.0, 0.0)


def test_mps_with_per_process_util_still_splits_by_process() -> None:
    g = gpu(0)
    procs = (proc(10, uid(1), 10.0, 3000.0), proc(11, uid(2), 30.0, 1000.0))
    _, outs = run([*mps_node(2), tel(2 * S, dev(g, 40.0, procs=procs))])
    a, b = (last_pod(outs, uid(n)).rows[0] for n in (1, 2))
    assert {a.share_basis, b.share_basis} == {"process"}
    assert (a.util_pct, b.util_pct) == (10.0, 30.0)


def test_time_slicing_without_per_process_util_stays_an_equal_split() -> None:
    g = gpu(0)
    procs = (proc(10, uid(1), None, 3000.0), proc(11, uid(2), None, 1000.0))
    ts = {"nvidia.com/gpu.sharing-strategy": "time-slicing"}
    _, outs = run([*mps_node(2, ts), tel(2 * S, dev(g, 80.0, procs=procs))])
    a, b = (last_pod(outs, uid(n)).rows[0] for n in (1, 2))
    assert {a.share_basis, b.share_basis} == {"equal-split"} and a.util_pct == b.util_pct == 40.0


def test_mps_without_any_memory_figure_falls_back_to_an_equal_split() -> None:
    g = gpu(0)
    procs = (proc(10, uid(1), None, None), proc(11, uid(2), None, None))
    _, outs = run([*mps_node(2), tel(2 * S, dev(g, 80.0, procs=procs))])
    assert {last_pod(outs, uid(n)).rows[0].share_basis for n in (1, 2)} == {"equal-split"}


def test_the_mps_daemon_pods_process_is_neither_a_consumer_nor_unattributed() -> None:
    g = gpu(0)
    server = proc(77, uid(9), 90.0, 300.0)  # a driver charging the clients' work to the server
    procs = (server, proc(10, uid(1), 25.0, 3000.0), proc(11, uid(2), 5.0, 1000.0))
    _, outs = run([*mps_node(2), daemon_pod(9, 0), tel(2 * S, dev(g, 30.0, power=120.0, procs=procs))])
    a, b = (last_pod(outs, uid(n)).rows[0] for n in (1, 2))
    assert (a.util_pct, b.util_pct) == (25.0, 5.0)
    assert math.isclose(a.power_w or 0.0, 100.0) and math.isclose(b.power_w or 0.0, 20.0)
    assert findings(outs, "unattributed-usage") == []
    # The same process in an ordinary pod is unattributed usage: the exclusion is by the daemon's pod.
    other = pod(9, "not-a-daemon", 0, ns="gpu-operator")
    _, outs = run([*mps_node(2), other, tel(2 * S, dev(g, 30.0, procs=procs))])
    assert [f.pids for f in findings(outs, "unattributed-usage")][-1] == (77,)


def test_daemon_recognised_by_owner_or_by_pod_name() -> None:
    assert is_mps_daemon(daemon_pod(1, 0).pod)
    helm = replace(pod(2, "nvdp-nvidia-device-plugin-mps-control-daemon-abcde", 0).pod)
    assert is_mps_daemon(helm)
    assert not is_mps_daemon(pod(3, "mps-control-daemon-client", 0).pod)
    assert not is_mps_daemon(pod(4, "train-0", 0).pod)


@settings(max_examples=40, deadline=None)
@given(
    util=st.floats(0, 100),
    # NVML reports usedGpuMemory in whole bytes: MiB values are multiples of 2**-20, never subnormal.
    mems=st.lists(st.integers(0, 40000 * 2**20).map(lambda b: b / 2**20), min_size=2, max_size=5),
)
def test_memory_weighted_shares_add_up_to_the_device(util: float, mems: list[float]) -> None:
    g = gpu(0)
    n = len(mems)
    procs = tuple(proc(100 + i, uid(i + 1), None, m) for i, m in enumerate(mems))
    _, outs = run([*mps_node(n), tel(2 * S, dev(g, util, power=200.0, procs=procs))])
    rows = [last_pod(outs, uid(i + 1)).rows[0] for i in range(n)]
    total = sum(mems)
    if total <= 0:
        assert {r.share_basis for r in rows} == {"equal-split"}
        return
    assert {r.share_basis for r in rows} == {"memory-weighted"}
    assert math.isclose(sum(r.util_pct or 0.0 for r in rows), util, abs_tol=0.01 * n)
    assert math.isclose(sum(r.power_w or 0.0 for r in rows), 200.0, abs_tol=0.01 * n)
    for r, m in zip(rows, mems, strict=True):
        assert math.isclose(r.util_pct or 0.0, util * m / total, abs_tol=0.01)
