"""The Faust application: the six node-keyed input topics, three changelogged tables.

All node inputs share one partition count and are keyed by node, and Faust's assignor gives the
same-numbered partitions of co-partitioned topics (and of the tables' changelogs) to the same worker,
so one actor applies a node's events in order and owns that node's state. Values stay raw bytes and
are decoded with periscope.bus.codec. Tables use the memory store; their changelog topics are the
durable copy a restarted or rebalanced worker recovers from. Faust's stream joins are not used: an
agent subscribes the input topics, and their records go from each fetch straight to the worker in
batches (periscope.bus.faust_transport.Direct), which acknowledges each to the consumer itself.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Callable
from typing import Any, cast

import faust
from faust.tables import TableManager
from faust.types import TP

from periscope import heap
from periscope.bus.clients import Kafka
from periscope.bus.deadletter import DeadLetters
from periscope.bus.faust_transport import Direct, transport_class
from periscope.bus.topics import DEFAULT_PARTITIONS, NODE_INPUTS, TELEMETRY
from periscope.clock import clock_from_setting
from periscope.freshness import Freshness
from periscope.settings.joiner import JoinerSettings
from services.joiner.changelog import ChangelogTable
from services.joiner.delivery import OutputSender, RecordBatches
from services.joiner.metrics import JoinerMetrics
from services.joiner.positions import Positions
from services.joiner.progress import ProgressWatch, assigned, assigned_inputs, ready, unrecovered
from services.joiner.slots import Message
from services.joiner.web import JoinerWeb
from services.joiner.worker import Hooks, Joiner

log = logging.getLogger(__name__)

SERVICE = "joiner"
TICK_S = 1.0
STALL_MIN_S = 20.0
TAKE_MAX = 500  # input records per batch at most: a batch is stepped without a turn for the event loop
ENDS_EVERY_TICKS = 5  # how often the progress watch asks for end offsets (where the broker has them)


def _give_back(nodes: int) -> None:
    """What catching up freed stays with the C allocator otherwise (periscope.heap.give_back)."""
    before, started = heap.resident_bytes(), time.perf_counter()
    if heap.give_back() and before is not None:
        after = heap.resident_bytes() or before
        log.info("caught up on %d node(s): %.1f MiB of freed memory given back to the system (%.0f ms)",
                 nodes, (before - after) / 2**20, 1000 * (time.perf_counter() - started))


class Taken:
    """An input record as the worker takes it (it reads `.message`, as of a Faust event)."""

    __slots__ = ("message",)

    def __init__(self, message: Any) -> None:
        self.message = message


class Acked:
    """What Faust's `Consumer.ack` reads of a record (its position; `acked` it sets; a weak reference
    for its set of tracked records), made when the worker acknowledges one: the worker keeps a record's
    offset, not the record, while it waits for its node's persist."""

    __slots__ = ("__weakref__", "acked", "offset", "topic", "tp")

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic, self.offset, self.tp, self.acked = topic, offset, TP(topic, partition), False


class JoinerTableManager(TableManager):
    """Faust's table manager without the second it sleeps when starting (so that tables declared after
    the app starts can register): the joiner declares its tables before, and a restarted worker is
    back that second sooner."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class JoinerApp(faust.App):
    joiner: Joiner
    shutdown_timeout_s: float = 10.0
    kafka: Kafka
    direct: Direct

    def on_init_dependencies(self) -> Any:
        deps = super().on_init_dependencies()
        # Faust's Monitor sensor keeps per-record timings and counts that nothing reads (the worker has
        # its own metrics); as a sensor it runs for every input record. It stays as an object, for
        # the few places that call it directly.
        self.sensors.remove(self.monitor)
        return deps

    def on_rebalance_start(self) -> None:
        super().on_rebalance_start()
        # With no sensor installed the per-sensor rebalance state is empty, and Faust takes an empty
        # one for a rebalance whose start it missed: it would warn "Missing sensor state" on every
        # rebalance. A marker says the start was seen; it is only read per installed sensor.
        if not self._rebalancing_sensor_state:
            self._rebalancing_sensor_state = {"started": True}

    def _new_transport(self) -> Any:
        return transport_class(self.kafka.profile)(self.conf.broker_consumer, self)

    async def on_stop(self) -> None:
        # Persist every node before Faust stops the consumer, whose last commit then covers it all.
        # Bounded: with the broker gone nothing can be persisted, and SIGTERM must still stop us.
        joiner = getattr(self, "joiner", None)
        if joiner is not None:
            try:
                await asyncio.wait_for(joiner.shutdown(), self.shutdown_timeout_s)
            except Exception as e:  # a timeout or a failed write: the restart re-reads the rest
                log.warning("final persist failed: %r", e)
                for line in joiner.slow_persists(0.0):
                    log.warning("%s", line)
        await super().on_stop()


def create_app(settings: JoinerSettings, *, announce: Any = print, data_dir: str | None = None,
               on_stall: Callable[[], Any] | None = None, partitions: int = DEFAULT_PARTITIONS) -> JoinerApp:
    """The worker's Faust app; `data_dir` (default: DATA_DIR, else a new temporary directory) is Faust's.
    `on_stall` runs when Faust stops making progress (see services.joiner.progress; default: crash).
    `partitions` is the input topics' partition count, which the tables' changelogs must share."""
    session = settings.session_timeout
    rebalance_timeout = max(session, 10.0)
    kafka = settings.kafka()
    JoinerApp.kafka = kafka  # read by _new_transport, which Faust calls during construction
    app = JoinerApp(
        settings.app_id,
        **kafka.faust_settings(),
        store="memory://",
        TableManager=JoinerTableManager,
        datadir=data_dir or settings.data_dir or tempfile.mkdtemp(prefix="periscope-joiner-"),
        autodiscover=False,
        topic_partitions=partitions,
        topic_disable_leader=True,
        # Acks are held until state is persisted; revocation must not wait for them.
        stream_wait_empty=False,
        consumer_auto_offset_reset="earliest",
        table_standby_replicas=settings.standby_replicas,
        broker_session_timeout=session,
        broker_heartbeat_interval=max(0.2, session / 5),
        broker_rebalance_timeout=rebalance_timeout,
        # Take records already waiting in the stream's queue without a round through the event loop
        # each (Faust's repaired Cython fast path; opt-in in this Faust version).
        cython_optimizations=True,
    )
    app.kafka = kafka
    app.shutdown_timeout_s = max(5.0, session)
    metrics = JoinerMetrics()
    batches = RecordBatches(app.producer)
    tables = {
        name: ChangelogTable(
            app.Table(name, key_type=bytes, value_type=bytes, partitions=partitions, help=doc),
            batches, kafka.profile.fence_records, listed=name == "nodes")  # adopt() lists the nodes
        for name, doc in (
            ("nodes", "node -> node part of the engine state"),
            ("pods", "pod UID -> that pod's attribution rows"),
            ("marks", "node -> newest output time published"),
        )
    }
    dead_letters = DeadLetters(kafka, f"{settings.app_id}-deadletters", SERVICE)

    async def send_dead_letter(msg: Message, error: str) -> None:
        await dead_letters.send(msg.topic, msg.partition, msg.offset, msg.key, msg.value or b"", error)

    sender = OutputSender(batches.send, tables["marks"].fence,
                          lambda topic, n: metrics.events_out.labels(topic).inc(n), app.crash)

    def crash() -> None:
        app.add_future(app.crash(RuntimeError("rebalance made no progress")))

    positions = Positions()  # the worker writes it, the watch reads it
    watch = ProgressWatch(app, positions, max(STALL_MIN_S, 4 * session), on_stall or crash,
                          ask_ends=kafka.profile.end_offsets_exact, held_up=lambda: sender.held_up)

    async def ack(topic: str, partition: int, offset: int) -> None:
        app.consumer.ack(cast(Any, Acked(topic, partition, offset)))  # the record may be committed
    joiner = Joiner(
        config=settings.engine_config(), persist_interval_s=settings.state_persist_interval, metrics=metrics,
        nodes=tables["nodes"], pods=tables["pods"], marks=tables["marks"], sender=sender,
        hooks=Hooks(
            dead_letter=send_dead_letter, on_error=app.crash, ack=ack,
            rebalancing=lambda: bool(app.rebalancing),
            # As Faust's own per-record check: a record fetched before the latest rebalance is skipped.
            current=lambda msg: getattr(msg, "generation_id", None) == app.consumer_generation_id,
            first_offset=watch.first_offset, end_of=watch.end_of,
            event_ms_of=clock_from_setting(settings.clock).event_ms,
        ),
        future_skew_ms=round(settings.future_skew * 1000), stalled_after_s=settings.stale_after,
        positions=positions,
    )
    app.joiner = joiner
    freshness = Freshness(settings.stale_after)  # from the last input record handled or assignment

    source = app.topic(*(t.name for t in NODE_INPUTS), key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")

    async def take(messages: list[Any]) -> None:
        freshness.touch()
        await joiner.handle_batch([Taken(m) for m in messages])

    # Input records go from each fetch to the worker in batches (see faust_transport.Direct): at most
    # TAKE_MAX, or what one fetch brought. Nothing is acknowledged here (see worker.py).
    app.direct = Direct(frozenset(t.name for t in NODE_INPUTS), take, TAKE_MAX, room=sender.room)

    async def join(stream: Any) -> None:
        # The agent subscribes the input topics (and makes them acknowledged topics); their records
        # bypass its stream.
        async for _event in stream.noack():
            pass

    app.agent(source, name="periscope.joiner.join", concurrency=1)(join)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        ticks += 1
        if ticks % ENDS_EVERY_TICKS == 0:
            await watch.refresh_ends()
        watch.check(time.monotonic())
        joiner.tick()
        if joiner.caught_up_again():
            _give_back(len(joiner.slots))

    app.timer(TICK_S, name="periscope.joiner.tick")(tick)

    async def run_sender() -> None:
        await sender.run()

    app.task(run_sender)

    async def on_revoked(_sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        # Half the time the group gives members to rejoin: outputs that reach the broker after the next
        # owner recovered the marks could be overtaken by its older ones.
        await joiner.on_revoked(timeout_s=rebalance_timeout / 2)

    async def on_assigned(_sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        freshness.touch()  # a worker that just got its partitions has had no time to read them yet
        joiner.on_assigned()

    app.on_partitions_revoked.connect(cast(Any, on_revoked))
    app.on_partitions_assigned.connect(cast(Any, on_assigned))

    async def on_shutdown(_sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        await dead_letters.stop()

    app.on_before_shutdown.connect(cast(Any, on_shutdown))

    async def on_rebalance_complete(_sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        # Faust resumes the stream partitions and seeks them next, and only then resumes its flow
        # control, which empties every stream's queue: records fetched in between would be dropped with
        # their read offset passed, never read again. Held here, they wait for that resume instead.
        app.flow_control.suspend()
        try:
            await watch.align()  # before the first record: it must be where its partition was put
        except Exception as e:  # a rebalance under way again; the next one aligns
            log.warning("could not position the input partitions: %r", e)
        for topic, lacking in unrecovered(assigned(app), app.tables.changelog_topics).items():
            log.error("changelog %s: partition(s) %s not assigned with their input partitions, so not "
                      "recovered: the nodes there start from what this worker writes", topic,
                      ", ".join(map(str, lacking)))
        # The tables are recovered: take up the nodes of the partitions now held.
        held = {tp.partition for tp in assigned_inputs(app) if tp.topic == TELEMETRY.name}
        if held and (taken := await joiner.adopt(held)):
            log.info("%d node(s) taken up from the tables", taken)

    app.on_rebalance_complete.connect(cast(Any, on_rebalance_complete))
    metrics.watch_lag(watch.lag)
    app.web_server(JoinerWeb(settings.web_host, settings.web_port, metrics,
                             ready=lambda: ready(app) and not freshness.stale(), announce=announce,
                             stalled=joiner.stalled,
                             data_age=freshness.age_s))
    return app
