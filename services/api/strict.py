"""Routes that refuse query parameters they do not declare, so a typo is never silently an unfiltered
query. What a route accepts is read from its own signature (and its dependencies'), by FastAPI's own
analysis of it: a parameter added to the handler is accepted, with nothing else to keep in step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import get_dependant
from fastapi.params import Depends as DependsParam

from services.api.errors import ApiError


def query_names(d: Dependant) -> set[str]:
    """The query parameters a handler and its dependencies declare, by the names callers send."""
    names = {p.alias for p in d.query_params}
    for sub in d.dependencies:
        names |= query_names(sub)
    return names


def only(known: set[str]) -> Callable[[Request], None]:
    def check(request: Request) -> None:
        unknown = sorted(k for k in request.query_params if k not in known)
        if unknown:
            hint = ", ".join(sorted(known)) or "none"
            raise ApiError(400, f"unknown query parameter {unknown[0]!r} (accepted: {hint})")

    return check


class StrictRouter(APIRouter):
    """An APIRouter whose routes answer 400 to an undeclared query parameter."""

    def add_api_route(self, path: str, endpoint: Callable[..., Any], *,
                      dependencies: Sequence[DependsParam] | None = None, **kwargs: Any) -> None:
        known = query_names(get_dependant(path=self.prefix + path, call=endpoint))
        for dep in dependencies or ():
            if dep.dependency is not None:
                known |= query_names(get_dependant(path=self.prefix + path, call=dep.dependency))
        super().add_api_route(path, endpoint, dependencies=[*(dependencies or ()), Depends(only(known))],
                              **kwargs)
