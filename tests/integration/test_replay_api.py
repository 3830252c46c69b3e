"""GET /v1/owners over real HTTP and a real broker: the replay answer for an instant, the same as
`periscope replay --at`; bad queries are 400 {"error"}."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from periscope.bus.clients import Kafka
from periscope.cli.main import main
from periscope.contract.values import rfc3339
from periscope.settings.api import ApiSettings
from services.api.server import ApiServer
from tests.integration.test_replay import BASE, publish
from tests.kafka_tier import settings_of
from tests.unit.core_builders import gpu, uid
from tests.unit.test_replay_owners import reuse_scenario

S = 1000
START = BASE + 50_000 * S


@pytest.fixture
async def api(broker: Kafka, unique: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = ApiSettings(api_port=0, **settings_of(broker), api_group_prefix=f"test-owners-{unique}-",
                           log_level="warning")
    server = ApiServer(settings, consume=False)
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            yield c
    finally:
        await server.stop()


async def test_owners_endpoint_answers_like_replay_at(api: httpx.AsyncClient, broker: Kafka, unique: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    node = f"replay-api-{unique}"
    await publish(broker, node, reuse_scenario(node, START))
    at = rfc3339(START + 30 * S)
    r = await api.get("/v1/owners", params={"at": at, "gpu_uuid": gpu(0), "node": node})
    assert r.status_code == 200
    body = r.json()
    assert body["at"] == at
    assert [(i["node"], i["gpu_uuid"], i["pod_uid"], i["pod"]) for i in body["items"]] == [
        (node, gpu(0), uid(1), "train-0")]
    # After the pod name was reused, the new UID; all GPUs of the node without gpu_uuid.
    r = await api.get("/v1/owners", params={"at": rfc3339(START + 90 * S), "node": node})
    assert [(i["gpu_uuid"], i["pod_uid"]) for i in r.json()["items"]] == [(gpu(0), uid(2)), (gpu(1), uid(3))]

    def cli() -> None:  # on its own thread: the command runs its own event loop
        with pytest.raises(SystemExit):
            main(["replay", "--bootstrap", broker.bootstrap, "--at", rfc3339(START + 90 * S), "--node", node,
                  "--format", "json", "--quiet"])

    await asyncio.to_thread(cli)
    assert json.loads(capsys.readouterr().out) == r.json()


@pytest.mark.parametrize("params,needle", [
    ({}, "at"),
    ({"at": "yesterday"}, "at: not an RFC 3339 time"),
    ({"at": "2026-11-22T04:00:00Z", "gpu": "GPU-x"}, "unknown query parameter 'gpu'"),
])
async def test_bad_queries_are_400(api: httpx.AsyncClient, params: dict[str, str], needle: str) -> None:
    r = await api.get("/v1/owners", params=params)
    assert r.status_code == 400 and needle in r.json()["error"]


async def test_owners_is_in_the_openapi_document(api: httpx.AsyncClient) -> None:
    spec = (await api.get("/openapi.json")).json()
    params = {p["name"] for p in spec["paths"]["/v1/owners"]["get"]["parameters"]}
    assert params == {"at", "gpu_uuid", "node"}
