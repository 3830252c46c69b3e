"""The fake NVML's MIG profile tables, derived from the instances in the state.

A MIG entry's `profile` is the device's profile as NVML names it, without the "MIG " prefix: a whole GPU
instance ("3g.40gb", Blackwell's "1g.23gb+me", "2g.47gb-me", "1g.23gb+me.all", "1g.23gb+gfx") or a compute
instance that splits one ("1c.3g.40gb"); `profile_id` is the GPU-instance profile ID. The GPU-instance
profile sits at the NVML_GPU_INSTANCE_PROFILE_* index its slices and suffix name (the `_REV1` profiles carry
the media extensions, `+me`; `_NO_ME` is `-me`, `_ALL_ME` `+me.all`, `_GFX` `+gfx`: go-nvlib's
NewMigProfile reads them so), or at `profile_index` when the entry gives one. Compute-instance profiles
are numbered by their NVML_COMPUTE_INSTANCE_PROFILE_* index and named `<c>c.<GI profile>` when they take
fewer slices than their GPU instance. Answers are ctypes-shaped: the v2 structs' fields, `name` as bytes.
"""

from __future__ import annotations

import re
from typing import Any

import pynvml

from periscope.sim.nvml.state import Gpu, Struct

_PROFILE = re.compile(r"^(?:(?P<c>\d+)c\.)?(?P<gi>(?P<g>\d+)g\.(?P<gb>\d+)gb(?P<suffix>[+-][a-z.]+)?)$")
_GI_INDEX = {  # (slices, suffix) -> NVML_GPU_INSTANCE_PROFILE_* index
    (1, ""): pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, (2, ""): pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    (3, ""): pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, (4, ""): pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    (6, ""): pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE, (7, ""): pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    (8, ""): pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE,
    (1, "+me"): pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
    (2, "+me"): pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1,
    (1, "-me"): pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME,
    (2, "-me"): pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME,
    (1, "+me.all"): pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME,
    (2, "+me.all"): pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME,
    (1, "+gfx"): pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX,
    (2, "+gfx"): pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX,
    (3, "+gfx"): pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX,
    (4, "+gfx"): pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX,
}  # fmt: skip
_CI_INDEX = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE, 7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}  # fmt: skip


def _parts(m: Gpu) -> re.Match[str]:
    found = _PROFILE.match(str(m.get("profile", "1g.10gb")))
    if found is None:
        raise ValueError(f"not a MIG profile: {m.get('profile')!r}")
    return found


def gi_slices(m: Gpu) -> int:
    return int(_parts(m).group("g"))


def ci_slices(m: Gpu) -> int:
    c = _parts(m).group("c")
    return int(c) if c else gi_slices(m)


def gi_profile_index(m: Gpu) -> int:
    if "profile_index" in m:
        return int(m["profile_index"])
    p = _parts(m)
    return int(_GI_INDEX.get((int(p.group("g")), p.group("suffix") or ""), -1))


def ci_profile_index(slices: int) -> int:
    return int(_CI_INDEX.get(slices, -1))


def gi_profile_info(m: Gpu, version: int) -> Struct:
    """nvmlDeviceGetGpuInstanceProfileInfo's answer (c_nvmlGpuInstanceProfileInfo_v2_t, or _t for v1)."""
    fields: dict[str, Any] = dict(
        id=int(m.get("profile_id", 0)), isP2pSupported=0, sliceCount=gi_slices(m), instanceCount=1,
        multiprocessorCount=0, copyEngineCount=0, decoderCount=0, encoderCount=0, jpegCount=0, ofaCount=0,
        memorySizeMB=int(float(m.get("memory_total_mib", 0))),
    )  # fmt: skip
    if version == 2:
        fields = {"version": pynvml.nvmlGpuInstanceProfileInfo_v2, **fields,
                  "name": f"MIG {_parts(m).group('gi')}".encode()}  # fmt: skip
    return Struct(**fields)


def ci_profile_info(m: Gpu, index: int, version: int) -> Struct | None:
    """nvmlGpuInstanceGetComputeInstanceProfileInfo's answer for the GPU instance of `m`, at a compute
    profile index (None: no such profile within that GPU instance)."""
    slices = next((s for s, i in _CI_INDEX.items() if i == index), 0)
    g = gi_slices(m)
    if not slices or slices > g:
        return None
    fields: dict[str, Any] = dict(
        id=index, sliceCount=slices, instanceCount=g // slices, multiprocessorCount=0,
        sharedCopyEngineCount=0, sharedDecoderCount=0, sharedEncoderCount=0, sharedJpegCount=0,
        sharedOfaCount=0,
    )  # fmt: skip
    if version == 2:
        name = ("" if slices == g else f"{slices}c.") + _parts(m).group("gi")
        fields = {"version": pynvml.nvmlComputeInstanceProfileInfo_v2, **fields,
                  "name": f"MIG {name}".encode()}  # fmt: skip
    return Struct(**fields)
