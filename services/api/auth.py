"""The API's access gate: bearer token -> TokenReview -> SubjectAccessReviews -> the caller's `Scope`.

Reviews are cached (decisions, allow or deny, for `ttl_s`; a rejected token for at most
`negative_ttl_s`, so a token that just became valid works soon; each cache bounded to `max_entries`,
least recently used first out), so a warm request costs a hash and a few dict
lookups. Concurrent requests with one token share one review (single flight). The apiserver not
answering is a 503 for every request that needs a review, never an allow. Tokens are kept only as
digests and never logged.

The apiserver is protected from callers (429 with Retry-After, never a guess): only namespaces the view
holds are reviewed (a `namespace=` the view does not hold has no rows to show), each user gets at most
`review_budget` SubjectAccessReviews per `ttl_s`, and each client address at most `failure_budget`
rejected tokens per minute before its unknown tokens are refused without a TokenReview. A caller's
scope is kept no longer than the oldest review it was built from: a revoked user loses access within
`ttl_s` of the review that allowed it, whatever else it asks in between.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request
from starlette.exceptions import HTTPException

from services.api.access import EVERYTHING, Scope, decide
from services.api.limits import Buckets, Throttled
from services.api.reviews import Identity, ReviewUnavailable, get_url, list_pods

# "/" is the web view: a static page that asks for a token itself before it reads anything.
OPEN_PATHS = frozenset({"/", "/healthz", "/readyz", "/openapi.json", "/docs", "/docs/assets/{name}"})
CLUSTER_PATHS = frozenset({"/v1/policy", "/metrics"})
_PARALLEL = 8  # SubjectAccessReviews in flight per scope review
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS-1123 label


class Reviews(Protocol):
    async def authenticate(self, token: str) -> Identity | None: ...
    async def authorize(self, who: Identity, attributes: dict[str, Any]) -> bool: ...


class TtlCache:
    """A bounded map whose entries expire; least recently used entries go first when full."""

    def __init__(self, max_entries: int, clock: Callable[[], float]) -> None:
        self.max_entries, self.clock = max_entries, clock
        self._d: OrderedDict[Any, tuple[float, Any]] = OrderedDict()

    def get(self, key: Any) -> tuple[bool, Any]:
        hit = self.entry(key)
        return (False, None) if hit is None else (True, hit[1])

    def entry(self, key: Any) -> tuple[float, Any] | None:
        """(expiry, value) of a live entry, or None."""
        hit = self._d.get(key)
        if hit is None:
            return None
        if hit[0] <= self.clock():
            del self._d[key]
            return None
        self._d.move_to_end(key)
        return hit

    def put(self, key: Any, value: Any, ttl_s: float) -> float:
        return self.put_until(key, value, self.clock() + ttl_s)

    def put_until(self, key: Any, value: Any, expires: float) -> float:
        self._d[key] = (expires, value)
        self._d.move_to_end(key)
        while len(self._d) > self.max_entries:
            self._d.popitem(last=False)
        return expires

    def __len__(self) -> int:
        return len(self._d)


@dataclass(frozen=True, slots=True)
class _Scoped:
    scope: Scope
    reviewed: frozenset[str]


def unauthorized(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": 'Bearer realm="periscope"'})


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Gate:
    def __init__(
        self,
        reviews: Reviews,
        *,
        ttl_s: float = 30.0,
        negative_ttl_s: float = 5.0,
        max_entries: int = 10_000,
        review_budget: int = 1_000,
        failure_budget: int = 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reviews = reviews
        self.clock = clock
        self.ttl_s, self.negative_ttl_s = ttl_s, min(negative_ttl_s, ttl_s)
        self.identities = TtlCache(max_entries, clock)
        self.decisions = TtlCache(max_entries, clock)
        self.scopes = TtlCache(max_entries, clock)
        # SubjectAccessReviews per user per TTL; rejected tokens per client address per minute.
        self.review_budget = Buckets(review_budget, ttl_s, max_keys=max_entries, clock=clock)
        self.failure_budget = Buckets(failure_budget, 60.0, max_keys=max_entries, clock=clock)
        self._inflight: dict[Any, asyncio.Future[Any]] = {}

    async def _once(self, key: Any, make: Callable[[], Awaitable[Any]]) -> Any:
        """Single flight: the first caller with `key` starts `make()` as its own task and every caller
        awaits that task, so a client that disconnects does not cancel the review for the others."""
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(make())
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._settled(key, t))
        return await asyncio.shield(task)

    def _settled(self, key: Any, task: asyncio.Future[Any]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved even when every waiter went away

    async def identity(self, token: str, client: str = "") -> Identity:
        return (await self._identity(token, client))[0]

    async def _identity(self, token: str, client: str) -> tuple[Identity, float]:
        """The token's user and until when that answer holds; 401 for a rejected token, 429 once the
        client sent too many rejected ones."""
        key = _digest(token)
        hit = self.identities.entry(key)
        if hit is None:
            hit = await self._once(("token", key), lambda: self._authenticate(key, token, client))
        expires, who = hit
        if who is None:
            raise unauthorized("the bearer token was not accepted")
        assert isinstance(who, Identity)
        return who, expires

    async def _authenticate(self, key: str, token: str, client: str) -> tuple[float, Identity | None]:
        # Charged before asking, refunded when the token is good: concurrent requests with random
        # tokens cannot all get past the check before the first answer comes back.
        if not self.failure_budget.take(client):
            raise Throttled("too many rejected bearer tokens from this client",
                            self.failure_budget.wait_s(client))
        try:
            who = await self.reviews.authenticate(token)
        except BaseException:
            self.failure_budget.give(client)  # the apiserver's trouble is not the client's fault
            raise
        if who is not None:
            self.failure_budget.give(client)
        return self.identities.put(key, who, self.ttl_s if who is not None else self.negative_ttl_s), who

    async def allowed(self, who: Identity, attributes: dict[str, Any]) -> bool:
        return (await self._decision(who, attributes))[0]

    async def _decision(self, who: Identity, attributes: dict[str, Any]) -> tuple[bool, float]:
        """The answer of a SubjectAccessReview and until when it holds."""
        key = (who, repr(sorted(attributes.items())))
        hit = self.decisions.entry(key)
        if hit is not None:
            return bool(hit[1]), hit[0]
        expires, ok = await self._once(("sar", key), lambda: self._authorize(key, who, attributes))
        return bool(ok), expires

    async def _authorize(self, key: Any, who: Identity, attributes: dict[str, Any]) -> tuple[float, bool]:
        if not self.review_budget.take(who):
            budget = self.review_budget
            raise Throttled(f"too many access reviews for {who.username} (at most {budget.burst} per "
                            f"{self.ttl_s:g}s)", budget.wait_s(who))
        ok = await self.reviews.authorize(who, attributes)
        # Denials are kept as long as allows: a tenant's many "no" answers (one per other namespace) are
        # what most reviews are, and re-asking them every few seconds would load the apiserver most.
        return self.decisions.put(key, ok, self.ttl_s), ok

    async def scope(self, token: str, namespaces: Collection[str], client: str = "") -> Scope:
        """The caller's scope over (at least) `namespaces`; a namespace not reviewed is not seen."""
        key = _digest(token)
        hit, scoped = self.scopes.get(key)
        if hit and (scoped.scope.cluster or scoped.reviewed.issuperset(namespaces)):
            return scoped.scope  # type: ignore[no-any-return]
        who, expires = await self._identity(token, client)
        cluster, until = await self._decision(who, list_pods(""))
        expires = min(expires, until)
        if cluster:
            self.scopes.put_until(key, _Scoped(EVERYTHING, frozenset()), expires)
            return EVERYTHING
        wanted = sorted({*namespaces, *(scoped.reviewed if hit else ())} - {""})
        gate = asyncio.Semaphore(_PARALLEL)

        async def one(ns: str) -> tuple[bool, float]:
            async with gate:
                return await self._decision(who, list_pods(ns))

        answers = await asyncio.gather(*(one(ns) for ns in wanted))
        scope = decide(False, {ns: ok for ns, (ok, _) in zip(wanted, answers, strict=True)})
        # Never longer than the oldest answer it rests on: widening an old scope must not renew it.
        expires = min([expires, *(until for _, until in answers)])
        self.scopes.put_until(key, _Scoped(scope, frozenset(wanted)), expires)
        return scope

    async def url(self, token: str, path: str, client: str = "") -> bool:
        return await self.allowed(await self.identity(token, client), get_url(path))


def bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("a bearer token is required (Authorization: Bearer <token>)")
    return token.strip()


def _route_path(request: Request) -> str:
    route = request.scope.get("route")
    return str(getattr(route, "path", None) or request.url.path)


async def _guarded(request: Request, gate: Gate, extra: Iterable[str]) -> Scope:
    path = _route_path(request)
    if path in OPEN_PATHS:
        return EVERYTHING
    token = bearer(request)
    client = request.client.host if request.client else ""
    try:
        if path in CLUSTER_PATHS:
            if not await gate.url(token, path, client):
                raise HTTPException(403, f"{path} is cluster-scoped: get on the non-resource URL is needed")
            return EVERYTHING
        # Only namespaces the view holds (and, for history, those `extra` names): a `namespace=` of
        # anything else has no rows to show, so it costs no review, however many distinct ones come.
        view = request.app.state.view
        wanted = {*view.namespaces(), *(ns for ns in extra if _NAMESPACE.match(ns))}
        return await gate.scope(token, wanted, client)
    except ReviewUnavailable as e:
        raise HTTPException(503, f"access cannot be checked: {e}") from None
    except Throttled as e:
        raise HTTPException(429, str(e), headers={"Retry-After": str(e.retry_after_s)}) from None


async def caller(request: Request) -> Scope:
    """FastAPI dependency: the caller's scope; everything when access control is off.

    Installed app-wide, so a route is closed unless it is one of OPEN_PATHS; FastAPI runs it once per
    request even when a handler asks for it too."""
    gate: Gate | None = getattr(request.app.state, "gate", None)
    if gate is None:
        return EVERYTHING
    return await _guarded(request, gate, ())


async def widen(request: Request, scope: Scope, namespaces: Iterable[str]) -> Scope:
    """The scope again, with namespaces the view does not hold reviewed too (history replayed from
    the topics names pods long gone)."""
    gate: Gate | None = getattr(request.app.state, "gate", None)
    missing = {ns for ns in namespaces if ns and not scope.sees(ns)}
    if gate is None or scope.cluster or not missing:
        return scope
    return await _guarded(request, gate, missing)
