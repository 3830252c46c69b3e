"""What `periscope top` takes from the API's answers: the fields it shows, typed and made printable.

The API may be someone else's (a proxy, a wrong URL, a compromised pod), so an answer is data to check,
not to trust: each listing must be `{"items": [...]}` with the fields the table reads, of their types,
strings without escape sequences or control characters (periscope.cli.terminal) and of a sane length.
Anything else is `BadAnswer`, one line naming the endpoint and where in the answer it went wrong. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from periscope.cli.terminal import printable, shown
from periscope.cli.top_table import Snapshot

MAX_ITEMS = 100_000  # rows per listing: far more than a cluster has GPUs

Text = Annotated[str, StringConstraints(max_length=1024), AfterValidator(printable)]
Number = Annotated[float | None, Field(allow_inf_nan=False)]


class BadAnswer(ValueError):
    """An answer `top` cannot show; the message names the endpoint and the place in the answer."""


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Mig(_Item):
    uuid: Text | None = None
    profile: Text | None = None
    gi: int | None = None
    ci: int | None = None


class Gpu(_Item):
    gpu_uuid: Text
    node: Text
    index: int = -1
    util_pct: Number = None
    fb_used_mib: Number = None
    power_w: Number = None


class Pod(_Item):
    pod_uid: Text
    namespace: Text
    pod: Text
    container: Text
    node: Text
    device_id: Text
    gpu_uuid: Text
    mig: Mig | None = None
    util_pct: Number = None
    fb_used_mib: Number = None
    power_w: Number = None
    sm_active_pct: Number = None
    tensor_active_pct: Number = None
    dram_active_pct: Number = None


class Idle(_Item):
    pod_uid: Text
    device_id: Text
    wasted_gpu_hours: Number = None


T = TypeVar("T", bound=_Item)


class Listing(BaseModel, Generic[T]):
    model_config = ConfigDict(extra="ignore")
    items: Annotated[list[T], Field(max_length=MAX_ITEMS)]
    as_of: Text | None = None


def listing(path: str, doc: Any, item: type[T]) -> Listing[T]:
    """`doc` (a decoded JSON answer of `path`) as a listing of `item`, or BadAnswer."""
    try:
        return Listing[item].model_validate(doc)  # type: ignore[valid-type]
    except ValidationError as e:
        err = e.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        problem = shown(err["msg"], 100)
        raise BadAnswer(f"{path}: unexpected answer at {where or 'the top'}: {problem}") from None


def snapshot(answers: Mapping[str, Any], namespace: str | None) -> Snapshot:
    """A Snapshot from the decoded answers of /v1/gpus, /v1/pods and /v1/idle."""
    gpus = listing("/v1/gpus", answers["/v1/gpus"], Gpu)
    pods = listing("/v1/pods", answers["/v1/pods"], Pod)
    idle = listing("/v1/idle", answers["/v1/idle"], Idle)
    gpu_items = [g.model_dump() for g in gpus.items]
    pod_items = [p.model_dump() for p in pods.items]
    if namespace is not None:  # only the GPUs this namespace's pods hold
        held = {p["gpu_uuid"] for p in pod_items}
        gpu_items = [g for g in gpu_items if g["gpu_uuid"] in held]
    return Snapshot(gpu_items, pod_items, [i.model_dump() for i in idle.items], pods.as_of, namespace)
