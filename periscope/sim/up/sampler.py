"""Ground-truth snapshots of what the API said during a `periscope up --truth` run.

A report written after the run cannot see the past, so the `Sampler` thread asks the API for the
active pods and the GPUs at every scenario tick (on the shared scaled clock, skipping ticks it fell
behind on) and appends each answer as a `snapshot` row, following pagination; when told to finish it
writes one `final` row with the XID, policy, idle and full pod listings. The rows go, one JSON
object a line, to `snapshots_path(truth)`: `t.api.jsonl` beside the simulator's `t.jsonl`.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from periscope.clock import ScaledClock, real_seconds
from periscope.contract.values import parse_time_ms, rfc3339


def snapshots_path(truth: Path) -> Path:
    """Where `up --truth t.jsonl` records the API as the run goes: `t.api.jsonl` beside it."""
    return truth.with_name(truth.name.removesuffix(".jsonl") + ".api.jsonl")


def usage_path(truth: Path) -> Path:
    """Where `up --truth t.jsonl` keeps `periscope usage`'s answer for the run: `t.usage.json`."""
    return truth.with_name(truth.name.removesuffix(".jsonl") + ".usage.json")


def api_get(client: httpx.Client, path: str) -> tuple[Any, str | None]:
    """An API answer, with every page of a listing joined into one list, and the listing's `as_of`."""
    items: list[Any] = []
    url, as_of = path, None
    while True:
        r = client.get(url)
        r.raise_for_status()
        doc = r.json()
        if not isinstance(doc, dict) or "items" not in doc:
            return doc, as_of
        if url == path:
            as_of = doc.get("as_of")
        items += doc["items"]
        if not doc.get("continue"):
            return items, as_of
        url = f"{path}{'&' if '?' in path else '?'}continue={doc['continue']}"


def final_row(client: httpx.Client, at_ms: int, **extra: Any) -> dict[str, Any]:
    """The `final` row: the listings a report reads once, after the run."""
    paths = {"xid": "/v1/xid", "policy": "/v1/policy", "idle": "/v1/idle", "pods": "/v1/pods"}
    return {"kind": "final", "at_ms": at_ms, **extra, **{k: api_get(client, p)[0] for k, p in paths.items()}}


class Sampler(threading.Thread):
    """Records what the API says at every tick (a report after the run cannot see the past)."""

    def __init__(self, api: str, path: Path, clock: ScaledClock, tick_ms: int, start_ms: int,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(daemon=True, name="api-sampler")
        self.api, self.clock, self.tick_ms, self.start_ms = api, clock, tick_ms, start_ms
        self.headers = headers or {}  # with --api-auth: a cluster-wide user's token
        self.out = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by finish()
        self.stopping = threading.Event()
        self.lags_ms: list[int] = []  # how far each sampled view's as_of was behind the clock

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.api, timeout=5.0, headers=self.headers)

    def run(self) -> None:
        with self._client() as client:
            k = 0
            while not self.stopping.is_set():
                wait_s = real_seconds(self.clock, self.start_ms + k * self.tick_ms - self.clock.now_ms())
                if wait_s > 0 and self.stopping.wait(wait_s):
                    break
                at = self.clock.now_ms()
                k = max(k + 1, (at - self.start_ms) // self.tick_ms + 1)  # skip ticks we fell behind on
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    # as_of: the API's "newest event time in the view" of the pod listing
                    pods, as_of = api_get(client, "/v1/pods?active=true")
                    gpus = api_get(client, "/v1/gpus")[0]
                    self._write({"kind": "snapshot", "at_ms": at, "at": rfc3339(at), "as_of": as_of,
                                 "pods": pods, "gpus": gpus})
                    if as_of is not None:
                        self.lags_ms.append(at - parse_time_ms(as_of))

    def settle(self, end_ms: int, limit_s: float) -> tuple[float, int | None]:
        """After the scenario's end, before the final row: wait (at most `limit_s` real seconds) until
        the API's view has reached `end_ms` as closely as it usually follows the clock, so the final
        listings hold what the whole run published (a joiner still catching up has not published it
        yet). Ticks are still sampled meanwhile, as until `finish`. Returns (seconds waited, how far
        behind the view still was; None: not known)."""
        lags = list(self.lags_ms)  # a copy: the sampling thread appends
        usual = statistics.median(lags) if lags else 0
        allowance = max(2 * usual, 2 * self.tick_ms)
        began = time.monotonic()
        behind: int | None = None
        with self._client() as client:
            while True:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    as_of = api_get(client, "/v1/pods?active=true")[1]
                    behind = None if as_of is None else max(0, end_ms - parse_time_ms(as_of))
                waited = time.monotonic() - began
                if (behind is not None and behind <= allowance) or waited >= limit_s:
                    return waited, behind
                time.sleep(0.25)

    def _write(self, row: dict[str, Any]) -> None:
        self.out.write(json.dumps(row, separators=(",", ":")) + "\n")
        self.out.flush()

    def finish(self) -> None:
        """Stop sampling and write the final row (once; later calls do nothing)."""
        if self.out.closed:
            return
        self.stopping.set()
        if self.ident is not None:  # started
            self.join(15)
        with contextlib.suppress(httpx.HTTPError, ValueError), self._client() as client:
            at = self.clock.now_ms()
            self._write(final_row(client, at, at=rfc3339(at)))
        self.out.close()
