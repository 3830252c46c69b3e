"""Bytes on the bus <-> domain objects: `encode(obj)` and `decode(topic, data)`.

Protobuf parses many arbitrary byte strings without complaint (unknown fields are kept), so decoding
also checks the fields every consumer relies on: the event header, the node of node-keyed events,
the identity of the subject. Anything that fails either step raises `DecodeError` and, in a consumer,
becomes a dead letter instead of a crash.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from periscope.bus import convert as cv
from periscope.bus.topics import DEADLETTER, Topic
from periscope.core import model as m
from periscope.v1 import attribution_pb2 as apb
from periscope.v1 import cluster_pb2 as cpb
from periscope.v1 import node_pb2 as npb


class DecodeError(ValueError):
    """The bytes are not a valid message of the topic's type."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record some consumer could not decode, with where it came from and why (periscope.deadletter.v1)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    error: str
    service: str
    at_ms: int
    # What the original was when `key`/`value` hold only a prefix (periscope.bus.deadletter).
    value_size: int = 0
    value_sha256: bytes = b""
    key_size: int = 0
    truncated: bool = False


def _dead_letter_to_pb(x: DeadLetter) -> apb.DeadLetter:
    return apb.DeadLetter(topic=x.topic, partition=x.partition, offset=x.offset, key=x.key or b"",
                          value=x.value, error=x.error, service=x.service, at_ms=x.at_ms,
                          value_size=x.value_size, value_sha256=x.value_sha256, key_size=x.key_size,
                          truncated=x.truncated)


def _dead_letter_from_pb(p: apb.DeadLetter) -> DeadLetter:
    # protobuf cannot tell an empty key from a missing one; both read back as None.
    return DeadLetter(topic=p.topic, partition=p.partition, offset=p.offset, key=p.key or None,
                      value=p.value, error=p.error, service=p.service, at_ms=p.at_ms,
                      value_size=p.value_size, value_sha256=p.value_sha256, key_size=p.key_size,
                      truncated=p.truncated)


# ---------------------------------------------------------------- validation of parsed messages


def _meta(p: Any, *, node: bool) -> None:
    if not p.HasField("meta"):
        raise DecodeError("missing meta")
    if not p.meta.source:
        raise DecodeError("missing meta.source")
    if node and not p.meta.node:
        raise DecodeError("missing meta.node")


def _require(p: Any, *fields: str) -> None:
    for name in fields:
        if not getattr(p, name):
            raise DecodeError(f"missing {name}")


def _check_node_event(p: Any) -> None:
    _meta(p, node=True)


def _check_xid(p: npb.XidEvent) -> None:
    _meta(p, node=True)
    _require(p, "gpu_uuid")


def _check_pod(p: cpb.PodEvent) -> None:
    _meta(p, node=False)  # "" = unscheduled pod
    if not p.HasField("pod") or not p.pod.uid:
        raise DecodeError("missing pod.uid")


def _check_node(p: cpb.NodeEvent) -> None:
    _meta(p, node=True)
    _require(p, "name")


def _check_policy(p: cpb.PolicyEvent) -> None:
    _meta(p, node=True)
    _require(p, "crd")


# ---------------------------------------------------------------- registry

_Decoder = tuple[type[Message], Callable[[Any], None] | None, Callable[[Any], Any]]

_DECODERS: dict[str, _Decoder] = {
    "AllocationSnapshot": (npb.AllocationSnapshot, _check_node_event, cv.allocation_snapshot_from_pb),
    "NodeTelemetry": (npb.NodeTelemetry, _check_node_event, cv.node_telemetry_from_pb),
    "XidEvent": (npb.XidEvent, _check_xid, cv.xid_event_from_pb),
    "DeviceInventory": (npb.DeviceInventory, _check_node_event, cv.device_inventory_from_pb),
    "PodEvent": (cpb.PodEvent, _check_pod, cv.pod_event_from_pb),
    "NodeEvent": (cpb.NodeEvent, _check_node, cv.node_event_from_pb),
    "PolicyEvent": (cpb.PolicyEvent, _check_policy, cv.policy_event_from_pb),
    "PodAttribution": (apb.PodAttribution, lambda p: _require(p, "pod_uid"), cv.pod_attribution_from_pb),
    "GpuState": (apb.GpuState, lambda p: _require(p, "gpu_uuid"), cv.gpu_state_from_pb),
    "Finding": (apb.Finding, lambda p: _require(p, "kind", "id"), cv.finding_from_pb),
    "DeadLetter": (apb.DeadLetter, lambda p: _require(p, "topic"), _dead_letter_from_pb),
}

_ENCODERS: dict[type, Callable[[Any], Message]] = {
    m.AllocationSnapshot: cv.allocation_snapshot_to_pb,
    m.NodeTelemetry: cv.node_telemetry_to_pb,
    m.XidEvent: cv.xid_event_to_pb,
    m.DeviceInventory: cv.device_inventory_to_pb,
    m.PodEvent: cv.pod_event_to_pb,
    m.NodeEvent: cv.node_event_to_pb,
    m.PolicyEvent: cv.policy_event_to_pb,
    m.PodAttribution: cv.pod_attribution_to_pb,
    m.GpuState: cv.gpu_state_to_pb,
    m.Finding: cv.finding_to_pb,
    DeadLetter: _dead_letter_to_pb,
}


def to_message(obj: object) -> Message:
    """The protobuf message for a domain object (TypeError for a type that has no bus schema)."""
    fn = _ENCODERS.get(type(obj))
    if fn is None:
        raise TypeError(f"no bus encoding for {type(obj).__name__}")
    return fn(obj)


def encode(obj: object) -> bytes:
    """Serialize an event/output dataclass (or a DeadLetter). Deterministic: maps are written sorted."""
    return to_message(obj).SerializeToString(deterministic=True)


def _parse(topic: Topic, data: bytes) -> tuple[Any, Callable[[Any], Any]]:
    """Parse and check `data` as the message type of `topic`; return it and its converter."""
    try:
        cls, check, convert = _DECODERS[topic.message]
    except KeyError:
        raise DecodeError(f"topic {topic.name} has no known message type {topic.message!r}") from None
    msg = cls()
    try:
        msg.ParseFromString(data)
    except Exception as e:  # google.protobuf.message.DecodeError, and upb's RuntimeError on deep nesting
        raise DecodeError(f"not a {topic.message}: {e or type(e).__name__}") from e
    if check is not None:
        try:
            check(msg)
        except DecodeError as e:
            raise DecodeError(f"invalid {topic.message}: {e}") from None
    return msg, convert


def decode(topic: Topic, data: bytes) -> Any:
    """Parse `data` as the message type of `topic` and convert it to the domain object."""
    msg, convert = _parse(topic, data)
    try:
        return convert(msg)
    except ValueError as e:
        raise DecodeError(f"invalid {topic.message}: {e}") from e


def decode_meta(topic: Topic, data: bytes) -> m.Meta:
    """Parse and check `data` as `decode` does, but convert only the event header (for a reader that
    converts the rest later, when it needs it). Raises DecodeError like `decode`."""
    msg, _ = _parse(topic, data)  # every node input has an EventMeta `meta`
    if not msg.HasField("meta"):
        raise DecodeError(f"invalid {topic.message}: missing meta")
    return cv.meta_from_pb(msg.meta)


def encode_dead_letter(letter: DeadLetter) -> bytes:
    return encode(letter)


def decode_dead_letter(data: bytes) -> DeadLetter:
    result: DeadLetter = decode(DEADLETTER, data)
    return result

