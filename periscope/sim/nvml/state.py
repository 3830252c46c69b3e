"""The fake NVML's state file: the simulator writes it, every `FakePynvml` over it reads it.

State (one file per simulated node; every key but `gpus[].uuid` optional):

    {"driver_version": "550.54.15", "cuda_driver_version": 12040,
     "gpus": [{"uuid": "GPU-...", "name": "NVIDIA A100-SXM4-80GB", "minor": 0,
               "pci_bus_id": "00000000:07:00.0", "memory_total_mib": 81920, "memory_used_mib": 512,
               "util_pct": 40, "mem_util_pct": 10, "power_w": 210.5, "temp_c": 51,
               "lost": false,                      # true: metric calls raise NVMLError_GpuIsLost
               "fail": {"nvmlDeviceGetPowerUsage": "NotSupported"},   # injected errors by call
               "processes": [{"pid": 4242, "used_mib": 500, "sm_util": 35, "mem_util": 8,
                              "name": "python3"}],     # name: what nvmlSystemGetProcessName answers
               "graphics_processes": [],           # listed by nvmlDeviceGetGraphicsRunningProcesses
               "mps": {"server_pid": 77, "server_used_mib": 30, "utilization": "clients"},
                       # MPS on: `processes` are the clients, listed only by the MPS call; the compute
                       # list holds the server alone; compute mode EXCLUSIVE_PROCESS. `utilization`:
                       # clients (samples per client) | server (one sample, the server's PID) | none
                       # (NotSupported)
               "mig_capable": true,                # MIG mode [0, 0]; without it: NotSupported
               "mig": [{"uuid": "MIG-...", "profile": "1g.10gb", "gi": 9, "ci": 0,
                        "profile_id": 19, "placement_start": 0, "placement_size": 1,
                        "memory_total_mib": 9856, "memory_used_mib": 100,
                        "processes": [{"pid": 4343, "used_mib": 100}]}],    # "mig" set: enabled
               "mig_list_needs_privilege": false}],  # true: the whole-GPU list on MIG: NoPermission
     "xids": [{"seq": 1, "gpu": "GPU-...", "code": 79, "gi": null, "ci": null}]}

XIDs: an event set delivers, once, each XID of a registered GPU whose `seq` is above the highest
`seq` present when the set was created, as NVML delivers only events that happen after registration.
`add_xid(state, gpu_uuid, code)` appends one with the next `seq`. Per-process utilization is sampled
at call time: every process with `sm_util` yields one sample stamped with the current time in µs.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_nvml_state(path: str | Path, state: Mapping[str, Any]) -> None:
    """Write the state so that readers never see a partial file (temp file + rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".nvml-", dir=target.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    os.replace(tmp, target)


def read_nvml_state(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        data: dict[str, Any] = json.load(f)
    return data


def add_xid(
    state: dict[str, Any], gpu_uuid: str, code: int, gi: int | None = None, ci: int | None = None
) -> dict[str, Any]:
    xids = state.setdefault("xids", [])
    seq = max((int(x.get("seq", 0)) for x in xids), default=0) + 1
    xids.append({"seq": seq, "gpu": gpu_uuid, "code": code, "gi": gi, "ci": ci})
    return state
