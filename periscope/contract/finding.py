"""A finding as users read it: /v1/findings rows and `periscope replay` items."""

from __future__ import annotations

from pydantic import BaseModel, Field

from periscope.contract.gpu import HIDDEN_OWNERS
from periscope.contract.values import Json, Mig, OwnerRef, mig_json, num, owners_json, text, time_json
from periscope.core.model import FINDING_KINDS, Finding


class FindingRow(BaseModel):
    id: str = Field(description="stable per subject: a finding is updated in place, cleared with "
                                "active false")
    kind: str = Field(description=" | ".join(FINDING_KINDS))
    key: str = Field(description="pod UID or GPU UUID (a node's name for source-health)")
    node: str
    at: str | None
    active: bool
    gpu_uuid: str | None
    mig: Mig | None
    pod_uid: str | None
    namespace: str | None
    pod: str | None
    container: str | None
    device_id: str | None
    xid_code: int | None
    owners: list[OwnerRef] = Field(description="xid-owner: the owners at the error; ambiguous-join: the "
                                               "candidate UIDs")
    hidden_owners: int = Field(0, description=HIDDEN_OWNERS)
    message: str
    since: str | None
    avg_util_pct: float | None
    wasted_gpu_hours: float | None
    pids: list[int] = Field(description="unattributed-usage: the processes on a device their pod does "
                                        "not hold")


def finding_json(f: Finding) -> Json:
    return {
        "id": f.id, "kind": f.kind, "key": f.key, "node": f.node, "at": time_json(f.at_ms),
        "active": f.active,
        "gpu_uuid": text(f.gpu_uuid), "mig": mig_json(f.mig), "pod_uid": text(f.pod_uid),
        "namespace": text(f.namespace), "pod": text(f.pod), "container": text(f.container),
        "device_id": text(f.device_id), "xid_code": f.xid_code or None, "owners": owners_json(f.owners),
        "hidden_owners": 0, "message": f.message, "since": time_json(f.since_ms),
        "avg_util_pct": num(f.avg_util_pct), "wasted_gpu_hours": num(f.wasted_gpu_hours),
        "pids": list(f.pids),
    }
