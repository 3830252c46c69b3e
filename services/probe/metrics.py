"""Prometheus metrics of one probe, in its own registry (several probes may share a process)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from periscope.core.model import SourceHealth

SOURCES = ("podresources", "checkpoint", "nvml", "procfs", "dra", "dcgm")
STATES = ("ok", "absent", "corrupt", "unavailable", "error", "disabled")


class ProbeMetrics:
    def __init__(self, node: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.source_up = Gauge(
            "periscope_probe_source_up", "1 when the source's state is ok", ["node", "source"], registry=r
        )
        self.source_state = Gauge(
            "periscope_probe_source_state",
            "1 for the current state of each source",
            ["node", "source", "state"],
            registry=r,
        )
        self.publish_latency = Histogram(
            "periscope_probe_publish_latency_seconds",
            "Time from enqueue to broker ack",
            ["node", "topic"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.published = Counter(
            "periscope_probe_published_total",
            "Messages acknowledged by the broker",
            ["node", "topic"],
            registry=r,
        )
        self.dropped = Counter(
            "periscope_probe_dropped_total",
            "Messages dropped because the buffer was full (or could not be encoded)",
            ["node", "kind"],
            registry=r,
        )
        self.buffered = Gauge(
            "periscope_probe_buffered", "Messages waiting for the broker", ["node"], registry=r
        )
        self.broker_up = Gauge(
            "periscope_probe_broker_connected", "1 while the publisher is connected", ["node"], registry=r
        )
        self.data_age = Gauge(
            "periscope_probe_data_age_seconds",
            "Seconds buffered events have waited without a publish (0 when none wait)",
            ["node"],
            registry=r,
        )
        self.kubelet_connects = Counter(
            "periscope_probe_kubelet_connects_total",
            "New PodResources channels (first connect and after kubelet restarts)",
            ["node"],
            registry=r,
        )
        self.xids = Counter("periscope_probe_xid_total", "XID events seen", ["node"], registry=r)
        self.dcgm_scrapes = Counter(
            "periscope_probe_dcgm_scrapes_total",
            "Scrapes of the node's dcgm-exporter by result (ok, unavailable, corrupt)",
            ["node", "result"],
            registry=r,
        )
        self.dcgm_scrape_seconds = Histogram(
            "periscope_probe_dcgm_scrape_seconds",
            "Time one dcgm-exporter scrape took (fetch and parse)",
            ["node"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.dcgm_devices = Gauge(
            "periscope_probe_dcgm_devices",
            "Devices (GPUs and MIG instances) of the latest sample with fresh DCGM profiling values",
            ["node"],
            registry=r,
        )
        self.node = node

    def set_health(self, health: Iterable[SourceHealth]) -> None:
        for h in health:
            self.source_up.labels(self.node, h.source).set(1 if h.state == "ok" else 0)
            for s in STATES:
                self.source_state.labels(self.node, h.source, s).set(1 if h.state == s else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
