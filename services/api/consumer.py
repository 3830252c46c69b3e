"""Kafka -> View: reads the joiner's output topics (and the cluster policy/node topics) into the view.

Each replica has its own id (prefix + random suffix, its client id), joins no consumer group, reads
every partition from the beginning and never commits, so every replica rebuilds the full view on its
own and replicas are interchangeable. Readiness:
at start the end offset of every partition is noted; the replica is ready once it has read up to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from periscope.bus import topics as t
from periscope.bus.clients import Kafka
from periscope.bus.codec import DecodeError, decode
from periscope.bus.deadletter import DeadLetters
from periscope.bus.recovery import CALL_TIMEOUT_S, stop_within
from periscope.bus.retry import Backoff
from periscope.bus.security import KafkaSecurityError
from periscope.core.model import DeviceInventory, Finding, GpuState, PodAttribution
from periscope.logs import Trouble
from services.api.evidence import Evidence
from services.api.status import ConsumerStatus
from services.api.view import View

log = logging.getLogger(__name__)

SERVICE = "api"
# The inventory is not shown: it is the evidence GPU states are checked against (services.api.evidence).
TOPICS: tuple[t.Topic, ...] = (t.ATTRIBUTION, t.GPUS, t.FINDINGS, t.POLICY, t.NODES, t.INVENTORY)
# Freshness: the joiner publishes its outputs on change plus a heartbeat (5 s event time by default), so
# even a quiet cluster keeps sending, and any new one of them means data moves.
FRESH_TYPES = (PodAttribution, GpuState, Finding)
_LAG_EVERY_S = 1.0
_EVICT_EVERY_S = 60.0
_TOPICS_EVERY_S = 2.0  # how often to look for output topics created after start


def group_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(4)}"


class ViewConsumer:
    def __init__(
        self,
        view: View,
        kafka: Kafka,
        group_prefix: str = "periscope-api-",
        topics: Sequence[t.Topic] = TOPICS,
        *,
        dead_letters: bool = True,
        retention_ms: int = 24 * 3_600_000,
        window_retention_ms: int = 3_600_000,
        stale_after_s: float = 30.0,
        evidence: Evidence | None = None,
    ) -> None:
        self.view = view
        # Without one: the wall clock, 10 minutes of skew, GPUs checked against the inventory.
        self.evidence = evidence or Evidence(lambda: time.time_ns() // 1_000_000, 600_000)
        self.kafka = kafka
        self.topics = tuple(topics)
        self.status = ConsumerStatus(group_id=group_id(group_prefix), stale_after_s=stale_after_s)
        self._dead_letters = (DeadLetters(kafka, f"{self.status.group_id}-dlq", SERVICE)
                              if dead_letters else None)
        self._backoff = Backoff()
        self._targets: dict[TopicPartition, int] | None = None  # end offsets seen at start
        self._next: dict[TopicPartition, int] = {}
        self._lag_at = 0.0
        self._retention_ms = retention_ms
        self._window_retention_ms = window_retention_ms
        self._evicted_at = time.monotonic()
        self._trouble = Trouble(log, "api consumer: broker unreachable")

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop` is set; broker trouble is reported in the status and retried."""
        try:
            while not stop.is_set():
                try:
                    await self._session(stop)
                # KafkaSecurityError: a rotated-away password file is retried too
                except (KafkaError, OSError, TimeoutError, KafkaSecurityError) as e:
                    self.status.connected = False
                    self.status.error = f"{type(e).__name__}: {e}"
                    self._trouble.failed(f"{self.status.error}; retrying")
                    await self._backoff.sleep(stop)
        finally:
            if self._dead_letters is not None:
                with contextlib.suppress(Exception):  # a broker that is gone cannot take the goodbye
                    await self._dead_letters.stop()

    async def _session(self, stop: asyncio.Event) -> None:
        # Built per session, so a retry after a failure reads a rotated password file.
        # No consumer group: the partitions are assigned by hand and nothing is committed, so there is no
        # coordinator to find or join (the id names this replica's client).
        consumer = self.kafka.consumer(client_id=self.status.group_id)
        try:
            await asyncio.wait_for(consumer.start(), CALL_TIMEOUT_S)
            if self._targets is None:
                self._targets = await asyncio.wait_for(self._end_offsets(consumer), CALL_TIMEOUT_S)
                self.status.pending = {(tp.topic, tp.partition): n for tp, n in self._targets.items() if n}
                self._check_ready()
            self.status.connected, self.status.error = True, ""
            self._trouble.cleared()
            self._backoff.reset()
            assigned: set[TopicPartition] = set()
            checked = 0.0
            while not stop.is_set():
                if time.monotonic() - checked >= _TOPICS_EVERY_S:
                    # Bounded: a paused broker answers nothing, and this is how a stall is noticed.
                    assigned = await asyncio.wait_for(self._assign(consumer, assigned), CALL_TIMEOUT_S)
                    checked = time.monotonic()
                    self.status.connected, self.status.error = True, ""
                    self._trouble.cleared()
                if not assigned:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), _TOPICS_EVERY_S)
                    continue
                batches = await consumer.getmany(timeout_ms=300, max_records=2000)
                for tp, records in batches.items():
                    for rec in records:
                        await self._handle(rec)
                    if records:
                        self._next[tp] = records[-1].offset + 1
                await self._progress(consumer, assigned)
                ev = self.evidence
                self.status.refused, self.status.held = dict(ev.refused), len(ev.held)
                self.status.last_refusal = ev.last_refusal
                await asyncio.sleep(0)  # let HTTP requests in between batches
        finally:
            await stop_within(consumer, CALL_TIMEOUT_S)

    async def _partitions(self, consumer: AIOKafkaConsumer) -> set[TopicPartition]:
        # One metadata request for all topics: it sees topics created since start (the consumer's own
        # metadata only tracks assigned ones) and, unlike asking for names, never auto-creates them.
        cluster = await consumer._client.fetch_all_metadata()
        return {
            TopicPartition(tp.name, p)
            for tp in self.topics
            for p in cluster.partitions_for_topic(tp.name) or ()
        }

    async def _end_offsets(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, int]:
        tps = sorted(await self._partitions(consumer))
        if not tps:
            return {}
        ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        return ends

    async def _assign(self, consumer: AIOKafkaConsumer, assigned: set[TopicPartition]) -> set[TopicPartition]:
        """Read every partition of the topics (manual assignment: no group join to wait for, no rebalance
        that would send a never-committing member back to offset 0), resuming where this replica was."""
        tps = await self._partitions(consumer)
        if tps == assigned:
            return assigned
        consumer.assign(sorted(tps))
        for tp in tps:
            if tp in self._next:
                consumer.seek(tp, self._next[tp])
        return tps

    async def _handle(self, rec: ConsumerRecord[Any, Any]) -> None:
        s = self.status
        s.consumed[rec.topic] = s.consumed.get(rec.topic, 0) + 1
        topic = t.BY_NAME.get(rec.topic)
        value: bytes = rec.value or b""
        try:
            if topic is None:
                raise DecodeError(f"not a topic the api reads: {rec.topic}")
            obj = decode(topic, value)
        except DecodeError as e:
            await self._dead_letter(rec, value, str(e))
            return
        if isinstance(obj, DeviceInventory):
            for held in self.evidence.learn(obj):
                await self._apply(rec, value, held)
            return
        if self.evidence.verdict(obj):
            await self._apply(rec, value, obj)

    async def _apply(self, rec: ConsumerRecord[Any, Any], value: bytes, obj: object) -> None:
        s = self.status
        try:
            changed = self.view.apply(obj)
        except Exception as e:  # a bug applying one record must not stop the stream
            log.exception("api view: applying %s@%d/%d failed", rec.topic, rec.partition, rec.offset)
            await self._dead_letter(rec, value, f"apply failed: {type(e).__name__}: {e}")
            return
        if changed:
            s.applied += 1
            if isinstance(obj, FRESH_TYPES):
                s.newest_at = time.monotonic()
        else:
            s.stale += 1

    async def _progress(self, consumer: AIOKafkaConsumer, assigned: set[TopicPartition]) -> None:
        for key in list(self.status.pending):
            tp = TopicPartition(*key)
            pos = self._next.get(tp, 0)
            if tp in assigned:
                pos = max(pos, await consumer.position(tp))
            if pos >= self.status.pending[key]:
                del self.status.pending[key]
        if self._targets is not None and not any(k[0] == t.INVENTORY.name for k in self.status.pending):
            self.evidence.caught_up()
        self._check_ready()
        now = time.monotonic()
        if now - self._lag_at < _LAG_EVERY_S:
            return
        self._lag_at = now
        if now - self._evicted_at >= _EVICT_EVERY_S and self.view.as_of_ms:
            self._evicted_at = now
            # Event time, but never ahead of the wall clock: one record stamped by a skewed clock
            # must not age everything else out.
            t_ms = min(self.view.as_of_ms, time.time_ns() // 1_000_000)
            self.status.evicted += self.view.evict(t_ms - self._retention_ms)
            self.view.prune_windows(t_ms - self._window_retention_ms)
        lag: dict[tuple[str, int], int] = {}
        for tp in assigned:
            hw = consumer.highwater(tp)
            if hw is not None:
                lag[(tp.topic, tp.partition)] = max(0, hw - self._next.get(tp, 0))
        self.status.lag = lag

    def _check_ready(self) -> None:
        if not self.status.ready and not self.status.pending and self._targets is not None:
            self.status.ready = True
            log.info(
                "api view caught up: %d pod-device rows, %d GPUs", self.view.row_count(), len(self.view.gpus)
            )

    async def _dead_letter(self, rec: ConsumerRecord[Any, Any], value: bytes, error: str) -> None:
        self.status.dead_letters += 1
        log.warning("api consumer: dead letter %s@%d/%d: %s", rec.topic, rec.partition, rec.offset, error)
        if self._dead_letters is None:
            return
        try:
            await self._dead_letters.send(rec.topic, rec.partition, rec.offset, rec.key, value, error)
        except Exception as e:  # losing a dead letter must not stop consumption; it is counted above
            log.warning("api consumer: could not publish dead letter: %s", e)
