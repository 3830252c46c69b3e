"""The --truth sampler's final listings wait for the API's view to reach the scenario's end (a joiner
still catching up has not published the end of the run yet), within a limit; against a small HTTP
server whose pod listing's `as_of` moves as a test says."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from periscope.clock import ScaledClock
from periscope.contract.values import rfc3339
from periscope.sim.up.sampler import Sampler

END_MS = 1_800_000_000_000


class View:
    """What the fake API serves: `as_of` of the pod listing (None: no view yet)."""

    def __init__(self) -> None:
        self.as_of_ms: int | None = None
        self.asked = 0


@pytest.fixture
def api() -> Iterator[tuple[str, View]]:
    view = View()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            view.asked += 1
            doc: Any = {"items": []}
            if self.path.startswith("/v1/pods") and view.as_of_ms is not None:
                doc["as_of"] = rfc3339(view.as_of_ms)
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", view
    server.shutdown()


def sampler(url: str, tmp_path: Path, lags_ms: list[int]) -> Sampler:
    s = Sampler(url, tmp_path / "t.api.jsonl", ScaledClock(END_MS, 1.0), 1000, END_MS)
    s.lags_ms = lags_ms  # the run's usual lag, as its snapshots measured it
    return s


def test_the_final_listing_waits_until_the_view_reaches_the_end(
        api: tuple[str, View], tmp_path: Path) -> None:
    url, view = api
    view.as_of_ms = END_MS - 60_000  # a joiner a minute behind, catching up
    s = sampler(url, tmp_path, [1500, 2000, 2500])

    def catch_up() -> None:
        time.sleep(0.6)
        view.as_of_ms = END_MS - 3000  # within twice the usual 2 s lag

    threading.Thread(target=catch_up, daemon=True).start()
    waited, behind = s.settle(END_MS, limit_s=10)
    assert 0.5 <= waited < 5 and behind == 3000
    s.finish()
    rows = [json.loads(line) for line in (tmp_path / "t.api.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["final"]


def test_a_view_that_never_catches_up_is_waited_for_only_until_the_limit(
        api: tuple[str, View], tmp_path: Path) -> None:
    url, view = api
    view.as_of_ms = END_MS - 60_000
    s = sampler(url, tmp_path, [1000])
    waited, behind = s.settle(END_MS, limit_s=0.8)
    assert 0.8 <= waited < 3 and behind == 60_000
    assert view.asked >= 2  # asked again while waiting, not once


def test_no_view_at_all_is_said_as_unknown(api: tuple[str, View], tmp_path: Path) -> None:
    url, _ = api
    waited, behind = sampler(url, tmp_path, []).settle(END_MS, limit_s=0.3)
    assert behind is None and waited >= 0.3


def test_a_current_view_is_not_waited_for(api: tuple[str, View], tmp_path: Path) -> None:
    url, view = api
    view.as_of_ms = END_MS - 1000  # a tick behind: as usual
    waited, behind = sampler(url, tmp_path, [1000, 1200]).settle(END_MS, limit_s=10)
    assert waited < 0.5 and behind == 1000
