"""The bus over a real broker: every event type round-trips through Kafka, bad records become dead
letters while consumption goes on, groups commit, and the embedded broker launcher behaves."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from aiokafka import ConsumerRecord

from periscope.bus import codec, topics
from periscope.bus.admin import ensure_topics
from periscope.bus.clients import Kafka
from periscope.bus.deadletter import DeadLetters
from periscope.bus.faust_transport import listed
from periscope.bus.producer import Publisher
from periscope.bus.topics import Topic
from periscope.core import model as m
from periscope.devkit.apache_kafka import ApacheKafka
from periscope.devkit.consumer import ConsumerStats, consume
from periscope.devkit.embedded import BrokerError, EmbeddedBroker, metadata_ready

# On the embedded broker a group join waits session_timeout_ms / 2 (at least 1 s): keep it short.
FAST_GROUP: dict[str, Any] = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}



def _meta(node: str, seq: int = 1) -> m.Meta:
    return m.Meta(node=node, source=f"probe/{node}", epoch=1_700_000_000_000, seq=seq,
                  time_ms=1_700_000_001_000)


def samples(node: str) -> dict[str, Any]:
    mig = m.MigRef("MIG-aa", "1g.10gb", 7, 0)
    owner = m.Owner("uid-1", "ml", "train-0", "main", "GPU-1")
    return {
        "AllocationSnapshot": m.AllocationSnapshot(
            _meta(node), (m.AllocationEntry(m.AllocSource.CHECKPOINT, "main", "nvidia.com/gpu", ("GPU-1::2",),
                                            pod_uid="uid-1"),),
            allocatable=(("nvidia.com/gpu", "GPU-1::2"),), health=(m.SourceHealth("checkpoint", "ok"),)),
        "NodeTelemetry": m.NodeTelemetry(_meta(node), (
            m.DeviceSample("MIG-aa", parent_uuid="GPU-1", mig=mig, fb_used_mib=512.0,
                           processes=(m.ProcessSample(4242, "uid-1", "c" * 64, "guaranteed",
                                                      used_mib=500.0),)),
            m.DeviceSample("GPU-2", index=1, util_pct=0.0, power_w=61.5, temp_c=40.0))),
        "XidEvent": m.XidEvent(_meta(node), "GPU-1", 79, mig=mig),
        "DeviceInventory": m.DeviceInventory(
            _meta(node), (m.GpuInfo("GPU-1", 0, "NVIDIA A100", 81920.0, mig_enabled=True,
                                    mig_devices=(m.MigDeviceInfo("MIG-aa", "1g.10gb", 7, 0, 9856.0),)),),
            driver_version="570.86.15"),
        "PodEvent": m.PodEvent(_meta(node), m.PodInfo(
            "uid-1", "ml", "train-0", node=node, phase="Running", labels=(("app", "train"),),
            containers=(m.ContainerInfo("main", requests=(("nvidia.com/gpu", "1"),)),))),
        "NodeEvent": m.NodeEvent(_meta(node), node, labels=(("nvidia.com/gpu.product", "A100"),)),
        "PolicyEvent": m.PolicyEvent(_meta("cluster"), "installed", "cluster-policy", "ready",
                                     components=(("dcgmExporter", False), ("mig", None)),
                                     operands=(m.OperandStatus("nvidia-dcgm-exporter", "dcgmExporter",
                                                               False),)),
        "PodAttribution": m.PodAttribution("uid-1", "ml", "train-0", node, (
            m.AttributionRow("main", "GPU-1", "GPU-1", "exclusive", "exclusive", util_pct=3.0,
                             windows=(m.WindowStat(60_000, 6, 18.0, 6),)),)),
        "GpuState": m.GpuState(node, "GPU-1", owners=(owner,), last_xid=m.XidRef(79, 5), fb_total_mib=None),
        "Finding": m.Finding("xid-owner", "GPU-1", node, 5, "xid-owner/GPU-1", owners=(owner,), xid_code=79,
                             pids=(4242,)),
        "DeadLetter": codec.DeadLetter("periscope.node.xid.v1", 0, 3, node.encode(), b"\x00", "bad", "test",
                                       9),
    }


async def private_topics(broker: Kafka, unique: str, *bases: Topic) -> list[Topic]:
    """Copies of registry topics under unique names, so tests sharing the broker never see each other."""
    copies = [dataclasses.replace(t, name=f"{t.name}.{unique}") for t in bases]
    await ensure_topics(broker, copies)
    return copies


async def run_until(stats: ConsumerStats, stop: asyncio.Event, done: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out; stats={stats}"
        await asyncio.sleep(0.02)
    stop.set()


async def test_every_message_type_round_trips_through_the_broker(any_broker: Kafka, unique: str) -> None:
    node = f"node-{unique}"
    by_message = samples(node)
    copies = await private_topics(any_broker, unique, *topics.ALL)
    async with Publisher(any_broker, "test-producer") as pub:
        for t in copies:
            await pub.send(t, node, by_message[t.message])
    got: dict[str, tuple[str | None, Any]] = {}

    async def handler(topic: Topic, key: str | None, obj: Any, record: ConsumerRecord[bytes, bytes]) -> None:
        got[topic.message] = (key, obj)

    stop, stats = asyncio.Event(), ConsumerStats()
    task = asyncio.create_task(consume(any_broker, copies, None, handler, service="test", stop=stop,
                                       stats=stats))
    await run_until(stats, stop, lambda: len(got) == len(copies))
    await task
    assert got == {name: (node, obj) for name, obj in by_message.items()}
    assert stats.consumed == len(copies) and stats.dead_lettered == 0


async def test_bad_records_become_dead_letters_and_consumption_goes_on(any_broker: Kafka, unique: str
                                                                       ) -> None:
    (telemetry,) = await private_topics(any_broker, unique, topics.TELEMETRY)
    node = f"node-{unique}"
    good = samples(node)["NodeTelemetry"]
    bad = [(node.encode(), b"\xff\xfenot protobuf"),  # unparseable
           (node.encode(), b""),  # parses, but no meta: not an event
           (node.encode(), codec.encode(dataclasses.replace(good, meta=_meta("")))),  # no node
           (b"\xff" + node.encode(), codec.encode(good))]  # key is not UTF-8
    seen: list[Any] = []

    async def handler(topic: Topic, key: str | None, obj: Any, record: ConsumerRecord[bytes, bytes]) -> None:
        seen.append(obj)

    async with Publisher(any_broker, "test-producer") as pub:
        for key, value in bad:
            await pub.send_raw(telemetry.name, key, value)
        await pub.send(telemetry, node, good)
        stop, stats = asyncio.Event(), ConsumerStats()
        letters_out = DeadLetters(any_broker, f"dlq-{unique}", "joiner")
        task = asyncio.create_task(consume(any_broker, [telemetry], f"g-{unique}", handler,
                                           dead_letters=letters_out, service="joiner", stop=stop, stats=stats,
                                           **FAST_GROUP))
        await run_until(stats, stop, lambda: len(seen) == 1)
        await task
        await letters_out.stop()
    assert seen == [good]
    assert (stats.consumed, stats.dead_lettered) == (1, len(bad))

    letters = [codec.decode_dead_letter(r.value) for r in await read_all(any_broker, topics.DEADLETTER.name)
               if r.key is not None and r.key.endswith(node.encode())]
    errors = {(x.key, x.value): x.error for x in letters if x.topic == telemetry.name}
    assert sorted(errors) == sorted(bad)
    assert all(x.service == "joiner" and x.at_ms > 0 for x in letters)
    assert [errors[kv] for kv in bad] == [
        "not a NodeTelemetry: Error parsing message with type 'periscope.v1.NodeTelemetry': "
        "Wire format was corrupt",
        "invalid NodeTelemetry: missing meta",
        "invalid NodeTelemetry: missing meta.node",
        "key is not UTF-8: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"]
    # The letters point back at the records: same-key records keep their order within one partition.
    assert sorted(x.offset for x in letters if x.key == node.encode()) == [0, 1, 2]


async def read_all(broker: Kafka, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
    """Everything currently in a topic (no group)."""
    consumer = broker.consumer(topic, client_id="test-read-all")
    await consumer.start()
    try:
        end = await consumer.end_offsets(list(consumer.assignment()))
        out: list[ConsumerRecord[bytes, bytes]] = []
        while [tp for tp, off in end.items() if await consumer.position(tp) < off]:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(records)
        return out
    finally:
        await consumer.stop()


async def test_group_resumes_after_its_committed_offsets(any_broker: Kafka, unique: str) -> None:
    (pods,) = await private_topics(any_broker, unique, topics.PODS)
    node = f"node-{unique}"
    events = [dataclasses.replace(samples(node)["PodEvent"], meta=_meta(node, seq)) for seq in range(1, 7)]
    seen: list[int] = []

    async def handler(topic: Topic, key: str | None, obj: Any, record: ConsumerRecord[bytes, bytes]) -> None:
        seen.append(obj.meta.seq)

    async def consume_until(count: int) -> None:
        stop, stats = asyncio.Event(), ConsumerStats()
        task = asyncio.create_task(consume(any_broker, [pods], f"g-{unique}", handler, service="test",
                                           stop=stop, stats=stats, **FAST_GROUP))
        await run_until(stats, stop, lambda: len(seen) == count)
        await task

    async with Publisher(any_broker, "test-producer") as pub:
        await pub.send_many(pods, [(node, e) for e in events[:3]])
        await consume_until(3)
        await pub.send_many(pods, [(node, e) for e in events[3:]])
        await consume_until(6)
    assert seen == [1, 2, 3, 4, 5, 6]  # one key = one partition = order kept; nothing re-read


async def test_latest_consumer_sees_what_is_sent_after_ready(any_broker: Kafka, unique: str) -> None:
    (xid,) = await private_topics(any_broker, unique, topics.XID)
    node = f"node-{unique}"
    old, new = (dataclasses.replace(samples(node)["XidEvent"], code=c) for c in (13, 48))
    codes: list[int] = []

    async def handler(topic: Topic, key: str | None, obj: Any, record: ConsumerRecord[bytes, bytes]) -> None:
        codes.append(obj.code)

    async with Publisher(any_broker, "test-producer") as pub:
        await pub.send(xid, node, old)
        stop, stats = asyncio.Event(), ConsumerStats()
        task = asyncio.create_task(consume(any_broker, [xid], None, handler, from_beginning=False,
                                           service="test", stop=stop, stats=stats))
        await asyncio.wait_for(stats.ready.wait(), 30)
        await pub.send(xid, node, new)
        await run_until(stats, stop, lambda: len(codes) == 1)
        await task
    assert codes == [48]


async def test_acks_all_batches_and_keys_pin_partitions(any_broker: Kafka, unique: str) -> None:
    (nodes,) = await private_topics(any_broker, unique, topics.NODES)
    names = [f"node-{unique}-{i}" for i in range(8)]
    items = [(n, m.NodeEvent(_meta(n, seq), n)) for seq in range(1, 51) for n in names]
    async with Publisher(any_broker, "test-producer") as pub:
        started = time.monotonic()
        await pub.send_many(nodes, items)
        elapsed = time.monotonic() - started
        assert pub.sent == len(items)
    records = await read_all(any_broker, nodes.name)
    assert len(records) == len(items)
    partitions: dict[bytes, set[int]] = {}
    for r in records:
        partitions.setdefault(r.key or b"", set()).add(r.partition)
    assert all(len(p) == 1 for p in partitions.values())  # a node's events share one partition
    assert elapsed < 10


async def test_a_batch_waiting_as_its_producer_starts_following_another_topic_is_delivered(
        any_broker: Kafka, unique: str) -> None:
    """aiokafka's client asks for every topic's metadata until it follows one, then for the followed
    ones only. A topic written to while known from the first kind of answer must be followed too, or
    the refresh that following a new topic starts forgets it, and a batch of it waiting then is not
    sent until it expires and fails (the request timeout): periscope.bus.clients.Producer."""
    known = Topic(f"test.known.{unique}", "node", "NodeEvent", partitions=4)
    await ensure_topics(any_broker, [known])
    producer = any_broker.producer("test-follow", linger_ms=300)
    await producer.start()
    try:
        # Known from an answer about every topic (the client follows none yet), not followed.
        deadline = time.monotonic() + 30
        while not producer.client.cluster.partitions_for_topic(known.name):
            assert time.monotonic() < deadline, "the metadata of every topic never listed it"
            await producer.client.force_metadata_update()
        await producer.send_and_wait(known.name, b"1", key=b"k")
        later = Topic(f"test.later.{unique}", "node", "NodeEvent", partitions=1)
        await ensure_topics(any_broker, [later])  # created after the producer's first metadata
        waiting = await producer.send(known.name, b"2", key=b"k")  # lingers 300 ms
        await asyncio.wait_for(producer.send_and_wait(later.name, b"3", key=b"k"), 15)
        delivered = await asyncio.wait_for(waiting, 15)
        assert delivered.offset == 1
    finally:
        await producer.stop()


async def test_ensure_topics_is_idempotent_and_keeps_fixed_partitions(any_broker: Kafka, unique: str) -> None:
    wanted = [Topic(f"test.a.{unique}", "node", "NodeEvent", partitions=3),
              Topic(f"test.b.{unique}", "node", "NodeEvent", partitions=1)]
    await ensure_topics(any_broker, wanted)
    await ensure_topics(any_broker, wanted)
    admin = any_broker.admin("test-admin")
    await admin.start()
    try:
        described = await admin.describe_topics([t.name for t in wanted])
    finally:
        await admin.close()
    assert {d["topic"]: len(d["partitions"]) for d in described} == {t.name: t.partitions for t in wanted}


async def test_the_joiner_subscription_waits_for_a_topic_until_the_metadata_lists_it(
        any_broker: Kafka, unique: str) -> None:
    """What the joiner's consumer does before it subscribes (periscope.bus.faust_transport), against the
    broker's real metadata: a topic that is not there yet is waited for, and shows once created."""
    consumer = any_broker.consumer(client_id="test-metadata")
    await consumer.start()
    try:
        fetch = consumer._client.fetch_all_metadata
        late = f"test.late.{unique}"
        waiting = asyncio.create_task(listed(fetch, {late, topics.TELEMETRY.name}, 60))
        await asyncio.sleep(1.0)
        assert not waiting.done()
        await ensure_topics(any_broker, [Topic(late, "node", "NodeEvent", partitions=2)])
        assert await asyncio.wait_for(waiting, 60) == set()
        assert await listed(fetch, {f"test.never.{unique}"}, 0.5) == {f"test.never.{unique}"}
    finally:
        await consumer.stop()


async def test_registry_topics_exist_on_the_shared_broker(any_broker: Kafka) -> None:
    admin = any_broker.admin("test-admin")
    await admin.start()
    try:
        assert {t.name for t in topics.ALL} <= set(await admin.list_topics())
    finally:
        await admin.close()


# ---------------------------------------------------------------- the launcher


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it is gone for our purposes only once reaped, so check its state.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_stop_leaves_no_process_behind() -> None:
    b = EmbeddedBroker()
    started = time.monotonic()
    bootstrap = b.start()
    assert time.monotonic() - started < 10
    pid = b.pid
    assert pid is not None and bootstrap == f"127.0.0.1:{b.port}"
    assert os.getpgid(pid) == pid  # own process group: a terminal Ctrl-C reaches the owner only
    b.stop()
    b.stop()  # idempotent
    assert b.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie
    assert _port_closed(b.port)


def test_broker_dies_with_a_killed_owner(tmp_path: Any) -> None:
    script = ("import sys, time\nfrom periscope.devkit.embedded import EmbeddedBroker\n"
              "b = EmbeddedBroker(); b.start(); print(b.pid, b.port, flush=True); time.sleep(60)\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        pid, port = map(int, owner.stdout.readline().split())
        assert not _gone(pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 5
        while not (_gone(pid) and _port_closed(port)):  # threads may outlast the leader by a moment
            assert time.monotonic() < deadline, "broker outlived its owner"
            time.sleep(0.02)
    finally:
        owner.kill()
        owner.wait()


def test_bogus_binary_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(BrokerError, match="not an executable file"):
        EmbeddedBroker(binary=str(tmp_path / "no-such-broker")).start()
    script = tmp_path / "broken-broker"
    script.write_text("#!/bin/sh\necho 'cannot open storage' >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(BrokerError, match=r"(?s)exited during start.*cannot open storage"):
        EmbeddedBroker(binary=str(script)).start(timeout_s=10)


def test_missing_wheel_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", str(tmp_path / "nothing-here"))
    with pytest.raises(BrokerError, match="no embedded broker binary"):
        EmbeddedBroker().start()


def test_taken_port_is_reported_with_the_broker_log(broker: Kafka) -> None:
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    with pytest.raises(BrokerError, match=r"(?s)exited during start.*AddrInUse"):
        EmbeddedBroker(port=port).start(timeout_s=10)


def test_a_broker_slow_to_fail_its_bind_is_not_taken_for_the_serving_one(
    broker: Kafka, tmp_path: Any
) -> None:
    """Under load a second broker can take seconds to find its port taken, while the first answers
    on it: its answers are not ours."""
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    script = tmp_path / "slow-broker"
    script.write_text("#!/bin/sh\nsleep 2\necho 'Error: Os { kind: AddrInUse }' >&2\nexit 1\n")
    script.chmod(0o755)
    with pytest.raises(BrokerError, match=r"(?s)exited during start.*AddrInUse"):
        EmbeddedBroker(port=port, binary=str(script)).start(timeout_s=10)


def test_broker_started_from_a_worker_thread_outlives_that_thread() -> None:
    # PR_SET_PDEATHSIG follows the forking thread, so the launcher forks from a long-lived one.
    b = EmbeddedBroker()
    worker = threading.Thread(target=b.start)
    worker.start()
    worker.join()
    try:
        time.sleep(0.2)
        assert b.running() and metadata_ready(b.host, b.port)
    finally:
        b.stop()


def test_metadata_probe_rejects_a_non_kafka_server() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"\x00\x00\x00\x10HTTP/1.1 400 Bad")

        t = threading.Thread(target=answer)
        t.start()
        assert not metadata_ready("127.0.0.1", port, timeout_s=2)
        t.join()


def _metadata_answer(brokers: list[tuple[int, str, int]]) -> bytes:
    """A Metadata v0 response (correlation id 1) listing `brokers` (node id, host, port), no topics."""
    body = struct.pack(">ii", 1, len(brokers))
    for node, host, port in brokers:
        body += struct.pack(">ih", node, len(host)) + host.encode() + struct.pack(">i", port)
    body += struct.pack(">i", 0)
    return struct.pack(">i", len(body)) + body


def test_apache_kafka_is_serving_once_its_metadata_lists_it_not_at_its_started_line(tmp_path: Any) -> None:
    """"Kafka Server started" can be logged before the broker is registered: metadata asked for then
    lists no broker, and an admin client fails (NodeNotReadyError). Start-up waits for both."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        kafka = ApacheKafka(port, directory=tmp_path)
        assert not kafka._serving()  # nothing logged yet
        kafka.log_path.write_text("[KafkaRaftServer nodeId=1] Kafka Server started\n")
        answers = [_metadata_answer([]), _metadata_answer([(1, "127.0.0.1", port)])]

        def answer() -> None:
            for reply in answers:
                conn, _ = server.accept()
                with conn:
                    conn.recv(1024)
                    conn.sendall(reply)

        t = threading.Thread(target=answer)
        t.start()
        assert not kafka._serving()  # started, but not in its own metadata yet
        assert kafka._serving()
        t.join()


async def _admin_module(kafka: Kafka, **env: str) -> tuple[int, str, str]:
    environ = {**os.environ, "PERISCOPE_KAFKA_BOOTSTRAP": kafka.bootstrap, **env}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "periscope.bus.admin", env=environ, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_admin_module_creates_every_topic_with_its_settings() -> None:
    with EmbeddedBroker() as fresh:
        kafka = Kafka(fresh.bootstrap)
        settings = {"PERISCOPE_TOPIC_PARTITIONS": "6", "PERISCOPE_INPUT_RETENTION": "3d"}
        rc, out, err = await _admin_module(kafka, **settings)
        assert rc == 0, err
        assert out.strip() == f"topics ready on {fresh.bootstrap}: {len(topics.ALL)}"
        admin = kafka.admin("test-admin")
        await admin.start()
        try:
            described = await admin.describe_topics([t.name for t in topics.ALL])
        finally:
            await admin.close()
        # The same settings again: nothing differs.
        rc, _, err = await _admin_module(kafka, **settings)
        assert rc == 0 and err == ""
    assert {d["topic"]: len(d["partitions"]) for d in described} == {t.name: t.partitions or 6
                                                                      for t in topics.ALL}


async def test_existing_topics_with_other_settings_are_reported_not_accepted(any_broker: Kafka) -> None:
    # The session's topics were created with the default settings; a job asking for others is told.
    rc, out, err = await _admin_module(any_broker, PERISCOPE_TOPIC_PARTITIONS="5",
                                       PERISCOPE_INPUT_RETENTION="2d")
    assert rc == 1, out + err
    lines = err.strip().splitlines()
    assert f"periscope.bus.admin: topic {topics.TELEMETRY.name} has 4 partitions, the settings say 5" in lines
    assert (f"periscope.bus.admin: topic {topics.XID.name}: retention.ms is '604800000', the settings say "
            "'172800000'") in lines
    assert not any(topics.ATTRIBUTION.name in line and "retention" in line for line in lines)  # outputs agree
    assert lines[-1].startswith("periscope.bus.admin: ") and "differ" in lines[-1]


def test_a_reused_log_file_does_not_fake_readiness(broker: Kafka, tmp_path: Any) -> None:
    log = tmp_path / "broker.log"
    with EmbeddedBroker(log_path=log) as first:
        assert "ready in" in log.read_text()
        port = first.port
    # Same log, a port someone else serves: the old "ready" line must not count, the new failure must show.
    taken = int(broker.bootstrap.rsplit(":", 1)[1])
    with pytest.raises(BrokerError, match="AddrInUse") as info:
        EmbeddedBroker(port=taken, log_path=log).start(timeout_s=10)
    assert "ready in" not in str(info.value)
    assert log.exists() and port > 0  # a caller's log file is kept
