"""An XID error as users read it (/v1/xid): an xid-owner finding seen as the error it records, with the
pods that owned the device at that moment (not at query time)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from periscope.contract.gpu import HIDDEN_OWNERS
from periscope.contract.values import Json, Mig, OwnerRef, mig_json, owners_json, time_json
from periscope.core.model import Finding

# The fields of an xid-owner finding that an XID row leaves to /v1/findings: its identity and state as a
# finding, and those only the other kinds of finding fill.
NOT_AN_XID = frozenset({"kind", "key", "id", "active", "pod_uid", "namespace", "pod", "container",
                        "device_id", "since_ms", "avg_util_pct", "wasted_gpu_hours", "pids"})


class XidRow(BaseModel):
    at: str | None
    node: str
    gpu_uuid: str
    mig: Mig | None
    code: int
    owners: list[OwnerRef] = Field(description="owners at the moment of the error, not at query time")
    hidden_owners: int = Field(0, description=HIDDEN_OWNERS)
    message: str


def xid_json(f: Finding) -> Json:
    return {"at": time_json(f.at_ms), "node": f.node, "gpu_uuid": f.gpu_uuid, "mig": mig_json(f.mig),
            "code": f.xid_code, "owners": owners_json(f.owners), "hidden_owners": 0, "message": f.message}
