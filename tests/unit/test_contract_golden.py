"""Golden tests of what users read: objects in, exact JSON out, for every endpoint and for
`periscope replay --format json` (tests/unit/golden_scenario.py: every output kind, every unknown).

The expected documents are tests/unit/data/golden/*.json. After a deliberate change of the contract, run
with PERISCOPE_GOLDEN_UPDATE=1 to rewrite them, and read the diff before committing it.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from periscope.contract.values import rfc3339
from periscope.core.model import Meta, NodeEvent, OperandStatus, PolicyEvent
from periscope.replay.owners import owners_from_events
from periscope.replay.reader import ReadStats
from periscope.replay.runner import ReplayResult, replay_events
from periscope.replay.timeline import Spool, replay_to_spool, write_document
from periscope.settings.replay import ReplaySettings
from services.api.app import create_app
from services.api.owners import OwnerQueries, OwnersLimits
from services.api.owners import router as owners_router
from services.api.view import View
from services.replay.cli import range_config, spooled_document
from tests.unit import golden_scenario as g

GOLDEN = Path(__file__).parent / "data" / "golden"
UPDATE = os.environ.get("PERISCOPE_GOLDEN_UPDATE") == "1"


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert path.is_file(), f"no golden {path}: run with PERISCOPE_GOLDEN_UPDATE=1"
    assert text == path.read_text(), f"{name} differs from its golden copy"


_RESULT: list[ReplayResult] = []


def _replayed() -> ReplayResult:
    if not _RESULT:
        _RESULT.append(replay_events(g.events()))
    return _RESULT[0]


def _view() -> View:
    view = View()
    for o in _replayed().outputs:
        view.apply(o)
    for node in (g.A, g.B):
        view.apply(NodeEvent(meta=Meta(node, "kube_watcher", 1, 1, g.T0), name=node,
                             labels=(("nvidia.com/gpu.deploy.device-plugin", "true"),)))
    view.apply(PolicyEvent(
        meta=Meta("", "kube_watcher", 1, 2, g.T0), crd="installed", name="cluster-policy", state="ready",
        namespace="gpu-operator", components=(("devicePlugin", True), ("dcgmExporter", None)),
        kind="ClusterPolicy",
        operands=(OperandStatus("nvidia-device-plugin-daemonset", "devicePlugin", True, 2, 2, 2),
                  OperandStatus("nvidia-dcgm-exporter", "dcgmExporter", True, 2, 1, 1))))
    return view


async def _owners(at_ms: int, gpu_uuid: str | None, node: str | None) -> dict[str, Any]:
    return owners_from_events(g.events(), at_ms, gpu_uuid=gpu_uuid, node=node)


@pytest.fixture(scope="module")
def view() -> View:
    return _view()


@pytest.fixture
async def api(view: View) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(view, extra_routers=[owners_router(OwnerQueries(_owners, OwnersLimits()))])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        yield c


AT = rfc3339(g.T0 + 12 * g.MIN + 500)
ENDPOINTS = [
    ("pods", "/v1/pods"),
    ("pods-active", "/v1/pods?active=true&node=gpu-a"),
    ("pod-train", f"/v1/pods/{g.uid(1)}"),
    ("pod-checkpoint-only", f"/v1/pods/{g.uid(9)}"),
    ("gpus", "/v1/gpus"),
    ("gpu-mig", f"/v1/gpus/{g.gpu(g.A, 2)}"),
    ("idle", "/v1/idle"),
    ("idle-strict", "/v1/idle?threshold_pct=2&window=2m"),
    ("xid", "/v1/xid"),
    ("findings", "/v1/findings"),
    ("policy", "/v1/policy"),
    ("owners", f"/v1/owners?at={AT}"),
    ("owners-gpu", f"/v1/owners?at={AT}&gpu_uuid={g.gpu(g.A, 0)}"),
    ("usage", "/v1/usage?from=20m"),
    ("usage-pod", "/v1/usage?from=20m&by=pod"),
    ("healthz", "/healthz"),
    ("readyz", "/readyz"),
]


@pytest.mark.parametrize(("name", "url"), ENDPOINTS, ids=[n for n, _ in ENDPOINTS])
async def test_endpoint(api: httpx.AsyncClient, name: str, url: str) -> None:
    r = await api.get(url)
    assert r.status_code == 200, r.text
    _check(f"api-{name}.json", json.dumps(r.json(), indent=2) + "\n")


def test_every_endpoint_has_a_golden(view: View) -> None:
    app = create_app(view, extra_routers=[owners_router(OwnerQueries(_owners, OwnersLimits()))])
    documented = set(app.openapi()["paths"])
    served = {url.split("?")[0].replace(g.uid(1), "{pod_uid}").replace(g.uid(9), "{pod_uid}")
              .replace(g.gpu(g.A, 2), "{gpu_uuid}") for _, url in ENDPOINTS}
    # /metrics is Prometheus text, not JSON: test_api_metrics pins it.
    assert documented - served == {"/metrics"}


def test_replay_format_json() -> None:
    """The bytes `periscope replay --from T --to T --format json` writes for the scenario's inputs, the
    last 20 seconds of it (the outputs in range; the whole history replayed before them)."""
    from_ms, to_ms = g.END - 20 * g.S, g.END
    filters: dict[str, str | None] = {"pod": None, "gpu": None, "node": None}
    config = range_config(from_ms, to_ms, ReplaySettings(), filters)
    buf = io.BytesIO()
    with Spool() as spool:
        result = replay_to_spool(g.events(), config, spool, workers=1)
        stats = ReadStats(records=len(g.events()), events=len(g.events()))
        write_document(buf, spooled_document(from_ms, to_ms, result, stats, filters), spool)
    _check("replay-range.json", buf.getvalue().decode())


def test_replay_at_format_json() -> None:
    doc = owners_from_events(g.events(), g.T0 + 12 * g.MIN + 500)
    _check("replay-at.json", json.dumps(doc, indent=2) + "\n")
