"""Replay results -> JSON documents and rich tables; RFC 3339 times; the stderr progress bar.

Times are Unix ms inside and RFC 3339 UTC with milliseconds outside (0 means unknown: null).
A document's "items" may be any iterable: `json_chunks` writes them one at a time, so the JSON of a
long range (an hour of a large cluster is gigabytes of it) is never held in memory all at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from periscope.core.model import AttributionRow, Finding, GpuState, Owner, PodAttribution
from periscope.wirejson import mig_json, rfc3339
from periscope.wirejson import num as _num

Json = dict[str, Any]


def _time(ms: int) -> str | None:
    return rfc3339(ms) if ms else None


def _owner(o: Owner) -> Json:
    return {"pod_uid": o.pod_uid or None, "namespace": o.namespace, "pod": o.pod, "container": o.container,
            "device_id": o.device_id}


def _row(r: AttributionRow) -> Json:
    return {
        "container": r.container, "device_id": r.device_id, "gpu_uuid": r.gpu_uuid or None,
        "mig": mig_json(r.mig), "sharing": r.sharing, "share_basis": r.share_basis,
        "util_pct": _num(r.util_pct), "fb_used_mib": _num(r.fb_used_mib), "power_w": _num(r.power_w),
        "active": r.active, "idle": r.idle, "idle_since": _time(r.idle_since_ms),
        "avg_util_pct": _num(r.avg_util_pct), "wasted_gpu_hours": r.wasted_gpu_hours,
        "first_seen": _time(r.first_seen_ms), "last_seen": _time(r.last_seen_ms), "sources": list(r.sources),
        "sm_active_pct": _num(r.sm_active_pct), "sm_occupancy_pct": _num(r.sm_occupancy_pct),
        "tensor_active_pct": _num(r.tensor_active_pct), "dram_active_pct": _num(r.dram_active_pct),
    }


def output_json(o: PodAttribution | GpuState | Finding) -> Json:
    """One timeline item: the record the core emitted, with its event time and bus key."""
    # One dict literal per kind (no merging of a shared head): this runs for every record of a range.
    if isinstance(o, PodAttribution):
        return {"at": rfc3339(o.as_of_ms), "node": o.node, "kind": "attribution", "key": o.pod_uid,
                "pod_uid": o.pod_uid, "namespace": o.namespace, "pod": o.pod, "phase": o.phase,
                "owner": {"kind": o.owner_kind, "name": o.owner_name} if o.owner_kind else None,
                "created": _time(o.created_ms), "deleted": _time(o.deleted_ms),
                "rows": [_row(r) for r in o.rows]}
    if isinstance(o, GpuState):
        migs = [{"uuid": m.uuid, "profile": m.profile, "gi": m.gi, "ci": m.ci, "util_pct": _num(m.util_pct),
                 "fb_used_mib": _num(m.fb_used_mib), "fb_total_mib": _num(m.fb_total_mib),
                 "owners": [_owner(x) for x in m.owners]} for m in o.mig_devices]
        xid = None if o.last_xid is None else {"code": o.last_xid.code, "at": rfc3339(o.last_xid.at_ms)}
        return {"at": rfc3339(o.as_of_ms), "node": o.node, "kind": "gpu", "key": o.gpu_uuid,
                "gpu_uuid": o.gpu_uuid, "model": o.model, "index": o.index, "sharing": o.sharing,
                "util_pct": _num(o.util_pct),
                "fb_used_mib": _num(o.fb_used_mib), "fb_total_mib": _num(o.fb_total_mib),
                "power_w": _num(o.power_w), "temp_c": _num(o.temp_c), "lost": o.lost,
                "owners": [_owner(x) for x in o.owners], "mig_devices": migs, "last_xid": xid}
    return {"at": rfc3339(o.at_ms), "node": o.node, "kind": "finding", "key": o.key, "finding": o.kind,
            "id": o.id, "active": o.active, "gpu_uuid": o.gpu_uuid or None, "mig": mig_json(o.mig),
            "pod_uid": o.pod_uid or None,
            "namespace": o.namespace or None, "pod": o.pod or None, "container": o.container or None,
            "device_id": o.device_id or None, "xid_code": o.xid_code or None,
            "owners": [_owner(x) for x in o.owners], "message": o.message, "since": _time(o.since_ms),
            "avg_util_pct": _num(o.avg_util_pct), "wasted_gpu_hours": o.wasted_gpu_hours}


def json_chunks(doc: Json, stream: str = "items") -> Iterator[str]:
    """`doc` as indented JSON in pieces, except that each item of `doc[stream]` (any iterable of JSON
    values, consumed once) is one compact line: an hour of a cluster is millions of items, and the
    indenting encoder is pure Python (several times slower than the C one, most of a replay's time)."""
    text = json.dumps({**doc, stream: []}, indent=2)
    marker = f"\n  {json.dumps(stream)}: ["  # top level: deeper keys are indented further
    head, found, tail = text.partition(marker + "]")
    assert found, "dumps writes every top-level key on its own line"
    yield head + marker
    empty = True
    for item in doc[stream]:
        yield ("\n    " if empty else ",\n    ") + json.dumps(item, separators=(", ", ": "))
        empty = False
    yield ("]" if empty else "\n  ]") + tail


# ---------------------------------------------------------------- tables


def stdout_console(file: IO[str]) -> Console:
    # Piped output keeps full UUIDs on one line instead of folding them at 80 columns.
    return Console(file=file, width=None if file.isatty() else 240, soft_wrap=False)


def _pct(x: Any) -> str:
    return "-" if x is None else f"{x:g}%"


def _who(o: Json) -> str:
    name = f"{o['namespace']}/{o['pod']}" if o.get("pod") else "?"
    return f"{name} ({o['pod_uid'] or 'ambiguous'})"


def _detail(item: Json) -> str:
    if item["kind"] == "attribution":
        rows = [f"{r['container']}@{r['device_id']} util {_pct(r['util_pct'])} fb {r['fb_used_mib']} MiB"
                + (" idle" if r["idle"] else "") + ("" if r["active"] else " released") for r in item["rows"]]
        return f"{item['namespace']}/{item['pod']}: " + "; ".join(rows)
    if item["kind"] == "gpu":
        owners = ", ".join(_who(o) for o in item["owners"]) or "no owner"
        return f"{item['sharing']} util {_pct(item['util_pct'])} fb {item['fb_used_mib']} MiB; {owners}"
    state = "" if item["active"] else " (cleared)"
    return f"{item['finding']}{state}: {item['message']}"


def timeline_table(doc: Json) -> Table:
    table = Table()
    for col in ("at", "kind", "node", "key", "detail"):
        table.add_column(col, overflow="fold")
    for item in doc["items"]:
        table.add_row(item["at"], item["kind"], item["node"], item["key"], _detail(item))
    return table


def owners_table(doc: Json) -> Table:
    table = Table()
    cols = ("node", "gpu_uuid", "device_id", "mig", "pod_uid", "namespace", "pod", "container")
    for col in cols:
        table.add_column(col, overflow="fold")
    for item in doc["items"]:
        mig = item["mig"]
        cells = {**item, "mig": f"{mig['profile']} gi{mig['gi']}/ci{mig['ci']}" if mig else "-"}
        table.add_row(*("-" if cells[c] is None else str(cells[c]) for c in cols))
    return table


# ---------------------------------------------------------------- progress


class ProgressBar:
    """A progress bar on stderr for long replays; draws nothing when stderr is not a terminal."""

    def __init__(self, stderr: IO[str], enabled: bool) -> None:
        on = enabled and stderr.isatty()
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(file=stderr), transient=True, disable=not on,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, name: str, advance: int, total: int | None = None) -> None:
        task = self._tasks.get(name)
        if task is None:
            task = self._tasks[name] = self._progress.add_task(name, total=total)
        self._progress.update(task, advance=advance, total=total)
