"""What a MIG instance is, from NVML's own profile tables: placement, GI profile ID and the profile name.

A MIG device's GPU instance (nvmlDeviceGetGpuInstanceById, then nvmlGpuInstanceGetInfo) gives its GI
profile ID and placement; the profile's name is NVML's (the `name` of nvmlGpuInstanceProfileInfo_v2_t,
e.g. "MIG 1g.10gb", "MIG 1g.23gb+me", "MIG 2g.47gb-me", "MIG 1g.23gb+me.all", "MIG 1g.23gb+gfx"), never
rebuilt from memory sizes. A compute instance smaller than its GPU instance (a split GPU instance) is
named by its compute-instance profile instead ("MIG 1c.3g.20gb"). Lookups:
- GI profile by ID: nvmlDeviceGetGpuInstanceProfileInfoById (newer drivers), else each
  NVML_GPU_INSTANCE_PROFILE_* index through nvmlDeviceGetGpuInstanceProfileInfo (v2: with the name);
- CI: nvmlGpuInstanceGetComputeInstanceById + nvmlComputeInstanceGetInfo for its profile ID, then each
  NVML_COMPUTE_INSTANCE_PROFILE_* index through nvmlGpuInstanceGetComputeInstanceProfileInfo.
NVML's reference marks nvmlDeviceGetGpuInstanceById "Requires privileged user": an unprivileged probe
without the MIG monitor capability gets NoPermission, and then knows no placement (DRA MIG device names
cannot be resolved); `Placement.denied` says so and the probe reports it as its `mig` health.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PRIVILEGE_FIX = (
    "give the probe the MIG monitor capability (env NVIDIA_MIG_MONITOR_DEVICES=all with capability "
    "SYS_ADMIN, deploy/components/mig-monitor) or run it privileged"
)


@dataclass(frozen=True, slots=True)
class Placement:
    profile: str = ""  # NVML's profile name without its "MIG " prefix; "" when NVML gave none
    profile_id: int | None = None  # GI profile ID (what NVIDIA DRA MIG device names carry)
    start: int | None = None
    size: int | None = None
    denied: str = ""  # why the GPU instance could not be read (NoPermission), "" otherwise


def profile_name(raw: Any) -> str:
    """NVML's profile name as MIG profiles are written elsewhere: `MIG 1g.10gb` -> `1g.10gb`."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")
    text = text.strip().rstrip("\x00").strip()
    return text[4:].strip() if text.startswith("MIG ") else text


class MigProfiles:
    """Profile lookups over one pynvml module, cached per GPU and profile ID (tables never change
    while a GPU keeps its MIG mode)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._gi: dict[tuple[str, int], tuple[str, int]] = {}
        # keyed by the GPU instance's profile too: a GI ID can come back with another profile
        self._ci: dict[tuple[str, int, int, int], tuple[str, int]] = {}

    def _is(self, e: BaseException, *names: str) -> bool:
        return any(isinstance(e, getattr(self.nvml, f"NVMLError_{n}", ())) for n in names)

    def placement(self, gpu_uuid: str, handle: Any, gi: int, ci: int) -> Placement:
        nv = self.nvml
        try:
            gi_handle = nv.nvmlDeviceGetGpuInstanceById(handle, gi)
            info = nv.nvmlGpuInstanceGetInfo(gi_handle)
        except nv.NVMLError as e:
            if self._is(e, "NoPermission"):
                return Placement(denied=f"nvmlDeviceGetGpuInstanceById: {e} (requires privileged user)")
            if self._is(e, "GpuIsLost"):
                raise
            return Placement()
        profile_id = int(info.profileId)
        gi_name, gi_slices = self._gi_profile(gpu_uuid, handle, profile_id)
        name = gi_name
        ci_name, ci_slices = self._ci_profile(gpu_uuid, gi, profile_id, gi_handle, ci)
        if ci_name and 0 < ci_slices < gi_slices:  # a split GPU instance: the CI is the device
            name = ci_name
        return Placement(name, profile_id, int(info.placement.start), int(info.placement.size))

    def _gi_profile(self, gpu_uuid: str, handle: Any, profile_id: int) -> tuple[str, int]:
        key = (gpu_uuid, profile_id)
        if key not in self._gi:
            self._gi[key] = self._find_gi(handle, profile_id)
        return self._gi[key]

    def _find_gi(self, handle: Any, profile_id: int) -> tuple[str, int]:
        nv = self.nvml
        try:
            p = nv.nvmlDeviceGetGpuInstanceProfileInfoById(handle, profile_id)
            return profile_name(p.name), int(p.sliceCount)
        except nv.NVMLError as e:
            if not self._is(e, "FunctionNotFound", "NotSupported", "InvalidArgument"):
                raise
        for index in range(int(nv.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            try:
                p = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
            except nv.NVMLError as e:
                if self._is(e, "FunctionNotFound"):
                    return "", 0  # a driver without v2 profile info: no names from NVML
                continue  # NotSupported / InvalidArgument: no such profile on this GPU
            if int(p.id) == profile_id:
                return profile_name(p.name), int(p.sliceCount)
        return "", 0

    def _ci_profile(
        self, gpu_uuid: str, gi: int, gi_profile: int, gi_handle: Any, ci: int
    ) -> tuple[str, int]:
        nv = self.nvml
        try:
            ci_info = nv.nvmlComputeInstanceGetInfo(nv.nvmlGpuInstanceGetComputeInstanceById(gi_handle, ci))
        except nv.NVMLError as e:
            if self._is(e, "GpuIsLost"):
                raise
            return "", 0
        profile_id = int(ci_info.profileId)
        key = (gpu_uuid, gi, gi_profile, profile_id)
        if key in self._ci:
            return self._ci[key]
        found = "", 0
        for index in range(int(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            try:
                p = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi_handle, index, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except nv.NVMLError as e:
                if self._is(e, "FunctionNotFound"):
                    break
                continue
            if int(p.id) == profile_id:
                found = profile_name(p.name), int(p.sliceCount)
                break
        self._ci[key] = found
        return found
