"""GET /v1/owners: who owned which GPU at an instant, answered by replaying the input topics.

The materialized view only holds the present; this endpoint rebuilds the allocation state as of `at`
with the replay code (the same core the joiner runs), so it answers for any time the topics still hold.
It reads the broker per request, never committing, so concurrent requests are limited.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from periscope.bus.clients import Kafka
from periscope.replay.owners import owners_at
from periscope.replay.reader import ReadError
from periscope.wirejson import parse_time_ms
from services.api import access, schemas
from services.api.access import Scope
from services.api.auth import caller, widen
from services.api.queries import ApiError, only

_CONCURRENT = 2


class OwnerItem(BaseModel):
    node: str
    gpu_uuid: str | None
    device_id: str
    mig: schemas.Mig | None
    pod_uid: str | None
    namespace: str
    pod: str
    container: str


class Owners(BaseModel):
    at: str
    items: list[OwnerItem]
    hidden_owners: int = Field(
        0, description="owners in namespaces the caller may not see, left out (namespace-scoped callers only)"
    )


def router(kafka: Kafka) -> APIRouter:
    r = APIRouter(tags=["replay"])
    slots = asyncio.Semaphore(_CONCURRENT)

    @r.get(
        "/v1/owners",
        responses={200: {"model": Owners}, 400: {"model": schemas.Error}, 503: {"model": schemas.Error}},
        dependencies=[Depends(only("at", "gpu_uuid", "node"))],
    )
    async def owners(
        request: Request,
        at: str = Query(..., description="the instant (RFC 3339 UTC)"),
        gpu_uuid: str | None = Query(None, description="only this GPU (or MIG instance) UUID"),
        node: str | None = Query(None, description="only this node"),
        scope: Scope = Depends(caller),
    ) -> dict[str, Any]:
        """Who owned what at `at`: `{at, items: [{node, gpu_uuid, device_id, mig, pod_uid, namespace, pod,
        container}]}`, rebuilt from the input topics (the same answer as `periscope replay --at`)."""
        try:
            at_ms = parse_time_ms(at)
        except ValueError as e:
            raise ApiError(400, f"at: {e}") from None
        async with slots:
            try:
                out = await owners_at(kafka, at_ms, gpu_uuid=gpu_uuid, node=node)
            except ReadError as e:
                raise ApiError(503, str(e)) from None
        if scope.cluster:
            return out  # exactly `periscope replay --at`'s document
        items = out.get("items") or []
        scope = await widen(request, scope, {str(i.get("namespace") or "") for i in items})
        seen, hidden = access.owner_items(items, scope)
        return {**out, "items": seen, "hidden_owners": hidden}

    return r
