"""Red-team cases against the running API over a real broker and real HTTP: forged output records,
every endpoint fuzzed (GET /v1/owners included, which replays the broker), /v1/owners flooded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from periscope.bus import topics as t
from periscope.bus.clients import Kafka
from periscope.bus.producer import Publisher
from periscope.core.model import DeviceInventory, GpuInfo
from periscope.settings.api import ApiSettings
from services.api.server import ApiServer
from tests.kafka_tier import settings_of
from tests.unit.test_api_samples import gpu, meta, pod, row


@asynccontextmanager
async def running_api(kafka: Kafka, unique: str, **kw: Any) -> AsyncIterator[httpx.AsyncClient]:
    s = ApiSettings(api_port=0, **settings_of(kafka), api_group_prefix=f"test-hostile-{unique}-",
                    log_level="warning", **kw)
    server = ApiServer(s)
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            yield c
    finally:
        await server.stop()


async def until(probe: Any, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (out := await probe()):
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)
    return out


# ---------------------------------------------------------------- item 3: forged output records


async def test_forged_gpu_states_are_refused_counted_and_said(any_broker: Kafka, unique: str) -> None:
    node = f"node-{unique}"
    real, phantom, future = (f"GPU-{unique}-{x}" for x in ("real", "phantom", "future"))
    now = int(time.time() * 1000)
    ten_years = now + 10 * 365 * 86_400_000
    async with Publisher(any_broker, "test-forger") as p:
        await p.send(t.INVENTORY, node, DeviceInventory(meta(now - 1000, node), (
            GpuInfo(real, 0), GpuInfo(future, 2))))
        await p.send(t.GPUS, real, gpu(real, node, 0, as_of=now))
        await p.send(t.GPUS, phantom, gpu(phantom, node, 1, as_of=now))  # no inventory names it
        await p.send(t.GPUS, future, gpu(future, node, 2, as_of=ten_years))
        ahead = pod(f"uid-{unique}", f"ns-{unique}", "p", node, row(real), as_of=ten_years)
        await p.send(t.ATTRIBUTION, f"uid-{unique}", ahead)
    async with running_api(any_broker, unique) as c:

        async def caught_up() -> bool:
            return (await c.get(f"/v1/gpus/{real}")).status_code == 200 and \
                (await c.get("/readyz")).json().get("held_for_inventory", 0) >= 1

        await until(caught_up)
        assert (await c.get(f"/v1/gpus/{phantom}")).status_code == 404
        assert (await c.get(f"/v1/gpus/{future}")).status_code == 404
        assert (await c.get(f"/v1/pods/uid-{unique}")).status_code == 404
        ready = (await c.get("/readyz")).json()
        assert ready["refused"]["future"] >= 2 and ready["refused"]["unknown-gpu"] >= 1
        assert ready["last_refusal"]
        text = (await c.get("/metrics")).text
        assert 'periscope_api_records_refused_total{reason="future"}' in text
        assert "periscope_api_records_held " in text
        # Evidence that comes later: the GPU is believed from then on, its held state shown.
        async with Publisher(any_broker, "test-probe") as p:
            await p.send(t.INVENTORY, node, DeviceInventory(meta(now, node), (
                GpuInfo(real, 0), GpuInfo(phantom, 1), GpuInfo(future, 2))))

        async def shown() -> bool:
            return (await c.get(f"/v1/gpus/{phantom}")).status_code == 200

        await until(shown)
        assert (await c.get(f"/v1/gpus/{future}")).status_code == 404  # still ten years ahead


# ---------------------------------------------------------------- fuzzing every endpoint

_VALUES = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"\A[0-9]{1,400}(ms|s|m|h|d)?\Z"),
    st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
                  r"(Z|[+-][0-9]{2}:[0-9]{2})?\Z"),
    st.sampled_from(["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "1e400", "nan", "-1s",
                     "[" * 5000, "\x00", "\x1b[2J", "true", "-0", "0s", "9" * 400]),
)
_PARAMS = {
    "/v1/pods": ["active", "namespace", "node", "limit", "continue"],
    "/v1/pods/x": [],
    "/v1/gpus": ["namespace", "node", "limit", "continue"],
    "/v1/gpus/x": [],
    "/v1/idle": ["threshold_pct", "window", "namespace", "node", "limit", "continue"],
    "/v1/xid": ["since", "node", "namespace", "gpu_uuid", "limit", "continue"],
    "/v1/findings": ["kind", "active", "node", "namespace", "limit", "continue"],
    "/v1/owners": ["at", "gpu_uuid", "node"],
    "/v1/policy": [],
    "/metrics": [],
    "/healthz": [],
    "/readyz": [],
    "/openapi.json": [],
    "/docs": [],
    "/": [],
}


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, str]]:
    path = draw(st.sampled_from(sorted(_PARAMS)))
    if path.endswith("/x"):
        segment = draw(st.text(min_size=1, max_size=60).filter(lambda s: s not in (".", "..")))
        path = path[:-1] + quote(segment, safe="")
    names = _PARAMS.get(path) or _PARAMS.get(path.rsplit("/", 1)[0] + "/x", [])
    chosen = draw(st.lists(st.sampled_from([*names, "bogus"]), max_size=4, unique=True)) if names else []
    return path, {n: draw(_VALUES) for n in chosen}


@pytest.mark.timeout(600)
def test_fuzzed_requests_to_every_endpoint_never_get_a_5xx(broker: Kafka, unique: str) -> None:
    """Each request runs against a live API over the broker (so /v1/owners replays for real)."""
    async def run(cases: list[tuple[str, dict[str, str]]]) -> list[tuple[str, dict[str, str], int, str]]:
        out = []
        async with running_api(broker, unique, api_owners_cache_ttl="0s") as c:
            for path, params in cases:
                r = await c.get(path, params=params)
                out.append((path, params, r.status_code, r.text[:300]))
        return out

    cases: list[tuple[str, dict[str, str]]] = []

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(requests())
    def collect(case: tuple[str, dict[str, str]]) -> None:
        cases.append(case)

    collect()
    for path, params, status, body in asyncio.run(run(cases)):
        if path == "/readyz" and status == 503:
            # Not an error but readiness: the API is still catching up (docs/api.md), whatever it was sent.
            assert body.startswith('{"ready":false,'), body
            continue
        assert status < 500, (path, params, status, body)
        assert "internal error" not in body.lower(), (path, params, body)
        if status >= 400:
            assert body.startswith('{"error":'), (path, params, body)


# ---------------------------------------------------------------- item 4 end to end


async def test_a_flood_of_owner_queries_gets_429s_and_nothing_waits_unboundedly(broker: Kafka,
                                                                               unique: str) -> None:
    limits = {"api_owners_concurrency": 1, "api_owners_queue": 2, "api_owners_cache_ttl": "0s",
              "api_owners_timeout": "20s"}
    async with running_api(broker, unique, **limits) as c:
        started = time.monotonic()
        ats = [f"2026-11-22T04:{i // 60:02d}:{i % 60:02d}Z" for i in range(50)]
        answers = await asyncio.gather(*(c.get("/v1/owners", params={"at": at}) for at in ats))
        took = time.monotonic() - started
    codes = [r.status_code for r in answers]
    assert set(codes) <= {200, 429, 503}, codes
    assert codes.count(429) >= 40 and codes.count(200) >= 1, codes
    assert all(int(r.headers["retry-after"]) >= 1 for r in answers if r.status_code != 200)
    assert took < 25  # the timeout bounds every wait
