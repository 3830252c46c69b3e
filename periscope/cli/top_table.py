"""The `periscope top` table: API answers in, a rich Table out. Pure (no I/O, no clock) so that the
rendering is tested against golden text.

One row per device a pod container holds now (a time-slicing replica or a MIG slice is its own
row), and one row per GPU that nobody holds (left out when a namespace filter is on: a free GPU
belongs to no namespace). On a MIG slice UTIL% is the instance's DCGM graphics-engine activity; the
DCGM columns (SM%, TENSOR%, DRAM%) show only when some row has them (a node's dcgm-exporter is scraped).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

Json = Mapping[str, Any]
SORTS = ("util", "idle", "memory")
COLUMNS = (
    "NODE", "GPU", "DEVICE", "NAMESPACE", "POD", "UID", "CONTAINER",
    "UTIL%", "MEM MiB", "POWER W", "IDLE GPU-h",
)
DCGM_COLUMNS = ("SM%", "TENSOR%", "DRAM%")  # after UTIL%, only when some row has DCGM profiling data


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one refresh read: /v1/gpus, /v1/pods?active=true and /v1/idle items, and the view's as_of."""

    gpus: Sequence[Json]
    pods: Sequence[Json]
    idle: Sequence[Json]
    as_of: str | None
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class Row:
    node: str
    gpu_index: int
    gpu: str
    device: str
    namespace: str
    pod: str
    uid: str
    container: str
    util: float | None
    mem: float | None
    power: float | None
    wasted: float | None  # GPU-hours; None when not idle
    sm: float | None = None  # DCGM profiling fields of the row's own unit (percent)
    tensor: float | None = None
    dram: float | None = None


def _text(v: Any) -> str:
    """An API value as a cell: what the API does not know is null, shown as `-`."""
    return "-" if v is None else str(v)


def _short(uuid: str) -> str:
    return uuid.removeprefix("GPU-").removeprefix("MIG-")[:8]


def _device(row: Json) -> str:
    mig = row.get("mig")
    if mig:
        return f"{mig.get('profile') or 'mig'} {mig.get('gi')}/{mig.get('ci')}"
    device_id = str(row.get("device_id", ""))
    if "::" in device_id:
        return f"replica {device_id.rsplit('::', 1)[1]}"
    return "whole"


def rows(snap: Snapshot) -> list[Row]:
    gpus = {str(g["gpu_uuid"]): g for g in snap.gpus}
    wasted = {(str(r["pod_uid"]), str(r["device_id"])): r.get("wasted_gpu_hours") for r in snap.idle}
    out = []
    held = set()
    for p in snap.pods:
        uuid = str(p["gpu_uuid"] or "")  # null: the device ID names no known GPU
        held.add(uuid)
        g = gpus.get(uuid, {})
        out.append(
            Row(
                node=str(p["node"]), gpu_index=int(g.get("index", -1)), gpu=_short(uuid), device=_device(p),
                namespace=_text(p["namespace"]), pod=_text(p["pod"]), uid=str(p["pod_uid"])[:8],
                container=str(p["container"]), util=p.get("util_pct"), mem=p.get("fb_used_mib"),
                power=p.get("power_w"), wasted=wasted.get((str(p["pod_uid"]), str(p["device_id"]))),
                sm=p.get("sm_active_pct"), tensor=p.get("tensor_active_pct"), dram=p.get("dram_active_pct"),
            )
        )
    if snap.namespace is None:
        for uuid, g in gpus.items():
            if uuid not in held:
                out.append(
                    Row(
                        node=str(g["node"]), gpu_index=int(g["index"]), gpu=_short(uuid), device="free",
                        namespace="-", pod="-", uid="-", container="-", util=g.get("util_pct"),
                        mem=g.get("fb_used_mib"), power=g.get("power_w"), wasted=None,
                    )
                )
    return out


def _desc(v: float | None) -> float:
    return -v if v is not None else float("inf")  # unknown sorts last


def sort_rows(items: list[Row], sort: str | None) -> list[Row]:
    place = sorted(items, key=lambda r: (r.node, r.gpu_index, r.gpu, r.device, r.namespace, r.pod, r.uid))
    if sort == "util":
        return sorted(place, key=lambda r: _desc(r.util))
    if sort == "memory":
        return sorted(place, key=lambda r: _desc(r.mem))
    if sort == "idle":
        return sorted(place, key=lambda r: _desc(r.wasted))
    return place


def _num(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _hours(v: float | None) -> str:
    """GPU-hours to two decimals; a small positive amount (minutes of waste) in two significant digits,
    so an idle row never reads 0.00 as if it had wasted nothing."""
    if v is not None and 0 < v < 0.005:
        return f"{v:.2g}"
    return _num(v, 2)


def summary(snap: Snapshot) -> str:
    pods = len({p["pod_uid"] for p in snap.pods})
    wasted = sum(float(r.get("wasted_gpu_hours") or 0.0) for r in snap.idle)
    return (
        f"as of {snap.as_of or '-'}   GPUs {len(snap.gpus)}   pods holding GPUs {pods}   "
        f"idle {len(snap.idle)} ({_hours(wasted)} GPU-h wasted)"
    )


def table(snap: Snapshot, sort: str | None = None) -> Table:
    # Every cell and the title are Text, never markup: a name such as "[red]x" is shown as it is.
    t = Table(title=Text(summary(snap)), title_justify="left", box=None, pad_edge=False, header_style="bold")
    items = sort_rows(rows(snap), sort)
    dcgm = any(r.sm is not None or r.tensor is not None or r.dram is not None for r in items)
    util_at = COLUMNS.index("UTIL%") + 1
    names = (*COLUMNS[:util_at], *DCGM_COLUMNS, *COLUMNS[util_at:]) if dcgm else COLUMNS
    for name in names:
        numeric = name in {"UTIL%", "MEM MiB", "POWER W", "IDLE GPU-h", *DCGM_COLUMNS}
        t.add_column(name, justify="right" if numeric else "left", no_wrap=True)
    for r in items:
        idle_style = "yellow" if r.wasted is not None else None
        cells: tuple[str, ...] = (
            r.node, f"{r.gpu_index} {r.gpu}" if r.gpu_index >= 0 else r.gpu, r.device, r.namespace, r.pod,
            r.uid, r.container, _num(r.util, 0), _num(r.mem, 0), _num(r.power, 0), _hours(r.wasted),
        )
        if dcgm:
            cells = (*cells[:util_at], _num(r.sm, 0), _num(r.tensor, 0), _num(r.dram, 0), *cells[util_at:])
        t.add_row(*(Text(c) for c in cells), style=idle_style)
    return t


def render_text(snap: Snapshot, sort: str | None = None, width: int = 160) -> str:
    """The table as plain text (no colour), as `--once` prints it into a pipe."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False).print(table(snap, sort))
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())
