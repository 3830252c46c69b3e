"""FastAPI application over a View: query endpoints, /v1/policy, /metrics, /healthz, /readyz, / (web).

`create_app(view, status)` only wires routes; the consumer that fills the view is started by whoever
runs the app (services.api.server), so tests can serve a preloaded view. More routers (e.g. GET
/v1/owners from the replay tool) plug in through `extra_routers`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from periscope.contract.values import time_json
from periscope.core.idle import DEFAULT_RULE, IdleRule
from services.api import apidocs, queries, schemas, usage, webview
from services.api.auth import Gate, caller
from services.api.errors import ApiError
from services.api.findings_series import FindingsCollector
from services.api.headers import SecurityHeaders
from services.api.metrics import GpuSeries, PodSeries, ViewCollector
from services.api.status import ConsumerStatus
from services.api.strict import StrictRouter
from services.api.view import View

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


# Documented on every guarded route, so /docs (and a schema check) knows what access control answers.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": schemas.Error, "description": "no bearer token, or one the apiserver rejects"},
    429: {"model": schemas.Error, "description": "too many rejected tokens from this client, or too many "
          "access reviews for this user: try again after Retry-After seconds"},
    503: {"model": schemas.Error, "description": "access cannot be checked (apiserver unreachable)"},
}
CLUSTER_RESPONSES: dict[int | str, dict[str, Any]] = {
    **AUTH_RESPONSES,
    403: {"model": schemas.Error, "description": "the caller may not get this cluster-scoped URL"},
}


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x not in ("query", "path", "body")]
        where = ".".join(loc) or "request"
        parts.append(f"{where}: {err.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(
    view: View,
    status: ConsumerStatus | None = None,
    *,
    extra_routers: Sequence[APIRouter] = (),
    lifespan: Lifespan | None = None,
    gate: Gate | None = None,
    idle_rule: IdleRule = DEFAULT_RULE,
) -> FastAPI:
    """The HTTP API over `view`. With `status` None the view is static and always ready. With a
    `gate`, every route but /healthz, /readyz and the OpenAPI document needs a bearer token and
    answers within the caller's namespaces (services.api.auth)."""
    app = FastAPI(
        title="Periscope API",
        summary="Which pod is using this GPU right now, and what is it doing?",
        version="1",
        lifespan=lifespan,
        dependencies=[Depends(caller)],  # closed by default: a new route is checked too
        # FastAPI's pages load scripts from a CDN: /docs is served by services.api.apidocs instead,
        # and there is no /redoc or OAuth2 redirect page (no OAuth2 flow here).
        docs_url=None,
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
    )
    app.add_middleware(SecurityHeaders)
    app.state.view = view
    app.state.status = status
    app.state.gate = gate

    # The contract: bad input is 400 {"error": ...}, never FastAPI's 422 shape.
    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, _validation_message(exc))

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    app.include_router(queries.router(view, idle_rule), responses=AUTH_RESPONSES)
    app.include_router(usage.router(view), responses=AUTH_RESPONSES)
    app.include_router(webview.router())
    app.include_router(apidocs.router())
    for r in extra_routers:
        app.include_router(r, responses=AUTH_RESPONSES)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ViewCollector(view, status))
    registry.register(FindingsCollector(view))
    pod_series, gpu_series = PodSeries(view), GpuSeries(view)
    cluster = StrictRouter()

    @cluster.get(
        "/v1/policy",
        tags=["cluster"],
        responses={200: {"model": schemas.Policy}, 503: {"model": schemas.Error}, **CLUSTER_RESPONSES},
    )
    async def policy() -> Any:
        """GPU Operator intent (ClusterPolicy) against what is reconciled on the nodes."""
        try:
            from periscope.core.policy import policy_view
        except ImportError:
            raise ApiError(503, "policy view is not available in this build") from None
        nodes = [n for n in view.nodes.values() if not n.deleted]
        out = policy_view(view.policy, nodes).to_json()
        if isinstance(out, dict):
            out = {**out, "as_of": time_json(view.policy.meta.time_ms) if view.policy else None}
        return out

    @cluster.get(
        "/metrics",
        tags=["ops"],
        response_class=Response,
        responses=CLUSTER_RESPONSES,
    )
    async def metrics() -> Response:
        """Prometheus text, generated from the view at scrape time."""
        body = (pod_series.text() + gpu_series.text()).encode() + generate_latest(registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    app.include_router(cluster)

    @app.get("/healthz", tags=["ops"], response_model=schemas.Health)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["ops"],
        response_model=None,
        responses={200: {"model": schemas.Ready}, 503: {"model": schemas.Ready}},
    )
    async def readyz() -> JSONResponse:
        """200 once the view has caught up with the topics' end offsets seen at start and while it is fresh
        (a new attribution within API_STALE_AFTER, the broker reachable); 503 otherwise."""
        if status is None:
            return JSONResponse({"ready": True, "group_id": None, "lag": None, "error": None})
        serving = status.serving()
        body = {
            "ready": serving,
            "group_id": status.group_id,
            "lag": status.total_lag(),
            "error": status.error or None,
            "pending_partitions": len(status.pending),
            "data_age_s": round(status.data_age_s(), 3),
            "stale": status.is_stale(),
            # Records not believed (services.api.evidence): they do not make the view unready, but
            # someone wrote them, so they are said here and counted on /metrics.
            "refused": status.refused,
            "held_for_inventory": status.held,
            "last_refusal": status.last_refusal or None,
        }
        return JSONResponse(body, status_code=200 if serving else 503)

    return app
