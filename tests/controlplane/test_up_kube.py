"""`periscope up --apiserver kube` end to end: the simulated cluster written into Kubernetes' own
apiserver, the real watcher reading it there, `--api-auth` decided by its TokenReview and RBAC. A short
scenario with a reused name (a StatefulSet restart), a Job and two teams; scored as the simulated
apiserver's runs are, and read by a namespace-limited user while it runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from periscope.sim.report.score import ReportOptions, Truth, build_report
from periscope.sim.report.text import read_jsonl
from tests.controlplane.conftest import needs_controlplane
from tests.e2e.support import marked_env, marked_pids

SCENARIO = """
name: kube-churn
seed: 5
duration: 12s
tick: 1s
nodes:
  - name: kube-a
    gpus:
      - {model: NVIDIA A10, memory_mib: 23028}
      - {model: NVIDIA A10, memory_mib: 23028}
pods:
  - {namespace: batch, name: worker-0, node: kube-a, owner: {kind: StatefulSet, name: worker}, stop: 5s,
     containers: [{name: main, util_pct: 80, memory_mib: 12000}]}
  - {namespace: batch, name: worker-0, node: kube-a, owner: {kind: StatefulSet, name: worker}, start: 5s,
     containers: [{name: main, util_pct: 20, memory_mib: 3000}]}
  - {namespace: etl, name: etl-1-x7k2p, node: kube-a, owner: {kind: Job, name: etl-1}, start: 2s, stop: 9s,
     containers: [{name: job, util_pct: 95, memory_mib: 20000}]}
policy:
  state: ready
users:
  - {name: ops, token: ops-token, cluster: true}
  - {name: batch-team, token: batch-token, namespaces: [batch]}
"""


def test_up_on_a_real_apiserver_scores_as_on_the_simulated_one(tmp_path: Path) -> None:
    needs_controlplane()
    scenario, truth = tmp_path / "kube-churn.yaml", tmp_path / "truth.jsonl"
    scenario.write_text(SCENARIO)
    marker = uuid.uuid4().hex
    args = [
        sys.executable,
        "-m",
        "periscope.cli.main",
        "up",
        "--apiserver",
        "kube",
        "--api-auth",
        "--scenario",
        str(scenario),
        "--truth",
        str(truth),
        "--exit-at-end",
        "--api-port",
        "0",
        "--broker-port",
        "0",
    ]
    log = tmp_path / "up.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            args, env=marked_env(marker), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        api = _api_url(log, proc, 150)
        seen: set[str] = set()
        with httpx.Client(base_url=api, timeout=10) as client:
            while proc.poll() is None:
                r = client.get("/v1/pods", headers={"Authorization": "Bearer batch-token"})
                if r.status_code == 200:
                    seen |= {p["namespace"] for p in r.json()["items"]}
                    everyone = client.get("/v1/pods", headers={"Authorization": "Bearer ops-token"}).json()
                    if {p["namespace"] for p in everyone["items"]} >= {"batch", "etl"}:
                        assert (
                            client.get(
                                "/v1/policy", headers={"Authorization": "Bearer batch-token"}
                            ).status_code
                            == 403
                        )
                        break
                time.sleep(0.5)
        assert seen == {"batch"}  # never etl's pods, though the view holds them
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not marked_pids(marker), "processes left behind by periscope up"
    output = log.read_text()
    assert "apiserver: https://127.0.0.1:" in output
    t = Truth(read_jsonl(truth))
    report = build_report(t, read_jsonl(truth.with_name("truth.api.jsonl")), ReportOptions())
    p = report["periscope"]
    assert report["snapshots"] >= 0.8 * report["ticks"], report
    assert p["owners"]["total"] > 0 and p["owners"]["share"] == 1.0, p["examples"]
    assert p["reused_names"]["total"] > 0 and p["reused_names"]["share"] == 1.0, p["examples"]
    assert p["exclusive_util"]["share"] == 1.0, p["examples"]
    uids = {r["pod_uid"] for rows in t.ticks.values() for r in rows.values() if r["pod"] == "worker-0"}
    assert len(uids) == 2  # two generations; their UIDs are the apiserver's, adopted by the kubelet's state


def _api_url(log: Path, proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("api: http"):
                return line.split(" ", 1)[1].strip()
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"no api line in {timeout_s}s: {log.read_text()[-2000:]}")


def test_up_kube_without_go_is_one_line_exit_2(tmp_path: Path) -> None:
    """No cached build and no Go on PATH: `up --apiserver kube` says so in one line before starting."""
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "XDG_CACHE_HOME": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "periscope.cli.main",
            "up",
            "--apiserver",
            "kube",
            "--api-port",
            "0",
            "--broker-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("periscope: --apiserver kube: ")
    assert "Go" in proc.stderr and proc.stdout == ""
