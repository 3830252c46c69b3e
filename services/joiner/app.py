"""The Faust application: one agent over the six node-keyed input topics, three changelogged tables.

All node inputs share one partition count and are keyed by node, and Faust's assignor gives the
same-numbered partitions of co-partitioned topics (and of the tables' changelogs) to the same worker,
so one actor applies a node's events in order and owns that node's state. Values stay raw bytes and
are decoded with periscope.bus.codec. Tables use the memory store; their changelog topics are the
durable copy a restarted or rebalanced worker recovers from. Faust's stream joins are not used.
"""

from __future__ import annotations

import functools
import logging
import tempfile
from collections.abc import Iterator
from typing import Any, cast

import faust
from faust.types import TP

from periscope.bus.deadletter import dead_letter
from periscope.bus.producer import Publisher
from periscope.bus.topics import NODE_INPUTS, TELEMETRY
from services.joiner.agents import Joiner, Message
from services.joiner.metrics import JoinerMetrics
from services.joiner.output import OutputSender
from services.joiner.settings import JoinerSettings
from services.joiner.web import JoinerWeb

log = logging.getLogger(__name__)

SERVICE = "joiner"
TICK_S = 1.0
FENCE_KEY = b"\x00fence/"  # no node name or pod UID starts with a NUL byte


class ChangelogTable:
    """A Faust table written with an explicit partition, so timers and persist tasks (which run
    outside any stream event) can write; each write returns the changelog record's delivery future."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def get(self, key: bytes) -> bytes | None:
        value = self.table.data.get(key)
        return value if isinstance(value, bytes) else None

    def put(self, key: bytes, value: bytes, partition: int) -> Any:
        fut = self.table.send_changelog(partition, key, value)
        self.table.data[key] = value
        return fut

    def delete(self, key: bytes, partition: int) -> Any:
        fut = self.table.send_changelog(partition, key, None, value_serializer="raw")
        self.table.data.pop(key, None)
        return fut

    def fence(self, partition: int) -> Any:
        """Append a record that only marks a point in the changelog partition (see agents.py)."""
        return self.put(FENCE_KEY + str(partition).encode(), b"1", partition)


class JoinerApp(faust.App):
    joiner: Joiner

    async def on_stop(self) -> None:
        # Persist every node before Faust stops the consumer, whose last commit then covers it all.
        joiner = getattr(self, "joiner", None)
        if joiner is not None:
            try:
                await joiner.shutdown()
            except Exception as e:  # the restart re-reads what was not persisted
                log.warning("final persist failed: %r", e)
        await super().on_stop()


def _brokers(bootstrap: str) -> list[str]:
    return [f"kafka://{h.strip()}" for h in bootstrap.split(",") if h.strip()]


def create_app(settings: JoinerSettings, *, announce: Any = print) -> JoinerApp:
    session = settings.session_timeout
    app = JoinerApp(
        settings.app_id,
        broker=_brokers(settings.kafka_bootstrap),
        store="memory://",
        datadir=settings.data_dir or tempfile.mkdtemp(prefix="periscope-joiner-"),
        autodiscover=False,
        topic_partitions=TELEMETRY.partitions,
        topic_disable_leader=True,
        # Acks are held until state is persisted; revocation must not wait for them.
        stream_wait_empty=False,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        table_standby_replicas=settings.standby_replicas,
        broker_session_timeout=session,
        broker_heartbeat_interval=max(0.2, session / 5),
        broker_rebalance_timeout=max(session, 10.0),
    )
    metrics = JoinerMetrics()
    tables = {
        name: ChangelogTable(
            app.Table(name, key_type=bytes, value_type=bytes, partitions=TELEMETRY.partitions, help=doc))
        for name, doc in (
            ("nodes", "node -> node part of the engine state"),
            ("pods", "pod UID -> that pod's attribution rows"),
            ("marks", "node -> newest output time published"),
        )
    }
    publishers: list[Publisher] = []  # created on first use: aiokafka needs the running loop

    async def send_dead_letter(msg: Message, error: str) -> None:
        if not publishers:
            publisher = Publisher(settings.kafka_bootstrap, client_id=f"{settings.app_id}-deadletters")
            await publisher.start()
            publishers.append(publisher)
        await dead_letter(publishers[0], msg.topic, msg.partition, msg.offset, msg.key, msg.value or b"",
                          error, SERVICE)

    async def send(topic: str, key: bytes, value: bytes) -> Any:
        return await app.producer.send(topic, key, value, None, None, None)

    sender = OutputSender(send, tables["marks"].fence, lambda topic: metrics.events_out.labels(topic).inc(),
                          app.crash)
    joiner = Joiner(
        config=settings.engine_config(), persist_interval_s=settings.state_persist_interval, metrics=metrics,
        nodes=tables["nodes"], pods=tables["pods"], marks=tables["marks"], sender=sender,
        dead_letter=send_dead_letter, rebalancing=lambda: bool(app.rebalancing), on_error=app.crash,
    )
    app.joiner = joiner

    source = app.topic(*(t.name for t in NODE_INPUTS), key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")

    async def join(stream: Any) -> None:
        manual = stream.noack()
        joiner.ack = manual.ack
        async for event in manual.events():
            await joiner.handle(event)

    app.agent(source, name="periscope.joiner.join", concurrency=1)(join)

    async def tick() -> None:
        joiner.tick()

    app.timer(TICK_S, name="periscope.joiner.tick")(tick)

    async def run_sender() -> None:
        await sender.run()

    app.task(run_sender)

    async def on_revoked(_sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        await joiner.on_revoked(timeout_s=settings.session_timeout / 2)

    async def on_assigned(_sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        joiner.on_rebalance()

    app.on_partitions_revoked.connect(cast(Any, on_revoked))
    app.on_partitions_assigned.connect(cast(Any, on_assigned))

    async def on_shutdown(_sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        for publisher in publishers:
            await publisher.stop()

    app.on_before_shutdown.connect(cast(Any, on_shutdown))
    metrics.watch_lag(functools.partial(_lag, app, joiner))
    app.web_server(JoinerWeb(settings.web_host, settings.web_port, metrics,
                             ready=functools.partial(_ready, app), announce=announce))
    return app


def _assigned_inputs(app: faust.App) -> list[TP]:
    try:
        assignment = app.consumer.assignment()
    except Exception:  # not started yet
        return []
    names = {t.name for t in NODE_INPUTS}
    return sorted(tp for tp in assignment if tp.topic in names)


def _ready(app: faust.App) -> bool:
    return bool(_assigned_inputs(app)) and not app.rebalancing


def _lag(app: faust.App, joiner: Joiner) -> Iterator[tuple[str, int, int]]:
    committed = app.monitor.tp_committed_offsets or {}
    for tp in _assigned_inputs(app):
        try:
            end = app.consumer.highwater(tp)
        except Exception:
            continue
        if end is None or end < 0:
            continue
        done = joiner.processed.get((tp.topic, tp.partition))
        position = done + 1 if done is not None else committed.get(tp, 0)
        yield tp.topic, tp.partition, max(0, end - position)
