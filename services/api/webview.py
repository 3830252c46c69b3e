"""GET /: the one-screen web view, a static page (webview.html) that reads the JSON API itself.

The page is the same for everyone and holds no data, so it is served without authentication; its
fetch() calls carry the bearer token the user gives it, and the API checks those. The
Content-Security-Policy keeps it self-contained: no external script, style, font or image can load.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@cache
def page() -> str:
    return resources.files("services.api").joinpath("webview.html").read_text(encoding="utf-8")


def router() -> APIRouter:
    r = APIRouter()

    @r.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(
            page(),
            headers={
                "Content-Security-Policy": CSP,
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-cache",
            },
        )

    return r
