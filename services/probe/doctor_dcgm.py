"""`periscope doctor`'s dcgm-exporter checks: is the node's exporter reachable at
PERISCOPE_DCGM_EXPORTER_URL, and does it export DCGM's profiling fields (MIG utilization needs them)?

The exporter is optional, so nothing here fails the probe: a problem is a `warn` with the fix. The
scrape and the parse are the probe's own (services.probe.dcgm), so doctor sees what the probe would.
"""

from __future__ import annotations

from periscope.settings.probe import ProbeSettings
from services.probe.dcgm import FIELDS, ExporterError, Fetch, http_fetch, parse
from services.probe.doctor_report import Check

_REACH_FIX = (
    "check that dcgm-exporter runs on this node (GPU Operator: `kubectl -n gpu-operator get pods -o wide "
    "-l app=nvidia-dcgm-exporter`) and that the probe reaches its port 9400: the node's IP "
    "(status.hostIP) with the exporter on hostPort/hostNetwork, or a NetworkPolicy that allows the "
    "probe's egress to it (docs/deploy.md)"
)
_PROFILING_FIX = (
    "enable the DCGM_FI_PROF_* fields in the exporter's counters file (dcp-metrics-included.csv, the "
    "GPU Operator's default, has GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE and DRAM_ACTIVE) and check that "
    "DCGM's profiling module loads; GPUs before Volta and some others do not support profiling at all, "
    "and then MIG slices have no utilization"
)


def dcgm_checks(settings: ProbeSettings, mig_on: bool, fetch: Fetch = http_fetch) -> list[Check]:
    url = settings.dcgm_exporter_url
    if not url:
        if mig_on:
            return [Check("dcgm.exporter", "warn",
                          "PERISCOPE_DCGM_EXPORTER_URL is not set: MIG slices will show no utilization",
                          "point it at the node's dcgm-exporter, e.g. http://$(HOST_IP):9400/metrics "
                          "(docs/deploy.md)")]
        return [Check("dcgm.exporter", "ok", "not configured (optional: DCGM profiling fields per pod)")]
    try:
        text = fetch(url, max(settings.dcgm_timeout, 2.0), settings.dcgm_max_bytes)
        readings, total = parse(text)
    except ExporterError as e:
        fix = _REACH_FIX if e.state == "unavailable" else "the URL must name the exporter's /metrics"
        return [Check("dcgm.exporter", "warn", f"{url}: {e}", fix)]
    checks = [Check("dcgm.exporter", "ok", f"{url} answered: {total} DCGM series")]
    if not readings:
        return [*checks, Check("dcgm.profiling", "warn", "no DCGM_FI_PROF_* field in the exposition",
                               _PROFILING_FIX)]
    attrs = {r.attr for r in readings}
    names = sorted({n.removeprefix("DCGM_FI_PROF_") for n, a in FIELDS.items() if a in attrs
                    and not n.endswith("_RATIO")})
    instances = {(r.uuid, r.gi) for r in readings if r.gi is not None}
    detail = f"profiling fields {', '.join(names)}; {len(instances)} MIG instances"
    if "gr_engine_active_pct" not in attrs:
        return [*checks, Check("dcgm.profiling", "warn", detail + "; no GR_ENGINE_ACTIVE",
                               "add DCGM_FI_PROF_GR_ENGINE_ACTIVE to the counters file: MIG utilization "
                               "comes from it")]
    if mig_on and not instances:
        return [*checks, Check("dcgm.profiling", "warn", detail + " although MIG is on",
                               "the exporter reports no GPU instance (GPU_I_ID): run it with MIG "
                               "monitoring on (its default) and a DCGM that supports MIG profiling")]
    return [*checks, Check("dcgm.profiling", "ok", detail)]
