"""Joiner state records: a node's engine state survives the tables whole, even when a persist is cut
short between its pod records and its node record."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from periscope.bus.topics import TELEMETRY
from periscope.core.engine import EngineConfig, NodeState, apply, current_view, new_state
from periscope.core.model import NodeInput
from periscope.core.rows import RowConfig
from periscope.core.snapshot import to_parts
from services.joiner.changelog import (
    Persist,
    PodVersion,
    StateError,
    _dumps,
    decode_mark,
    encode_mark,
    load_record,
    plan_persist,
    pod_version,
    restore,
)
from tests.unit.core_builders import NODE, alloc, ck, dev, gpu, inventory, pod, pr, proc, tel, uid
from tests.unit.test_core_properties import state_events, with_samples

S = 1000
CFG = EngineConfig(rows=RowConfig(window_ms=10 * S), lateness_ms=0)


def feed(state: NodeState, events: list[NodeInput]) -> NodeState:
    for e in events:
        apply(state, e, CFG)
    return state


def setup_events() -> list[NodeInput]:
    g0, g1 = gpu(0), gpu(1)
    return [
        inventory(), pod(1, "train", 0), pod(2, "notebook", 0),
        alloc(S, pr("ml", "train", (g0,)), ck(uid(1), (g0,)), pr("ml", "notebook", (g1,)), ck(uid(2), (g1,))),
    ]


def sample(t: int, busy: float) -> NodeInput:
    g0, g1 = gpu(0), gpu(1)
    return tel(t * S, dev(g0, busy, procs=(proc(10, uid(1), busy, 100.0),)),
               dev(g1, 2.0, index=1, procs=(proc(11, uid(2), 2.0, 50.0),)))


class Tables:
    """What the changelogged tables hold after some writes (a plain dict per table)."""

    def __init__(self) -> None:
        self.nodes: dict[str, bytes] = {}
        self.pods: dict[str, bytes] = {}

    def write(self, plan: Persist, *, node_record: bool = True) -> None:
        self.pods.update(plan.pods)
        if node_record:
            self.nodes[NODE] = plan.node
            for u in plan.removed:
                self.pods.pop(u, None)

    def restore(self) -> tuple[NodeState, int, dict[str, PodVersion]]:
        got = restore(NODE, self.nodes.get(NODE), self.pods.get)
        return got.state, got.seq, got.versions


def test_a_persisted_node_comes_back_with_every_row_window_and_pending_sample() -> None:
    state = feed(new_state(NODE), [*setup_events(), *(sample(t, 50.0 + t) for t in range(2, 25))])
    versions: dict[str, PodVersion] = {}
    plan = plan_persist(state, 1, versions)
    assert sorted(plan.pods) == [uid(1), uid(2)] and plan.removed == []
    tables = Tables()
    tables.write(plan)
    back, seq, back_versions = tables.restore()
    assert seq == 1 and back_versions == versions
    assert current_view(back) == current_view(state)
    assert (back.processed_ms, back.watermark_ms) == (state.processed_ms, state.watermark_ms)
    # The restored state keeps joining exactly like the original one.
    more = [sample(t, 10.0) for t in range(25, 40)]
    assert current_view(feed(back, more)) == current_view(feed(state, more))


def test_only_pods_whose_rows_changed_are_written_again() -> None:
    state = feed(new_state(NODE), [*setup_events(), sample(2, 50.0)])
    versions: dict[str, PodVersion] = {}
    plan_persist(state, 1, versions)
    assert plan_persist(state, 2, versions).pods == {}
    apply(state, pod(3, "idle", 0), CFG)  # a pod without rows changes no row record
    assert plan_persist(state, 3, versions).pods == {}
    apply(state, sample(3, 60.0), CFG)
    assert sorted(plan_persist(state, 4, versions).pods) == [uid(1), uid(2)]


def test_a_persist_cut_short_before_its_node_record_restores_the_previous_persist_whole() -> None:
    state = feed(new_state(NODE), [*setup_events(), *(sample(t, 40.0) for t in range(2, 10))])
    versions: dict[str, PodVersion] = {}
    tables = Tables()
    tables.write(plan_persist(state, 1, versions))
    view_1 = current_view(state)
    feed(state, [sample(t, 90.0) for t in range(10, 20)])
    tables.write(plan_persist(state, 2, versions), node_record=False)  # crash here
    assert load_record(tables.pods[uid(1)])["seq"] == 2
    back, seq, back_versions = tables.restore()
    assert seq == 1 and current_view(back) == view_1  # nothing from persist 2, not half of it
    # The pod records still say "persist 2" in the table: the next persist rewrites them even if
    # the rows it has are identical, so no later node record can point at the abandoned version.
    assert all(v.stale and v.seq == 1 for v in back_versions.values())
    again = plan_persist(back, 2, back_versions)
    assert sorted(again.pods) == [uid(1), uid(2)]
    tables.write(again)
    back2, seq2, _ = tables.restore()
    assert seq2 == 2 and current_view(back2) == view_1


def test_a_new_pod_of_an_abandoned_persist_is_ignored() -> None:
    state = feed(new_state(NODE), [inventory(), pod(1, "train", 0), alloc(S, pr("ml", "train", (gpu(0),))),
                                   sample(2, 50.0)])
    versions: dict[str, PodVersion] = {}
    tables = Tables()
    tables.write(plan_persist(state, 1, versions))
    both = alloc(3 * S, pr("ml", "train", (gpu(0),)), pr("ml", "notebook", (gpu(1),)))
    feed(state, [pod(2, "notebook", 0), both, sample(4, 50.0)])
    tables.write(plan_persist(state, 2, versions), node_record=False)
    assert uid(2) in tables.pods
    back, _, back_versions = tables.restore()
    assert {k[0] for k in back.rows} == {uid(1)} and set(back_versions) == {uid(1)}


def test_rows_that_are_gone_are_removed_after_the_node_record() -> None:
    versions = {uid(9): pod_version(1, b"[]", b"[]")}
    plan = plan_persist(feed(new_state(NODE), [*setup_events(), sample(2, 50.0)]), 2, versions)
    assert plan.removed == [uid(9)] and uid(9) not in versions
    assert load_record(plan.node)["pods"] == [uid(1), uid(2)]


def test_no_record_means_a_fresh_node_and_a_foreign_record_is_an_error() -> None:
    got = restore(NODE, None, lambda u: None)
    assert got.seq == 0 and got.state.node == NODE and not got.state.rows
    with pytest.raises(StateError):
        restore(NODE, b"\x00 not json", lambda u: None)
    with pytest.raises(StateError):
        restore(NODE, json.dumps({"format": 99}).encode(), lambda u: None)


def test_marks_round_trip_and_unreadable_ones_count_as_none() -> None:
    assert decode_mark(encode_mark(1_790_000_000_123)) == 1_790_000_000_123
    assert decode_mark(None) == decode_mark(b"") == decode_mark(b"x") == 0


def test_records_written_before_rows_were_packed_and_compressed_still_restore() -> None:
    """Uncompressed JSON, a pod's rows as a plain list with every window in full, allocation repeats as
    key lists and no last publications: the format of the previous release."""
    state = feed(new_state(NODE), [*setup_events(), *(sample(t, 50.0 + t) for t in range(2, 25))])
    state = feed(state, [alloc(t * S, pr("ml", "train", (gpu(0),)), ck(uid(1), (gpu(0),)),
                               pr("ml", "notebook", (gpu(1),)), ck(uid(2), (gpu(1),))) for t in (25, 30)])
    plan = plan_persist(state, 1, {})
    node = load_record(plan.node)
    node["state"].pop("pub_gpus")
    node["state"]["alloc_repeats"] = [[list(k), [list(x) for x in state.alloc_repeats[k]]]
                                      for k in sorted(state.alloc_repeats)]
    pods: dict[str, bytes] = {}
    for u, raw in plan.pods.items():
        rec = load_record(raw)
        rows = rec["rows"]["rows"]
        for r in rows:
            r.pop("pub")
            iw = r.pop("iwin")
            full = [[iw[i], 0, iw[i + 1], iw[i + 2], 0, 0] for i in range(0, len(iw), 3)]
            full += [r["win"][i:i + 6] for i in range(0, len(r["win"]), 6)]
            r["win"] = full
        rec["rows"] = rows
        pods[u] = json.dumps(rec).encode()
    got = restore(NODE, json.dumps(node).encode(), pods.get)
    assert got.seq == 1 and got.state.alloc_repeats == state.alloc_repeats
    more = [sample(t, 3.0) for t in range(31, 50)]
    assert current_view(feed(got.state, more)) == current_view(feed(state, more))


def test_a_version_keeps_no_copy_of_its_rows_but_finds_them_in_the_record_the_table_holds() -> None:
    state = feed(new_state(NODE), [*setup_events(), sample(2, 50.0)])
    versions: dict[str, PodVersion] = {}
    first = plan_persist(state, 1, versions)
    rows_1 = {u: load_record(rec)["rows"] for u, rec in first.pods.items()}
    for u, v in versions.items():
        assert v.packed is first.pods[u]  # the very bytes the table keeps: nothing more per pod
        assert json.loads(v.rows()) == rows_1[u]
    apply(state, sample(3, 90.0), CFG)
    second = plan_persist(state, 2, versions)
    for u, rec in second.pods.items():  # the next record carries the version before it
        got = load_record(rec)
        assert (got["prev_seq"], got["prev"]) == (1, rows_1[u]) and got["rows"] != rows_1[u]
    tables = Tables()
    tables.write(first)
    tables.write(second, node_record=False)  # cut short: the previous version comes back
    _, seq, back = tables.restore()
    assert seq == 1
    for u, v in back.items():
        assert v.stale and v.packed is tables.pods[u] and json.loads(v.rows()) == rows_1[u]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_node_fed_a_non_finite_reading_off_the_wire_still_persists(bad: float) -> None:
    """JSON has no NaN: a state holding one could never be persisted, and the worker crashed on every
    persist of that node's partition. The decoder turns such a reading into none."""
    from periscope.bus import codec

    hostile = codec.decode(TELEMETRY, codec.encode(sample(3, bad)))
    state = feed(new_state(NODE), [*setup_events(), sample(2, 50.0), hostile, sample(4, 40.0)])
    tables = Tables()
    tables.write(plan_persist(state, 1, {}))
    assert current_view(tables.restore()[0]) == current_view(state)


@settings(max_examples=25, deadline=None)
@given(state_events(), st.integers(5, 55))
def test_the_records_written_as_they_are_make_the_same_json(events: list[NodeInput], cut: int) -> None:
    """The persist hands the state's records to the encoder as dataclasses (to_parts native): the JSON
    is byte for byte what their to_jsonable form gives, so old and new records restore alike."""
    state = new_state(NODE)
    for e in with_samples(events):
        if e.meta.time_ms <= cut * S:
            apply(state, e)
    native, jsonable = to_parts(state, native=True), to_parts(state)
    assert _dumps(native) == _dumps(jsonable)
    assert json.loads(_dumps(jsonable)) == json.loads(json.dumps(jsonable))  # the standard encoder's
