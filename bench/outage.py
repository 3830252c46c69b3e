"""Catch-up after a broker outage: the broker (embedded or Apache Kafka) paused (SIGSTOP: every thread
stops, memory and disk kept) under the freshness run's live load, then resumed; the figure is the
seconds from the resume until the API is fresh again.

Fresh means what a user checks: /readyz answers 200 and the newest sample shown for the marker
namespace is younger than the freshness goal (2 s). During the pause the real probes buffer, the load
publisher skips ticks it cannot send, and the joiner and API wait; after it, everything must come back
by itself, the probes' backlog first.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import httpx

from bench.common import Figure, broker_label
from periscope.contract.values import parse_time_ms

FRESH_S = 2.0


async def _fresh(client: httpx.AsyncClient, namespace: str) -> bool:
    if (await client.get("/readyz")).status_code != 200:
        return False
    rows = (await client.get("/v1/pods", params={"namespace": namespace})).json()["items"]
    newest = max((parse_time_ms(r["last_seen"]) for r in rows if r["last_seen"]), default=0)
    return time.time() - newest / 1000 < FRESH_S


async def catch_up(broker_pid: int, api_url: str, namespace: str, pause_s: float,
                   timeout_s: float = 300) -> tuple[Figure, dict[str, Any]]:
    """Pause the broker for `pause_s`, resume it, and time the way back to fresh."""
    async with httpx.AsyncClient(base_url=api_url, timeout=10) as client:
        os.kill(broker_pid, signal.SIGSTOP)
        paused = time.monotonic()
        stale_at = None
        try:
            while time.monotonic() - paused < pause_s:
                if stale_at is None and (await client.get("/readyz")).status_code != 200:
                    stale_at = time.monotonic() - paused
                await asyncio.sleep(0.5)
        finally:
            os.kill(broker_pid, signal.SIGCONT)
        resumed = time.monotonic()
        fresh_after = None
        while time.monotonic() - resumed < timeout_s:
            if await _fresh(client, namespace):
                fresh_after = time.monotonic() - resumed
                break
            await asyncio.sleep(0.1)
    if fresh_after is None:
        raise RuntimeError(f"not fresh {timeout_s:g}s after a {pause_s:g}s broker pause")
    setup = {"outage": f"{broker_label()} paused (SIGSTOP) for {pause_s:g} s under the freshness load, then "
                       "resumed (SIGCONT)",
             "fresh": f"/readyz 200 and the newest marker sample in /v1/pods younger than {FRESH_S:g} s",
             "readyz_503_after_s": None if stale_at is None else round(stale_at, 1)}
    figure = Figure("outage_catch_up_s", fresh_after, "s", setup,
                    "the probes' buffered backlog, the joiner's and the API's reconnects (bounded at 10 s "
                    "per stalled broker call) and the joiner's lateness", None, [fresh_after],
                    f"{pause_s:g} s broker pause, resume -> fresh")
    return figure, setup
