"""Topics as production needs them, from the registry in periscope.bus.topics.

`python -m periscope.bus.admin [--bootstrap HOST:PORT]` (the deployment's one-shot topics job)
creates every topic with explicit settings: partitions (`PERISCOPE_TOPIC_PARTITIONS`, shared by all
node-keyed inputs so they stay co-partitioned, and used for the outputs), replication factor and
`min.insync.replicas`, retention (the inputs keep `PERISCOPE_INPUT_RETENTION`, 7 days by default:
that is how far back `periscope replay` and `periscope usage` can reach) and compression. Topics
that exist already are checked against the same settings, and every difference is reported: exit
status 1, one line per difference (partition counts are never changed: that would move keys between
partitions). The TLS/SASL settings come from PERISCOPE_KAFKA_SECURITY_PROTOCOL and friends.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError
from pydantic import Field, field_validator

from periscope.bus import topics as registry
from periscope.bus.clients import Kafka
from periscope.bus.diagnosis import check_connection
from periscope.bus.retry import Backoff
from periscope.bus.security import KafkaSecurityError
from periscope.bus.settings import ServiceSettings
from periscope.bus.topics import Topic
from periscope.config import Duration, load_settings

log = logging.getLogger(__name__)

_TOPIC_ALREADY_EXISTS = 36
_DAY_S = 86_400.0
# How long each role's records are kept: the inputs are the forensics horizon (how far back replay and
# usage reports reach), the API rebuilds its view from a day of outputs.
RETENTION_S = {"input": 7 * _DAY_S, "output": _DAY_S, "deadletter": 7 * _DAY_S}


class TopicError(RuntimeError):
    """The broker refused to create a topic."""


class TopicSettings(ServiceSettings):
    """How the topics job creates topics (env prefix PERISCOPE_)."""

    topic_partitions: int = Field(default=registry.DEFAULT_PARTITIONS, ge=1, le=10_000, description=(
        "partitions of each new topic (the joiner's parallelism: a node's records go to one)"))
    topic_replication_factor: int = Field(default=1, ge=1, le=32, description="replicas of each new topic")
    topic_min_insync_replicas: int = Field(default=1, ge=1, le=32, description=(
        "min.insync.replicas of each new topic (at most the replication factor)"))
    input_retention: Duration = Field(default=RETENTION_S["input"], description=(
        "retention of the input topics: the forensics horizon, how far back replay can reach"))
    output_retention: Duration = Field(default=RETENTION_S["output"], description=(
        "retention of the output topics: the API rebuilds its view from this much output"))
    deadletter_retention: Duration = Field(default=RETENTION_S["deadletter"], description=(
        "retention of the dead-letter topic"))
    topic_compression: Literal["lz4", "zstd", "snappy", "gzip", "producer"] = Field(
        default="lz4", description="compression.type of each new topic")

    @field_validator("input_retention", "output_retention", "deadletter_retention")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value < 1:
            raise ValueError("must be at least 1s")
        return value

    def plan(self) -> TopicPlan:
        if self.topic_min_insync_replicas > self.topic_replication_factor:
            raise ValueError("PERISCOPE_TOPIC_MIN_INSYNC_REPLICAS is larger than the replication factor")
        retention = {"input": self.input_retention, "output": self.output_retention,
                     "deadletter": self.deadletter_retention}
        return TopicPlan(self.topic_partitions, self.topic_replication_factor, self.topic_min_insync_replicas,
                         _ms(retention), self.topic_compression)


def _ms(seconds_by_role: dict[str, float]) -> dict[str, int]:
    return {role: round(s * 1000) for role, s in seconds_by_role.items()}


@dataclass(frozen=True, slots=True)
class TopicPlan:
    partitions: int = registry.DEFAULT_PARTITIONS
    replication_factor: int = 1
    min_insync_replicas: int = 1
    retention_ms: dict[str, int] = field(default_factory=lambda: _ms(RETENTION_S))
    compression: str = "lz4"
    # Kafka deletes whole closed segments only, and rolls one after 7 days (or 1 GiB) by default: a
    # retention much shorter than that needs segments at least as short to take effect.
    segment_ms: int | None = None

    def partitions_of(self, topic: Topic) -> int:
        return topic.partitions or self.partitions

    def configs(self, topic: Topic) -> dict[str, str]:
        retention = self.retention_ms[topic.role]
        segment = {"segment.ms": str(self.segment_ms)} if self.segment_ms is not None else {}
        out = {"cleanup.policy": "delete", "retention.ms": str(retention), **segment,
               "min.insync.replicas": str(self.min_insync_replicas), "compression.type": self.compression}
        if topic.role == "input":
            # The broker stamps each input record with the time it took it, which no producer can set:
            # the joiner rejects a record whose event time is too far ahead of it (PERISCOPE_FUTURE_SKEW).
            out["message.timestamp.type"] = "LogAppendTime"
        return out


DEFAULT_PLAN = TopicPlan()
CREATED_WAIT_S = 15.0  # how long a new topic may take to show its partitions and leaders


async def ensure_topics(kafka: Kafka, topics: Iterable[Topic] = registry.ALL, *,
                        plan: TopicPlan = DEFAULT_PLAN, client_id: str = "periscope-admin") -> list[str]:
    """Create the topics that do not exist yet; returns one line per difference of an existing topic
    from the plan (partition count or a config), empty when all agree."""
    wanted = {t.name: t for t in topics}
    admin = kafka.admin(client_id)
    await admin.start()
    try:
        # list_topics asks for all topics; asking for unknown names would auto-create them on brokers
        # with auto-creation on, with a default partition count.
        existing = set(await admin.list_topics())
        new = [NewTopic(name, plan.partitions_of(t), plan.replication_factor, topic_configs=plan.configs(t))
               for name, t in wanted.items() if name not in existing]
        if new:
            try:
                response = await admin.create_topics(new)
            except TopicAlreadyExistsError:  # a concurrent creator won the race
                response = None
            for name, code, *rest in getattr(response, "topic_errors", ()):
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    raise TopicError(f"cannot create topic {name}: error {code} {rest[0] if rest else ''}")
        drift: list[str] = []
        for meta in await _described(admin, list(wanted), {t.name for t in new}):
            name, count = meta["topic"], len(meta["partitions"])
            if count != plan.partitions_of(wanted[name]):
                drift.append(f"topic {name} has {count} partitions, the settings say "
                             f"{plan.partitions_of(wanted[name])}")
        checked = [t for name, t in wanted.items() if name in existing]
        if checked:
            drift += await _config_drift(admin, checked, plan)
        return drift
    finally:
        await admin.close()


async def _described(admin: Any, names: list[str], created: set[str]) -> list[dict[str, Any]]:
    """The topics' metadata, once each topic just `created` lists its partitions, each with a leader (up to
    CREATED_WAIT_S). Apache Kafka answers CreateTopics before its brokers' metadata has the new topics: a
    topic described at once has no partitions yet, which would read as drift, and one used at once has no
    leader to take its writes."""
    deadline = time.monotonic() + CREATED_WAIT_S
    backoff = Backoff(initial_s=0.05, max_s=1.0)  # a new topic's leaders come in well under a second
    while True:
        described: list[dict[str, Any]] = await admin.describe_topics(names)
        waiting = [m["topic"] for m in described if m["topic"] in created
                   and not (m["partitions"] and all(p["leader"] >= 0 for p in m["partitions"]))]
        if not waiting or time.monotonic() >= deadline:
            return described
        await backoff.sleep()


async def partition_counts(kafka: Kafka, names: Iterable[str], client_id: str = "periscope-partitions"
                           ) -> dict[str, int]:
    """Each named topic's partition count; topics that do not exist are left out."""
    admin = kafka.admin(client_id)
    await admin.start()
    try:
        wanted = set(names) & set(await admin.list_topics())
        described = await admin.describe_topics(sorted(wanted)) if wanted else []
    finally:
        await admin.close()
    return {meta["topic"]: len(meta["partitions"]) for meta in described if meta["partitions"]}


async def input_partitions(kafka: Kafka, topics: Iterable[Topic] = registry.NODE_INPUTS) -> int | None:
    """The partition count the node-keyed inputs share; None while any of them does not exist yet.
    TopicError when they differ (a node's records would then land on different-numbered partitions)."""
    names = [t.name for t in topics]
    counts = await partition_counts(kafka, names)
    if len(counts) < len(names):
        return None
    if len(set(counts.values())) != 1:
        listed = ", ".join(f"{n}: {c}" for n, c in sorted(counts.items()))
        raise TopicError(f"the node-keyed input topics must share one partition count ({listed})")
    return next(iter(counts.values()))


async def _config_drift(admin: Any, topics: list[Topic], plan: TopicPlan) -> list[str]:
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, t.name) for t in topics])
    actual: dict[str, dict[str, str]] = {}
    for response in responses:
        for resource in response.resources:  # (error_code, error_message, type, name, [config entries])
            actual[resource[3]] = {entry[0]: entry[1] for entry in resource[4]}
    out = []
    for t in topics:
        have = actual.get(t.name, {})
        for key, value in plan.configs(t).items():
            if have.get(key) != value:
                out.append(f"topic {t.name}: {key} is {have.get(key)!r}, the settings say {value!r}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m periscope.bus.admin",
        description="Create every Periscope topic with the configured partitions, replication, retention "
                    "and compression (PERISCOPE_TOPIC_*, PERISCOPE_*_RETENTION); report existing topics "
                    "whose settings differ (exit 1).")
    parser.add_argument("--bootstrap", help="Kafka bootstrap HOST:PORT (default: PERISCOPE_KAFKA_BOOTSTRAP)")
    parser.add_argument("--replication-factor", type=int,
                        help="for new topics (default: PERISCOPE_TOPIC_REPLICATION_FACTOR, 1)")
    args = parser.parse_args(argv)  # exits 2 with one usage line on bad input
    if args.replication_factor is not None and args.replication_factor < 1:
        parser.error("--replication-factor must be at least 1")
    overrides = {"topic_replication_factor": args.replication_factor} if args.replication_factor else {}
    try:
        settings = load_settings(TopicSettings, "periscope.bus.admin", **overrides)
        plan = settings.plan()
    except ValueError as e:  # SettingsError included
        print(f"periscope.bus.admin: {e}", file=sys.stderr)
        return 2
    kafka = settings.kafka()
    if args.bootstrap:
        kafka = kafka.with_bootstrap(args.bootstrap)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # aiokafka logs each failed connection attempt; the cause is reported once, below.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        drift = asyncio.run(_create(kafka, plan))
    except KafkaSecurityError as e:
        print(f"periscope.bus.admin: cannot connect to {kafka.bootstrap}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # the job is retried by its controller; one clear line beats a traceback
        print(f"periscope.bus.admin: cannot create topics on {kafka.bootstrap}: {e or type(e).__name__}",
              file=sys.stderr)
        return 1
    for line in drift:
        print(f"periscope.bus.admin: {line}", file=sys.stderr)
    if drift:
        print(f"periscope.bus.admin: {len(drift)} setting(s) of existing topics differ; change them with "
              "kafka-configs, or change the settings to match", file=sys.stderr)
        return 1
    print(f"topics ready on {kafka.bootstrap}: {len(registry.ALL)}")
    return 0


async def _create(kafka: Kafka, plan: TopicPlan) -> list[str]:
    await check_connection(kafka.bootstrap, kafka.security)
    return await ensure_topics(kafka, plan=plan)


if __name__ == "__main__":
    sys.exit(main())
