"""GPU-hours of a past period from the input topics: replay, then the windows' accounting summed per row.

The replay is the timeline's (periscope.replay.runner: the same core as the live joiner, nodes side by
side in worker processes), fed through the end of the last window the period counts and a charge gap
beyond it (the samples that charge that window's last part). Nothing is kept
of the outputs but each row's windows in the period, summed as they are emitted (in the worker that
replays the node), and at the end each row's windows the engine had not published yet; so a month
costs what its events cost to read, not what its outputs would take to hold. Pod labels and GPU
models come from the pod and inventory events read (a pod's labels as of its latest event).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from periscope.bus import codec
from periscope.bus import topics as t
from periscope.bus.clients import Kafka
from periscope.core.gpuhours import Account, RowTally, Subject
from periscope.core.model import DeviceInventory, Output, PodAttribution, PodEvent
from periscope.heap import paused_gc
from periscope.replay.parallel import workers_for
from periscope.replay.plan import ReadPlan
from periscope.replay.reader import ReadStats, Warn, read_inputs
from periscope.replay.runner import (
    NodeReplay,
    OnError,
    Pending,
    ReplayConfig,
    ReplayInput,
    ReplayResult,
    by_node,
    replay_nodes,
)
from periscope.settings.replay import ReplaySettings

RowKey = tuple[str, str, str]  # pod UID, container, device ID


@dataclass(slots=True)
class _Row:
    subject: Subject
    tally: RowTally


@dataclass(slots=True)
class _Tallies:
    """Per node, per row: the windows of the period seen so far (filled where the node is replayed)."""

    from_ms: int
    to_ms: int
    nodes: dict[str, dict[RowKey, _Row]] = field(default_factory=dict)

    def keep(self, o: Output) -> bool:
        if isinstance(o, PodAttribution):
            rows = self.nodes.setdefault(o.node, {})
            for r in o.rows:
                if r.windows:
                    self._row(rows, o, r.container, r.device_id, r.gpu_uuid).tally.add_all(r.windows)
        return False  # nothing is kept as an output

    def _row(self, rows: dict[RowKey, _Row], o: PodAttribution, container: str, device_id: str,
             gpu_uuid: str) -> _Row:
        key = (o.pod_uid, container, device_id)
        held = rows.get(key)
        subject = Subject(o.pod_uid, o.namespace, o.pod, o.node, gpu_uuid, o.owner_kind, o.owner_name)
        if held is None:
            held = rows[key] = _Row(subject, RowTally(self.from_ms, self.to_ms))
        elif o.owner_kind or not held.subject.owner_kind:
            held.subject = subject  # the latest identity (an early attribution may precede the pod event)
        return held

    def finish(self, res: NodeReplay) -> NodeReplay:
        """The node's rows with their accounts, as `rendered`; the state is not sent back."""
        rows = self.nodes.pop(res.node, {})
        state = res.state
        if state is not None:
            for (uid, container, device_id), r in sorted(state.rows.items()):
                pending = r.unpublished()
                if not pending:
                    continue
                held = rows.get((uid, container, device_id))
                if held is None:
                    subject = Subject(uid, r.namespace, r.pod, res.node, r.gpu_uuid)
                    tally = RowTally(self.from_ms, self.to_ms)
                    held = rows[(uid, container, device_id)] = _Row(subject, tally)
                held.tally.add_all(pending)
        res.rendered = [(rows[k].subject, rows[k].tally.total()) for k in sorted(rows)]
        res.state = None
        return res


@dataclass(slots=True)
class Accounts:
    """What a period's replay gives: per row, who it was and what it was charged; and the reading."""

    rows: list[tuple[Subject, Account]]
    stats: ReadStats
    result: ReplayResult
    models: dict[str, str]  # GPU UUID -> model


def period_plan(from_ms: int, to_ms: int, settings: ReplaySettings) -> ReadPlan:
    """Read telemetry from the window lookback before `from` (warm idle state) through the end of the
    last window that starts before `to`, and a charge gap beyond: the first sample after it charges
    the time between the last sample before it and its end to that window (periscope.core.accounting)."""
    beyond = settings.engine_config().rows.charge_gap_ms
    return ReadPlan(anchor_ms=from_ms - settings.ms("replay_window_lookback"),
                    to_ms=last_ms(to_ms, settings) + beyond, lookback_ms=settings.ms("replay_lookback"),
                    late_slack_ms=settings.ms("replay_late_slack"))


def last_ms(to_ms: int, settings: ReplaySettings) -> int:
    """The last instant of the last window that starts before `to`."""
    w = settings.engine_config().rows.window_ms
    return -(-to_ms // w) * w - 1


def identities(events: list[ReplayInput]) -> tuple[dict[str, PodEvent], dict[str, str]]:
    """The latest event of each pod (labels, owner) and each GPU's model, from the events read."""
    pods: dict[str, PodEvent] = {}
    models: dict[str, tuple[int, str]] = {}
    for ev in events:
        if isinstance(ev, PodEvent):
            held = pods.get(ev.pod.uid)
            if held is None or ev.meta.time_ms >= held.meta.time_ms:
                pods[ev.pod.uid] = ev
            continue
        inv = _inventory(ev)
        if inv is not None:
            for g in inv.gpus:
                if g.model and models.get(g.uuid, (-1, ""))[0] <= ev.meta.time_ms:
                    models[g.uuid] = (ev.meta.time_ms, g.model)
    return pods, {u: m for u, (_, m) in models.items()}


def _inventory(ev: ReplayInput) -> DeviceInventory | None:
    """`ev` as an inventory if it is one (the reader keeps it as bytes: decoded here, it is small)."""
    if isinstance(ev, Pending) and ev.topic is t.INVENTORY:
        try:
            ev = ev.decode()
        except codec.DecodeError:  # the core reports it when the node is replayed
            return None
    return ev if isinstance(ev, DeviceInventory) else None


def account_period(kafka: Kafka, from_ms: int, to_ms: int, settings: ReplaySettings, *,
                   warn: Warn | None = None, reading: Callable[[int, int], None] | None = None,
                   replaying: Callable[[int, int], None] | None = None,
                   on_error: OnError | None = None) -> Accounts:
    plan = period_plan(from_ms, to_ms, settings)
    with paused_gc():
        events, stats = asyncio.run(read_inputs(kafka, plan, warn=warn, lazy=True, progress=reading))
        pods, models = identities(events)
        total = len(events)
        tallies = _Tallies(from_ms, to_ms)
        config = ReplayConfig(engine=settings.engine_config(), to_ms=plan.to_ms, keep=tallies.keep)
        groups = by_node(events, plan.to_ms)
        del events
        result = ReplayResult()
        rows: list[tuple[Subject, Account]] = []
        done = [0]

        def progress(n: int) -> None:
            done[0] += n
            if replaying is not None:
                replaying(done[0], total)

        for res in replay_nodes(groups, config, result, progress=progress, on_error=on_error,
                                workers=workers_for(settings.replay_workers), finish=tallies.finish):
            rendered = res.rendered if isinstance(res.rendered, list) else []
            rows += [(_known(s, pods, models), a) for s, a in rendered]
    return Accounts(rows, stats, result, models)


def _known(s: Subject, pods: dict[str, PodEvent], models: dict[str, str]) -> Subject:
    ev = pods.get(s.pod_uid)
    info = ev.pod if ev is not None else None
    return Subject(
        s.pod_uid, s.namespace or (info.namespace if info else ""), s.pod or (info.name if info else ""),
        s.node, s.gpu_uuid, s.owner_kind or (info.owner_kind if info else ""),
        s.owner_name or (info.owner_name if info else ""), models.get(s.gpu_uuid, ""),
        info.labels if info else (),
    )
