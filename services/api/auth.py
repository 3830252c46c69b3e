"""The API's access gate: bearer token -> TokenReview -> SubjectAccessReviews -> the caller's `Scope`.

Reviews are cached (decisions, allow or deny, for `ttl_s`; a rejected token for at most
`negative_ttl_s`, so a token that just became valid works soon; each cache bounded to `max_entries`,
least recently used first out), so a warm request costs a hash and a few dict
lookups. Concurrent requests with one token share one review (single flight). The apiserver not
answering is a 503 for every request that needs a review, never an allow. Tokens are kept only as
digests and never logged.
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
        hit = self._d.get(key)
        if hit is None:
            return False, None
        if hit[0] <= self.clock():
            del self._d[key]
            return False, None
        self._d.move_to_end(key)
        return True, hit[1]

    def put(self, key: Any, value: Any, ttl_s: float) -> None:
        self._d[key] = (self.clock() + ttl_s, value)
        self._d.move_to_end(key)
        while len(self._d) > self.max_entries:
            self._d.popitem(last=False)

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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reviews = reviews
        self.ttl_s, self.negative_ttl_s = ttl_s, min(negative_ttl_s, ttl_s)
        self.identities = TtlCache(max_entries, clock)
        self.decisions = TtlCache(max_entries, clock)
        self.scopes = TtlCache(max_entries, clock)
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

    async def identity(self, token: str) -> Identity:
        key = _digest(token)
        hit, who = self.identities.get(key)
        if not hit:
            who = await self._once(("token", key), lambda: self._authenticate(key, token))
        if who is None:
            raise unauthorized("the bearer token was not accepted")
        assert isinstance(who, Identity)
        return who

    async def _authenticate(self, key: str, token: str) -> Identity | None:
        who = await self.reviews.authenticate(token)
        self.identities.put(key, who, self.ttl_s if who is not None else self.negative_ttl_s)
        return who

    async def allowed(self, who: Identity, attributes: dict[str, Any]) -> bool:
        key = (who, repr(sorted(attributes.items())))
        hit, ok = self.decisions.get(key)
        if hit:
            return bool(ok)
        return bool(await self._once(("sar", key), lambda: self._authorize(key, who, attributes)))

    async def _authorize(self, key: Any, who: Identity, attributes: dict[str, Any]) -> bool:
        ok = await self.reviews.authorize(who, attributes)
        # Denials are kept as long as allows: a tenant's many "no" answers (one per other namespace) are
        # what most reviews are, and re-asking them every few seconds would load the apiserver most.
        self.decisions.put(key, ok, self.ttl_s)
        return ok

    async def scope(self, token: str, namespaces: Collection[str]) -> Scope:
        """The caller's scope over (at least) `namespaces`; a namespace not reviewed is not seen."""
        key = _digest(token)
        hit, scoped = self.scopes.get(key)
        if hit and (scoped.scope.cluster or scoped.reviewed.issuperset(namespaces)):
            return scoped.scope  # type: ignore[no-any-return]
        who = await self.identity(token)
        cluster = await self.allowed(who, list_pods(""))
        if cluster:
            self.scopes.put(key, _Scoped(EVERYTHING, frozenset()), self.ttl_s)
            return EVERYTHING
        wanted = sorted({*namespaces, *(scoped.reviewed if hit else ())} - {""})
        gate = asyncio.Semaphore(_PARALLEL)

        async def one(ns: str) -> bool:
            async with gate:
                return await self.allowed(who, list_pods(ns))

        answers = await asyncio.gather(*(one(ns) for ns in wanted))
        scope = decide(False, dict(zip(wanted, answers, strict=True)))
        self.scopes.put(key, _Scoped(scope, frozenset(wanted)), self.ttl_s)
        return scope

    async def url(self, token: str, path: str) -> bool:
        return await self.allowed(await self.identity(token), get_url(path))


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
    try:
        if path in CLUSTER_PATHS:
            if not await gate.url(token, path):
                raise HTTPException(403, f"{path} is cluster-scoped: get on the non-resource URL is needed")
            return EVERYTHING
        view = request.app.state.view
        wanted = {*view.namespaces(), *extra}
        ns = request.query_params.get("namespace")
        if ns and _NAMESPACE.match(ns):  # only a possible namespace is worth a review
            wanted.add(ns)
        return await gate.scope(token, wanted)
    except ReviewUnavailable as e:
        raise HTTPException(503, f"access cannot be checked: {e}") from None


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
