"""Ownership at an instant from replayed state: pod-name reuse, ambiguity, MIG, filters."""

from __future__ import annotations

import dataclasses

from periscope.contract.owners import owners_document
from periscope.core.model import Finding, NodeEvent, NodeInput, PodEvent
from periscope.replay.owners import owner_items
from periscope.replay.runner import ReplayConfig, replay_events
from tests.unit.core_builders import (
    NODE,
    alloc,
    ck,
    dev,
    gpu,
    inventory,
    mig,
    pod,
    pr,
    tel,
    uid,
    xid,
)

S = 1000
XID_TIMES = (30 * S, 60 * S + 500, 90 * S)  # old pod's, between the two, new pod's


def relocate(ev: NodeInput, node: str, base_ms: int) -> NodeInput:
    """The same event on another node, `base_ms` later (so tests on a shared broker do not collide)."""
    meta = dataclasses.replace(ev.meta, node=node, time_ms=ev.meta.time_ms + base_ms)
    if isinstance(ev, PodEvent):
        info = dataclasses.replace(
            ev.pod, node=node, created_ms=ev.pod.created_ms + base_ms,
            deletion_ms=ev.pod.deletion_ms + base_ms if ev.pod.deletion_ms else 0)
        return dataclasses.replace(ev, meta=meta, pod=info)
    if isinstance(ev, NodeEvent):
        return dataclasses.replace(ev, meta=meta, name=node)
    return dataclasses.replace(ev, meta=meta)


def reuse_scenario(node: str = NODE, base_ms: int = 0) -> list[NodeInput]:
    """GPU0: pod train-0 (uid 1) until 60 s, then a new train-0 (uid 2) from 61 s; GPU1: infer (uid 3).
    XIDs on GPU0 at 30 s, 60.5 s and 90 s; telemetry every 5 s. In event-time order."""
    g0, g1 = gpu(0), gpu(1)

    def snapshot(t: int, train_uid: str) -> NodeInput:
        return alloc(t, pr("ml", "train-0", (g0,)), ck(train_uid, (g0,)), pr("ml", "infer", (g1,)),
                     ck(uid(3), (g1,)))

    evs: list[NodeInput] = [
        inventory(0), pod(1, "train-0", 0), pod(3, "infer", 0), snapshot(1 * S, uid(1)),
        pod(1, "train-0", 0, deleted_at=60 * S), pod(2, "train-0", 61 * S), snapshot(62 * S, uid(2)),
        *(xid(t, g0) for t in XID_TIMES),
        *(tel(t * S, dev(g0, 50.0), dev(g1, 20.0, index=1)) for t in range(2, 121, 5)),
    ]
    evs.sort(key=lambda e: e.meta.time_ms)
    return [relocate(e, node, base_ms) for e in evs]


def owners_of(finding: Finding) -> set[tuple[str | None, str, str, str, str]]:
    return {(o.pod_uid or None, o.namespace, o.pod, o.container, o.device_id) for o in finding.owners}


def item_owners(items: list[dict[str, object]]) -> set[tuple[object, ...]]:
    return {(i["pod_uid"], i["namespace"], i["pod"], i["container"], i["device_id"]) for i in items}


def test_owners_follow_the_uid_across_a_reused_pod_name() -> None:
    result = replay_events(reuse_scenario())
    g0, g1 = gpu(0), gpu(1)
    at_30 = owner_items(result.states, 30 * S)
    assert [(i["gpu_uuid"], i["pod_uid"], i["pod"]) for i in at_30] == [
        (g0, uid(1), "train-0"), (g1, uid(3), "infer")]
    assert [i["pod_uid"] for i in owner_items(result.states, 90 * S, gpu_uuid=g0)] == [uid(2)]
    # Between the old pod's deletion and the new snapshot the name means nobody alive: not guessed.
    [gap] = owner_items(result.states, 60 * S + 500, gpu_uuid=g0)
    assert gap["pod_uid"] is None and gap["pod"] == "train-0"


def test_owners_at_each_xid_match_the_xid_owner_findings() -> None:
    result = replay_events(reuse_scenario())
    findings = {o.at_ms: o for o in result.outputs if isinstance(o, Finding) and o.kind == "xid-owner"}
    assert sorted(findings) == list(XID_TIMES)
    for t, finding in findings.items():
        items = owner_items(result.states, t, gpu_uuid=finding.gpu_uuid, node=NODE)
        assert item_owners(items) == owners_of(finding)


def test_item_shape_and_document() -> None:
    result = replay_events(reuse_scenario())
    doc = owners_document(30 * S, owner_items(result.states, 30 * S, pod_uid=uid(3)))
    assert doc == {"at": "1970-01-01T00:00:30.000Z", "items": [{
        "node": NODE, "gpu_uuid": gpu(1), "device_id": gpu(1), "mig": None, "pod_uid": uid(3),
        "namespace": "ml", "pod": "infer", "container": "cuda"}]}


def test_mig_owner_names_parent_gpu_and_instance_and_gpu_filter_matches_either() -> None:
    g, m = gpu(0), mig(1)
    res = "nvidia.com/mig-3g.40gb"
    events: list[NodeInput] = [
        inventory(0, migs=((1, "3g.40gb", 1, 0, 40192.0),)), pod(1, "nb", 0),
        alloc(S, pr("ml", "nb", (m,), resource=res), ck(uid(1), (m,), resource=res)),
    ]
    states = replay_events(events).states
    [item] = owner_items(states, 2 * S, gpu_uuid=g)
    assert item["gpu_uuid"] == g and item["device_id"] == m
    assert item["mig"] == {"uuid": m, "profile": "3g.40gb", "gi": 1, "ci": 0}
    assert owner_items(states, 2 * S, gpu_uuid=m) == [item]
    assert owner_items(states, 2 * S, gpu_uuid=gpu(1)) == []
    assert owner_items(states, 2 * S, node="elsewhere") == []


def test_nothing_is_owned_before_the_first_snapshot() -> None:
    states = replay_events(reuse_scenario()).states
    assert owner_items(states, 500) == []


def test_owners_across_nodes_are_sorted_by_node() -> None:
    events = reuse_scenario("node-b") + reuse_scenario("node-a")
    items = owner_items(replay_events(events, ReplayConfig(to_ms=40 * S)).states, 30 * S)
    assert [i["node"] for i in items] == ["node-a", "node-a", "node-b", "node-b"]



def test_pod_events_stamped_just_after_the_instant_count_as_they_do_for_the_live_finding() -> None:
    from periscope.core.engine import EngineConfig, apply, flush, new_state
    from periscope.replay.owners import owners_from_events

    def stamped(ev: PodEvent, t: int) -> PodEvent:  # the watcher saw it a moment after it happened
        return dataclasses.replace(ev, meta=dataclasses.replace(ev.meta, time_ms=t))

    g = gpu(0)
    events: list[NodeInput] = [
        inventory(0), pod(0, "train-0", 0), alloc(1 * S, pr("ml", "train-0", (g,)), ck(uid(0), (g,))),
        alloc(29 * S + 800, pr("ml", "train-0", (g,)), ck(uid(1), (g,))),  # the new train-0's devices
        xid(30 * S, g),
        stamped(pod(0, "train-0", 0, deleted_at=29 * S), 30 * S + 300),
        stamped(pod(1, "train-0", 29 * S + 500), 30 * S + 300),
        tel(32 * S, dev(g, 10.0)),
    ]
    state, live = new_state(NODE), []
    for ev in events:  # as the joiner gets them
        live += apply(state, ev)
    live += flush(state)
    [finding] = [o for o in live if isinstance(o, Finding) and o.kind == "xid-owner"]
    assert owners_of(finding) == {(uid(1), "ml", "train-0", "cuda", g)}
    assert item_owners(owners_from_events(events, 30 * S, gpu_uuid=g)["items"]) == owners_of(finding)
    # Knowing only what was stamped by the instant itself names the old pod.
    blind = owners_from_events(events, 30 * S, gpu_uuid=g, engine=EngineConfig(lateness_ms=0))
    assert [i["pod_uid"] for i in blind["items"]] == [uid(0)]
