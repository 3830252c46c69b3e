"""What the engine publishes: the outputs worth publishing under the change rule, remembered per key.

Each output is compared with the last one published under its key (periscope.core.changes); a
PodAttribution that carried closed windows marks them published on its rows, which then keep them
only while idle detection needs them.
"""

from __future__ import annotations

from periscope.core.changes import gpu_due, pod_due, without_windows, worth_publishing
from periscope.core.engine_config import EngineConfig
from periscope.core.model import Finding, GpuState, Output, PodAttribution
from periscope.core.state import NodeState


def emit(state: NodeState, outs: list[Output], config: EngineConfig) -> list[Output]:
    """Keep the outputs worth publishing (periscope.core.changes); remember what was published."""
    fresh: list[Output] = []
    emitted, cfg = state.emitted, config.changes
    for o in outs:
        # worth_publishing, by kind (this runs for every pod and GPU of every sample).
        if isinstance(o, PodAttribution):
            key = o.pod_uid
            last = emitted.get(key)
            if isinstance(last, PodAttribution) and not pod_due(last, o, cfg):
                continue
            windows = False
            for r in o.rows:
                if r.windows:
                    windows = True
                    break
            emitted[key] = without_windows(o) if windows else o
            fresh.append(o)
            if windows:
                _published_windows(state, o, config)
        elif isinstance(o, GpuState):
            key = o.gpu_uuid
            last = emitted.get(key)
            if isinstance(last, GpuState) and not gpu_due(last, o, cfg):
                continue
            emitted[key] = o
            fresh.append(o)
        else:
            key = "finding/" + o.id
            if worth_publishing(emitted.get(key), o, cfg):
                emitted[key] = o
                fresh.append(o)
    return fresh


def _published_windows(state: NodeState, att: PodAttribution, config: EngineConfig) -> None:
    for r in att.rows:
        if r.windows:
            row = state.rows.get((att.pod_uid, r.container, r.device_id))
            if row is not None:
                row.mark_published(r.windows[-1].start_ms, config.rows)


def output_key(o: Output) -> str:
    if isinstance(o, Finding):
        return "finding/" + o.id
    if isinstance(o, GpuState):
        return "gpu/" + o.gpu_uuid
    return "pod/" + o.pod_uid
