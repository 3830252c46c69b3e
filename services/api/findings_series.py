"""Series for alerting and the pipeline panels: active findings, source health, XID times.
Data age (`periscope_api_data_age_seconds`) is the readiness series in `services.api.metrics`.

Cardinality is bounded by the cluster, not by traffic: findings by kind x node (5 kinds), unhealthy
sources by node x source (5 probe sources; the state is a label but one source has one state at a
time), XID times by the same label set as `periscope_xid_errors_total` (bounded by the view's
retention). docs/metrics.md lists every label.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from periscope.core.model import FINDING_KINDS
from services.api.metrics import label, labels
from services.api.view import XID_KIND, View

SOURCE_HEALTH_KIND = "source-health"


def _source_and_state(finding_id: str, message: str) -> tuple[str, str]:
    """A source-health finding is `source-health/<node>/<source>` with message `<source> <state>[: ...]`."""
    source = finding_id.rsplit("/", 1)[-1]
    words = message.split(":", 1)[0].split()
    state = words[1] if len(words) > 1 and words[0] == source else "unknown"
    return source, state


class FindingsCollector(Collector):
    def __init__(self, view: View) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        yield from self._findings()
        yield self._xid_times()

    def _findings(self) -> Iterator[Metric]:
        v = self.view
        nodes = {n for n, ev in v.nodes.items() if not ev.deleted} | {g.node for g in v.gpus.values()}
        counts: Counter[tuple[str, str]] = Counter()
        unhealthy = GaugeMetricFamily(
            "periscope_source_unhealthy",
            "1 while a probe source of the node is not healthy (corrupt, absent, unavailable, error)",
            labels=["node", "source", "state"],
        )
        for f in sorted(v.findings.values(), key=lambda x: x.id):
            if not f.active or f.kind == XID_KIND:
                continue
            counts[(f.kind, f.node)] += 1
            nodes.add(f.node)
            if f.kind == SOURCE_HEALTH_KIND:
                source, state = _source_and_state(f.id, f.message)
                unhealthy.add_metric(labels((f.node, source, state)), 1.0)
        active = GaugeMetricFamily(
            "periscope_findings_active",
            "Conditions the joiner flags that still hold (XIDs are events: see periscope_xid_errors_total)",
            labels=["kind", "node"],
        )
        for kind in FINDING_KINDS:
            if kind == XID_KIND:
                continue
            for node in sorted(nodes):  # zeros too, so "none" is a value and not a missing series
                active.add_metric([kind, label(node)], counts[(kind, node)])
        yield active
        yield unhealthy

    def _xid_times(self) -> Metric:
        newest: dict[tuple[str, ...], int] = {}
        for f in self.view.findings.values():
            if f.kind != XID_KIND:
                continue
            owners = [(o.pod_uid, o.namespace, o.pod, o.container) for o in f.owners] or [("", "", "", "")]
            for o in owners:
                series = (f.node, f.gpu_uuid, str(f.xid_code), *o)
                newest[series] = max(newest.get(series, 0), f.at_ms)
        fam = GaugeMetricFamily(
            "periscope_xid_last_timestamp_seconds",
            "Event time of the latest XID error per device, code and the pod that owned the device then",
            labels=["node", "gpu_uuid", "code", "pod_uid", "namespace", "pod", "container"],
        )
        for key, at_ms in sorted(newest.items()):
            fam.add_metric(labels(key), at_ms / 1000)
        return fam
