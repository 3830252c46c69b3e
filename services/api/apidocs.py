"""GET /docs: the interactive API documentation (Swagger UI), served entirely by the API itself.

FastAPI's own /docs page loads Swagger UI's script and style from a CDN and starts it with an inline
script, on the same origin as the web view; /redoc loads another CDN script. Both are turned off
(create_app) and this page replaces /docs: its script and style come from the pinned `fastapi-offline`
wheel, the start-up script is a file of this package, and the Content-Security-Policy allows scripts
from this origin only. Like /openapi.json it holds no data, so it stays open with access control on;
"Try it out" calls carry whatever token the user types in, and the API checks those.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

# Swagger UI sets inline styles and draws icons from data: URIs; it needs no inline or remote script.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_ASSETS = {  # name -> (package, file, media type)
    "swagger-ui-bundle.js": ("fastapi_offline", "static/swagger-ui-bundle.js", "text/javascript"),
    "swagger-ui.css": ("fastapi_offline", "static/swagger-ui.css", "text/css"),
    "favicon.png": ("fastapi_offline", "static/favicon.png", "image/png"),
    "start.js": ("services.api", "apidocs.js", "text/javascript"),
}
_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Periscope API</title>
<link rel="icon" type="image/png" href="{root}/docs/assets/favicon.png">
<link rel="stylesheet" href="{root}/docs/assets/swagger-ui.css">
</head>
<body>
<div id="swagger-ui" data-openapi="{root}/openapi.json"></div>
<script src="{root}/docs/assets/swagger-ui-bundle.js"></script>
<script src="{root}/docs/assets/start.js"></script>
</body>
</html>
"""


@cache
def asset(name: str) -> bytes:
    package, path, _ = _ASSETS[name]
    return resources.files(package).joinpath(path).read_bytes()


def router() -> APIRouter:
    r = APIRouter()

    @r.get("/docs", response_class=HTMLResponse, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = str(request.scope.get("root_path") or "").rstrip("/")
        return HTMLResponse(_PAGE.format(root=root),
                            headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})

    @r.get("/docs/assets/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> Response:
        if name not in _ASSETS:
            return Response(status_code=404)
        return Response(asset(name), media_type=_ASSETS[name][2],
                        headers={"Cache-Control": "public, max-age=86400"})

    return r
