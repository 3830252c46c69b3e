"""The synthetic cluster behind the replay benchmark, scaled down: its replay must make sense."""

from __future__ import annotations

from collections import Counter

from periscope.core.engine import EngineConfig
from periscope.core.model import Finding, GpuState, NodeTelemetry, PodAttribution, PodEvent, XidEvent
from periscope.core.rows import RowConfig
from periscope.devkit.workload import ClusterSpec, generate, node_name
from periscope.replay.runner import ReplayConfig, replay_events

SPEC = ClusterSpec(nodes=3, gpus_per_node=4, duration_ms=8 * 60_000, pod_lifetime_ms=180_000, gap_ms=10_000,
                   xid_every_ms=120_000, seed=3)
# Idle after 2 minutes below 5 %, so the scaled-down hour still shows idle pods.
CONFIG = ReplayConfig(engine=EngineConfig(rows=RowConfig(idle_window_ms=120_000)), latest_only=True)


def test_generation_is_deterministic_and_time_ordered() -> None:
    a, b = list(generate(SPEC)), list(generate(SPEC))
    assert a == b
    times = [e.meta.time_ms for e in a]
    assert times == sorted(times)
    assert list(generate(ClusterSpec(nodes=3, gpus_per_node=4, duration_ms=60_000, seed=4))) != a[:100]


def test_every_device_sample_is_replayed() -> None:
    events = list(generate(SPEC))
    assert sum(len(e.devices) for e in events if isinstance(e, NodeTelemetry)) == SPEC.device_samples
    result = replay_events(events, CONFIG)
    assert result.device_samples == SPEC.device_samples == 3 * 4 * 480
    assert result.samples == 3 * 480 and result.failed == 0


def test_replayed_attribution_is_sane() -> None:
    events = list(generate(SPEC))
    result = replay_events(events, CONFIG)
    kinds = Counter(o.kind for o in result.outputs if isinstance(o, Finding))
    # Names are reused but every holder is resolved by UID: nothing ambiguous, nothing unattributed.
    assert kinds["ambiguous-join"] == 0 and kinds["unattributed-usage"] == 0
    xids = [e for e in events if isinstance(e, XidEvent)]
    assert kinds["xid-owner"] == len(xids) == 11  # every 2 minutes per node, staggered by node
    for f in (o for o in result.outputs if isinstance(o, Finding) and o.kind == "xid-owner"):
        assert len(f.owners) <= 1 and all(o.pod_uid for o in f.owners)
    gpus = [o for o in result.outputs if isinstance(o, GpuState)]
    assert len(gpus) == 3 * 4 and all(g.util_pct is not None for g in gpus)
    pods = {o.pod_uid: o for o in result.outputs if isinstance(o, PodAttribution)}
    created = {e.pod.uid for e in events if isinstance(e, PodEvent)}
    assert set(pods) <= created and len(pods) >= 3 * 4 * 2  # pods were replaced at least once per GPU
    idle = {o.pod_uid for o in result.outputs if isinstance(o, Finding) and o.kind == "idle" and o.active}
    busy = {u for u, a in pods.items() if any(r.avg_util_pct and r.avg_util_pct > 50 for r in a.rows)}
    assert idle and busy and not idle & busy


def test_owners_match_the_generator_at_any_instant() -> None:
    events = list(generate(SPEC))
    states = replay_events(events, CONFIG).states
    alive: dict[str, tuple[str, int, int]] = {}
    for e in events:
        if isinstance(e, PodEvent):
            alive[e.pod.uid] = (e.pod.node, e.pod.created_ms, e.pod.deletion_ms)
    for t in (SPEC.start_ms + 65_000, SPEC.start_ms + 300_000):
        for n in range(SPEC.nodes):
            held = {h.pod_uid for h in states[node_name(n)].holdings_at(t)}
            # The snapshot taken at or before t names exactly the pods alive at that snapshot.
            snap_t = t - (t - SPEC.start_ms) % SPEC.alloc_every_ms
            truth = {u for u, (node, c, d) in alive.items()
                     if node == node_name(n) and c <= snap_t and (not d or d > snap_t)}
            assert held == truth
