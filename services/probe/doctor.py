"""`periscope doctor`: can the probe work on this node? One check per source it needs.

Every check answers `ok`, `warn` (the probe works, with less) or `fail` (it cannot do its job) and,
unless ok, the fix. The checks run the probe's own readers with the probe's own settings
(`ProbeSettings`, `PodResourcesClient`, `CheckpointSource`, `NvmlBackend` over the module
`load_nvml` gives, `/proc` as `ProcMapper` reads it), so doctor sees exactly what the probe would.
NVML and /proc checks live in `doctor_nvml`, the verdicts in `doctor_report`; this module holds the
kubelet checks and runs them all.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from grpc import aio

from periscope.kubelet.checkpoint import MAX_CHECKPOINT_BYTES
from periscope.settings.probe import ProbeSettings
from services.probe.allocations import is_gpu_resource
from services.probe.checkpoint_source import CheckpointSource
from services.probe.doctor_dcgm import dcgm_checks
from services.probe.doctor_nvml import nvml_checks, procfs_checks
from services.probe.doctor_report import STATUSES, Check, DoctorReport, Status
from services.probe.podresources import PodResourcesClient, PodResourcesUnavailable, socket_identity

__all__ = ["STATUSES", "Check", "DoctorReport", "Status", "diagnose"]

_MOUNT_FIX = (
    "mount the host's {dir} into the probe pod (hostPath directory, not the socket file) "
    "and point PERISCOPE_KUBELET_ROOT or PERISCOPE_PODRESOURCES_SOCKET at it"
)


async def podresources_checks(socket_path: str, timeout_s: float = 2.0) -> list[Check]:
    """Socket present, and which of List / GetAllocatableResources / Get answer; DRA data seen."""
    if socket_identity(socket_path) is None:
        return [
            Check(
                "podresources.socket",
                "fail",
                f"{socket_path} does not exist",
                _MOUNT_FIX.format(dir="/var/lib/kubelet/pod-resources"),
            )
        ]
    checks = [Check("podresources.socket", "ok", socket_path)]
    client = PodResourcesClient(socket_path, timeout_s=timeout_s)
    try:
        try:
            pods = await client.list_pods()
        except (PodResourcesUnavailable, aio.AioRpcError) as e:
            why = str(e) if isinstance(e, PodResourcesUnavailable) else f"{e.code().name}: {e.details()}"
            checks.append(
                Check(
                    "podresources.list",
                    "fail",
                    f"List did not answer ({why})",
                    "the socket exists but no kubelet serves it: check that the kubelet runs and that "
                    "the probe may connect (it needs root or the socket's group)",
                )
            )
            return checks
        gpu_pods = sum(
            1 for p in pods if any(is_gpu_resource(d.resource_name) for c in p.containers for d in c.devices)
        )
        checks.append(
            Check("podresources.list", "ok", f"List answered: {len(pods)} pods, {gpu_pods} with GPUs")
        )
        checks.append(await _allocatable_check(client))
        try:
            mode = await client.get_mode()
        except PodResourcesUnavailable as e:  # the kubelet went away between the calls
            mode = "unknown"
            checks.append(Check("podresources.get", "warn", str(e), "run doctor again"))
        else:
            checks.append(_get_check(mode))
        checks.append(_dra_check(pods, mode))
    finally:
        await client.close()
    return checks


async def _allocatable_check(client: PodResourcesClient) -> Check:
    try:
        devices = [
            i for d in await client.allocatable() if is_gpu_resource(d.resource_name) for i in d.device_ids
        ]
    except aio.AioRpcError as e:
        return Check(
            "podresources.allocatable", "warn", f"{e.code().name}: {e.details()}", "check the kubelet log"
        )
    except PodResourcesUnavailable as e:
        return Check("podresources.allocatable", "warn", str(e), "check the kubelet log")
    if not devices:
        # The client reads UNIMPLEMENTED (kubelet < 1.21) as "nothing allocatable" too.
        return Check(
            "podresources.allocatable",
            "warn",
            "GetAllocatableResources lists no nvidia.com devices",
            "check that the NVIDIA device plugin runs on this node (kubelet >= 1.21 lists its devices)",
        )
    return Check(
        "podresources.allocatable", "ok", f"GetAllocatableResources answered: {len(devices)} GPU devices"
    )


def _get_check(mode: str) -> Check:
    if mode == "enabled":
        return Check("podresources.get", "ok", "Get answers")
    if mode == "disabled":
        return Check(
            "podresources.get",
            "warn",
            "Get is disabled (feature gate KubeletPodResourcesGet off)",
            "enable the kubelet feature gate KubeletPodResourcesGet (on by default from 1.34); "
            "List still works",
        )
    return Check(
        "podresources.get",
        "warn",
        "Get is not implemented (kubelet < 1.27)",
        "upgrade the kubelet to 1.27 or later; List still works",
    )


def _dra_check(pods: list[Any], get_mode: str) -> Check:
    claims = sum(len(c.dynamic_resources) for p in pods for c in p.containers)
    if claims:
        return Check("podresources.dra", "ok", f"DRA data present: {claims} claims in List")
    if get_mode == "enabled":
        return Check(
            "podresources.dra", "ok", "no DRA claims on this node (dynamic_resources would be listed)"
        )
    return Check(
        "podresources.dra",
        "warn",
        "no DRA data, and dynamic_resources is likely off",
        "enable KubeletPodResourcesDynamicResources if pods use DRA ResourceClaims; "
        "device-plugin GPUs are unaffected",
    )


def checkpoint_check(path: str) -> Check:
    """Readable, parsable, checksum: read with the probe's own CheckpointSource."""
    source = CheckpointSource(path)
    entries, health = source.read()
    if health.state == "absent":
        return Check(
            "checkpoint",
            "warn",
            f"{path} does not exist",
            "no device plugin has allocated here yet, or mount /var/lib/kubelet/device-plugins read-only "
            "into the probe pod; without it pod UIDs come from the watcher alone",
        )
    if health.state == "error":
        return Check(
            "checkpoint",
            "fail",
            f"unreadable: {health.detail}",
            "run the probe as root (it reads a root-owned file)",
        )
    if health.state == "corrupt" and _oversized(path):
        return Check(
            "checkpoint",
            "fail",
            f"{path}: {health.detail}",
            "this is not the kubelet's checkpoint: point PERISCOPE_CHECKPOINT_PATH (or "
            "PERISCOPE_KUBELET_ROOT) at the kubelet's device-plugins/kubelet_internal_checkpoint",
        )
    if health.state == "corrupt":
        return Check(
            "checkpoint",
            "fail",
            f"corrupt: {health.detail}",
            "the kubelet rewrites it on the next allocation; if it stays corrupt, the kubelet version writes "
            "a format this probe does not know: report it with `periscope inspect checkpoint`",
        )
    detail = f"{health.detail}; {len(entries)} GPU entries"
    if "not verified" in health.detail:
        return Check(
            "checkpoint",
            "warn",
            detail,
            "the file has no checksum the probe can check; entries are used as they are",
        )
    return Check("checkpoint", "ok", detail)


def _oversized(path: str) -> bool:
    try:
        return os.stat(path).st_size > MAX_CHECKPOINT_BYTES
    except OSError:
        return False


async def diagnose(settings: ProbeSettings, nvml: Any | None = None) -> DoctorReport:
    """Every check, in the order the probe needs its sources. `nvml` replaces the module the
    settings name (tests); otherwise it is loaded the way the probe loads it."""
    checks = await podresources_checks(settings.podresources_socket)
    checks.append(checkpoint_check(settings.checkpoint_path))
    nv_checks, gpu_pids = nvml_checks(settings.nvml_backend, settings.proc_root, nvml)
    checks.extend(nv_checks)
    checks.extend(procfs_checks(settings.proc_root, gpu_pids))
    mig_on = any(c.name == "nvml.mig" and not c.detail.startswith("MIG off") for c in nv_checks)
    checks.extend(await asyncio.to_thread(dcgm_checks, settings, mig_on))  # a blocking HTTP GET
    inputs = {
        "podresources_socket": settings.podresources_socket,
        "checkpoint": settings.checkpoint_path,
        "proc_root": settings.proc_root,
        "nvml_backend": settings.nvml_backend,
        "dcgm_exporter_url": settings.dcgm_exporter_url,
    }
    return DoctorReport(tuple(checks), inputs)
