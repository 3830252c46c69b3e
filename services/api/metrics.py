"""Prometheus exposition, generated from the view at scrape time.

Nothing is kept in global gauges: each scrape walks the view, so a pod that left stops being exported
at once (no stale series to expire) and replicas need no state beyond the view. Attribution series are
labelled with the pod UID, never the name alone (names are reused).

XID, GPU-hour and consumer series go through a prometheus-client collector. The per pod-device and per
GPU series are written by `PodSeries` and `GpuSeries` in the same text format with label sets cached
per row or GPU, and the text kept while the view is unchanged: at 100,000 rows the client library's
per-sample label validation and escaping takes tens of seconds (a second for 10,000 GPUs), longer than
a scrape should hold the event loop, while the label values almost never change between scrapes.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from periscope.contract.values import num
from periscope.core.model import AttributionRow, GpuState, PodAttribution
from services.api.evidence import REASONS
from services.api.status import ConsumerStatus
from services.api.view import XID_KIND, RowKey, View

_MIB = 1024 * 1024
POD_LABELS = ["pod_uid", "namespace", "pod", "container", "node", "gpu_uuid", "device_id", "mig_profile"]
GPU_LABELS = ["node", "gpu_uuid", "model", "index"]
XID_LABELS = ["node", "gpu_uuid", "code", "pod_uid", "namespace", "pod", "container"]
_LabelKey = tuple[RowKey, str, str, str]  # row key, node, gpu_uuid, MIG profile


def _g(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def label(v: str) -> str:
    """A label value without control characters: the values come from records anyone who can write
    to the broker may have forged, and a scrape is often read on a terminal. A newline stays: the
    exposition format writes it escaped, as `\\n`."""
    if v.isprintable():  # the common case, and cheap
        return v
    return "".join(c for c in v if c.isprintable() or c == "\n" or unicodedata.category(c) == "Zs")


def labels(values: Iterable[str]) -> list[str]:
    return [label(v) for v in values]


def _escape(v: str) -> str:
    return label(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# (name, help, row -> value or None); a None value exports no sample (unknown is not zero).
_POD_FAMILIES: tuple[tuple[str, str, Callable[[AttributionRow], float | None]], ...] = (
    (
        "periscope_pod_gpu_allocated",
        "1 per device the pod container holds (present even when usage is unknown)",
        lambda r: 1.0,
    ),
    (
        "periscope_pod_gpu_util_percent",
        "Attributed GPU utilization of the pod's device",
        lambda r: num(r.util_pct),
    ),
    (
        "periscope_pod_gpu_fb_used_bytes",
        "Attributed framebuffer memory in use",
        lambda r: None if (m := num(r.fb_used_mib)) is None else m * _MIB,
    ),
    ("periscope_pod_gpu_power_watts", "Attributed board power", lambda r: num(r.power_w)),
    (
        "periscope_pod_gpu_sm_active_percent",
        "DCGM SM activity of the pod's own unit (whole GPU or MIG instance; absent when shared or unknown)",
        lambda r: num(r.sm_active_pct),
    ),
    (
        "periscope_pod_gpu_sm_occupancy_percent",
        "DCGM SM occupancy of the pod's own unit (absent when shared or unknown)",
        lambda r: num(r.sm_occupancy_pct),
    ),
    (
        "periscope_pod_gpu_tensor_active_percent",
        "DCGM tensor pipe activity of the pod's own unit (absent when shared or unknown)",
        lambda r: num(r.tensor_active_pct),
    ),
    (
        "periscope_pod_gpu_dram_active_percent",
        "DCGM device memory interface activity of the pod's own unit (absent when shared or unknown)",
        lambda r: num(r.dram_active_pct),
    ),
    ("periscope_pod_gpu_idle", "1 when the allocation is idle (the joiner's flag)", lambda r: float(r.idle)),
    (
        "periscope_pod_gpu_idle_wasted_gpu_hours",
        "GPU-hours held idle so far (idle rows only)",
        lambda r: num(r.wasted_gpu_hours) if r.idle else None,
    ),
)


def _headers(families: Iterable[tuple[str, str]]) -> list[list[str]]:
    """One list of exposition lines per gauge family, each starting with its HELP and TYPE."""
    return [[f"# HELP {n} {h}\n# TYPE {n} gauge\n"] for n, h in families]


class ViewSeries:
    """Series of the view written as exposition text, kept with the view version it was written from
    and reused while the view is unchanged: at 100,000 rows one rendering holds the event loop for a
    noticeable time, and clients scraping at once would otherwise each wait behind a rendering of the
    same rows."""

    def __init__(self, view: View) -> None:
        self.view = view
        self._text = ""
        self._text_version = -1

    def text(self) -> str:
        """The exposition text of the view as it is now, rendered again only when it changed."""
        if self.view.version != self._text_version:
            version = self.view.version
            self._text, self._text_version = self.render(), version
        return self._text

    def render(self) -> str:
        raise NotImplementedError


class PodSeries(ViewSeries):
    """Per pod-device gauges of the active rows."""

    def __init__(self, view: View) -> None:
        super().__init__(view)
        self._labels: dict[_LabelKey, str] = {}

    def _label_set(self, key: RowKey, pod: PodAttribution, row: AttributionRow) -> tuple[_LabelKey, str]:
        profile = row.mig.profile if row.mig else ""
        ck = (key, pod.node, row.gpu_uuid, profile)
        text = self._labels.get(ck)
        if text is None:
            values = (
                pod.pod_uid,
                pod.namespace,
                pod.pod,
                row.container,
                pod.node,
                row.gpu_uuid,
                row.device_id,
                profile,
            )
            text = _label_text(POD_LABELS, values)
        return ck, text

    def render(self) -> str:
        lines = _headers((n, h) for n, h, _ in _POD_FAMILIES)
        labels: dict[_LabelKey, str] = {}
        for key in self.view.row_keys():
            pod, row = self.view.row(key)
            if not row.active:
                continue  # released allocations are history, not series
            ck, text = self._label_set(key, pod, row)
            labels[ck] = text
            for out, (name, _, value) in zip(lines, _POD_FAMILIES, strict=True):
                v = value(row)
                if v is not None:
                    out.append(f"{name}{{{text}}} {float(v)!r}\n")
        self._labels = labels  # keeps only rows still exported
        return "".join(s for out in lines for s in out)


# (name, help, GPU -> value or None), labelled GPU_LABELS; a None value exports no sample.
_GPU_FAMILIES: tuple[tuple[str, str, Callable[[GpuState], float | None]], ...] = (
    ("periscope_gpu_util_percent", "GPU utilization", lambda g: num(g.util_pct)),
    ("periscope_gpu_fb_used_bytes", "Framebuffer memory in use",
     lambda g: None if (m := num(g.fb_used_mib)) is None else m * _MIB),
    ("periscope_gpu_fb_total_bytes", "Framebuffer memory size",
     lambda g: None if (m := num(g.fb_total_mib)) is None else m * _MIB),
    ("periscope_gpu_power_watts", "Board power", lambda g: num(g.power_w)),
    ("periscope_gpu_temperature_celsius", "GPU temperature", lambda g: num(g.temp_c)),
    ("periscope_gpu_owners", "Pod containers holding the GPU or one of its MIG slices",
     lambda g: float(len(g.owners) + sum(len(m.owners) for m in g.mig_devices))),
    ("periscope_gpu_lost", "1 when the GPU fell off the bus", lambda g: 1.0 if g.lost else 0.0),
    ("periscope_gpu_last_xid_code", "Code of the GPU's latest XID error",
     lambda g: None if g.last_xid is None else float(g.last_xid.code)),
)
_MIG_FAMILY = ("periscope_gpu_mig_owners", "Pod containers holding each MIG instance of the GPU (0: free)")


class GpuSeries(ViewSeries):
    """Per GPU gauges, and per MIG instance the containers holding it."""

    def __init__(self, view: View) -> None:
        super().__init__(view)
        self._labels: dict[tuple[str, ...], str] = {}

    def render(self) -> str:
        lines = _headers([*((n, h) for n, h, _ in _GPU_FAMILIES), _MIG_FAMILY])
        mig = lines[-1]
        labels: dict[tuple[str, ...], str] = {}
        for key in self.view.gpu_keys():
            g = self.view.gpus[key[2]]
            values = (g.node, g.gpu_uuid, g.model, str(g.index))
            text = labels[values] = self._labels.get(values) or _label_text(GPU_LABELS, values)
            for out, (name, _, value) in zip(lines[:-1], _GPU_FAMILIES, strict=True):
                v = value(g)
                if v is not None:
                    out.append(f"{name}{{{text}}} {float(v)!r}\n")
            for m in g.mig_devices:
                extra = _label_text(["mig_profile", "gi", "ci"], (m.profile, str(m.gi), str(m.ci)))
                mig.append(f"{_MIG_FAMILY[0]}{{{text},{extra}}} {float(len(m.owners))!r}\n")
        self._labels = labels  # keeps only GPUs still exported
        return "".join(s for out in lines for s in out)


def _label_text(names: Iterable[str], values: Iterable[str]) -> str:
    return ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True))


class ViewCollector(Collector):
    def __init__(self, view: View, status: ConsumerStatus | None) -> None:
        self.view = view
        self.status = status

    def collect(self) -> Iterator[Metric]:
        yield from self._xids()
        yield from self._gpu_hours()
        yield from self._consumer()

    def _xids(self) -> Iterator[Metric]:
        counts: Counter[tuple[str, ...]] = Counter()
        for f in self.view.findings.values():
            if f.kind != XID_KIND:
                continue
            if not f.owners:
                counts[(f.node, f.gpu_uuid, str(f.xid_code), "", "", "", "")] += 1
            for o in f.owners:
                counts[(f.node, f.gpu_uuid, str(f.xid_code), o.pod_uid, o.namespace, o.pod, o.container)] += 1
        xid = CounterMetricFamily(
            "periscope_xid_errors", "XID errors by the pods that owned the device then", labels=XID_LABELS
        )
        for key, n in sorted(counts.items()):
            xid.add_metric(labels(key), n)
        yield xid

    def _gpu_hours(self) -> Iterator[Metric]:
        """GPU-hours counters per namespace and workload, bounded (services.api.accounts)."""
        fams = [
            CounterMetricFamily(f"periscope_gpu_hours_{what}", doc, labels=["namespace", "workload"])
            for what, doc in (
                ("allocated", "GPU-hours held: device-equivalents x time (docs/accounting.md)"),
                ("used", "GPU-hours used: allocated time weighted by utilization"),
                ("idle", "GPU-hours held in runs the idle verdict confirmed"),
            )
        ]
        for key, hours in self.view.gpu_hours.hours():
            lv = labels(key)
            for fam, h in zip(fams, hours, strict=True):
                fam.add_metric(lv, h)
        yield from fams

    def _consumer(self) -> Iterator[Metric]:
        v = self.view
        size = _g("periscope_api_view_rows", "Rows held by the view", ["kind"])
        size.add_metric(["pod_device"], v.row_count())
        size.add_metric(["pod"], len(v.pods))
        size.add_metric(["gpu"], len(v.gpus))
        size.add_metric(["finding"], len(v.findings))
        yield size
        s = self.status
        ready = _g("periscope_api_ready", "1 while the view is caught up and fresh (as /readyz)", [])
        ready.add_metric([], 1.0 if s is None or s.serving() else 0.0)
        yield ready
        if s is None:
            return
        age = _g("periscope_api_data_age_seconds", "Seconds since the view last took a new attribution", [])
        age.add_metric([], s.data_age_s())
        yield age
        consumed = CounterMetricFamily("periscope_api_records_consumed", "Records read", labels=["topic"])
        for topic, n in sorted(s.consumed.items()):
            consumed.add_metric([label(topic)], n)
        applied = CounterMetricFamily("periscope_api_records_applied", "Records that changed the view")
        applied.add_metric([], s.applied)
        stale = CounterMetricFamily("periscope_api_records_stale", "Duplicate or older records ignored")
        stale.add_metric([], s.stale)
        evicted = CounterMetricFamily(
            "periscope_api_view_evicted", "Finished entries dropped after retention"
        )
        evicted.add_metric([], s.evicted)
        dead = CounterMetricFamily("periscope_api_dead_letters", "Records that could not be decoded/applied")
        dead.add_metric([], s.dead_letters)
        refused = CounterMetricFamily(
            "periscope_api_records_refused",
            "Records not believed when they arrived: event time too far ahead of the clock (future), or "
            "a GPU no probe's inventory reported (unknown-gpu; held until one does)",
            labels=["reason"],
        )
        for reason in REASONS:
            refused.add_metric([reason], s.refused.get(reason, 0))
        held = _g("periscope_api_records_held", "Records waiting for an inventory that names their GPU", [])
        held.add_metric([], s.held)
        lag = _g("periscope_api_consumer_lag", "Records behind the end of the topic", ["topic"])
        per_topic: Counter[str] = Counter()
        for (topic, _), n in s.lag.items():
            per_topic[topic] += n
        for topic, n in sorted(per_topic.items()):
            lag.add_metric([topic], n)
        yield from (consumed, applied, stale, evicted, dead, refused, held, lag)
