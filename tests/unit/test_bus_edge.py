"""The Kafka edge without a broker: what each profile makes of a client, the topic plan, the ACL table
and its two published copies (docs/deploy.md's commands, deploy/'s Strimzi KafkaUsers), the back-off."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from periscope.bus import topics as t
from periscope.bus.acls import SERVICES, kafka_acls_commands, service_acls
from periscope.bus.admin import TopicPlan, TopicSettings
from periscope.bus.clients import Kafka
from periscope.bus.profile import EMBEDDED, KAFKA, profile
from periscope.bus.retry import Backoff
from periscope.bus.settings import KafkaSettings

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("p", "idempotent", "compression", "batch", "linger"), [
    (KAFKA, True, "lz4", 256 * 1024, 0.005), (EMBEDDED, False, None, 1, 0.0)])
async def test_producers_follow_their_profile(p: object, idempotent: bool, compression: str | None,
                                              batch: int, linger: float) -> None:
    producer = Kafka("127.0.0.1:1", profile=p).producer("test")  # type: ignore[arg-type]
    assert (producer._txn_manager is not None) == idempotent
    assert producer._compression_type == compression
    assert producer._message_accumulator._batch_size == batch  # 1: every record in a batch of its own
    assert producer._message_accumulator._linger_time == linger  # a one-record batch cannot fill by waiting


def test_a_producer_asked_to_linger_does_so_on_either_broker() -> None:
    for p in (KAFKA, EMBEDDED):
        assert Kafka("127.0.0.1:1", profile=p).producer_settings(linger_ms=300)["linger_ms"] == 300


async def test_consumers_wait_as_their_broker_allows_and_never_commit_on_a_timer() -> None:
    for p, wait in ((KAFKA, 500), (EMBEDDED, 100)):
        consumer = Kafka("127.0.0.1:1", profile=p).consumer("x", client_id="test")
        assert consumer._fetch_max_wait_ms == wait and consumer._enable_auto_commit is False


def test_the_profile_setting_is_checked() -> None:
    assert KafkaSettings().kafka().profile is KAFKA  # production is Apache Kafka
    assert KafkaSettings(kafka_profile="embedded").kafka().profile is EMBEDDED
    with pytest.raises(ValueError, match="unknown broker profile"):
        profile("tansu")
    with pytest.raises(ValueError):
        KafkaSettings(kafka_profile="tansu")


def test_faust_gets_the_profiles_batching_and_compression() -> None:
    s = Kafka("a:1,b:2", profile=KAFKA).faust_settings()
    assert s["broker"] == ["kafka://a:1", "kafka://b:2"]
    assert (s["producer_acks"], s["producer_compression_type"], s["producer_max_batch_size"]) == (-1, "lz4",
                                                                                                  256 * 1024)
    assert s["consumer_max_fetch_size"] == 64 * 1024  # what a catching-up worker materializes at once
    # One uncompressed record a batch: the same bytes hold a tenth of the records, so Faust's default.
    assert Kafka("a:1", profile=EMBEDDED).faust_settings()["consumer_max_fetch_size"] == 1024 * 1024


def test_the_topic_plan_gives_every_topic_explicit_settings() -> None:
    plan = TopicSettings(topic_partitions=12, topic_replication_factor=3, topic_min_insync_replicas=2,
                         input_retention="3d").plan()
    assert [plan.partitions_of(x) for x in (t.TELEMETRY, t.PODS, t.ATTRIBUTION, t.POLICY, t.DEADLETTER)] == [
        12, 12, 12, 1, 1]
    assert plan.configs(t.XID) == {"cleanup.policy": "delete", "retention.ms": str(3 * 86_400_000),
                                   "min.insync.replicas": "2", "compression.type": "lz4",
                                   "message.timestamp.type": "LogAppendTime"}
    assert "message.timestamp.type" not in plan.configs(t.GPUS)  # outputs keep their producer's time
    assert plan.configs(t.GPUS)["retention.ms"] == str(86_400_000)  # outputs: a day
    assert TopicPlan().configs(t.TELEMETRY)["retention.ms"] == str(7 * 86_400_000)  # the forensics horizon
    with pytest.raises(ValueError, match="larger than the replication factor"):
        TopicSettings(topic_min_insync_replicas=2).plan()
    for bad in ({"topic_partitions": 0}, {"input_retention": "0s"}, {"topic_compression": "brotli"}):
        with pytest.raises(ValueError):
            TopicSettings(**bad)


def test_only_the_joiner_may_write_the_outputs() -> None:
    grants = service_acls()
    assert set(grants) == set(SERVICES)
    for service, acls in grants.items():
        writes = {(a.name, a.pattern) for a in acls if {"Write", "All"} & set(a.operations)}
        for output in t.OUTPUTS:
            may = any(output.name == n or (p == "prefixed" and output.name.startswith(n)) for n, p in writes)
            assert may == (service == "joiner"), (service, output.name)
    probe_writes = {a.name for a in grants["probe"] if "Write" in a.operations}
    assert probe_writes == {"periscope.node."}


def test_docs_list_exactly_the_granted_kafka_acls_commands() -> None:
    commands = kafka_acls_commands()
    assert len(commands) == sum(len(acls) for acls in service_acls().values())
    docs = (REPO / "docs" / "deploy.md").read_text()
    listed = [line for line in docs.splitlines() if line.startswith("kafka-acls.sh ")]
    assert listed == commands


def test_the_strimzi_kafka_users_grant_what_the_table_says() -> None:
    users = list(yaml.safe_load_all((REPO / "deploy/components/kafka-acls/kafka-users.yaml").read_text()))
    by_name = {u["metadata"]["name"]: u for u in users}
    assert set(by_name) == {f"periscope-{s}" for s in SERVICES}
    for service, acls in service_acls().items():
        spec = by_name[f"periscope-{service}"]["spec"]
        assert spec["authentication"] == {"type": "scram-sha-512"}
        got = [(r["resource"]["type"], r["resource"].get("name"), r["resource"]["patternType"],
                tuple(r["operations"])) for r in spec["authorization"]["acls"]]
        assert got == [(a.resource, a.name, a.pattern, a.operations) for a in acls]


def test_backoff_grows_to_its_ceiling_with_jitter_and_resets() -> None:
    b = Backoff(initial_s=0.2, max_s=1.0, jitter=0.0)
    assert [round(b.next(), 3) for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.next() == 0.2
    spread = Backoff(initial_s=1.0, jitter=0.2)
    assert all(0.8 <= Backoff(initial_s=1.0, jitter=0.2).next() <= 1.2 for _ in range(50)) and spread


def test_kafka_clients_are_built_in_the_bus_only() -> None:
    """One owner for the Kafka edge: no AIOKafka* client or faust.App is constructed outside it."""
    pattern = re.compile(r"\bAIOKafka(Producer|Consumer|AdminClient)\(|\bfaust\.App\(")
    files = [p for root in ("periscope", "services") for p in (REPO / root).rglob("*.py")]
    offenders = [str(p.relative_to(REPO)) for p in files
                 if pattern.search(p.read_text()) and not p.is_relative_to(REPO / "periscope" / "bus")]
    assert offenders == []


class _CreatedTopicMetadata:
    """`describe_topics` as aiokafka's admin client answers it (MetadataResponse.to_object()'s topics) for a
    topic Apache Kafka has just created: first unknown, with no partitions, then its partitions without a
    leader (-1), then led; an older topic is described in full from the start."""

    def __init__(self, new: str, old: str, unready: int) -> None:
        self.new, self.old, self.unready, self.calls = new, old, unready, 0

    @staticmethod
    def _topic(name: str, leader: int | None) -> dict[str, object]:
        parts = [] if leader is None else [
            {"error_code": 0 if leader >= 0 else 5, "partition": p, "leader": leader, "replicas": [1],
             "isr": [1]} for p in range(3)]
        return {"error_code": 0 if parts else 3, "topic": name, "is_internal": False, "partitions": parts}

    async def describe_topics(self, names: list[str]) -> list[dict[str, object]]:
        self.calls += 1
        stage = None if self.calls <= self.unready // 2 else -1 if self.calls <= self.unready else 1
        return [self._topic(n, stage if n == self.new else 1) for n in names]


async def test_a_created_topic_is_described_once_its_partitions_have_leaders() -> None:
    from periscope.bus.admin import _described

    admin = _CreatedTopicMetadata("fresh", "old", unready=4)
    described = await _described(admin, ["old", "fresh"], {"fresh"})
    assert admin.calls == 5
    assert [(m["topic"], [p["leader"] for p in m["partitions"]]) for m in described] == [
        ("old", [1, 1, 1]), ("fresh", [1, 1, 1])]


async def test_a_topic_that_existed_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from periscope.bus import admin as admin_module

    monkeypatch.setattr(admin_module, "CREATED_WAIT_S", 0.2)
    admin = _CreatedTopicMetadata("stuck", "old", unready=10**6)
    described = await admin_module._described(admin, ["stuck"], set())
    assert admin.calls == 1 and described[0]["partitions"] == []
    # One just created that never shows its partitions is described as it is once the wait is over (the
    # caller reports it as drift).
    described = await admin_module._described(admin, ["stuck"], {"stuck"})
    assert 1 < admin.calls < 10 and described[0]["partitions"] == []
