"""The query endpoints: /v1/pods, /v1/pods/{pod_uid}, /v1/gpus, /v1/idle, /v1/xid, /v1/findings.

Handlers are `async def` on purpose: they run on the event loop, between the consumer's batches, so a
response never sees a half-applied record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args

from fastapi import APIRouter, Depends, Query, Request

from periscope.core.duration import format_duration_ms
from periscope.core.model import FINDING_KINDS
from periscope.wirejson import num
from services.api import access, idle, schemas
from services.api.access import Scope
from services.api.auth import caller
from services.api.errors import ApiError
from services.api.paging import BadToken, decode_token, encode_token, page
from services.api.params import duration_ms, instant_or_ago_ms
from services.api.render import (
    Json,
    finding_json,
    gpu_row,
    pod_detail,
    rfc3339,
    window_json,
    xid_row,
)
from services.api.view import GpuKey, RowKey, View, XidKey

FindingKind = Literal["idle", "xid-owner", "unattributed-usage", "ambiguous-join", "source-health"]
assert get_args(FindingKind) == FINDING_KINDS  # an unknown kind is a 400, so the two must agree

MAX_LIMIT = 100_000
_ROW_SHAPE = (str, str, str, str, str, int)
_GPU_SHAPE = (str, int, str)
_XID_SHAPE = (int, str, str, str)
_FINDING_SHAPE = (int, str)


def only(*allowed: str) -> Callable[[Request], None]:
    """Reject query parameters the endpoint does not know, so a typo is not silently an unfiltered query."""
    known = {*allowed}

    def check(request: Request) -> None:
        unknown = sorted(k for k in request.query_params if k not in known)
        if unknown:
            hint = ", ".join(sorted(known)) or "none"
            raise ApiError(400, f"unknown query parameter {unknown[0]!r} (accepted: {hint})")

    return check


def _after(kind: str, token: str | None, shape: tuple[type, ...]) -> Any:
    if token is None:
        return None
    try:
        return decode_token(kind, token, shape)
    except BadToken as e:
        raise ApiError(400, str(e)) from None


def _listing(
    view: View, kind: str, items: list[Json], next_key: tuple[Any, ...] | None, **extra: Any
) -> Json:
    return {
        "items": items,
        "as_of": rfc3339(view.as_of_ms),
        "continue": None if next_key is None else encode_token(kind, next_key),
        **extra,
    }


_LIMIT = Query(None, ge=1, le=MAX_LIMIT, description="page size; all rows when absent")
_CONTINUE = Query(None, alias="continue", description="token from the previous page")
_NODE = Query(None, description="only this node")
_NS = Query(None, description="only this namespace")
_PAGED = ("limit", "continue")
_CALLER = Depends(caller)


def router(view: View) -> APIRouter:
    r = APIRouter(tags=["attribution"])
    errors: dict[int | str, dict[str, Any]] = {400: {"model": schemas.Error}}

    @r.get(
        "/v1/pods",
        responses={200: {"model": schemas.PodList}, **errors},
        dependencies=[Depends(only("active", "namespace", "node", *_PAGED))],
    )
    async def list_pods(
        active: bool | None = Query(None, description="only rows whose allocation is (not) current"),
        namespace: str | None = _NS,
        node: str | None = _NODE,
        limit: int | None = _LIMIT,
        cont: str | None = _CONTINUE,
        scope: Scope = _CALLER,
    ) -> Json:
        """One row per pod x container x device, sorted by namespace, pod, pod_uid, container, device_id."""
        after = _after("pods", cont, _ROW_SHAPE)

        def select(k: RowKey) -> Json | None:
            if active is not None and view.row(k)[1].active != active:
                return None
            return view.row_json(k)

        items, nxt = page(access.row_keys(view.row_keys(node, namespace), scope), after, limit, select)
        return _listing(view, "pods", items, nxt)

    @r.get(
        "/v1/pods/{pod_uid}",
        responses={200: {"model": schemas.PodDetail}, 404: {"model": schemas.Error}},
        dependencies=[Depends(only())],
    )
    async def get_pod(pod_uid: str, scope: Scope = _CALLER) -> Json:
        """A pod's identity, lifecycle and every row it holds or held."""
        pod = view.pods.get(pod_uid)
        # Another namespace's pod is as unknown as a missing one: its existence is not revealed.
        if pod is None or not scope.sees(pod.namespace):
            raise ApiError(404, f"unknown pod UID {pod_uid!r}")
        rows = [
            {**view.row_json(k), "windows": [window_json(w) for w in view.windows(k)]}
            for k in view.pod_row_keys(pod_uid)
        ]
        return pod_detail(pod, rows)

    @r.get(
        "/v1/gpus",
        responses={200: {"model": schemas.GpuList}, **errors},
        dependencies=[Depends(only("namespace", "node", *_PAGED))],
    )
    async def list_gpus(
        namespace: str | None = Query(None, description="only GPUs with an owner in this namespace"),
        node: str | None = _NODE,
        limit: int | None = _LIMIT,
        cont: str | None = _CONTINUE,
        scope: Scope = _CALLER,
    ) -> Json:
        """One row per physical GPU, sorted by node, index, gpu_uuid."""
        after = _after("gpus", cont, _GPU_SHAPE)

        def select(k: GpuKey) -> Json | None:
            g = view.gpus[k[2]]
            if namespace is not None and not (
                scope.sees(namespace)
                and any(
                    o.namespace == namespace
                    for o in (*g.owners, *(o for m in g.mig_devices for o in m.owners))
                )
            ):
                return None
            return access.gpu_row(gpu_row(g), scope)

        items, nxt = page(view.gpu_keys(node), after, limit, select)
        return _listing(view, "gpus", items, nxt)

    @r.get(
        "/v1/gpus/{gpu_uuid}",
        responses={200: {"model": schemas.GpuRow}, 404: {"model": schemas.Error}},
        dependencies=[Depends(only())],
    )
    async def get_gpu(gpu_uuid: str, scope: Scope = _CALLER) -> Json:
        g = view.gpus.get(gpu_uuid)
        if g is None:
            raise ApiError(404, f"unknown GPU UUID {gpu_uuid!r}")
        return access.gpu_row(gpu_row(g), scope)

    @r.get(
        "/v1/idle",
        responses={200: {"model": schemas.IdleList}, **errors},
        dependencies=[Depends(only("threshold_pct", "window", "namespace", "node", *_PAGED))],
    )
    async def list_idle(
        threshold_pct: float | None = Query(
            None,
            ge=0,
            le=100,
            allow_inf_nan=False,
            description=f"idle below this average util (default "
            f"{idle.DEFAULT_THRESHOLD_PCT:g} when window is given)",
        ),
        window: str | None = Query(
            None,
            description="averaging window such as 10m (default "
            f"{format_duration_ms(idle.DEFAULT_WINDOW_MS)} when threshold_pct is given)",
        ),
        namespace: str | None = _NS,
        node: str | None = _NODE,
        limit: int | None = _LIMIT,
        cont: str | None = _CONTINUE,
        scope: Scope = _CALLER,
    ) -> Json:
        """Allocated-but-idle rows. Without parameters: the joiner's own idle flags. With threshold_pct
        and/or window: recomputed from each row's window stats."""
        after = _after("pods", cont, _ROW_SHAPE)
        recompute = threshold_pct is not None or window is not None
        th = idle.DEFAULT_THRESHOLD_PCT if threshold_pct is None else threshold_pct
        win_ms = idle.DEFAULT_WINDOW_MS if window is None else duration_ms("window", window)

        def select(k: RowKey) -> Json | None:
            pod, row = view.row(k)
            v = (
                idle.recompute(pod, row, view.window_stats(k), th, win_ms)
                if recompute
                else idle.joiner_verdict(row)
            )
            if v is None:
                return None
            return {
                **view.row_json(k),
                "idle": True,
                "idle_since": rfc3339(v.since_ms),
                "avg_util_pct": num(v.avg_util_pct),
                "wasted_gpu_hours": num(v.wasted_gpu_hours),
            }

        items, nxt = page(access.row_keys(view.row_keys(node, namespace), scope), after, limit, select)
        return _listing(
            view,
            "pods",
            items,
            nxt,
            threshold_pct=th if recompute else None,
            window=format_duration_ms(win_ms) if recompute else None,
        )

    @r.get(
        "/v1/xid",
        responses={200: {"model": schemas.XidList}, **errors},
        dependencies=[Depends(only("since", "node", "namespace", "gpu_uuid", *_PAGED))],
    )
    async def list_xid(
        since: str | None = Query(None, description="RFC 3339 time, or a duration back from as_of (1h)"),
        node: str | None = _NODE,
        namespace: str | None = Query(None, description="only errors that hit an owner in this namespace"),
        gpu_uuid: str | None = Query(None, description="only this GPU"),
        limit: int | None = _LIMIT,
        cont: str | None = _CONTINUE,
        scope: Scope = _CALLER,
    ) -> Json:
        """XID errors in time order, with the pods that owned the device when it happened."""
        after = _after("xid", cont, _XID_SHAPE)
        since_ms = None if since is None else instant_or_ago_ms("since", since, view.as_of_ms)

        def select(k: XidKey) -> Json | None:
            f = view.findings[k[3]]
            if since_ms is not None and f.at_ms < since_ms:
                return None
            if (node is not None and f.node != node) or (gpu_uuid is not None and f.gpu_uuid != gpu_uuid):
                return None
            if namespace is not None and not (
                scope.sees(namespace) and any(o.namespace == namespace for o in f.owners)
            ):
                return None
            return access.xid_row(xid_row(f), scope)

        items, nxt = page(view.xid_keys(), after, limit, select)
        return _listing(view, "xid", items, nxt)

    @r.get(
        "/v1/findings",
        responses={200: {"model": schemas.FindingList}, **errors},
        dependencies=[Depends(only("kind", "active", "node", "namespace", *_PAGED))],
    )
    async def list_findings(
        kind: FindingKind | None = Query(None, description=" | ".join(FINDING_KINDS)),
        active: bool | None = Query(None, description="only open (true) or cleared (false) findings"),
        node: str | None = _NODE,
        namespace: str | None = _NS,
        limit: int | None = _LIMIT,
        cont: str | None = _CONTINUE,
        scope: Scope = _CALLER,
    ) -> Json:
        """Everything the joiner flagged, in time order."""
        after = _after("findings", cont, _FINDING_SHAPE)
        keys = sorted((f.at_ms, f.id) for f in view.findings.values())

        def select(k: tuple[int, str]) -> Json | None:
            f = view.findings[k[1]]
            if (kind is not None and f.kind != kind) or (active is not None and f.active != active):
                return None
            if (node is not None and f.node != node) or (namespace is not None and f.namespace != namespace):
                return None
            return access.finding(finding_json(f), scope)

        items, nxt = page(keys, after, limit, select)
        return _listing(view, "findings", items, nxt)

    return r
