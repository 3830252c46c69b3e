"""`periscope replay` over a real broker: owners at an XID match the live finding across a pod-name reuse,
bad records are skipped and counted, start offsets are found without trusting the broker's time
index, a node's last snapshot is found behind the lookback, nothing is committed, and nodes are handed
over for replay partition by partition (again when a record of theirs turns up in a later partition).

The broker is shared with other tests: every test uses its own node name (and reads with --node), and
event times later than those of every test that runs before it (modules run in name order; the ones
before this one publish before BASE), so other records in a partition all come before ours.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket

import pytest
from aiokafka import TopicPartition

from periscope.bus import codec
from periscope.bus import topics as t
from periscope.bus.admin import partition_counts
from periscope.bus.clients import Kafka
from periscope.bus.producer import Publisher
from periscope.cli.main import main
from periscope.contract.values import rfc3339
from periscope.core.engine import apply, new_state
from periscope.core.model import (
    AllocationSnapshot,
    DeviceInventory,
    Finding,
    NodeEvent,
    NodeInput,
    NodeTelemetry,
    PodEvent,
    XidEvent,
)
from periscope.replay.document import output_json
from periscope.replay.owners import owners_at, owners_with_stats
from periscope.replay.plan import ReadPlan
from periscope.replay.reader import partition_for, read_inputs
from periscope.replay.runner import (
    Pending,
    ReplayConfig,
    ReplayInput,
    by_node,
    node_of,
    output_filter,
    replay_events,
)
from periscope.settings.replay import ReplaySettings
from tests.unit.core_builders import alloc, ck, dev, gpu, inventory, pod, pr, tel, uid
from tests.unit.test_replay_owners import XID_TIMES, item_owners, owners_of, relocate, reuse_scenario

BASE = 2_000_000_000_000  # 2033: later than any event time other tests publish
S = 1000
TOPIC: dict[type, t.Topic] = {PodEvent: t.PODS, NodeEvent: t.NODES, DeviceInventory: t.INVENTORY,
                              AllocationSnapshot: t.ALLOCATIONS, NodeTelemetry: t.TELEMETRY, XidEvent: t.XID}


def topic_of(ev: NodeInput) -> t.Topic:
    return TOPIC[type(ev)]


async def publish(kafka: Kafka, node: str, events: list[NodeInput]) -> None:
    """In order; consecutive events of one topic go in one batch."""
    async with Publisher(kafka, "replay-test") as pub:
        for topic, run in itertools.groupby(events, key=topic_of):
            await pub.send_many(topic, [(node, ev) for ev in run])


@pytest.fixture(autouse=True)
def _replay_profile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """`periscope replay` in this process reads the broker profile from the environment, as a user's does."""
    callspec = getattr(request.node, "callspec", None)
    monkeypatch.setenv("PERISCOPE_KAFKA_PROFILE", callspec.params["broker_kind"] if callspec else "embedded")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["replay", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


async def live_findings(kafka: Kafka, node: str, events: list[NodeInput]) -> list[Finding]:
    """The core run the way the joiner runs it: each record decoded and stepped as it arrives from the
    broker. Events are published one at a time, each once the previous one has been handled."""
    state = new_state(node)
    findings: list[Finding] = []
    parts = await partition_counts(kafka, (tp.name for tp in t.NODE_INPUTS))
    consumer = kafka.consumer(client_id="replay-live", fetch_max_wait_ms=20)
    await consumer.start()
    try:
        tps = [TopicPartition(tp.name, p) for tp in t.NODE_INPUTS for p in range(parts[tp.name])]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        async with Publisher(kafka, "replay-live") as pub:
            for ev in events:
                await pub.send(topic_of(ev), node, ev)
                arrived = False
                while not arrived:
                    for tp, recs in (await consumer.getmany(timeout_ms=1000)).items():
                        for rec in recs:
                            if rec.key != node.encode():
                                continue
                            outs = apply(state, codec.decode(t.BY_NAME[tp.topic], rec.value or b""))
                            findings += [o for o in outs if isinstance(o, Finding) and o.kind == "xid-owner"]
                            arrived = True
    finally:
        await consumer.stop()
    return findings


def test_owners_at_each_xid_match_the_live_finding_across_a_pod_name_reuse(
        any_broker: Kafka, unique: str, capsys: pytest.CaptureFixture[str]) -> None:
    node = f"replay-xid-{unique}"
    events = reuse_scenario(node, BASE)
    findings = asyncio.run(live_findings(any_broker, node, events))
    assert sorted(f.at_ms for f in findings) == [BASE + x for x in XID_TIMES]
    assert [len(f.owners) for f in findings] == [1, 1, 1]
    assert {f.owners[0].pod_uid for f in findings} == {uid(1), "", uid(2)}  # old pod, nobody sure, new pod
    for f in findings:
        code, out, _ = cli(capsys, "--bootstrap", any_broker.bootstrap,
                            "--at", rfc3339(f.at_ms), "--gpu", f.gpu_uuid,
                           "--node", node, "--format", "json", "--quiet")
        assert code == 0
        doc = json.loads(out)
        assert doc["at"] == rfc3339(f.at_ms) and set(doc) == {"at", "items"}
        assert item_owners(doc["items"]) == owners_of(f)
        assert all(set(i) == {"node", "gpu_uuid", "device_id", "mig", "pod_uid", "namespace", "pod",
                              "container"} for i in doc["items"])
    # The API's entry point answers the same.
    doc = asyncio.run(owners_at(any_broker, BASE + 90 * S, gpu_uuid=gpu(0), node=node))
    assert [i["pod_uid"] for i in doc["items"]] == [uid(2)]
    # Without --gpu, every device of the node.
    code, out, _ = cli(capsys, "--bootstrap", any_broker.bootstrap,
                            "--at", rfc3339(BASE + 90 * S), "--node", node,
                       "--format", "json", "--quiet")
    assert [(i["gpu_uuid"], i["pod_uid"]) for i in json.loads(out)["items"]] == [(gpu(0), uid(2)),
                                                                                 (gpu(1), uid(3))]


def test_range_replay_matches_the_offline_replay_and_skips_a_bad_record(
        any_broker: Kafka, unique: str, capsys: pytest.CaptureFixture[str]) -> None:
    node = f"replay-range-{unique}"
    events = reuse_scenario(node, BASE + 10_000 * S)
    asyncio.run(publish(any_broker, node, events[:40]))

    async def garbage() -> None:
        async with Publisher(any_broker, "replay-test") as pub:
            await pub.send_raw(t.TELEMETRY.name, node.encode(), b"\x0a\xff\xff not a NodeTelemetry")

    asyncio.run(garbage())
    asyncio.run(publish(any_broker, node, events[40:]))
    lo, hi = BASE + 10_025 * S, BASE + 10_095 * S
    code, out, err = cli(capsys, "--bootstrap", any_broker.bootstrap,
                            "--from", rfc3339(lo), "--to", rfc3339(hi),
                         "--node", node, "--format", "json")
    assert code == 0
    assert "periscope: warning: skipping bad record periscope.node.telemetry.v1" in err
    assert "skipped 1 bad record(s)" in err and "device samples/s" in err
    doc = json.loads(out)
    assert doc["stats"]["bad_records"] == 1 and doc["from"] == rfc3339(lo) and doc["to"] == rfc3339(hi)
    expected = replay_events(events, ReplayConfig(from_ms=lo, to_ms=hi, keep=output_filter(node=node)))
    assert doc["items"] == [output_json(o) for o in expected.outputs]
    assert {i["kind"] for i in doc["items"]} == {"attribution", "gpu", "finding"}
    # A pod's timeline: its attribution records and the XID that named it.
    code, out, _ = cli(capsys, "--bootstrap", any_broker.bootstrap,
                            "--from", rfc3339(lo), "--to", rfc3339(hi),
                       "--node", node, "--pod", uid(2), "--format", "json", "--quiet")
    items = json.loads(out)["items"]
    assert items and {i["kind"] for i in items} == {"attribution", "finding"}
    assert all(i["pod_uid"] == uid(2) or uid(2) in [o["pod_uid"] for o in i["owners"]] for i in items)
    code, out, _ = cli(capsys, "--bootstrap", any_broker.bootstrap,
                            "--from", rfc3339(lo), "--to", rfc3339(hi),
                       "--node", node, "--gpu", gpu(1), "--quiet")
    assert code == 0 and uid(3) in out and uid(1) not in out  # table output


def test_workers_print_the_document_one_process_prints(
        broker: Kafka, unique: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Several nodes in the range (no --node): replayed side by side, the same bytes as in one process."""
    base = BASE + 20_000 * S
    nodes = [f"replay-par-{unique}-{k}" for k in "cab"]
    for node in nodes:
        asyncio.run(publish(broker, node, reuse_scenario(node, base)))
    lo, hi = base + 10 * S, base + 110 * S
    outs: dict[str, str] = {}
    for workers in ("1", "2", "3"):
        code, out, err = cli(capsys, "--bootstrap", broker.bootstrap, "--from", rfc3339(lo),
                             "--to", rfc3339(hi), "--format", "json", "--quiet", "--workers", workers)
        assert code == 0, err
        outs[workers] = out
    assert outs["2"] == outs["1"] and outs["3"] == outs["1"]
    items = json.loads(outs["1"])["items"]
    assert {i["node"] for i in items} >= set(nodes)
    assert [i["at"] for i in items] == sorted(i["at"] for i in items)


async def test_start_offsets_are_found_by_event_time_not_the_time_index(any_broker: Kafka, unique: str
                                                                        ) -> None:
    node = f"replay-seek-{unique}"
    base = BASE + 20_000 * S
    g = gpu(0)
    events: list[NodeInput] = [relocate(e, node, base) for e in (
        inventory(0), pod(1, "train-0", 0), alloc(1 * S, pr("ml", "train-0", (g,)), ck(uid(1), (g,))))]
    events += [relocate(tel(k * S, dev(g, float(k % 90))), node, base) for k in range(2, 402)]
    await publish(any_broker, node, events)
    plan = ReadPlan(anchor_ms=base + 200 * S, to_ms=base + 250 * S, lookback_ms=3_600_000,
                    late_slack_ms=5 * S, node=node)
    got, stats = await read_inputs(any_broker, plan)
    tel_times = sorted(e.meta.time_ms - base for e in got if isinstance(e, NodeTelemetry))
    assert tel_times == [k * S for k in range(200, 251)]
    assert {type(e) for e in got} == {NodeTelemetry, PodEvent, DeviceInventory, AllocationSnapshot}
    assert stats.probes > 0  # located by probing event times
    assert stats.records < 200  # neither the 200 samples before the range nor the 150 after it were read


async def test_the_last_snapshot_before_the_lookback_is_still_found(any_broker: Kafka, unique: str) -> None:
    node = f"replay-old-{unique}"
    base = BASE + 30_000 * S
    g = gpu(0)
    old = [relocate(e, node, base) for e in (
        inventory(0), pod(1, "train-0", 0), alloc(1 * S, pr("ml", "train-0", (g,)), ck(uid(1), (g,))))]
    # Hours later, only telemetry: the probe republished nothing (a quiet node).
    later = [relocate(tel(k * S, dev(g, 40.0)), node, base + 3 * 3_600_000) for k in range(0, 30)]
    await publish(any_broker, node, old + later)
    settings = ReplaySettings(replay_lookback=600)
    at = base + 3 * 3_600_000 + 20 * S
    doc, stats = await owners_with_stats(any_broker, at, node=node, settings=settings)
    assert [(i["gpu_uuid"], i["pod_uid"]) for i in doc["items"]] == [(g, uid(1))]
    assert stats.extended > 0


async def test_replay_never_creates_a_consumer_group(any_broker: Kafka, unique: str) -> None:
    node = f"replay-nogroup-{unique}"
    await publish(any_broker, node, reuse_scenario(node, BASE + 40_000 * S)[:10])
    admin = any_broker.admin("test-admin")
    await admin.start()
    try:
        before = set(await admin.list_consumer_groups())
        await owners_at(any_broker, BASE + 40_030 * S, node=node)
        await read_inputs(any_broker, ReadPlan(anchor_ms=BASE + 40_000 * S, to_ms=BASE + 40_100 * S))
        assert set(await admin.list_consumer_groups()) == before
    finally:
        await admin.close()


def test_unreachable_broker_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = cli(capsys, "--bootstrap", f"127.0.0.1:{port}", "--at", rfc3339(BASE))
    assert code == 1 and out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"periscope: cannot read from the broker at 127.0.0.1:{port}")


async def test_nodes_are_handed_over_partition_by_partition_and_again_for_a_late_record(
        any_broker: Kafka, unique: str) -> None:
    """What a replay with `complete` is handed (each node's last handover) is what a read without it
    returns; nodes come a partition at a time, and a node with a record under another node's key, in a
    partition read after its own, is handed over again with that record."""
    base = BASE + 50_000 * S
    parts = (await partition_counts(any_broker, [t.TELEMETRY.name]))[t.TELEMETRY.name]
    if parts < 2:
        pytest.skip("the test broker's topics have one partition")
    names = (f"replay-hand-{unique}-{i}" for i in itertools.count())
    home = {n: partition_for(n, parts) for n in itertools.islice(names, 40)}
    first = min(home, key=lambda n: (home[n], n))
    later = max(home, key=lambda n: (home[n], n))
    nodes = [first, later, *[n for n in home if home[n] not in (home[first], home[later])][:2]]
    for node in nodes:
        await publish(any_broker, node, reuse_scenario(node, base))
    stray = relocate(tel(60 * S, dev(gpu(0), 12.5)), first, base)
    async with Publisher(any_broker, "replay-test") as pub:
        await pub.send(t.TELEMETRY, later, stray)  # under `later`'s key: in its partition
    # Read to the end of the partitions (the stray was published after `later`'s own records).
    plan = ReadPlan(anchor_ms=base + 10 * S, to_ms=base + 4_000 * S)
    handed: list[list[ReplayInput]] = []
    rest, stats = await read_inputs(any_broker, plan, lazy=True, complete=handed.append)
    whole, _ = await read_inputs(any_broker, plan, lazy=True)
    last: dict[str, list[ReplayInput]] = {}
    for events in handed:
        last.update(by_node(events))
    # (Other tests may publish to the shared broker between the two reads: only our nodes are compared.)
    assert {n: last[n] for n in nodes} == {n: by_node(whole)[n] for n in nodes}
    assert not by_node(rest)  # what is left belongs to no node
    assert stats.events == sum(len(evs) for evs in last.values()) + len(rest)
    assert len(handed) >= 2 and set(nodes) <= set(last)
    times = [[ev.meta.time_ms for ev in events if node_of(ev) == first and isinstance(ev, Pending)
              and ev.topic is t.TELEMETRY] for events in handed]
    with_first = [ts for ts in times if ts]
    assert len(with_first) == 2
    at = stray.meta.time_ms
    assert with_first[1].count(at) == with_first[0].count(at) + 1
    assert len(with_first[1]) == len(with_first[0]) + 1
