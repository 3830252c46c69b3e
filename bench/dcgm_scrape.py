"""What one dcgm-exporter scrape costs the probe: parse + map of a node's whole exposition.

The expositions are the exporter's format (tests/unit/data/corpus/dcgm/exporter.yaml: label names and
order, pod attributes, ratios 0-1) with the fields of its default counters file (`etc/default-counters.csv`:
20 device fields, the driver version as a label, five DCP fields) plus SM_ACTIVE and SM_OCCUPANCY,
which operators switch on for the probe's columns:

* `gpus`: 8 whole H100s, each held by a pod: 8 x 27 series;
* `mig`: 8 A100s with 7 `1g.10gb` instances each, every instance held by a pod. The exporter watches
  GPU instances on a MIG GPU and writes every field it can per instance (whole-GPU ones such as clocks
  repeat the parent's value); GPU/memory-copy/encoder/decoder utilization are not supported there:
  56 x 23 series.

Measured, in this thread's CPU time: `parse` (the probe's own, services/probe/dcgm.py) + `profiles` +
`annotate` on the devices NVML would list; the same run's baseline is the least any parser must do
with the same text: split it into lines and each line into name, labels and value.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.common import CpuTimer, Figure, Goal, median
from periscope.core.model import DeviceSample, MigRef

# (field, type) of the default counters file, then the two profiling fields it leaves commented out.
DEFAULT_FIELDS: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge"), ("DCGM_FI_DEV_MEM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge"), ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge"), ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"), ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge"), ("DCGM_FI_DEV_ENC_UTIL", "gauge"),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge"), ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "gauge"), ("DCGM_FI_DEV_FB_USED", "gauge"),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge"), ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge"), ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter"), ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge"), ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge"),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge"), ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge"),
)
NOT_ON_MIG = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL",
                        "DCGM_FI_DEV_DEC_UTIL"})
GOAL = Goal("<", 10.0, "< 10 ms CPU per scrape (the probe's whole per-tick budget)")
DRIVER = "550.54.15"


@dataclass(frozen=True)
class Node:
    """One node's exposition and the devices NVML lists on it."""

    name: str
    text: str
    devices: tuple[DeviceSample, ...]
    series: int


def _uuid(kind: str, g: int, i: int = 0) -> str:
    return f"{kind}-{g:08x}-{i:04x}-4000-8000-{0xdc6e0000 + g * 16 + i:012x}"


def _value(field: str, n: int) -> str:
    # Ratios with six decimals, the rest as integers, as the exporter prints them.
    return f"{(n % 97) / 100:.6f}" if field.startswith("DCGM_FI_PROF_") and "BYTES" not in field else str(
        1000 + n * 37 % 5000)


def _render(series: dict[str, list[str]]) -> str:
    out: list[str] = []
    for field, kind in DEFAULT_FIELDS:
        if series.get(field):
            out += [f"# HELP {field} {field.removeprefix('DCGM_FI_').replace('_', ' ').lower()}.",
                    f"# TYPE {field} {kind}", *series[field]]
    return "\n".join(out) + "\n"


def node(mig: bool, gpus: int = 8, instances: int = 7) -> Node:
    """The exposition of an 8-GPU node (whole GPUs, or `instances` MIG instances on each)."""
    model = "NVIDIA A100-SXM4-80GB" if mig else "NVIDIA H100 80GB HBM3"
    by_field: dict[str, list[str]] = {f: [] for f, _ in DEFAULT_FIELDS}
    devices: list[DeviceSample] = []
    n = 0
    for g in range(gpus):
        gpu = _uuid("GPU", g)
        devices.append(DeviceSample(gpu, index=g))
        base = (f'gpu="{g}",UUID="{gpu}",pci_bus_id="00000000:{0x18 + g:02X}:00.0",device="nvidia{g}",'
                f'modelName="{model}"')
        for i in range(1, instances + 1) if mig else (0,):
            mig_labels = f',GPU_I_PROFILE="1g.10gb",GPU_I_ID="{i}"' if mig else ""
            if mig:
                devices.append(DeviceSample(_uuid("MIG", g, i), parent_uuid=gpu,
                                            mig=MigRef(_uuid("MIG", g, i), "1g.10gb", i, 0)))
            pod = f"train-{g}-{i}"
            labels = (f'{base}{mig_labels},Hostname="gpu-node-0",DCGM_FI_DRIVER_VERSION="{DRIVER}",'
                      f'container="main",namespace="ml-team",pod="{pod}"')
            for field, _ in DEFAULT_FIELDS:
                if mig and field in NOT_ON_MIG:
                    continue
                n += 1
                by_field[field].append(f"{field}{{{labels}}} {_value(field, n)}")
    return Node("mig" if mig else "gpus", _render(by_field), tuple(devices), n)


def probe_parse_and_map(text: str, devices: tuple[DeviceSample, ...]) -> tuple[DeviceSample, ...]:
    from services.probe.dcgm import annotate, parse, profiles

    readings, _ = parse(text)
    return annotate(devices, profiles(readings, devices))


def bare_split(text: str) -> int:
    """The least any parser does: every line split into name, labels and value."""
    n = 0
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        n += len(labels.split(",")) + (value != "") + (name != "")
    return n


def prometheus_client_parse(text: str) -> int:
    """What the probe did before it parsed by hand: the profiling lines through prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    from services.probe.dcgm import FIELDS

    wanted = [ln for ln in text.splitlines() if ln.startswith(tuple(FIELDS)) or (
        ln.startswith("# ") and ln.split(" ", 3)[2:3] and ln.split(" ", 3)[2] in FIELDS)]
    return sum(len(f.samples) for f in text_string_to_metric_families("\n".join(wanted) + "\n"))


def _timed(fn: object, iters: int, repeats: int) -> list[float]:
    runs = []
    for _ in range(repeats):
        with CpuTimer() as t:
            for _ in range(iters):
                fn()  # type: ignore[operator]
        runs.append(t.seconds / iters * 1000)
    return runs


def run(iters: int, repeats: int, tick_s: float = 1.0, interval_s: float = 5.0) -> list[Figure]:
    """probe_dcgm_scrape_ms (8 GPUs) and probe_dcgm_scrape_mig_ms (56 MIG instances), each against the
    bare line split of the same text."""
    figures: list[Figure] = []
    for nd in (node(mig=False), node(mig=True)):
        annotated = probe_parse_and_map(nd.text, nd.devices)  # warm, and check it maps every device
        with_dcgm = sum(d.dcgm is not None for d in annotated)
        expect = sum(1 for d in nd.devices if d.parent_uuid) if nd.name == "mig" else len(nd.devices)
        if with_dcgm != expect:
            raise RuntimeError(f"{nd.name}: {with_dcgm} of {expect} devices got their DCGM values")
        suffix = "_mig" if nd.name == "mig" else ""
        runs = _timed(lambda nd=nd: probe_parse_and_map(nd.text, nd.devices), iters, repeats)
        base_runs = _timed(lambda nd=nd: bare_split(nd.text), iters, repeats)
        ms, base_ms = median(runs), median(base_runs)
        prometheus_client_parse(nd.text)  # warm: its first call compiles what it needs
        before_ms = median(_timed(lambda nd=nd: prometheus_client_parse(nd.text), max(1, iters // 5),
                                  repeats))
        shape = ("8 x A100, 7 MIG instances each (56), every instance held by a pod" if nd.name == "mig"
                 else "8 x H100, each held by a pod")
        setup = {"shape": shape, "series": nd.series, "bytes": len(nd.text.encode()),
                 "devices_annotated": with_dcgm, "iters": iters, "repeats": repeats,
                 "prometheus_client_parse_ms": round(before_ms, 3),  # the parser the probe used before
                 "what": "services.probe.dcgm parse + profiles + annotate, thread CPU per scrape; the "
                         "dcgm-exporter default counters file's fields plus SM_ACTIVE and SM_OCCUPANCY, "
                         "pod mapping on",
                 "runs_on": "the probe's own dcgm task (a worker thread), every PERISCOPE_DCGM_INTERVAL "
                            f"(default max(5 s, tick)), not the telemetry tick; per {tick_s:g} s tick at "
                            f"{interval_s:g} s: {ms * tick_s / interval_s:.3g} ms"}
        figures.append(Figure(
            f"probe_dcgm_bare_split{suffix}_ms", base_ms, "ms CPU/scrape",
            {**setup, "what": "str.splitlines + rpartition/partition/split per series of the same text"},
            "Python string methods per line", None, base_runs,
            f"{nd.series} series: bare line split, median of {repeats} x {iters}"))
        figures.append(Figure(
            f"probe_dcgm_scrape{suffix}_ms", ms, "ms CPU/scrape", setup,
            "a prefix scan of every line, then a regex match and a label split per profiling series "
            f"(prometheus_client's parser on the same lines: {before_ms:.3g} ms)", GOAL, runs,
            f"{shape}: {nd.series} series, parse + map, median of {repeats} x {iters}",
            baseline=f"probe_dcgm_bare_split{suffix}_ms"))
    return figures
