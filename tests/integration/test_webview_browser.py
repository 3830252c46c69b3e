"""The web view in a real headless Chromium over real HTTP, with access control in front of the API.

This branch's API has no authentication of its own, so a small ASGI guard stands in for it here: it
answers /v1/* with 401 without a bearer token and 403 with the wrong one, as the API does when access
control is on. The page must send the token given as /#token=..., and say clearly when it is refused;
the page itself stays loadable without a token. The scenario-driven rendering test is in
tests/e2e/test_operator_views.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from services.api.app import create_app
from services.api.server import bind
from tests.chromium import NEEDS_CHROMIUM, dom
from tests.unit.test_api_samples import GPU_A0, GPU_A1, GPU_B0, sample_view

pytestmark = NEEDS_CHROMIUM
TOKEN = "s3cret-token"


def guarded(app: Any) -> Any:
    async def guard(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            auth = dict(scope["headers"]).get(b"authorization", b"").decode()
            status = 0 if auth == f"Bearer {TOKEN}" else (401 if not auth else 403)
            if status:
                body = b'{"error": "unauthorized"}'
                await send({"type": "http.response.start", "status": status,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guard


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(guarded(create_app(sample_view())), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield url
    server.should_exit = True
    thread.join(10)
    sock.close()


def notice(page: str) -> str:
    return page.split('id="notice"', 1)[1].split("</div>", 1)[0]


@pytest.mark.timeout(180)
def test_with_the_token_from_the_fragment_the_page_shows_gpus_and_owners(api: str, tmp_path: Path) -> None:
    assert httpx.get(f"{api}/v1/gpus", timeout=5).status_code == 401  # the guard is on
    assert httpx.get(f"{api}/", timeout=5).status_code == 200  # the page itself is open
    page = dom(f"{api}/#token={TOKEN}", tmp_path / "profile", 5000)
    for uuid in (GPU_A0, GPU_A1, GPU_B0):
        assert f'data-gpu="{uuid}"' in page
    for name in ("ml/train-0", "ml/notebook-0", "infer/serve-0", "uid-busy", "uid-idle"):
        assert name in page, name
    assert "display: none" in notice(page)
    idle = page.split('id="idle"', 1)[1].split("</section>", 1)[0]
    assert "ml/notebook-0" in idle and "0.33" in idle  # 20 idle minutes of a whole GPU
    assert "dcgmExporter" in page and "devicePlugin" in page


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("fragment", "message"),
    [("", "The API requires a token (401)"), ("#token=wrong", "not allowed to read this (403)")],
)
def test_without_a_good_token_the_page_says_why(
    api: str, tmp_path: Path, fragment: str, message: str
) -> None:
    page = dom(f"{api}/{fragment}", tmp_path / "profile", 5000)
    shown = notice(page)
    assert message in shown and "/#token=" in shown and "display: block" in shown
    assert "data-gpu=" not in page and "train-0" not in page
