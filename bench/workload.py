"""The benchmarks' synthetic cluster: `periscope.devkit.workload`, the one generator that replay
measurements use too, under the names the benchmarks import.

A simulated node has `gpus` whole GPUs and one pod per GPU (exclusive allocation, seen by both the
PodResources API and the kubelet checkpoint); each pod runs `procs_per_gpu` processes on its GPU.
`cluster_events` and a `SyntheticNode` built without a spec give a static cluster: the same pods all
along, every GPU busy, no XIDs. Identifiers are derived from the node index, so any process can
regenerate the same cluster.
"""

from __future__ import annotations

from periscope.devkit.workload import (
    CONTAINER,
    EPOCH,
    FB_TOTAL_MIB,
    HEALTH,
    MODEL,
    NAMESPACE,
    RESOURCE,
    T0_MS,
    NodeShape,
    SyntheticNode,
    cluster_events,
    container_id,
    gpu_uuid,
    node_name,
    pod_name,
    pod_uid,
)

__all__ = ["CONTAINER", "EPOCH", "FB_TOTAL_MIB", "HEALTH", "MODEL", "NAMESPACE", "RESOURCE", "T0_MS",
           "NodeShape", "SyntheticNode", "cluster_events", "container_id", "gpu_uuid", "node_name",
           "pod_name", "pod_uid"]
