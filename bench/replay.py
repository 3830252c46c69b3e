"""Offline replay through the pure core: device-samples per second, and core state memory per row.

Input is the static synthetic cluster (periscope.devkit.workload via bench.workload), encoded to the
bus's protobuf bytes beforehand (not timed), as the replay tool reads them from the input topics. The
timed part is what the replay tool does with them: decode every record, then
`periscope.replay.runner.replay_events` (group by node, order by event time, step the core, flush, keep
the outputs), in one process. A second, core-only figure replays the already decoded objects, to split
the cost; a third measures the core after an hour of history. The parallel figure is what
`periscope replay --format json` does with what it read, without the broker: every record but pods
and nodes checked and kept as bytes, nodes sent to worker processes that decode, step the core and
render their JSON items, and the merged document written out; paired, in the same run, with the same
work in one process (`--workers 1`).
What limits each figure is read from a cProfile of the same work (top functions by self time).
"""

from __future__ import annotations

import copy
import gc
import os
import resource
import time
from typing import TYPE_CHECKING, Any

from bench.common import JOINER_ROW_GOAL, Figure, Goal, deep_size, median, repeat, rounded
from bench.hotspots import top_self
from bench.workload import T0_MS, NodeShape, cluster_events
from periscope.bus import codec
from periscope.bus.topics import Topic
from periscope.core import engine
from periscope.replay.parallel import cores
from periscope.replay.plan import STATE
from periscope.replay.runner import Pending, ReplayConfig, ReplayInput, ReplayResult, replay_events
from periscope.replay.timeline import Spool, replay_to_spool, write_document

if TYPE_CHECKING:
    from services.joiner.changelog import PodVersion

GOAL = Goal(">=", 100_000, ">= 100,000 device-samples/s")


def _device_samples(states: dict[str, engine.NodeState]) -> int:
    return sum(s.counters.device_samples for s in states.values())


def replay_records(records: list[tuple[Topic, bytes]]) -> ReplayResult:
    """What the replay tool does with what it read from the input topics: decode, then replay."""
    return replay_events(codec.decode(t, data) for t, data in records)


def run(nodes: int, ticks: int, repeats: int, shape: NodeShape = NodeShape()) -> list[Figure]:
    events = list(cluster_events(nodes, ticks, shape))
    objects = [ev for _, ev in events]
    records = [(t, codec.encode(ev)) for t, ev in events]
    setup: dict[str, Any] = {
        "nodes": nodes,
        "gpus_per_node": shape.gpus,
        "processes_per_node": shape.processes,
        "ticks": ticks,
        "tick": "1s",
        "records": len(records),
        "repeats": repeats,
        "path": "protobuf bytes -> periscope.bus.codec.decode -> periscope.replay.runner.replay_events "
                "(group by node, sort by event time, engine.step, flush; outputs kept in a list)",
    }
    info: dict[str, Any] = {}

    def with_decode() -> float:
        t = time.perf_counter()
        res = replay_records(records)
        dt = time.perf_counter() - t
        info["device_samples"], info["outputs"] = res.device_samples, len(res.outputs)
        info["outputs_per_device_sample"] = round(len(res.outputs) / max(1, res.device_samples), 3)
        return res.device_samples / dt

    def core_only() -> float:
        t = time.perf_counter()
        res = replay_events(objects)
        return res.device_samples / (time.perf_counter() - t)

    runs = repeat(repeats, with_decode)
    core_runs = repeat(repeats, core_only)
    setup |= {"device_samples": info["device_samples"], "outputs": info["outputs"],
              "outputs_per_device_sample": info["outputs_per_device_sample"]}
    small = records[: max(1, len(records) // 4)]
    some = objects[: len(small)]
    t = time.perf_counter()
    for topic, data in records:
        codec.decode(topic, data)
    decode_share = (time.perf_counter() - t) / (info["device_samples"] / median(runs))
    setup["decode_share"] = round(decode_share, 3)
    limit = (f"CPU, one Python thread; protobuf decode is {decode_share:.0%} of the time; top self time: "
             + top_self(lambda: replay_records(small)))
    core_limit = "CPU, one Python thread; top self time: " + top_self(lambda: replay_events(some))
    brief = (f"{nodes} nodes x {shape.gpus} GPUs x {ticks} s ticks from empty state; protobuf bytes -> "
             f"decode -> replay_events; median of {repeats}")
    return [
        Figure("replay_device_samples_per_s", median(runs), "device-samples/s", setup, limit, GOAL, runs,
               brief),
        Figure("replay_core_only_device_samples_per_s", median(core_runs), "device-samples/s",
               {**setup, "path": "decoded objects -> periscope.replay.runner.replay_events"},
               core_limit, None, core_runs,
               brief.replace("protobuf bytes -> decode ->", "decoded objects ->")),
    ]


def steady_state(nodes: int, minutes: int, measure_min: int, shape: NodeShape = NodeShape(), repeats: int = 1
                 ) -> tuple[Figure, Figure]:
    """Core speed after `minutes` of history (rows keep the windows of one idle span, the node an
    hour of allocation history), and the memory a joiner worker holds per pod-device row at that point.
    The speed is the median of `repeats` runs of the same span, each from its own copy of the state."""
    # Decoded from the bus's bytes, as a worker holds them (each record brings its own strings).
    events = [codec.decode(t, codec.encode(ev)) for t, ev in cluster_events(nodes, minutes * 60, shape)]
    cut = (minutes - measure_min) * 60_000 + T0_MS
    warm = [ev for ev in events if ev.meta.time_ms < cut]
    last = [ev for ev in events if ev.meta.time_ms >= cut]
    states: dict[str, engine.NodeState] = {}
    for ev in warm:
        st = states.get(ev.meta.node)
        if st is None:
            st = states[ev.meta.node] = engine.new_state(ev.meta.node)
        engine.apply(st, ev)
    snapshot = copy.deepcopy(states)  # to profile the same span afterwards
    persisted = TablesHeld.first(states)  # a worker's persist before the measured span (not timed)

    def timed(sts: dict[str, engine.NodeState]) -> float:
        before = _device_samples(sts)
        t = time.perf_counter()
        for ev in last:
            engine.apply(sts[ev.meta.node], ev)
        return (_device_samples(sts) - before) / (time.perf_counter() - t)

    rates = [timed(copy.deepcopy(snapshot)) for _ in range(repeats - 1)]
    rates.append(timed(states))  # the last run's state is the one whose memory is measured
    rate = median(rates)

    def again() -> None:
        for ev in last:
            engine.apply(snapshot[ev.meta.node], ev)

    limit = "CPU, one Python thread; top self time: " + top_self(again)
    speed = Figure(
        "replay_steady_device_samples_per_s", rate, "device-samples/s",
        {"nodes": nodes, "history": f"{minutes - measure_min} min of 1 s ticks stepped first (not timed)",
         "measured": f"the following {measure_min} min of ticks, decoded objects -> engine.step",
         "what": "per-sample core cost after an hour of history, as in a long-running joiner (rows keep "
                 "the windows of one idle span; allocation history is kept for an hour)"},
        limit, None, rates,
        f"core only, {nodes} nodes, last {measure_min} min after {minutes - measure_min} min of history "
        f"(an hour of history); median of {repeats}")
    persisted.again(states)
    return speed, joiner_state_bytes_per_row(states, minutes, persisted)


class TablesHeld:
    """What a worker holds of the changelogged tables for its nodes: the latest record of each key (the
    Faust memory store keeps table values in the process) and the per-pod versions of its last persists
    (services.joiner.changelog.PodVersion)."""

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self.versions: dict[str, dict[str, PodVersion]] = {}  # node -> pod UID -> its last version

    @classmethod
    def first(cls, states: dict[str, engine.NodeState]) -> TablesHeld:
        held = cls()
        held.again(states, seq=1)
        return held

    def again(self, states: dict[str, engine.NodeState], seq: int = 2) -> None:
        from services.joiner.changelog import plan_persist

        for node, st in states.items():
            plan = plan_persist(st, seq, self.versions.setdefault(node, {}))
            self.values[node.encode()] = plan.node
            self.values.update((uid.encode(), rec) for uid, rec in plan.pods.items())


def joiner_state_bytes_per_row(states: dict[str, engine.NodeState], minutes: int, held: TablesHeld
                               ) -> Figure:
    """What a worker keeps per pod-device row: the core's NodeState, the table values and versions."""
    gc.collect()
    rows = sum(len(s.rows) for s in states.values())
    core = deep_size(states)
    tables = deep_size(held.values)
    total = deep_size((states, held.values, held.versions))  # each object once: versions share records
    per_row = total / rows
    setup = {
        "rows": rows,
        "history": f"{minutes} min of 1 s ticks (window 1m, windows kept 1h), decoded from the bus's bytes",
        "core_state_bytes_per_row": round(core / rows),
        "table_values_bytes_per_row": round(tables / rows),
        "pod_versions_bytes_per_row": round((total - core - tables) / rows),
        "what": "periscope.core NodeState per node (pods, allocation history, row windows, last published "
                "outputs kept for the change rule) walked with sys.getsizeof, plus the latest node and pod "
                "records of two persists by services.joiner.changelog.plan_persist (the second one's pod "
                "records carry their previous version) as the in-memory tables hold them, and the worker's "
                "per-pod versions of them",
    }
    limit = ("per node, shared by its rows: the buffered and last processed telemetry samples, the "
             "allocation snapshot, the pod registry and the holdings cache; per row: its state with the "
             "windows idle detection needs (10 packed + the open one), the last published PodAttribution "
             "and GpuState, the compressed JSON records in the tables and the worker's version of each")
    return Figure("joiner_bytes_per_row", per_row, "bytes/row", setup, limit, JOINER_ROW_GOAL, [per_row],
                  f"core NodeState + changelog table records + per-pod versions per row after {minutes} min "
                  "of 1 s ticks")


def as_read(records: list[tuple[Topic, bytes]]) -> list[ReplayInput]:
    """What the CLI's reader hands on: pods and nodes decoded, every other record checked and kept as
    bytes."""
    return [codec.decode(topic, data) if topic in STATE
            else Pending(codec.decode_meta(topic, data), data, topic) for topic, data in records]


def _cpu_s() -> float:
    """CPU seconds of this process and of its children that have been waited for."""
    me, kids = os.times(), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.user + me.system + kids.ru_utime + kids.ru_stime


def to_document(records: list[tuple[Topic, bytes]], workers: int) -> tuple[float, float, int, int]:
    """(wall s, CPU s of this process and its workers, device samples, document bytes) of replaying
    `records` into the timeline document (written to /dev/null) with `workers` processes."""
    events = as_read(records)
    cpu, started = _cpu_s(), time.perf_counter()
    with Spool() as spool, open(os.devnull, "wb") as out:
        res = replay_to_spool(events, ReplayConfig(), spool, workers=workers)
        write_document(out, {"from": "a", "to": "b", "items": [], "stats": {}}, spool)
        size = out.tell()
    return time.perf_counter() - started, _cpu_s() - cpu, res.device_samples, size


def parallel(nodes: int, ticks: int, repeats: int, shape: NodeShape = NodeShape()) -> list[Figure]:
    """The timeline of `nodes` nodes in memory: one worker per CPU against one process, paired."""
    records = [(topic, codec.encode(ev)) for topic, ev in cluster_events(nodes, ticks, shape)]
    workers = cores()
    runs: dict[int, list[float]] = {workers: [], 1: []}
    cpu_us: dict[int, list[float]] = {workers: [], 1: []}
    load: list[float] = []
    for _ in range(repeats):
        for w in (1, workers):  # paired and alternating: both see the same machine
            gc.collect()
            load.append(os.getloadavg()[0])
            wall, cpu, samples, _size = to_document(records, w)
            runs[w].append(samples / wall)
            cpu_us[w].append(1e6 * cpu / samples)
    par, ser = median(runs[workers]), median(runs[1])
    ratios = [p / s for p, s in zip(runs[workers], runs[1], strict=True)]
    setup: dict[str, Any] = {
        "nodes": nodes, "gpus_per_node": shape.gpus, "ticks": ticks, "tick": "1s", "records": len(records),
        "workers": workers, "repeats": repeats,
        "path": "protobuf bytes in memory -> pods and nodes decoded, the rest kept as bytes (as the reader "
                "does) "
                "-> periscope.replay.timeline.replay_to_spool (workers decode, step the core, render JSON "
                "items into the spool) -> write_document to /dev/null",
        "runs_min_median_max": {"parallel": _mmm(runs[workers]), "one_process": _mmm(runs[1])},
        "cpu_us_per_device_sample": {"parallel": _mmm(cpu_us[workers]), "one_process": _mmm(cpu_us[1])},
        "ratio_to_one_process": _mmm(ratios),
        "load_average_1m_before_runs": _mmm(load),
    }
    limit = (f"CPU: {workers} workers on {cores()} CPUs; the parent reads nothing here but merges and "
             f"writes; {median(cpu_us[workers]):.1f} us of CPU per device sample in all processes against "
             f"{median(cpu_us[1]):.1f} in one (sending each node's records to a worker, result "
             f"hand-back); the machine is shared: the 1-minute load average before the runs was "
             f"{min(load):.1f}-{max(load):.1f}")
    brief = (f"{nodes} nodes x {shape.gpus} GPUs x {ticks} s ticks, protobuf bytes in memory -> "
             f"timeline JSON document, {workers} worker processes; median of {repeats}")
    return [
        Figure("replay_parallel_device_samples_per_s", par, "device-samples/s", setup, limit, GOAL,
               runs[workers], brief),
        Figure("replay_one_process_device_samples_per_s", ser, "device-samples/s",
               {**setup, "workers": 1}, "CPU, one Python process", None, runs[1],
               brief.replace(f"{workers} worker processes", "one process (--workers 1)")),
        Figure("replay_parallel_vs_one_process_ratio", median(ratios), "x", setup, limit, None, ratios,
               f"replay_parallel / replay_one_process, paired runs of the same work ({workers} workers)"),
    ]


def _mmm(xs: list[float]) -> dict[str, float | None]:
    s = sorted(xs)
    return {"min": rounded(s[0]), "median": rounded(median(s)), "max": rounded(s[-1])} if s else {}
