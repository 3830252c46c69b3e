"""Who owned what at an instant (`periscope replay --at`, GET /v1/owners): one item per holding, from the
core's holdings (periscope.core.allocation.Holding) at that instant."""

from __future__ import annotations

from pydantic import BaseModel, Field

from periscope.contract.values import Json, Mig, mig_json, rfc3339, text
from periscope.core.allocation import Holding

# What an owners item leaves out of a holding: how the allocation was learnt (resource, sources), which
# time-slicing replica it is (the device ID says it), why a device ID names no GPU (a row's and a
# finding's business), and an ambiguous holder's candidate UIDs (the ambiguous-join finding lists them).
ITEM_LEAVES = frozenset({"resource", "sources", "candidates", "device.replica", "device.unresolved"})


class OwnerItem(BaseModel):
    node: str
    gpu_uuid: str | None = Field(description="null when the device ID names no known GPU")
    device_id: str
    mig: Mig | None
    pod_uid: str | None = Field(description="null when the holder could not be told apart by UID (ambiguous)")
    namespace: str | None
    pod: str | None
    container: str


class Owners(BaseModel):
    at: str
    items: list[OwnerItem]
    hidden_owners: int = Field(
        0, description="owners in namespaces the caller may not see, left out (namespace-scoped callers only)"
    )


def owner_item(node: str, h: Holding) -> Json:
    return {
        "node": node, "gpu_uuid": text(h.device.gpu_uuid), "device_id": h.device.device_id,
        "mig": mig_json(h.device.mig), "pod_uid": text(h.pod_uid), "namespace": text(h.namespace),
        "pod": text(h.pod), "container": h.container,
    }


def owners_document(at_ms: int, items: list[Json]) -> Json:
    return {"at": rfc3339(at_ms), "items": items}
