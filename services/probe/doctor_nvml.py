"""Doctor checks for NVML and /proc: driver, GPUs, MIG, MPS, per-process utilization, XID events,
host PID namespace, cgroup layout.

NVML is reached through the probe's own seam (`load_nvml` and `NvmlBackend`), so a fake module
(`fake:<state>`) is checked exactly as the probe would use it. Calls that an NVML build or device
does not offer are reported, never raised.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from periscope.core.cgroup import CgroupInfo, parse_cgroup
from services.probe.doctor import Check
from services.probe.mig_profiles import PRIVILEGE_FIX
from services.probe.nvml import NvmlBackend, NvmlInventory, NvmlUnavailable
from services.probe.xid import XidWatcher

_COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}
_MPS_PROCESSES = ("nvidia-cuda-mps-server", "nvidia-cuda-mps-control")
_SCAN_LIMIT = 4096  # /proc entries read when looking for a daemon or a pod process
# Processes only the host's PID namespace shows (comm, cut to 15 characters by the kernel).
_HOST_DAEMONS = frozenset({"kubelet", "kubelite", "k3s-agent", "k3s-server", "k0s", "containerd", "crio",
                           "dockerd", "cri-dockerd"})  # fmt: skip
_RUNTIME_FIX = (
    "run the probe with the NVIDIA runtime (runtimeClassName: nvidia or the toolkit's CDI spec) so "
    "libnvidia-ml.so.1 and /dev/nvidia* reach it; on the host, `nvidia-smi` must work"
)


def nvml_checks(backend: str, proc_root: str, nvml: Any | None = None) -> tuple[list[Check], set[int]]:
    """NVML checks, and the host PIDs NVML reports on any GPU (for the /proc checks)."""
    try:
        if nvml is None:
            from services.probe.service import load_nvml

            nvml = load_nvml(backend)
    except ImportError as e:
        return [Check("nvml.init", "fail", f"cannot import pynvml ({e})", "install nvidia-ml-py")], set()
    nv = NvmlBackend(nvml)
    try:
        nv.open()
    except NvmlUnavailable as e:
        return [Check("nvml.init", "fail", str(e), _RUNTIME_FIX)], set()
    try:
        try:
            inv = nv.refresh()
        except nvml.NVMLError as e:
            return [
                Check("nvml.init", "fail", f"nvmlInit answered, enumeration failed: {e}", _RUNTIME_FIX)
            ], set()
        version = f"driver {inv.driver_version or 'unknown'}, CUDA {inv.cuda_driver_version or 'unknown'}"
        checks = [Check("nvml.init", "ok", version), _gpus_check(inv)]
        if not inv.gpus:
            return checks, set()
        checks.append(_mig_check(inv))
        samples = nv.sample()
        pids = {p.pid for d in samples for p in d.processes}
        checks.append(_mps_check(nvml, inv, proc_root))
        checks.append(_process_util_check(nvml, inv))
        checks.append(_xid_check(nvml, nv))
        return checks, pids
    finally:
        nv.close()


def _gpus_check(inv: NvmlInventory) -> Check:
    if not inv.gpus:
        return Check(
            "nvml.gpus",
            "fail",
            "NVML sees no GPUs",
            "give the probe every GPU without requesting one: NVIDIA_VISIBLE_DEVICES=all and no "
            "nvidia.com/gpu limit",
        )
    models = Counter(g.model or "unknown model" for g in inv.gpus)
    detail = f"{len(inv.gpus)} GPUs: " + ", ".join(f"{n}x {m}" for m, n in sorted(models.items()))
    lost = [g for g in inv.gpus if g.lost]
    if lost or inv.errors:
        what = [f"GPU {g.index} {g.uuid} is lost" for g in lost] + list(inv.errors)
        return Check(
            "nvml.gpus",
            "warn",
            f"{detail}; " + "; ".join(what),
            "check the kernel log for XID 79/48 and reset the GPU or drain the node",
        )
    return Check("nvml.gpus", "ok", detail)


def _mig_check(inv: NvmlInventory) -> Check:
    on = [g for g in inv.gpus if g.mig_enabled]
    if not on:
        return Check("nvml.mig", "ok", "MIG off on every GPU")
    parts = []
    empty = []
    for g in on:
        profiles = ", ".join(m.profile or "?" for m in g.mig_devices)
        parts.append(
            f"GPU {g.index}: {len(g.mig_devices)} instances ({profiles})"
            if g.mig_devices
            else f"GPU {g.index}: 0 instances"
        )
        if not g.mig_devices:
            empty.append(g.index)
    detail = f"MIG on {len(on)}/{len(inv.gpus)} GPUs; " + "; ".join(parts)
    fixes = []
    if empty:
        fixes.append(
            "create MIG instances (nvidia.com/mig.config label with the MIG manager) or disable MIG on GPUs "
            + ", ".join(map(str, empty))
        )
    if inv.placement_denied:  # NVML: nvmlDeviceGetGpuInstanceById "Requires privileged user"
        detail += (f"; GPU-instance placement unreadable ({inv.placement_denied}): DRA MIG devices cannot be "
                   "resolved and profile names come from device names")  # fmt: skip
        fixes.append(PRIVILEGE_FIX)
    if fixes:
        return Check("nvml.mig", "warn", detail, "; ".join(fixes))
    return Check("nvml.mig", "ok", detail)


def _is(nvml: Any, e: BaseException, name: str) -> bool:
    cls = getattr(nvml, f"NVMLError_{name}", None)
    return cls is not None and isinstance(e, cls)


def _handle(nvml: Any, index: int) -> Any:
    return nvml.nvmlDeviceGetHandleByIndex(index)


def _mps_check(nvml: Any, inv: NvmlInventory, proc_root: str) -> Check:
    modes: dict[int, str] = {}
    get_mode = getattr(nvml, "nvmlDeviceGetComputeMode", None)
    for g in inv.gpus:
        if g.lost or get_mode is None:
            continue
        try:
            modes[g.index] = _COMPUTE_MODES.get(int(get_mode(_handle(nvml, g.index))), "unknown")
        except nvml.NVMLError:
            continue
    daemons = sorted(_find_processes(proc_root, _MPS_PROCESSES))
    exclusive = [i for i, m in sorted(modes.items()) if m == "EXCLUSIVE_PROCESS"]
    mode_text = (
        "compute mode " + ", ".join(f"GPU {i} {m}" for i, m in sorted(modes.items()))
        if modes
        else "compute mode not reported"
    )
    if daemons:
        seen = ", ".join(f"{name} (pid {pid})" for pid, name in daemons[:3])
        return Check("nvml.mps", "ok", f"MPS in use: {seen}; {mode_text}")
    if exclusive:
        return Check(
            "nvml.mps",
            "warn",
            f"GPUs {', '.join(map(str, exclusive))} are EXCLUSIVE_PROCESS but no MPS daemon is in "
            f"{proc_root}; {mode_text}",
            "if the device plugin shares these GPUs with MPS, check its mps-control-daemon pod "
            "and run the probe with hostPID: true; otherwise one process at a time can use each GPU",
        )
    return Check("nvml.mps", "ok", f"MPS not in use; {mode_text}")


def _process_util_check(nvml: Any, inv: NvmlInventory) -> Check:
    whole = [g for g in inv.gpus if not g.mig_enabled and not g.lost]
    if not whole:
        return Check("nvml.process_util", "ok", "not applicable: every GPU is in MIG mode or lost")
    supported, unsupported, failed = [], [], []
    for g in whole:
        try:
            nvml.nvmlDeviceGetProcessUtilization(_handle(nvml, g.index), 0)
            supported.append(g.index)
        except nvml.NVMLError as e:
            if _is(nvml, e, "NotFound") or getattr(e, "value", None) == 0:
                supported.append(g.index)  # no sample yet: the call itself works
            elif _is(nvml, e, "NotSupported") or _is(nvml, e, "FunctionNotFound"):
                unsupported.append(g.index)
            else:
                failed.append(f"GPU {g.index}: {e}")
    if unsupported or failed:
        bad = ", ".join(map(str, unsupported))
        detail = "; ".join(
            ([f"not supported on GPUs {bad}"] if unsupported else [])
            + failed
            + ([f"supported on GPUs {', '.join(map(str, supported))}"] if supported else [])
        )
        return Check(
            "nvml.process_util",
            "warn",
            detail,
            "shared GPUs there are split by process memory or equally (share_basis says which); "
            "a newer driver may report it",
        )
    return Check("nvml.process_util", "ok", f"supported on GPUs {', '.join(map(str, supported))}")


def _xid_check(nvml: Any, nv: NvmlBackend) -> Check:
    handles = nv.handles()
    watcher = XidWatcher(nvml, lambda _xid: None, wait_ms=20)
    try:
        watcher.start(handles)
    except nvml.NVMLError as e:
        return Check("nvml.xid", "warn", f"nvmlEventSetCreate: {e}", "XIDs will not be reported on this node")
    finally:
        watcher.stop()
    n = len(watcher.registered)
    if n == len(handles):
        return Check("nvml.xid", "ok", f"XID events registered on {n}/{len(handles)} GPUs")
    why = f" ({watcher.error})" if watcher.error else ""
    return Check(
        "nvml.xid",
        "warn",
        f"XID events registered on {n}/{len(handles)} GPUs{why}",
        "some virtual machines and vGPU guests do not deliver XID events; the others still do",
    )


# ---------------------------------------------------------------- /proc


def _pid_dirs(root: Path) -> Iterator[Path]:
    try:
        entries = os.scandir(root)
    except OSError:
        return
    with entries:
        for n, entry in enumerate(entries):
            if n >= _SCAN_LIMIT:
                return
            if entry.name.isdigit():
                yield Path(entry.path)


def _comm(pid_dir: Path) -> str:
    try:
        return (pid_dir / "comm").read_text().strip()
    except OSError:
        pass
    try:
        stat = (pid_dir / "stat").read_text()
        return stat[stat.index("(") + 1 : stat.rindex(")")]
    except (OSError, ValueError):
        return ""


def _find_processes(proc_root: str, names: Iterable[str]) -> set[tuple[int, str]]:
    # The kernel cuts comm to 15 characters ("nvidia-cuda-mps" for both MPS daemons).
    wanted = {w for n in names for w in (n, n[:15])}
    return {(int(d.name), comm) for d in _pid_dirs(Path(proc_root)) if (comm := _comm(d)) in wanted}


def _cgroup(pid_dir: Path) -> CgroupInfo | None:
    try:
        return parse_cgroup((pid_dir / "cgroup").read_text())
    except (OSError, ValueError):
        return None


def procfs_checks(proc_root: str, gpu_pids: set[int]) -> list[Check]:
    root = Path(proc_root)
    if not root.is_dir():
        return [
            Check(
                "procfs.hostpid",
                "fail",
                f"{proc_root} is not a directory",
                "run the probe with hostPID: true, or mount the host's /proc and set PERISCOPE_PROC_ROOT",
            )
        ]
    return [_hostpid_check(root, gpu_pids), _cgroup_check(root, gpu_pids)]


def _hostpid_check(root: Path, gpu_pids: set[int]) -> Check:
    fix = "run the probe pod with hostPID: true: NVML reports host PIDs"
    if gpu_pids:
        visible = {p for p in gpu_pids if (root / str(p)).is_dir()}
        detail = f"{len(visible)}/{len(gpu_pids)} GPU process PIDs visible in {root}"
        if not visible:
            return Check("procfs.hostpid", "fail", detail, fix)
        if len(visible) < len(gpu_pids):
            return Check("procfs.hostpid", "warn", detail, fix + " (or a process just ended: run again)")
        return Check("procfs.hostpid", "ok", detail)
    evidence = _host_evidence(root)
    if evidence:
        return Check("procfs.hostpid", "ok", f"{evidence} (no GPU process to cross-check)")
    return Check(
        "procfs.hostpid",
        "warn",
        f"no host-only process in {root}: neither the kubelet nor a container runtime, and PID 1 is not the "
        "host's init (every PID namespace has a PID 1)",
        fix,
    )


def _host_evidence(root: Path) -> str:
    """What in `root` only the host's PID namespace shows ("" when nothing does): the kubelet or a
    container runtime, or a PID 1 that is no container's (outside every pod, at the cgroup root or
    init.scope, or above our cgroup namespace, and not in our own cgroup)."""
    for d in _pid_dirs(root):
        comm = _comm(d)
        if comm in _HOST_DAEMONS:
            return f"host processes visible in {root}: {comm} (pid {d.name})"
    init = _cgroup(root / "1")
    if init is None or init.pod_uid is not None or "kubepods" in init.path:
        return ""
    at_root = init.path in ("/", "/init.scope") or "/.." in init.path
    try:
        ours = (root / "self" / "cgroup").read_text()
    except OSError:
        ours = None  # a host /proc mounted elsewhere has no "self" for us
    mine = ours is not None and init == _parse(ours)
    if ours is None and init.path == "/":
        return ""  # a container's own PID 1 in a private cgroup namespace reads "/" too
    if at_root and not mine:
        return f"host processes visible in {root}: PID 1 is the host's init (cgroup {init.path})"
    return ""


def _parse(text: str) -> CgroupInfo | None:
    try:
        return parse_cgroup(text)
    except ValueError:
        return None


def _runtime_text(runtime: str | None) -> str:
    return runtime if runtime and runtime != "unknown" else "runtime unknown"


def _cgroup_check(root: Path, gpu_pids: set[int]) -> Check:
    if gpu_pids:
        infos = [i for p in sorted(gpu_pids) if (i := _cgroup(root / str(p))) is not None]
        what = "GPU processes"
    else:
        infos = [i for d in _pid_dirs(root) if (i := _cgroup(d)) is not None and "kubepods" in i.path]
        what = "pod processes"
    if not infos:
        return Check(
            "procfs.cgroup",
            "warn",
            f"no {what} to check the cgroup layout against",
            "run again while a GPU pod runs",
        )
    mapped = [i for i in infos if i.pod_uid]
    versions = sorted({f"v{i.version}" for i in infos})
    # cgroupfs leaves containerd and cri-dockerd the same path: "runtime unknown" there, not a guess
    layouts = sorted({f"{_runtime_text(i.runtime)} ({i.driver or 'unknown'} driver)" for i in mapped})
    detail = f"cgroup {'/'.join(versions)}; {len(mapped)}/{len(infos)} {what} map to pods"
    if layouts:
        detail += "; " + ", ".join(layouts)
    if not mapped:
        sample = infos[0].path
        return Check(
            "procfs.cgroup",
            "warn",
            f"{detail}; e.g. {sample}",
            "processes outside pods are unattributed; if these are pod processes, report the layout "
            "(`periscope inspect cgroup /proc/<pid>/cgroup`)",
        )
    return Check("procfs.cgroup", "ok", detail)
