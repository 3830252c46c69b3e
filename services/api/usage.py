"""GET /v1/usage: GPU-hours per group over the API's recent view, as `periscope usage` prints them.

The view holds each row's closed windows, with their accounting, for the window retention
(PERISCOPE_API_WINDOW_RETENTION, 1h) of event time back from `as_of`; a period reaching further back
is a 400 naming the CLI, which replays the input topics for any period they still hold. A window
counts when its start lies in [from, to), as in the CLI; the window still open at each row is not in
the view yet. Groups are built by periscope.core.gpuhours, as the CLI's are, so both agree on the same
windows. The caller sees only rows of the namespaces it may list; the total is the sum of those groups.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from periscope.contract.values import Json, rfc3339
from periscope.core.duration import format_duration_ms
from periscope.core.gpuhours import GROUPINGS, Account, RowTally, Subject, check_grouping, document, group
from services.api import access, schemas
from services.api.access import Scope
from services.api.auth import caller
from services.api.errors import ApiError
from services.api.params import instant_or_ago_ms
from services.api.strict import StrictRouter
from services.api.view import RowKey, View
from services.api.windows import window

BY = " | ".join(GROUPINGS)


def _rows(view: View, keys: list[RowKey], from_ms: int, to_ms: int) -> list[tuple[Subject, Account]]:
    out = []
    for k in keys:
        stats = view.window_stats(k)
        if not stats or stats[-1][0] < from_ms or stats[0][0] >= to_ms:
            continue
        pod, row = view.row(k)
        tally = RowTally(from_ms, to_ms)
        tally.add_all(window(s) for s in stats if from_ms <= s[0] < to_ms)
        acct = tally.total()
        if not (acct.gpu_ms or acct.request_gpu_ms):
            continue
        gpu = view.gpus.get(row.gpu_uuid)
        subject = Subject(pod.pod_uid, pod.namespace, pod.pod, pod.node, row.gpu_uuid, pod.owner_kind,
                          pod.owner_name, gpu.model if gpu is not None else "")
        out.append((subject, acct))
    return out


def router(view: View) -> APIRouter:
    r = StrictRouter(tags=["accounting"])

    @r.get(
        "/v1/usage",
        responses={200: {"model": schemas.Usage}, 400: {"model": schemas.Error}},
    )
    async def usage(
        from_: str = Query(..., alias="from", description="start: RFC 3339 time, or a duration back from "
                           "as_of (30m); at most the window retention back"),
        to: str | None = Query(None, description="end (exclusive): RFC 3339 time or a duration back from "
                               "as_of; default as_of"),
        by: str = Query("namespace", description=BY),
        namespace: str | None = Query(None, description="only this namespace"),
        scope: Scope = Depends(caller),
    ) -> Json:
        """Allocated, used and idle GPU-hours, memory GiB-hours, energy and the request x hours baseline
        per group, for windows starting in [from, to) within the API's recent view."""
        now = view.as_of_ms
        try:
            by = check_grouping(by)
        except ValueError as e:
            raise ApiError(400, f"by: {e}") from None
        if by not in GROUPINGS:
            raise ApiError(400, f"by: {by!r}: pod labels are not in the API's view; "
                           "`periscope usage --by label:KEY` groups by them")
        from_ms = instant_or_ago_ms("from", from_, now)
        to_ms = now + 1 if to is None else instant_or_ago_ms("to", to, now)
        if from_ms >= to_ms:
            raise ApiError(400, f"from: {from_!r} is not before to")
        oldest = now - view.window_retention_ms
        if from_ms < oldest:
            keep = format_duration_ms(view.window_retention_ms)
            raise ApiError(400, f"from: {rfc3339(from_ms)} is before the API's view ({keep} back from "
                           f"{rfc3339(now)}); `periscope usage --from T --to T` reports any period the "
                           "input topics hold")
        keys = list(access.row_keys(view.row_keys(namespace=namespace), scope))
        doc = document(rfc3339(from_ms), rfc3339(to_ms), by, group(_rows(view, keys, from_ms, to_ms), by),
                       False, as_of=rfc3339(now))
        return doc

    return r
