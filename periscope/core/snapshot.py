"""Engine state <-> JSON-compatible dicts, split into a node part and per-pod-UID parts.

The joiner keeps the node part in a table keyed by node and each pod's rows in a table keyed by pod
UID (both changelogged), so a restarted or rebalanced worker rebuilds exactly this state, including
what was last published per key (so it goes on publishing exactly what an uninterrupted run would).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from periscope.core.devices import DeviceMap
from periscope.core.findings import FindingBook
from periscope.core.model import (
    AllocationSnapshot,
    DeviceInventory,
    Finding,
    GpuState,
    MigRef,
    NodeEvent,
    NodeTelemetry,
    PodAttribution,
    PodInfo,
    XidEvent,
    XidRef,
)
from periscope.core.pods import PodRecord, PodRegistry
from periscope.core.repeats import Repeats
from periscope.core.rows import RowState
from periscope.core.serde import from_jsonable, from_positional, to_jsonable, to_positional
from periscope.core.state import Counters, NodeState, pending_key
from periscope.core.usage import Usage
from periscope.core.watermark import from_record, to_record
from periscope.core.windows import START, W

FORMAT = 1


def _row_to(r: RowState, jsonable: Callable[[Any], Any]) -> dict[str, Any]:
    return {
        "uid": r.pod_uid, "ns": r.namespace, "pod": r.pod, "c": r.container, "dev": r.device_id,
        "gpu": r.gpu_uuid, "mig": jsonable(r.mig), "first": r.first_seen_ms, "last": r.last_seen_ms,
        "sample": r.sample_ms, "active": r.active, "src": list(r.sources), "usage": jsonable(r.usage),
        "win": [_num(x) for x in r.windows], "pub": r.published_ms, "iwin": [_num(x) for x in r.idle_windows],
        "low": r.low_since_ms, "idle": r.idle, "idle_since": r.idle_since_ms, "avg": r.avg_util_pct,
        **({"unres": r.unresolved} if r.unresolved else {}),
        **({"led": [_num(x) for x in r.ledger], "lowg": _num(r.low_gpu_ms), "ib": r.idle_booked}
           if r.ledger else {}),
        **({"chg": _charged_to(r)} if r.charged is not None else {}),
    }


def _num(x: float) -> float | int:
    return int(x) if x.is_integer() else x  # shorter JSON; read back as the same double


def _windows_from(d: dict[str, Any]) -> tuple[array[float], int]:
    """Windows and publication mark of a row record. Records written before rows kept only what they
    need hold a list per window, every closed one already published (all were, on every tick)."""
    win = d["win"]
    if "pub" in d:
        return array("d", win), int(d["pub"])
    flat = array("d", (float(x) for w in win for x in w))
    closed = len(flat) - W if d["active"] else len(flat)
    return flat, int(flat[closed - W + START]) if closed > 0 else -1


def _row_from(d: dict[str, Any]) -> RowState:
    windows, published = _windows_from(d)
    row = RowState(
        pod_uid=d["uid"], namespace=d["ns"], pod=d["pod"], container=d["c"], device_id=d["dev"],
        gpu_uuid=d["gpu"], mig=from_jsonable(MigRef | None, d["mig"]), first_seen_ms=d["first"],
        last_seen_ms=d["last"], sample_ms=d["sample"], active=d["active"], sources=tuple(d["src"]),
        usage=from_jsonable(Usage | None, d["usage"]), windows=windows, published_ms=published,
        idle_windows=array("d", d.get("iwin", ())),
        low_since_ms=d["low"], idle=d["idle"], idle_since_ms=d["idle_since"], avg_util_pct=d["avg"],
        unresolved=d.get("unres", ""),
        # absent in records written before accounting: nothing charged yet
        ledger=array("d", d.get("led", ())), low_gpu_ms=float(d.get("lowg", 0.0)),
        idle_booked=bool(d.get("ib", False)),
    )
    _charged(row, d.get("chg"))
    return row


def _pending_to(ev: NodeTelemetry | XidEvent, jsonable: Callable[[Any], Any]) -> dict[str, Any]:
    return {"t": "xid" if isinstance(ev, XidEvent) else "tel", "v": jsonable(ev)}


def _pending_from(d: dict[str, Any]) -> NodeTelemetry | XidEvent:
    ev: NodeTelemetry | XidEvent = from_jsonable(XidEvent if d["t"] == "xid" else NodeTelemetry, d["v"])
    return ev


def _alloc_key(v: list[int]) -> tuple[int, int, int]:
    return (int(v[0]), int(v[1]), int(v[2]))


def _repeats(v: str | list[list[int]]) -> Repeats:
    # packed text; a list of keys in records written before the repeats were packed
    return Repeats.from_text(v) if isinstance(v, str) else Repeats(_alloc_key(x) for x in v)


def _as_is(value: Any) -> Any:
    return value


def to_parts(state: NodeState, *, native: bool = False) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(node part, {pod_uid: {"rows": [row dicts], "pub": the pod's last published attribution}}).

    The last published outputs (without windows) are kept so that a restored state decides what to
    publish exactly as the uninterrupted one would (periscope.core.changes compares with them).
    `native`: the event and state records in it are left as the dataclasses, enums and tuples they are,
    for an encoder that writes those itself as to_jsonable would (field names in declaration order,
    enum values, tuples as arrays): the same JSON, without building the dicts first."""
    jsonable = _as_is if native else to_jsonable
    node: dict[str, Any] = {
        "format": FORMAT,
        "node": state.node,
        "pods": [
            {"info": jsonable(r.info), "first": r.first_seen_ms, "deleted": r.deleted_ms,
             "ver": list(r.version)}
            for _, r in sorted(state.pods.pods.items())
        ],
        "allocs": [jsonable(s) for s in state.allocs],
        "alloc_repeats": [[list(k), v.to_text()] for k, v in sorted(state.alloc_repeats.items())],
        "inventory": jsonable(state.inventory),
        "node_event": jsonable(state.node_event),
        "pending": [_pending_to(p, jsonable) for p in state.pending],
        "watermark": state.watermark_ms,
        "inputs": to_record(state.inputs),
        "processed": state.processed_ms,
        "pruned": state.pruned_ms,
        "last_xid": {k: jsonable(v) for k, v in sorted(state.last_xid.items())},
        "last_telemetry": jsonable(state.last_telemetry and state.last_telemetry.without_processes()),
        "findings": [jsonable(f) for f in state.findings.active()],
        "counters": jsonable(state.counters),
        "pub_gpus": {k: to_positional(v) for k, v in sorted(state.emitted.items())
                     if isinstance(v, GpuState)},
    }
    pods: dict[str, dict[str, Any]] = {}
    for key in sorted(state.rows):
        pub = state.emitted.get(key[0])
        part = pods.setdefault(key[0], {
            "rows": [], "pub": to_positional(pub if isinstance(pub, PodAttribution) else None)})
        part["rows"].append(_row_to(state.rows[key], jsonable))
    return node, pods


def from_parts(node: dict[str, Any], pods: dict[str, Any]) -> NodeState:
    """Inverse of to_parts. A pod part may also be a plain list of row dicts (records written before
    the last published outputs were kept: the first output of each key after a restart is published)."""
    if node.get("format") != FORMAT:
        raise ValueError(f"unsupported state format {node.get('format')!r}")
    reg = PodRegistry()
    for p in node["pods"]:
        info: PodInfo = from_jsonable(PodInfo, p["info"])
        reg.pods[info.uid] = PodRecord(info, p["first"], p["deleted"], p["ver"][0], p["ver"][1])
    inventory = from_jsonable(DeviceInventory | None, node["inventory"])
    state = NodeState(
        node=node["node"],
        pods=reg,
        allocs=[from_jsonable(AllocationSnapshot, s) for s in node["allocs"]],
        # absent in records written before runs kept their repeats: those runs simply have none
        alloc_repeats={_alloc_key(k): _repeats(v) for k, v in node.get("alloc_repeats", [])},
        inventory=inventory,
        node_event=from_jsonable(NodeEvent | None, node["node_event"]),
        pending=sorted((_pending_from(p) for p in node["pending"]), key=pending_key),
        watermark_ms=node["watermark"],
        processed_ms=node["processed"],
        pruned_ms=node["pruned"],
        last_xid={k: from_jsonable(XidRef, v) for k, v in node["last_xid"].items()},
        last_telemetry=from_jsonable(NodeTelemetry | None, node["last_telemetry"]),
        findings=FindingBook({f["id"]: from_jsonable(Finding, f) for f in node["findings"]}),
        counters=from_jsonable(Counters, node["counters"]),
        devmap=DeviceMap.from_inventory(inventory),
        # absent in records written before alignment: no stream counts as read (each holds until it is)
        inputs=from_record(node.get("inputs"), node["watermark"]),
    )
    for uuid, g in node.get("pub_gpus", {}).items():
        state.emitted[uuid] = from_positional(GpuState, g)
    for uid, part in pods.items():
        rows = part if isinstance(part, list) else part["rows"]
        for d in rows:
            r = _row_from(d)
            state.rows[(r.pod_uid, r.container, r.device_id)] = r
        if isinstance(part, dict) and part.get("pub") is not None:
            state.emitted[uid] = from_positional(PodAttribution, part["pub"])
    return state


def _charged_to(r: RowState) -> list[Any]:
    assert r.charged is not None
    (share, basis), power = r.charged, r.charged_power
    return [_num(share), basis, None if power is None else _num(power), _num(r.charged_scale)]


def _charged(row: RowState, v: Any) -> None:
    """A row's last charge rate, as persisted (absent before it was kept: no end charge then)."""
    if isinstance(v, list) and len(v) == 4:
        row.charged = (float(v[0]), str(v[1]))
        row.charged_power, row.charged_scale = None if v[2] is None else float(v[2]), float(v[3])
