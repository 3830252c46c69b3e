"""A node's dcgm-exporter, as the real one exposes itself: Prometheus text on `GET /metrics`.

What it mirrors (NVIDIA/dcgm-exporter; the conformance fixture tests/unit/data/corpus/dcgm/exporter.yaml
lists each fact with its source, and tests/unit/test_sim_dcgm.py holds this module to it):
- the metric names, types and HELP texts of `etc/dcp-metrics-included.csv` (the counters file the GPU
  Operator's exporter runs with), plus SM_ACTIVE and SM_OCCUPANCY, which that file lists commented out
  and operators commonly switch on;
- the label set and order of `internal/pkg/rendermetrics`: `gpu`, `UUID`, `pci_bus_id`, `device`,
  `modelName`, then `GPU_I_PROFILE` and `GPU_I_ID` for a MIG instance, `Hostname`, the label-type
  counter `DCGM_FI_DRIVER_VERSION`, then the Kubernetes attributes `container`, `namespace`, `pod` of
  the device's holder (pod mapping on; one copy of the series per holder of a shared GPU);
- units: `DCGM_FI_PROF_*` are ratios 0-1, `DCGM_FI_DEV_GPU_UTIL` is percent, memory MiB, power W;
- MIG: one series per GPU instance keyed by the parent's `UUID` plus `GPU_I_ID`; a MIG instance has no
  `DCGM_FI_DEV_GPU_UTIL` (nor memory-copy/encoder/decoder util); power, temperature and clocks are the
  whole GPU's and stay on the parent's series.

The simulator's own model of the profiling ratios (stated here because the real values are measured):
graphics-engine activity = the unit's true util / 100, SM active = 0.95 of it, SM occupancy = 0.5 of
SM active, tensor pipe = 0.6 of it, DRAM active = 0.4 of it (the fake NVML's memory-controller share).
Every number is rendered at request time from the node's latest applied state. `mode` lets a test
break it the ways a real exporter breaks: `error` (HTTP 500), `garbage` (a body that is not Prometheus
text), `frozen` (the same exposition again and again, as an exporter whose DCGM stopped updating);
`stop()` takes it down (connection refused).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from periscope.sim.cluster.hardware import DRIVER_VERSION
from periscope.sim.cluster.model import GpuUsage, Holding

# (field, Prometheus type, HELP) in the counters file's order; None in FIELDS_ON_MIG = not on MIG.
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data."),
)
# Whole-GPU fields: on a MIG-enabled GPU they stay on the parent's series (no GPU_I_ID).
WHOLE_GPU = frozenset({"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"})
# Not supported on MIG instances, nor on the parent of MIG instances (NVML's util is NotSupported there).
NOT_ON_MIG = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"})
SM_ACTIVE_OF_GR, OCCUPANCY_OF_SM, TENSOR_OF_GR, DRAM_OF_GR = 0.95, 0.5, 0.6, 0.4


@dataclass(frozen=True, slots=True)
class Series:
    field: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def line(self) -> str:
        labels = ",".join(f'{k}="{_escape(v)}"' for k, v in self.labels)
        return f"{self.field}{{{labels}}} {_number(self.field, self.value)}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(field: str, v: float) -> str:
    # The exporter prints ratios with six decimals and integer fields as integers.
    return f"{v:.6f}" if field.startswith("DCGM_FI_PROF_") else f"{round(v):d}"


def _prof(active_pct: float) -> dict[str, float]:
    gr = max(0.0, min(100.0, active_pct)) / 100.0
    sm = gr * SM_ACTIVE_OF_GR
    return {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr,
        "DCGM_FI_PROF_SM_ACTIVE": sm,
        "DCGM_FI_PROF_SM_OCCUPANCY": sm * OCCUPANCY_OF_SM,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": gr * TENSOR_OF_GR,
        "DCGM_FI_PROF_DRAM_ACTIVE": gr * DRAM_OF_GR,
    }


def _k8s(holders: Sequence[Holding]) -> list[tuple[tuple[str, str], ...]]:
    """The pod attributes of each holder (one empty set when nobody holds the device)."""
    out: list[tuple[tuple[str, str], ...]] = [
        (("container", h.container.name), ("namespace", h.pod.namespace), ("pod", h.pod.name))
        for h in holders if h.pod is not None and h.container is not None]
    return out or [()]


def exposition_series(
    hostname: str, usage: Iterable[GpuUsage], holdings: Iterable[Holding], profiling: bool = True
) -> list[Series]:
    """Every series the node's exporter would show for one state, in field order."""
    holders: dict[str, list[Holding]] = {}
    for h in holdings:
        holders.setdefault(h.device.id, []).append(h)
    rows: list[Series] = []
    for u in usage:
        g = u.gpu
        base = (("gpu", str(g.index)), ("UUID", g.uuid), ("pci_bus_id", g.pci_bus_id),
                ("device", f"nvidia{g.index}"), ("modelName", g.model))
        tail = (("Hostname", hostname), ("DCGM_FI_DRIVER_VERSION", DRIVER_VERSION))
        whole = {
            "DCGM_FI_DEV_SM_CLOCK": 1410.0 if u.power_w else 210.0,
            "DCGM_FI_DEV_GPU_TEMP": u.temp_c, "DCGM_FI_DEV_POWER_USAGE": u.power_w,
        }
        if g.mig:
            rows += [Series(f, base + tail, v) for f, v in whole.items()]
            for m in u.mig:
                i = m.instance
                held = [h for h in holders.get(i.uuid, ()) if h.pod is not None]
                active = (held[0].util_pct or 0.0) if held else 0.0
                values = {"DCGM_FI_DEV_FB_FREE": i.memory_mib - m.fb_used_mib,
                          "DCGM_FI_DEV_FB_USED": m.fb_used_mib}
                if profiling:
                    values |= _prof(active)
                mig = (("GPU_I_PROFILE", i.profile), ("GPU_I_ID", str(i.gi)))
                for k8s in _k8s(held):
                    rows += [Series(f, base + mig + tail + k8s, v) for f, v in values.items()]
            continue
        util = u.util_pct or 0.0
        values = whole | {
            "DCGM_FI_DEV_GPU_UTIL": util, "DCGM_FI_DEV_MEM_COPY_UTIL": util * DRAM_OF_GR,
            "DCGM_FI_DEV_FB_FREE": g.memory_mib - u.fb_used_mib, "DCGM_FI_DEV_FB_USED": u.fb_used_mib,
        }
        if profiling:
            values |= _prof(util)
        on_gpu = [h for d, hs in holders.items() for h in hs if h.device.gpu is g and h.pod is not None]
        for k8s in _k8s(on_gpu):
            rows += [Series(f, base + tail + k8s, v) for f, v in values.items()]
    order = {f: n for n, (f, _, _) in enumerate(FIELDS)}
    return sorted(rows, key=lambda s: order[s.field])  # stable: per field, in device order


def render(series: Sequence[Series]) -> str:
    """Prometheus text: each present field's HELP and TYPE, then its series."""
    by_field: dict[str, list[Series]] = {}
    for s in series:
        by_field.setdefault(s.field, []).append(s)
    out: list[str] = []
    for f, kind, help_text in FIELDS:
        if f in by_field:
            out += [f"# HELP {f} {help_text}", f"# TYPE {f} {kind}", *(s.line() for s in by_field[f])]
    return "\n".join(out) + "\n"


class FakeDcgmExporter:
    """One node's exporter on 127.0.0.1:<port>: `GET /metrics` answers the text `body()` gives."""

    def __init__(self, hostname: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.hostname, self.host, self.port = hostname, host, port
        self.mode = "ok"  # ok | error | garbage | frozen
        self.text = ""  # the latest exposition (set by `update`)
        self._frozen = ""
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def update(self, usage: Iterable[GpuUsage], holdings: Iterable[Holding], profiling: bool = True) -> None:
        self.text = render(exposition_series(self.hostname, usage, holdings, profiling))

    def body(self) -> tuple[int, bytes]:
        if self.mode == "error":
            return 500, b"An error has occurred while serving metrics:\n\ncollector failed\n"
        if self.mode == "garbage":
            return 200, b"<html><body>502 Bad Gateway</body></html>\n{\"not\": prometheus}\n"
        if self.mode == "frozen":
            self._frozen = self._frozen or self.text
            return 200, self._frozen.encode()
        self._frozen = ""
        return 200, self.text.encode()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(parts) == 3 and parts[1].split("?")[0] == "/metrics":
                status, body = self.body()
            else:
                status, body = 404, b"404 page not found\n"
            reason = {200: "OK", 404: "Not Found"}.get(status, "Internal Server Error")
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
