"""The MPS control daemon's processes are infrastructure, never GPU consumers.

With the NVIDIA device plugin's `sharing.mps`, one control-daemon pod per node starts
`nvidia-cuda-mps-server`, which the driver lists as a compute process of every GPU it serves while
the real work belongs to the client pods. The probe drops the server by its process name; this is
the second check for when the name could not be read: the process's pod is the daemon's pod.
"""

from __future__ import annotations

import re
from dataclasses import replace

from periscope.core.model import DeviceSample, PodInfo
from periscope.core.pods import PodRegistry

# The device plugin's DaemonSet is `<prefix>-mps-control-daemon` (the GPU operator:
# `nvidia-device-plugin-mps-control-daemon`; the Helm chart: `<release>-nvidia-device-plugin-mps-...`).
MPS_DAEMON_SUFFIX = "mps-control-daemon"
# A DaemonSet's pods are named `<daemonset>-<5 random characters>`.
_DAEMON_POD = re.compile(r"mps-control-daemon-[a-z0-9]{5}$")


def is_mps_daemon(info: PodInfo) -> bool:
    if info.owner_kind == "DaemonSet" and info.owner_name.endswith(MPS_DAEMON_SUFFIX):
        return True
    return _DAEMON_POD.search(info.name) is not None


def mps_daemon_uids(pods: PodRegistry) -> frozenset[str]:
    """UIDs of the MPS control-daemon pods; recomputed only when the registry changed (it is asked
    on every sample)."""
    memo = pods.memo.get("mps-daemons")
    if memo is not None and memo[0] == pods.version:
        uids: frozenset[str] = memo[1]
        return uids
    uids = frozenset(uid for uid, rec in pods.pods.items() if is_mps_daemon(rec.info))
    pods.memo["mps-daemons"] = (pods.version, uids)
    return uids


def without_mps_daemons(devices: tuple[DeviceSample, ...], pods: PodRegistry) -> tuple[DeviceSample, ...]:
    """The samples with every process of an MPS control-daemon pod left out."""
    daemon_uids = mps_daemon_uids(pods)
    if not daemon_uids:
        return devices
    out = []
    for d in devices:
        kept = tuple(p for p in d.processes if p.pod_uid not in daemon_uids)
        out.append(d if len(kept) == len(d.processes) else replace(d, processes=kept))
    return tuple(out)
