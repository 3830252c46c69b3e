"""Who owned what at an instant: replay the state-based inputs up to T, then ask the core's holdings.

The same function answers `periscope replay --at T` and the API's `GET /v1/owners`, and it uses the
same `holdings_at` the joiner uses when it names the owners of an XID, so the three always agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from periscope.bus.clients import Kafka
from periscope.core.allocation import Holding
from periscope.core.engine import DEFAULT_CONFIG, EngineConfig, NodeState, holdings_at
from periscope.replay.plan import ReadPlan
from periscope.replay.reader import Progress, ReadStats, Warn, read_inputs
from periscope.replay.runner import ReplayConfig, ReplayInput, replay_events
from periscope.replay.settings import ReplaySettings
from periscope.wirejson import mig_json, rfc3339

Json = dict[str, Any]


def on_device(h: Holding, uuid: str) -> bool:
    """Does the holding sit on this GPU or MIG instance (a GPU UUID also matches its MIG slices)?"""
    return h.device.gpu_uuid == uuid or (h.device.mig is not None and h.device.mig.uuid == uuid)


def owner_item(node: str, h: Holding) -> Json:
    return {
        "node": node,
        "gpu_uuid": h.device.gpu_uuid or None,
        "device_id": h.device.device_id,
        "mig": mig_json(h.device.mig),
        "pod_uid": h.pod_uid or None,  # None: the holder could not be identified unambiguously
        "namespace": h.namespace,
        "pod": h.pod,
        "container": h.container,
    }


def owner_items(
    states: Mapping[str, NodeState], at_ms: int, *, gpu_uuid: str | None = None, node: str | None = None,
    pod_uid: str | None = None,
) -> list[Json]:
    items: list[Json] = []
    for name in sorted(states):
        if node is not None and name != node:
            continue
        for h in holdings_at(states[name], at_ms):
            if gpu_uuid is not None and not on_device(h, gpu_uuid):
                continue
            if pod_uid is not None and h.pod_uid != pod_uid:
                continue
            items.append(owner_item(name, h))
    items.sort(key=lambda i: (i["node"], i["gpu_uuid"] or "", i["device_id"], i["pod_uid"] or "",
                              i["container"], i["namespace"], i["pod"]))
    return items


def owners_document(at_ms: int, items: list[Json]) -> Json:
    return {"at": rfc3339(at_ms), "items": items}


def owners_plan(at_ms: int, settings: ReplaySettings, node: str | None = None) -> ReadPlan:
    # Ownership needs pods, nodes, allocations and inventory only: no telemetry, no XIDs.
    return ReadPlan(anchor_ms=at_ms, to_ms=at_ms + settings.ms("lateness"),
                    lookback_ms=settings.ms("replay_lookback"),
                    late_slack_ms=settings.ms("replay_late_slack"), samples=False, node=node)


def owners_from_events(
    events: Iterable[ReplayInput], at_ms: int, *, engine: EngineConfig = DEFAULT_CONFIG,
    gpu_uuid: str | None = None, node: str | None = None, pod_uid: str | None = None,
) -> Json:
    """Owners at `at_ms` from input events. Events up to the engine's lateness after it are fed too:
    the live core names an XID's owners only once that much later event time has been seen, so a pod
    event the watcher stamped just after the instant is known to both."""
    config = ReplayConfig(engine=engine, to_ms=at_ms + engine.lateness_ms, keep=lambda _: False)
    result = replay_events(events, config)
    return owners_document(at_ms, owner_items(result.states, at_ms, gpu_uuid=gpu_uuid, node=node,
                                              pod_uid=pod_uid))


async def owners_with_stats(
    kafka: Kafka, at_ms: int, *, gpu_uuid: str | None = None, node: str | None = None,
    pod_uid: str | None = None, settings: ReplaySettings | None = None, warn: Warn | None = None,
    progress: Progress | None = None,
) -> tuple[Json, ReadStats]:
    settings = settings or ReplaySettings()
    events, stats = await read_inputs(kafka, owners_plan(at_ms, settings, node), warn=warn, progress=progress)
    doc = await asyncio.to_thread(owners_from_events, events, at_ms, engine=settings.engine_config(),
                                  gpu_uuid=gpu_uuid, node=node, pod_uid=pod_uid)
    return doc, stats


async def owners_at(
    kafka: Kafka, at_ms: int, gpu_uuid: str | None = None, node: str | None = None, *,
    pod_uid: str | None = None, settings: ReplaySettings | None = None,
) -> Json:
    """`{"at": T, "items": [{node, gpu_uuid, device_id, mig, pod_uid, namespace, pod, container}]}`."""
    doc, _ = await owners_with_stats(kafka, at_ms, gpu_uuid=gpu_uuid, node=node, pod_uid=pod_uid,
                                     settings=settings)
    return doc
