"""GET /: the web view is one static, self-contained page that reads the JSON API itself.

Rendered by a real headless Chromium against `periscope up` in tests/e2e/test_operator_views.py.
"""

from __future__ import annotations

import re

import httpx

from services.api.app import create_app
from services.api.view import View


async def get(path: str) -> httpx.Response:
    app = create_app(View())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        return await c.get(path)


async def test_the_page_is_html_with_a_policy_that_forbids_external_assets() -> None:
    r = await get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    # Nothing loaded from elsewhere: no src/href to another origin, no @import, no protocol-relative URL.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", r.text)
    assert "@import" not in r.text and "<link" not in r.text
    assert "/openapi.json" not in r.text  # the page is not part of the API schema either
    for endpoint in ("v1/gpus", "v1/pods?active=true", "v1/idle", "v1/xid", "v1/policy"):
        assert f'"{endpoint}' in r.text, endpoint


async def test_the_page_sends_a_bearer_token_kept_from_the_url_fragment() -> None:
    text = (await get("/")).text
    assert "location.hash" in text and "sessionStorage" in text
    assert '"Bearer " + token' in text
    assert "r.status === 401 || r.status === 403" in text


async def test_the_page_is_not_in_the_openapi_document() -> None:
    spec = (await get("/openapi.json")).json()
    assert "/" not in spec["paths"]
