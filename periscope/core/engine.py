"""The per-node attribution engine: `apply(state, event) -> outputs`, the node's state changed in place.
Pure and deterministic (periscope.core.state holds what a node keeps).

State-based inputs (allocation snapshots, pods, inventory, node labels) update time-indexed state as
they arrive. Telemetry and XIDs are buffered and processed in event-time order once the node's
watermark (the newest probe event time seen) has passed them by `lateness_ms`, so small reorderings
between topics do not change the result, and the live joiner and replay compute the same outputs.
With `EngineConfig.align`, they also wait until the node's other input streams have been read through
their time or are at their end (periscope.core.watermark), so a consumer that is behind and reads the
topics at different speeds joins them as event-time order would.
Each sample is joined against the allocation snapshot and pod registry *as of the sample's time*.
An output is published when it changed beyond its thresholds since the last one published under its
key, or when a heartbeat of event time passed (periscope.core.changes); windows when they close.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping

from periscope.core.allocation import unresolved_health
from periscope.core.attribution import attribute_sample
from periscope.core.engine_config import DEFAULT_CONFIG as DEFAULT_CONFIG
from periscope.core.engine_config import EngineConfig as EngineConfig
from periscope.core.findings import health_findings
from periscope.core.model import (
    AllocationSnapshot,
    DeviceInventory,
    NodeEvent,
    NodeInput,
    NodeTelemetry,
    Output,
    PodEvent,
    SourceHealth,
    XidEvent,
    XidRef,
)
from periscope.core.publish import emit
from periscope.core.publish import output_key as output_key  # callers take it from the engine
from periscope.core.rows import RowState
from periscope.core.sharing import Pool, collect, share
from periscope.core.state import Counters as Counters
from periscope.core.state import NodeState as NodeState
from periscope.core.state import Pending, pending_key
from periscope.core.state import new_state as new_state
from periscope.core.views import gpu_states, pod_attribution, rows_by_pod, xid_finding
from periscope.core.watermark import OPEN, Stream, gate, holding

PRUNE_EVERY_MS = 60_000


def _meta_key(ev: NodeInput) -> tuple[str, int, int]:
    return (ev.meta.source, ev.meta.epoch, ev.meta.seq)


def _buffer(state: NodeState, ev: Pending) -> None:
    """Insert in processing order; the same record again (same key) is a duplicate. Records nearly
    always come in order (an append), and a node that is behind can hold many (no scan)."""
    pending, key = state.pending, pending_key(ev)
    if not pending or key > pending_key(pending[-1]):
        pending.append(ev)
        return
    i = bisect_left(pending, key, key=pending_key)
    if i < len(pending) and pending_key(pending[i]) == key:
        state.counters.duplicates += 1
    else:
        pending.insert(i, ev)


def apply(state: NodeState, event: NodeInput, config: EngineConfig = DEFAULT_CONFIG) -> list[Output]:
    """Apply one input event to the node's state (in place); return the outputs it caused (possibly
    none)."""
    state.counters.events += 1
    state.inputs.read(event)
    out: list[Output] = []
    if isinstance(event, PodEvent):
        if state.pods.apply(event):
            rec = state.pods.pods.get(event.pod.uid)
            if rec is not None and rec.info is event.pod:  # stored as it came: share its strings
                rec.info = share(event.pod, _pool(state))
    elif isinstance(event, NodeEvent):
        if state.node_event is None or event.meta.time_ms >= state.node_event.meta.time_ms:
            state.set_node_event(event)
    elif isinstance(event, DeviceInventory):
        newer = state.inventory is None or event.meta.time_ms >= state.inventory.meta.time_ms
        if newer and state.inventory != event:
            state.set_inventory(share(event, _pool(state)))
        _advance_watermark(state, event.meta.time_ms)
    elif isinstance(event, AllocationSnapshot):
        _add_snapshot(state, event)
        _advance_watermark(state, event.meta.time_ms)
    else:
        t = event.meta.time_ms
        if isinstance(event, NodeTelemetry) and t <= state.processed_ms:
            dup = state.last_telemetry is not None and _meta_key(state.last_telemetry) == _meta_key(event)
            if dup:
                state.counters.duplicates += 1
            else:
                state.counters.late_dropped += 1
        elif isinstance(event, XidEvent) and t <= state.processed_ms and not config.align:
            out.extend(_process_xid(state, event, config))  # never drop an XID
        else:  # (aligned, a late XID too waits until the node's inputs were read through its time)
            _buffer(state, event)
        _advance_watermark(state, t)
    out.extend(_release(state, config))
    return out


def advance(state: NodeState, t_ms: int, config: EngineConfig = DEFAULT_CONFIG) -> list[Output]:
    """Move the watermark to t (e.g. when a node has gone quiet) and process what that releases."""
    _advance_watermark(state, t_ms)
    return _release(state, config)


def mark_inputs(state: NodeState, config: EngineConfig = DEFAULT_CONFIG, *,
                at_end: Mapping[Stream, bool] | None = None,
                through_ms: Mapping[Stream, int] | None = None) -> list[Output]:
    """The host's word on the node's input streams: a stream's partition is at its end (True) or has
    records not yet stepped (False); a stream was read through an event time (never moves back). Say
    everything known at once (e.g. every stream after a restart or a rebalance). Returns the outputs of
    the samples and XIDs this releases (with alignment on)."""
    for stream, end in (at_end or {}).items():
        state.inputs.mark(stream, at_end=end)
    for stream, t in (through_ms or {}).items():
        state.inputs.mark(stream, through_ms=t)
    return _release(state, config)


def waiting_for(state: NodeState, config: EngineConfig = DEFAULT_CONFIG) -> tuple[Stream, ...]:
    """The aligned streams the oldest buffered sample or XID waits for (for a host that wants to read
    those first); empty when nothing waits for an input stream."""
    if not state.pending or not config.align:
        return ()
    return holding(state.inputs, config.align, state.pending[0].meta.time_ms)


def flush(state: NodeState, config: EngineConfig = DEFAULT_CONFIG) -> list[Output]:
    """Process everything still buffered (end of a replay, shutdown)."""
    return _drain(state, state.pending[-1].meta.time_ms if state.pending else 0, config)


def _advance_watermark(state: NodeState, t_ms: int) -> None:
    if t_ms > state.watermark_ms:
        if not state.watermark_ms:
            state.inputs.opened_ms = t_ms
        state.watermark_ms = t_ms


def _release(state: NodeState, config: EngineConfig) -> list[Output]:
    """Process the buffered samples and XIDs the watermark and, with alignment, the inputs allow."""
    upto = state.watermark_ms - config.lateness_ms
    if not config.align:
        return _drain(state, upto, config)
    bound, aligned, stalls = gate(state.inputs, config.align, state.watermark_ms, config.max_hold_ms)
    state.counters.input_stalls += stalls
    return _drain(state, min(upto, bound), config, aligned)


def _add_snapshot(state: NodeState, snap: AllocationSnapshot) -> None:
    if not state.add_snapshot(snap, lambda s: share(s, _pool(state))):
        state.counters.duplicates += 1


def _pool(state: NodeState) -> Pool:
    """The strings the node holds in its pods, inventory and newest allocation snapshot (for `share`)."""
    pool: Pool = {}
    for rec in state.pods.pods.values():
        collect(rec.info, pool)
    collect(state.inventory, pool)
    if state.allocs:
        collect(state.allocs[-1], pool)
    return pool


def _drain(state: NodeState, upto_ms: int, config: EngineConfig, aligned_ms: int = OPEN) -> list[Output]:
    pending = state.pending
    if not pending or pending[0].meta.time_ms > upto_ms:
        return []
    n = bisect_right(pending, upto_ms, key=_time_of)
    ready, state.pending = (pending[:n], pending[n:]) if n < len(pending) else (pending, [])
    if aligned_ms < upto_ms:  # a silent stream let these through
        state.counters.unaligned += n - bisect_right(ready, aligned_ms, key=_time_of)
    out: list[Output] = []
    for ev in ready:
        if isinstance(ev, XidEvent):
            out.extend(_process_xid(state, ev, config))
        elif ev.meta.time_ms > state.processed_ms:
            out.extend(_process_sample(state, ev, config))
        else:
            state.counters.late_dropped += 1
    return out


def _time_of(p: Pending) -> int:
    return p.meta.time_ms


def _process_xid(state: NodeState, ev: XidEvent, config: EngineConfig) -> list[Output]:
    # Views paused: those of the samples before the XID first, as they were (a GPU's state names its
    # last XID).
    before = _views(state)
    prev = state.last_xid.get(ev.gpu_uuid)
    if prev is None or ev.meta.time_ms >= prev.at_ms:
        state.last_xid[ev.gpu_uuid] = XidRef(code=ev.code, at_ms=ev.meta.time_ms)
    finding = xid_finding(state.node, ev, state.holdings_at(ev.meta.time_ms), state.pods)
    return emit(state, [*before, finding], config)


def _process_sample(state: NodeState, tel: NodeTelemetry, config: EngineConfig) -> list[Output]:
    # Views paused, a device gone from the sample gets no view from it: those of the samples before
    # first, while the last sample still holds it.
    before = _views(state) if state.views_stale and _devices_gone(state.last_telemetry, tel) else []
    t = tel.meta.time_ms
    gap = t - state.processed_ms if state.processed_ms else 0  # the time this sample is charged for
    state.processed_ms = t
    # Kept for duplicate detection and the GPU view, which read no per-process detail: without it (as
    # persisted), a node holds some 240 bytes less per device for about a microsecond per device.
    state.last_telemetry = tel.without_processes()
    state.counters.samples += 1
    state.counters.device_samples += len(tel.devices)
    held = state.held_at(t)
    touched, findings = attribute_sample(state, tel, held.index, config.rows, held.monitors, gap)
    findings.extend(health_findings(state.node, t, _health(state, t)))
    outs: list[Output] = before
    prune = t - state.pruned_ms >= PRUNE_EVERY_MS
    if state.views_paused:
        state.views_stale = True
        for uid in touched:
            state.views_pods[uid] = t
        if prune:
            outs.extend(_views(state))  # before pods gone past retention are dropped with their rows
    else:
        outs.extend(_pod_views(state, dict.fromkeys(touched, t)))
        outs.extend(gpu_states(state, tel, held.index, held.monitors))
    outs.extend(state.findings.reconcile(findings, t))
    if prune:
        _prune(state, t, config)
    return emit(state, outs, config)


def _pod_views(state: NodeState, as_of: dict[str, int],
               by_pod: dict[str, list[RowState]] | None = None) -> list[Output]:
    """The attribution of each pod of `as_of` (UID -> time), in UID order (`by_pod`: the state's
    `rows_by_pod`, where the caller has it)."""
    by_pod = rows_by_pod(state) if by_pod is None else by_pod
    outs: list[Output] = []
    for uid in sorted(as_of):
        att = pod_attribution(state, uid, as_of[uid], by_pod.get(uid, []))
        if att is not None:
            outs.append(att)
    return outs


def _gpu_views(state: NodeState) -> list[Output]:
    """The GPU states of the last processed sample (it is kept without its per-process detail, which
    the GPU view does not read)."""
    if state.last_telemetry is None:
        return []
    held = state.held_at(state.processed_ms)
    return list(gpu_states(state, state.last_telemetry, held.index, held.monitors))


def _devices_gone(last: NodeTelemetry | None, tel: NodeTelemetry) -> bool:
    """Whether the last sample holds a device `tel` lacks (devices come in the same order, nearly always)."""
    if last is None:
        return False
    if len(last.devices) == len(tel.devices) and all(
            a.uuid == b.uuid for a, b in zip(last.devices, tel.devices, strict=True)):
        return False
    return not {d.uuid for d in last.devices} <= {d.uuid for d in tel.devices}


def pause_views(state: NodeState) -> None:
    """For a host catching up on the node, which would keep only the newest attribution and GPU state
    of each key: step samples without building their views (the state, windows and findings advance
    as ever; findings still come out as they happen). `refresh_views` gives the newest views."""
    state.views_paused = True


def refresh_views(state: NodeState, config: EngineConfig = DEFAULT_CONFIG) -> list[Output]:
    """If samples were stepped with views paused since the last refresh, the views they would have
    ended with, under the change rule: each pod's attribution as of the last sample that stepped it
    (every window that closed meanwhile rides on it), and the GPU states of the last sample; else
    nothing."""
    return emit(state, _views(state), config)


def _views(state: NodeState) -> list[Output]:
    if not state.views_stale:
        return []
    state.views_stale = False
    stepped, state.views_pods = state.views_pods, {}
    return _pod_views(state, stepped) + _gpu_views(state)


def resume_views(state: NodeState, config: EngineConfig = DEFAULT_CONFIG) -> list[Output]:
    """Build views for every sample again; returns `refresh_views`."""
    state.views_paused = False
    return refresh_views(state, config)


def _health(state: NodeState, t_ms: int) -> list[SourceHealth]:
    """Kubelet-side health as of the sample (it rides on allocation snapshots), then the probe's own."""
    snap = state.snapshot_at(t_ms)
    devices = unresolved_health(state.holdings_at(t_ms))
    return [*(snap.health if snap else ()), *(state.inventory.health if state.inventory else ()),
            *((devices,) if devices else ())]


def _prune(state: NodeState, t_ms: int, config: EngineConfig) -> None:
    state.pruned_ms = t_ms
    gone = set(state.pods.prune(t_ms - config.retention_ms))
    for key in [k for k in state.rows if k[0] in gone]:
        del state.rows[key]
    for uid in gone:
        state.emitted.pop(uid, None)
    state.prune_history(t_ms - config.history_ms)


def current_view(state: NodeState) -> list[Output]:
    """Every output as of the latest processed sample (for recovery and convergence checks)."""
    by_pod = rows_by_pod(state)
    outs = _pod_views(state, dict.fromkeys(by_pod, state.processed_ms), by_pod) + _gpu_views(state)
    outs.extend(state.findings.active())
    return outs
