"""A joiner that catches up is right: stopped for three minutes of scenario time while pods are replaced
(same names, new UIDs) and XIDs fire, then started again on the backlog its consumer group missed. Faust
reads the input topics round-robin, so telemetry and XIDs come ahead of the allocations and pods of
their time; with event-time alignment every XID still names the pod that held the GPU at the error,
and the final attribution is the truth's. On both brokers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.support import Run, assert_checked, run_scenario
from tests.kafka_tier import kafka_missing

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]

XID_AT = (40, 75, 100, 130, 170, 200)  # seconds; the joiner is down from 30s to 3m30s


def _scenario() -> dict[str, Any]:
    pods: list[dict[str, Any]] = []
    for gpu, (first, period) in enumerate(((0, 35), (10, 45))):
        starts = list(range(first, 300, period))
        for k, start in enumerate(starts):  # a StatefulSet pod restarted every period: same name, new UID
            pod: dict[str, Any] = {
                "namespace": "batch", "name": f"worker-{gpu}", "node": "gpu-a",
                "owner": {"kind": "StatefulSet", "name": "worker"}, "start": f"{start}s",
                "containers": [{"name": "main", "util_pct": 20 + 10 * (k % 7), "memory_mib": 4000,
                                "devices": [str(gpu)]}]}
            if k + 1 < len(starts):
                pod["stop"] = f"{starts[k + 1] - 2}s"
            pods.append(pod)
    events: list[dict[str, Any]] = [{"at": "30s", "fault": "joiner-stop", "duration": "3m"}]
    events += [{"at": f"{t}s", "xid": {"node": "gpu-a", "gpu": i % 2, "code": 13 + i}}
               for i, t in enumerate(XID_AT)]
    # Two and a half minutes after the joiner is back: it catches up while the sampler watches, then runs
    # live (a caught-up worker publishes each key's newest state, so the API's distinct states come mostly
    # from the live minutes: GPU states on change or every 5 s heartbeat).
    return {"name": "catch-up", "seed": 5, "duration": "6m", "tick": "1s",
            "nodes": [{"name": "gpu-a", "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}] * 2}],  # noqa: E501
            "pods": pods, "events": events}


@pytest.fixture(scope="module", params=["embedded", "kafka"])
def caught_up(request: pytest.FixtureRequest, module_tmp: Path) -> Run:
    if request.param == "kafka" and kafka_missing():
        pytest.skip(kafka_missing())
    if request.param == "kafka":
        request.applymarker(pytest.mark.kafka)
    tmp = module_tmp / request.param
    tmp.mkdir()
    scenario = tmp / "catch-up.yaml"
    scenario.write_text(yaml.safe_dump(_scenario(), sort_keys=False))
    return run_scenario(tmp, str(scenario), 5, "--broker", request.param, timeout_s=240)


def test_every_xid_during_the_stop_names_its_owner_at_the_error(caught_up: Run) -> None:
    assert "[up] fault at 30s: stopped joiner for 3m" in caught_up.output
    assert "[up] joiner started again" in caught_up.output
    x = caught_up.report["periscope"]["xid_owners"]
    said = [(i["at"], i["gpu_uuid"], i["code"], [o["pod_uid"] for o in i["owners"]])
            for i in caught_up.final["xid"]]
    true = [(t["at_ms"], t["gpu_uuid"], t["code"], [o["pod_uid"] for o in t["owners"]])
            for t in caught_up.truth.xids]
    behind = caught_up.report["simulator_behind"]
    assert x["total"] == len(XID_AT) and x["share"] == 1.0, (
        f"said {said}\ntrue {true}\nsimulator behind: {behind}\n{caught_up.story()}")


def test_what_the_api_served_while_catching_up_was_true_at_its_time(caught_up: Run) -> None:
    # Every GPU owner the API showed (sampled every tick, the catch-up included), against the truth at
    # the time of the sample it came from; and the restarted pods' utilization under their new UIDs.
    p = caught_up.report["periscope"]
    assert p["owners"]["total"] > 50 and p["owners"]["share"] == 1.0, (p["examples"], caught_up.story())
    assert p["reused_names"]["total"] > 0 and p["reused_names"]["share"] == 1.0, (
        p["examples"], caught_up.report["simulator_behind"])
    assert_checked(caught_up)
