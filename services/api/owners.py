"""GET /v1/owners: who owned which GPU at an instant, answered by replaying the input topics.

The materialized view only holds the present; this endpoint rebuilds the allocation state as of `at`
with the replay code (the same core the joiner runs), so it answers for any time the topics still hold.
A replay reads the broker and costs far more than any other request, so it is bounded on every side
(`OwnersLimits`): a few run at once, a few more wait, and beyond that the answer is 429 with
Retry-After at once; a waiting or running request gives up after `timeout_s` (503, Retry-After);
identical queries share one replay while it runs and its answer for `cache_ttl_s` after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from periscope.bus.clients import Kafka
from periscope.replay.owners import owners_at
from periscope.replay.reader import ReadError
from services.api import access, schemas
from services.api.access import Scope
from services.api.auth import caller, widen
from services.api.params import instant_ms
from services.api.queries import ApiError, only

log = logging.getLogger(__name__)
Json = dict[str, Any]
# (at_ms, gpu_uuid, node) -> the `periscope replay --at` document
Lookup = Callable[[int, str | None, str | None], Awaitable[Json]]


@dataclass(frozen=True, slots=True)
class OwnersLimits:
    concurrency: int = 2  # replays running at once
    queue: int = 8  # requests waiting for a replay slot; one more is answered 429
    timeout_s: float = 30.0  # longest a request waits and runs in all
    cache_ttl_s: float = 10.0  # how long an answer serves identical queries
    cache_entries: int = 256


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


class Busy(Exception):
    """No room for another replay now; `retry_after_s` is when one is likely."""

    def __init__(self, status: int, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after_s = status, message, retry_after_s


class OwnerQueries:
    """The bounded, coalescing, caching runner of replays behind /v1/owners."""

    def __init__(self, lookup: Lookup, limits: OwnersLimits,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lookup, self.limits, self.clock = lookup, limits, clock
        self._slots = asyncio.Semaphore(limits.concurrency)
        self._admitted = 0  # running + waiting
        self._inflight: dict[tuple[Any, ...], asyncio.Future[Json]] = {}
        self._cache: OrderedDict[tuple[Any, ...], tuple[float, Json]] = OrderedDict()
        self._mean_s = 1.0  # recent replay duration, for Retry-After
        self.rejected = 0
        self.timed_out = 0

    def retry_after_s(self) -> int:
        waves = (self._admitted + 1) / self.limits.concurrency
        return max(1, min(60, math.ceil(waves * self._mean_s)))

    async def answer(self, at_ms: int, gpu_uuid: str | None, node: str | None) -> Json:
        key = (at_ms, gpu_uuid, node)
        hit = self._cache.get(key)
        if hit is not None and hit[0] > self.clock():
            self._cache.move_to_end(key)
            return hit[1]
        shared = self._inflight.get(key)
        if shared is None:
            if self._admitted >= self.limits.concurrency + self.limits.queue:
                self.rejected += 1
                raise Busy(429, "busy: too many /v1/owners queries at once", self.retry_after_s())
            self._admitted += 1
            shared = asyncio.ensure_future(self._run(key))
            self._inflight[key] = shared
            shared.add_done_callback(lambda f: self._settled(key, f))
        try:
            # shield: a client that goes away does not cancel the replay others wait for
            return await asyncio.wait_for(asyncio.shield(shared), self.limits.timeout_s)
        except TimeoutError:
            self.timed_out += 1
            raise Busy(503, f"/v1/owners: no answer within {self.limits.timeout_s:g}s",
                       self.retry_after_s()) from None

    def _settled(self, key: tuple[Any, ...], f: asyncio.Future[Json]) -> None:
        self._admitted -= 1
        if self._inflight.get(key) is f:
            del self._inflight[key]
        if not f.cancelled():
            f.exception()  # retrieved even when every waiter gave up

    async def _run(self, key: tuple[Any, ...]) -> Json:
        deadline = self.clock() + self.limits.timeout_s
        await self._slots.acquire()
        left = deadline - self.clock()
        if left <= 0:  # every waiter has given up by now: do not start a replay nobody reads
            self._slots.release()
            raise TimeoutError
        started = self.clock()
        replay = asyncio.ensure_future(self.lookup(*key))
        # The slot is free only once the replay is really over, even when its waiters gave up first:
        # a replay in a worker process cannot be interrupted, and must not make room for another.
        replay.add_done_callback(lambda _: self._slots.release())
        try:
            out = await asyncio.wait_for(asyncio.shield(replay), left)
        finally:
            if not replay.done():
                replay.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._mean_s = 0.8 * self._mean_s + 0.2 * (self.clock() - started)
        if self.limits.cache_ttl_s > 0:
            self._cache[key] = (self.clock() + self.limits.cache_ttl_s, out)
            self._cache.move_to_end(key)
            while len(self._cache) > self.limits.cache_entries:
                self._cache.popitem(last=False)
        return out


def _background() -> None:
    """A replay worker yields the CPU to the process that serves every other request."""
    with contextlib.suppress(OSError):
        os.nice(10)


def _replay(kafka: Kafka, at_ms: int, gpu_uuid: str | None, node: str | None) -> Json:
    return asyncio.run(owners_at(kafka, at_ms, gpu_uuid=gpu_uuid, node=node))


class ProcessLookup:
    """Replays in worker processes, at a lower CPU priority. A replay is CPU work (decoding the inputs,
    the core) of up to seconds: on the API's event loop it would hold every other request that long,
    and at the same priority it would still take the CPU from the loop where cores are few."""

    def __init__(self, kafka: Kafka, workers: int) -> None:
        self.kafka, self.workers = kafka, workers
        self._pool: ProcessPoolExecutor | None = None
        self._threads = False  # worker processes cannot be had here: replay on threads instead

    async def __call__(self, at_ms: int, gpu_uuid: str | None, node: str | None) -> Json:
        args = (self.kafka, at_ms, gpu_uuid, node)
        if not self._threads:
            try:
                if self._pool is None:  # started on first use: most replicas never replay
                    self._pool = ProcessPoolExecutor(self.workers, initializer=_background,
                                                     mp_context=multiprocessing.get_context("spawn"))
                return await asyncio.get_running_loop().run_in_executor(self._pool, _replay, *args)
            except (AssertionError, OSError, BrokenProcessPool) as e:  # e.g. a daemonic parent process
                log.warning("/v1/owners: no worker processes (%s: %s); replaying on threads",
                            type(e).__name__, e)
                self.close()
                self._threads = True
        # Its own event loop on a thread: the API's loop still gets its turns between the replay's.
        return await asyncio.to_thread(_replay, *args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def router(queries: OwnerQueries) -> APIRouter:
    r = APIRouter(tags=["replay"])
    busy = {"model": schemas.Error, "description": "too many /v1/owners queries at once (see Retry-After)"}

    @r.get(
        "/v1/owners",
        responses={200: {"model": Owners}, 400: {"model": schemas.Error}, 429: busy,
                   503: {"model": schemas.Error}},
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
        container}]}`, rebuilt from the input topics (the same answer as `periscope replay --at`).
        Limited: see docs/api.md (429 with Retry-After when busy)."""
        at_ms = instant_ms("at", at)
        try:
            out = await queries.answer(at_ms, gpu_uuid, node)
        except ReadError as e:
            raise ApiError(503, str(e)) from None
        except Busy as e:
            raise ApiError(e.status, e.message, {"Retry-After": str(e.retry_after_s)}) from None
        if scope.cluster:
            return out  # exactly `periscope replay --at`'s document
        items = out.get("items") or []
        scope = await widen(request, scope, {str(i.get("namespace") or "") for i in items})
        seen, hidden = access.owner_items(items, scope)
        return {**out, "items": seen, "hidden_owners": hidden}

    return r
