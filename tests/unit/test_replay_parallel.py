"""Replay in worker processes: the same result as the serial replay, the same document byte for byte."""

from __future__ import annotations

import io
import json
import os
from concurrent.futures.process import BrokenProcessPool

import orjson
import pytest

from periscope.core.model import NodeInput, NodeTelemetry
from periscope.replay import parallel, runner
from periscope.replay.render import output_json
from periscope.replay.runner import ReplayConfig, ReplayInput, output_filter, output_time, replay_events
from periscope.replay.synthetic import ClusterSpec, generate
from periscope.replay.timeline import Spool, replay_to_spool, write_document
from tests.unit.test_replay_owners import reuse_scenario

S = 1000
# Five nodes with churn, XIDs and idle pods, plus three nodes of one scenario at identical times (ties
# across nodes must keep node-name order).
SPEC = ClusterSpec(nodes=5, gpus_per_node=2, duration_ms=90_000, pod_lifetime_ms=40_000, gap_ms=5_000,
                   xid_every_ms=20_000, idle_every=3)

needs_fork = pytest.mark.skipif(not parallel.can_fork(), reason="no fork start method on this platform")


def cluster() -> list[NodeInput]:
    same_times = [ev for node in ("node-b", "node-a", "node-c") for ev in reuse_scenario(node, SPEC.start_ms)]
    return list(generate(SPEC)) + same_times


def document(events: list[ReplayInput], config: ReplayConfig, workers: int) -> bytes:
    with Spool() as spool:
        result = replay_to_spool(list(events), config, spool, workers=workers)
        out = io.BytesIO()
        write_document(out, {"from": "a", "items": [], "stats": {"events": result.events,
                                                                  "device_samples": result.device_samples}},
                       spool)
        return out.getvalue()


@needs_fork
@pytest.mark.parametrize("workers", [2, 3, 16])
def test_parallel_replay_gives_the_serial_result(workers: int) -> None:
    events = cluster()
    serial = replay_events(events)
    par = replay_events(events, workers=workers)
    assert par.outputs == serial.outputs and len(serial.outputs) > 1000
    assert (par.events, par.samples, par.device_samples, par.emitted, par.failed) == \
           (serial.events, serial.samples, serial.device_samples, serial.emitted, serial.failed)
    assert sorted(par.states) == sorted(serial.states)
    for node, state in serial.states.items():
        assert par.states[node].counters == state.counters and par.states[node].rows == state.rows


@needs_fork
@pytest.mark.parametrize("config", [ReplayConfig(), ReplayConfig(from_ms=SPEC.start_ms + 30 * S),
                                    ReplayConfig(keep=output_filter(node="node-a"))],
                         ids=["all", "from", "one-node"])
def test_the_parallel_timeline_is_the_serial_one_byte_for_byte(config: ReplayConfig) -> None:
    events = cluster()
    serial = document(events, config, workers=1)
    assert document(events, config, workers=2) == serial
    assert document(events, config, workers=4) == serial
    # ... and what writing the outputs sorted by event time one item at a time gives.
    result = replay_events(events, config)
    out = io.BytesIO()
    write_document(out, {"from": "a", "items": [], "stats": {"events": result.events,
                                                               "device_samples": result.device_samples}},
                   (orjson.dumps(output_json(o)) for o in sorted(result.outputs, key=output_time)))
    assert serial == out.getvalue()


def test_an_empty_timeline_and_a_timeline_of_one_item() -> None:
    empty = {"from": "a", "items": [], "stats": {"events": 0, "device_samples": 0}}
    assert document([], ReplayConfig(), workers=2) == (json.dumps(empty, indent=2) + "\n").encode()
    first = replay_events(reuse_scenario()).outputs[0]
    one = ReplayConfig(keep=lambda o: o == first)
    doc = document(reuse_scenario(), one, workers=1)
    assert b'"items": [\n    {' in doc and doc.count(b"\n    {") == 1 and b"[,\n" not in doc
    assert orjson.loads(doc)["items"] == [output_json(first)]


class Unpicklable(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickling rebuilds it with one argument: fails
        super().__init__(f"{a}/{b}")


@needs_fork
def test_events_the_core_raises_on_are_reported_from_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    events = cluster()
    bad = [ev for ev in events if isinstance(ev, NodeTelemetry)][::97]
    real_step = runner.step

    def step(state, ev, config):  # type: ignore[no-untyped-def]
        for k, b in enumerate(bad):
            if ev is b:
                raise Unpicklable(1, 2) if k == 0 else KeyError(k)
        return real_step(state, ev, config)

    monkeypatch.setattr(runner, "step", step)
    got: dict[int, list[tuple[int, str, str]]] = {1: [], 2: []}
    for workers, failed in got.items():
        result = replay_events(events, workers=workers,
                               on_error=lambda ev, e, f=failed: f.append((id(ev), type(e).__name__, str(e))))
        assert result.failed == len(bad) == len(failed) > 3
    assert [f[0] for f in got[2]] == [f[0] for f in got[1]]  # the very events, in this process's memory
    assert sorted(got[2]) == sorted([(id(bad[0]), "RuntimeError", "Unpicklable: 1/2"),
                                     *((id(b), "KeyError", str(k)) for k, b in enumerate(bad) if k)])


def test_one_worker_or_one_node_runs_in_this_process() -> None:
    pids: list[int] = []

    def fn(node: str, events: list[int]) -> int:
        pids.append(os.getpid())
        return sum(events)

    assert list(parallel.map_nodes(fn, {"b": [1, 2], "a": [3]}, workers=1)) == [("a", 3), ("b", 3)]
    assert list(parallel.map_nodes(fn, {"a": [3]}, workers=8)) == [("a", 3)]
    assert set(pids) == {os.getpid()}


@needs_fork
def test_workers_are_other_processes_and_results_come_in_node_order() -> None:
    groups = {f"n{i:02d}": [i] for i in range(12, 0, -1)}
    got = list(parallel.map_nodes(lambda node, evs: (node, os.getpid()), groups, workers=3))
    assert [n for n, _ in got] == sorted(groups) and [r[0] for _, r in got] == sorted(groups)
    assert os.getpid() not in {r[1] for _, r in got}
    assert parallel.workers_for(0) == parallel.cores() >= 1 and parallel.workers_for(3) == 3


def test_the_serial_spool_merges_runs_by_time_keeping_run_order() -> None:
    events = reuse_scenario()
    config = ReplayConfig()
    full = replay_events(events, config).outputs
    with Spool() as spool:
        spool.add_run(full[::2])
        spool.add_run(full[1::2])
        spool.add_run([])
        merged = [bytes(x) for x in spool.merged()]
    halves = [*((output_time(o), 0, i) for i, o in enumerate(full[::2])),
              *((output_time(o), 1, i) for i, o in enumerate(full[1::2]))]
    want = [output_json((full[::2], full[1::2])[k][i]) for _, k, i in sorted(halves)]
    assert [orjson.loads(x) for x in merged] == want


@needs_fork
def test_a_worker_that_dies_fails_the_replay_instead_of_hanging_it() -> None:
    def fn(node: str, events: list[int]) -> int:
        if node == "n3":
            os._exit(3)  # as if killed (out of memory, a crash in C)
        return len(events)

    with pytest.raises(BrokenProcessPool):
        list(parallel.map_nodes(fn, {f"n{i}": [i] for i in range(6)}, workers=2))
    again = parallel.map_nodes(lambda n, e: len(e), {"a": [1], "b": [2, 3]}, workers=2)
    assert list(again) == [("a", 1), ("b", 2)]  # and the next replay runs


@needs_fork
def test_a_caller_that_stops_early_leaves_nothing_behind() -> None:
    gen = parallel.map_nodes(lambda n, e: n, {f"n{i:02d}": [i] for i in range(40)}, workers=2)
    assert next(gen) == ("n00", "n00")
    gen.close()
    assert list(parallel.map_nodes(lambda n, e: n, {"a": [], "b": []}, workers=2)) == [("a", "a"), ("b", "b")]
