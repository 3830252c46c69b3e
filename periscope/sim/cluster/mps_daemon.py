"""The device plugin's MPS control daemon on a simulated MPS node: its pod and its server process.

A real node shared with `sharing.mps` runs one pod of the `nvidia-device-plugin-mps-control-daemon`
DaemonSet; inside it `nvidia-cuda-mps-control` starts `nvidia-cuda-mps-server`, which the driver then
lists as the compute process of every GPU it serves (the clients appear only in the MPS list). The pod
asks for no GPU resource. The simulator serves the pod from its apiserver, writes the server into the
node's /proc (in the pod's cgroup, named by `comm`) and into the fake NVML state of each MPS GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from periscope.sim.cluster.hardware import digest, gen_uuid
from periscope.sim.cluster.kube_objects import pod_document
from periscope.sim.cluster.model import ClusterModel

DAEMONSET = "nvidia-device-plugin-mps-control-daemon"
NAMESPACE = "gpu-operator"
CONTAINER = "mps-control-daemon-ctr"
SERVER_COMM = "nvidia-cuda-mps-server"
SERVER_USED_MIB = 30.0  # the server's own context on each GPU


@dataclass(frozen=True, slots=True)
class MpsDaemon:
    node: str
    uid: str
    name: str
    container_id: str
    server_pid: int


def mps_daemon(model: ClusterModel, node: str) -> MpsDaemon | None:
    """The node's MPS daemon, or None when none of its GPUs is shared with MPS."""
    if not any(g.sharing == "mps" for g in model.gpus[node]):
        return None
    seed = model.scenario.seed
    suffix = "".join("bcdfghjklmnpqrstvwxz2456789"[b % 27] for b in digest(seed, "mps-pod", node)[:5])
    return MpsDaemon(
        node=node,
        uid=gen_uuid(seed, "mps-daemon", node),
        name=f"{DAEMONSET}-{suffix}",
        container_id=digest(seed, "mps-container", node).hex(),
        server_pid=400 + sum(map(ord, node)) % 100,  # below the pods' PIDs, apart from host daemons
    )


def nvml_mps_state(d: MpsDaemon) -> dict[str, Any]:
    """The `mps` entry of an MPS GPU in the fake NVML state."""
    return {"server_pid": d.server_pid, "server_used_mib": SERVER_USED_MIB, "utilization": "clients"}


def mps_daemon_pod_object(d: MpsDaemon, created_ms: int, runtime: str) -> dict[str, Any]:
    image = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
    labels = {"app.kubernetes.io/name": DAEMONSET}
    return pod_document(
        NAMESPACE, d.name, d.uid, d.node, labels, ("DaemonSet", DAEMONSET),
        [(CONTAINER, image, {}, d.container_id)], "besteffort", runtime, created_ms,
    )
