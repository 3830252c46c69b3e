"""The topic registry: names, keys and roles of every Periscope topic (ARCHITECTURE.md).

Partition counts are a deployment setting (periscope.bus.admin): every node-keyed input shares one
count, so a node's records of all inputs land on the same-numbered partitions (the joiner's
co-partitioning); topics with `partitions` set keep that count whatever the setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["input", "output", "deadletter"]


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    key: str  # what the record key holds
    message: str  # protobuf message type in periscope.v1
    role: Role = "input"
    partitions: int | None = None  # fixed count; None: the deployment's partition setting


ALLOCATIONS = Topic("periscope.node.allocations.v1", "node", "AllocationSnapshot")
TELEMETRY = Topic("periscope.node.telemetry.v1", "node", "NodeTelemetry")
XID = Topic("periscope.node.xid.v1", "node", "XidEvent")
INVENTORY = Topic("periscope.node.inventory.v1", "node", "DeviceInventory")
PODS = Topic("periscope.cluster.pods.v1", "node", "PodEvent")
NODES = Topic("periscope.cluster.nodes.v1", "node", "NodeEvent")
POLICY = Topic("periscope.cluster.policy.v1", "cluster", "PolicyEvent", partitions=1)
ATTRIBUTION = Topic("periscope.attribution.v1", "pod UID", "PodAttribution", "output")
GPUS = Topic("periscope.gpus.v1", "GPU UUID", "GpuState", "output")
FINDINGS = Topic("periscope.findings.v1", "pod UID or GPU UUID", "Finding", "output")
DEADLETTER = Topic("periscope.deadletter.v1", "original key", "DeadLetter", "deadletter", partitions=1)

# Node-keyed inputs the joiner consumes; all co-partitioned (same partition count, key = node).
NODE_INPUTS: tuple[Topic, ...] = (ALLOCATIONS, TELEMETRY, XID, INVENTORY, PODS, NODES)
OUTPUTS: tuple[Topic, ...] = (ATTRIBUTION, GPUS, FINDINGS)
ALL: tuple[Topic, ...] = (*NODE_INPUTS, POLICY, *OUTPUTS, DEADLETTER)
BY_NAME: dict[str, Topic] = {t.name: t for t in ALL}
DEFAULT_PARTITIONS = 4
