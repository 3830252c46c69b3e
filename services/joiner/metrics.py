"""Prometheus metrics of one joiner worker, in its own registry, served on the worker's web port."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from periscope.core.engine import Counters

# (topic, partition) -> messages not yet processed; None when the broker's end offset is unknown.
LagSource = Callable[[], Iterable[tuple[str, int, int]]]


class _LagCollector(Collector):
    def __init__(self, source: LagSource) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "periscope_joiner_consumer_lag",
            "Input records on the broker not yet processed by this worker, per assigned partition",
            labels=["topic", "partition"],
        )
        for topic, partition, n in self.source():
            lag.add_metric([topic, str(partition)], float(n))
        yield lag


class JoinerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events_in = Counter(
            "periscope_joiner_events_in", "Input records consumed", ["topic"], registry=r
        )
        self.device_samples = Counter(
            "periscope_joiner_device_samples",
            "Device samples joined (one per GPU or MIG device of every telemetry record the core joined; "
            "a sample held for event-time alignment or lateness counts once it is released)",
            registry=r,
        )
        self.batches = Counter(
            "periscope_joiner_input_batches",
            "Batches of input records handled (events_in / this: the mean batch size)", registry=r,
        )
        self.events_out = Counter(
            "periscope_joiner_events_out", "Output records published", ["topic"], registry=r
        )
        self.dead_letters = Counter(
            "periscope_joiner_dead_letters",
            "Input records sent to the dead-letter topic (undecodable or invalid)",
            ["topic"],
            registry=r,
        )
        self.unattributed = Counter(
            "periscope_joiner_unattributed_samples",
            "Device samples whose usage could not be attributed to a pod",
            registry=r,
        )
        self.ambiguous = Counter(
            "periscope_joiner_ambiguous_joins",
            "Allocations that named a pod ambiguously (reused name, no UID)",
            registry=r,
        )
        self.late = Counter(
            "periscope_joiner_late_samples",
            "Telemetry samples dropped because they arrived after their node's watermark had passed",
            registry=r,
        )
        self.duplicates = Counter(
            "periscope_joiner_duplicate_events", "Input events recognised as duplicates", registry=r
        )
        self.future_records = Counter(
            "periscope_joiner_future_records",
            "Input records dead-lettered for an event time too far ahead of their broker timestamp",
            registry=r,
        )
        self.stalled_nodes = Gauge(
            "periscope_joiner_stalled_nodes",
            "Nodes whose probe records keep arriving while their event time does not move",
            registry=r,
        )
        self.input_stalls = Counter(
            "periscope_joiner_input_stalls",
            "Times a node's input stream fell silent past PERISCOPE_MAX_HOLD and stopped holding the others",
            registry=r,
        )
        self.unaligned = Counter(
            "periscope_joiner_unaligned_samples",
            "Samples and XIDs joined before every input stream of their node was read through their time",
            registry=r,
        )
        self.redelivered = Counter(
            "periscope_joiner_redelivered_events",
            "Input events seen again after a restart or rebalance (already in the recovered state)",
            registry=r,
        )
        self.skipped = Counter(
            "periscope_joiner_skipped_events",
            "Valid input records with nothing to join (a pod not scheduled to a node)",
            registry=r,
        )
        self.persists = Counter(
            "periscope_joiner_state_persists", "Node states written to the changelogged tables", registry=r
        )
        self.recoveries = Counter(
            "periscope_joiner_node_recoveries", "Node states rebuilt from the tables", registry=r
        )
        self.nodes = Gauge("periscope_joiner_nodes", "Nodes whose state this worker holds", registry=r)
        self.ready = Gauge(
            "periscope_joiner_ready", "1 when the worker has partitions, is not rebalancing and is fresh",
            registry=r,
        )
        self.data_age = Gauge(
            "periscope_joiner_data_age_seconds", "Seconds since the last input record was handled", registry=r
        )

    def watch_lag(self, source: LagSource) -> None:
        self.registry.register(_LagCollector(source))

    def count_engine(self, before: Counters, after: Counters, *, redelivered: bool) -> None:
        """Turn the engine's per-node counters (which survive recovery) into this worker's counters."""
        late = after.late_dropped - before.late_dropped
        if late > 0:
            (self.redelivered if redelivered else self.late).inc(late)
        for counter, delta in (
            (self.duplicates, after.duplicates - before.duplicates),
            (self.unattributed, after.unattributed_samples - before.unattributed_samples),
            (self.ambiguous, after.ambiguous_joins - before.ambiguous_joins),
            (self.input_stalls, after.input_stalls - before.input_stalls),
            (self.unaligned, after.unaligned - before.unaligned),
            (self.device_samples, after.device_samples - before.device_samples),
        ):
            if delta > 0:
                counter.inc(delta)

    def render(self) -> bytes:
        return generate_latest(self.registry)
