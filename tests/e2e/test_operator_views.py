"""What operators look at, against one running `periscope up` on a short scenario: a real Prometheus
scrapes it (every dashboard query parses, most return data, the idle alert selects the idle pod), a
real headless Chromium renders the web view, and `periscope top` reads the API over HTTP.

Prometheus and Chromium come from the Debian packages `prometheus` and `chromium`; their tests skip
when the binary is absent (CI installs both).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from periscope.contract.values import parse_time_ms
from periscope.devkit.launch import free_port
from tests import chromium
from tests.chromium import NEEDS_CHROMIUM
from tests.e2e.support import marked_env, marked_pids, periscope

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "monitoring"
PROMETHEUS = shutil.which("prometheus")
NEEDS_PROMETHEUS = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not on PATH (Debian/Ubuntu: apt-get install prometheus)"
)

# Small on purpose: three nodes cover an exclusive busy pod, an idle notebook, a time-sliced GPU shared
# by two pods, a MIG slice and an XID that hits a pod.
SCENARIO = {
    "name": "operator-views",
    "seed": 11,
    "duration": "10m",
    "tick": "1s",
    "nodes": [
        {"name": "gpu-x", "gpus": [{"model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}] * 2},
        {"name": "gpu-y", "gpus": [{"model": "Tesla T4", "memory_mib": 15360}],
         "sharing": {"strategy": "time-slicing", "replicas": 2}},
        {"name": "gpu-z", "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920,
                                    "mig": ["3g.40gb", "3g.40gb"]}]},
    ],
    "pods": [
        {"namespace": "train", "name": "busy-trainer", "node": "gpu-x", "containers": [
            {"name": "trainer", "resource": "nvidia.com/gpu", "util_pct": 90, "memory_mib": 40000,
             "devices": ["0"]}]},
        {"namespace": "notebooks", "name": "idle-notebook", "node": "gpu-x", "containers": [
            {"name": "notebook", "resource": "nvidia.com/gpu", "util_pct": 0, "memory_mib": 1000,
             "devices": ["1"]}]},
        {"namespace": "web", "name": "shared-a", "node": "gpu-y", "containers": [
            {"name": "server", "resource": "nvidia.com/gpu", "util_pct": 30, "memory_mib": 3000}]},
        {"namespace": "web", "name": "shared-b", "node": "gpu-y", "containers": [
            {"name": "server", "resource": "nvidia.com/gpu", "util_pct": 20, "memory_mib": 2000}]},
        {"namespace": "infer", "name": "mig-server", "node": "gpu-z", "containers": [
            {"name": "server", "resource": "nvidia.com/mig-3g.40gb", "util_pct": 50, "memory_mib": 9000}]},
    ],
    "events": [{"at": "3s", "xid": {"node": "gpu-x", "gpu": 0, "code": 31}}],
}
PODS = [p["name"] for p in SCENARIO["pods"]]


def wait_until(what: str, check: Any, timeout_s: float, interval_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@dataclass
class Stack:
    api: str
    lines: list[str]
    token: str  # the marker in the environment of every process `up` started


def probe_targets(token: str) -> list[str]:
    """host:port of each probe's health port (its /metrics), read from the probes' environment."""
    out = []
    for pid in marked_pids(token):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if b"PERISCOPE_NODE_NAME" in env and b"PERISCOPE_HEALTH_PORT" in env:
            out.append(f"127.0.0.1:{env[b'PERISCOPE_HEALTH_PORT'].decode()}")
    return sorted(out)


@pytest.fixture(scope="module")
def stack(module_tmp: Path) -> Iterator[Stack]:
    scenario = module_tmp / "operator-views.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    token = uuid.uuid4().hex
    proc = subprocess.Popen(
        periscope("up", "--scenario", str(scenario), "--api-port", "0", "--broker-port", "0",
                  "--idle-window", "10s"),
        env=marked_env(token), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0,
    )
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        api = ""
        while not api and time.monotonic() < deadline and proc.poll() is None:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            seen.append(line)
            if m := re.match(r"^api: (http://127\.0\.0\.1:\d+)$", line):
                api = m.group(1)
        assert api, "periscope up did not get ready:\n" + "\n".join(seen[-60:])
        # The idle notebook is flagged once a whole idle window has passed; the XID comes at 3s.
        wait_until("the idle notebook", lambda: httpx.get(f"{api}/v1/idle", timeout=5).json()["items"], 90)
        wait_until("the XID", lambda: httpx.get(f"{api}/v1/xid", timeout=5).json()["items"], 30)
        yield Stack(api, seen, token)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(45)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for pid in marked_pids(token):  # never leak into the rest of the suite
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def prometheus(stack: Stack, module_tmp: Path) -> Iterator[str]:
    assert PROMETHEUS is not None
    port = free_port()
    config = module_tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{
            "job_name": "periscope-api",
            "static_configs": [{"targets": [stack.api.removeprefix("http://")]}],
        }, {  # the probes' own /metrics: the dcgm-exporter scrapes panel
            "job_name": "periscope-probe",
            "static_configs": [{"targets": probe_targets(stack.token)}],
        }],
    }))
    log = (module_tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={module_tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until("prometheus ready", lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200, 60)
        # Enough scrapes that the range functions (increase over 10m) have two points.
        wait_until("three scrapes", lambda: len(query(url, "periscope_api_ready[1m]")[0]["values"]) >= 3, 60)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def query(url: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body.get('error')}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads((MONITORING / "periscope-dashboard.json").read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = re.sub(r"\$(namespace|node)\b", ".*", target["expr"]).replace("$__range", "1h")
            out.append((panel["title"], expr))
    return out


def test_the_banner_prints_the_web_view_first(stack: Stack) -> None:
    banner = next(i for i, line in enumerate(stack.lines) if line.startswith("periscope up: "))
    assert stack.lines[banner - 1] == f"web: {stack.api}/"


@NEEDS_PROMETHEUS
@pytest.mark.timeout(300)
def test_every_dashboard_query_parses_and_most_return_data(prometheus: str) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 15
    empty = [title for title, expr in queries if not query(prometheus, expr)]
    # Only what a healthy short run cannot show may be empty (no source is unhealthy here).
    assert set(empty) <= {"Source health"}, empty
    variables = json.loads((MONITORING / "periscope-dashboard.json").read_text())["templating"]["list"]
    for v in variables:
        if v["type"] == "query":  # label_values(metric, label): the metric has the label
            m = re.fullmatch(r"label_values\((\w+), (\w+)\)", v["query"]["query"])
            assert m is not None, v["query"]
            metric, label = m.groups()
            assert {s["metric"][label] for s in query(prometheus, metric)}, v["name"]


@NEEDS_PROMETHEUS
@pytest.mark.timeout(300)
def test_the_idle_alert_selects_the_idle_pod_and_only_it(prometheus: str, stack: Stack) -> None:
    rules = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]["groups"]
    by_name = {r["alert"]: r for g in rules for r in g["rules"]}
    hits = query(prometheus, by_name["PeriscopeGpuAllocatedIdle"]["expr"])
    assert [(h["metric"]["namespace"], h["metric"]["pod"]) for h in hits] == [("notebooks", "idle-notebook")]
    assert float(hits[0]["value"][1]) > 0
    xid = query(prometheus, by_name["PeriscopeXidWithOwner"]["expr"])
    assert {(h["metric"]["pod"], h["metric"]["code"]) for h in xid} == {("busy-trainer", "31")}
    for name in ("PeriscopeSourceUnhealthy", "PeriscopeUnattributedUsage", "PeriscopePipelineStale",
                 "PeriscopeDeadLettersGrowing"):
        assert query(prometheus, by_name[name]["expr"]) == [], name  # a healthy run alerts on nothing else


@NEEDS_PROMETHEUS
@pytest.mark.timeout(300)
def test_gpu_hours_counters_and_usage_agree_on_who_held_and_who_wasted(prometheus: str, stack: Stack) -> None:
    # The counters grow as windows close; the API's /v1/usage sums the same windows it holds.
    def by_namespace(metric: str) -> dict[str, float]:
        hits = query(prometheus, f"sum by (namespace) ({metric})")
        return {h["metric"]["namespace"]: float(h["value"][1]) for h in hits}

    every = {"train", "notebooks", "web", "infer"}

    def counted() -> tuple[dict[str, float], dict[str, float], dict[str, float]] | None:
        # The idle hours start once the idle window has passed and a window closed after it: on a
        # loaded machine that may be after every namespace has allocated hours.
        a, i, u = (by_namespace(f"periscope_gpu_hours_{k}_total") for k in ("allocated", "idle", "used"))
        return (a, i, u) if every <= set(a) and i.get("notebooks", 0.0) > 0 else None

    allocated, idle, used = wait_until("GPU-hours of every namespace, idle ones included", counted, 90)
    assert idle["notebooks"] > 0 and idle.get("train", 0.0) == 0.0, idle
    assert used["train"] > 0.8 * allocated["train"] and used["notebooks"] == 0.0, used
    # The two time-sliced pods split one T4: together they hold at most what the GPU has, i.e. the time
    # from the first sample of either to the latest (read after the counters; one window of slack for
    # the half interval a holding is charged before its first sample). Compared with another node's pod
    # instead, the answer would depend on which node's windows had closed last.
    rows = httpx.get(f"{stack.api}/v1/pods", params={"namespace": "web"}, timeout=10).json()["items"]
    span_ms = (max(parse_time_ms(r["last_seen"]) for r in rows)
               - min(parse_time_ms(r["first_seen"]) for r in rows))
    assert allocated["web"] <= (span_ms + 2_000) / 3_600_000, (allocated, span_ms)
    workloads = {h["metric"]["workload"] for h in query(prometheus, "periscope_gpu_hours_allocated_total")}
    assert workloads == {"Pod"}  # the scenario's pods have no controller
    doc = httpx.get(f"{stack.api}/v1/usage", params={"from": "30m", "by": "namespace"}, timeout=10).json()
    groups = {g["key"]: g for g in doc["groups"]}
    assert every <= set(groups), doc
    assert groups["notebooks"]["idle_gpu_hours"] > 0 and groups["train"]["efficiency"] > 0.85
    total = sum(g["allocated_gpu_hours"] for g in doc["groups"])
    assert doc["total"]["allocated_gpu_hours"] == pytest.approx(total, abs=1e-5)
    too_old = httpx.get(f"{stack.api}/v1/usage", params={"from": "2h"}, timeout=10)
    assert too_old.status_code == 400 and "periscope usage" in too_old.json()["error"]


@NEEDS_CHROMIUM
@pytest.mark.timeout(300)
def test_the_web_view_shows_the_scenarios_pods_and_gpus(stack: Stack, module_tmp: Path) -> None:
    def slice_util() -> bool:
        """The API has the MIG slice holder's utilization: the probe drops DCGM values after two failed
        scrapes in a row, which a loaded machine can cause, and then a slice has none (NVML has none)."""
        items = httpx.get(f"{stack.api}/v1/pods", params={"namespace": "infer"}, timeout=5).json()["items"]
        return any(r["pod"] == "mig-server" and r["util_pct"] == 50 for r in items)

    wait_until("the MIG slice holder's utilization in the API", slice_util, 60)
    dom = chromium.dom(f"{stack.api}/", module_tmp / "chromium")
    gpus = httpx.get(f"{stack.api}/v1/gpus", timeout=5).json()["items"]
    pods = httpx.get(f"{stack.api}/v1/pods?active=true", timeout=5).json()["items"]
    assert len(gpus) == 4 and {p["pod"] for p in pods} == set(PODS)
    for g in gpus:  # every GPU is drawn, under its node
        assert f'data-gpu="{g["gpu_uuid"]}"' in dom, g["gpu_uuid"]
    for p in pods:  # every owner, with the short UID that tells reused names apart
        assert p["pod"] in dom and p["pod_uid"][:8] in dom, p["pod"]
    idle = dom.split('id="idle"', 1)[1].split("</section>", 1)[0]
    assert "notebooks/idle-notebook" in idle and "busy-trainer" not in idle
    xids = dom.split('id="xids"', 1)[1].split("</section>", 1)[0]
    assert ">31<" in xids and "train/busy-trainer" in xids
    assert "3g.40gb" in dom and "free" in dom  # the MIG layout: one slice held, one free
    assert " 50%" in dom.split("mig-server", 1)[1][:400]  # the slice holder's util (DCGM)
    assert 'class="bad"' not in dom.split('id="status"', 1)[1].split("</span>", 1)[0]


@pytest.mark.timeout(300)
def test_periscope_top_reads_the_api_over_http(stack: Stack) -> None:
    out = subprocess.run(
        [*periscope("top", "--api", stack.api, "--once")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("as of ") and lines[1].split()[:3] == ["NODE", "GPU", "DEVICE"]
    for name in PODS:
        assert sum(f" {name} " in line for line in lines) == 1, name
    (mig,) = [line for line in lines if " mig-server " in line]
    assert "3g.40gb" in mig and "gpu-z" in mig
    # the MIG slice's util from the node's dcgm-exporter (UTIL%, then the DCGM columns SM% TENSOR% DRAM%)
    assert "SM%" in lines[1] and mig.split()[9] == "50", mig
    idle = subprocess.run(
        [*periscope("top", "--api", stack.api, "--once", "--namespace", "notebooks", "--sort", "idle")],
        capture_output=True, text=True, timeout=60,
    )
    assert idle.returncode == 0, idle.stderr
    (row,) = idle.stdout.splitlines()[2:]
    assert " idle-notebook " in row and float(row.split()[-1]) > 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_periscope_top_keeps_refreshing_until_ctrl_c(stack: Stack, sigint: str) -> None:
    # A non-interactive shell starts background jobs with SIGINT ignored, and children inherit that.
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint == "ignored" else None
    proc = subprocess.Popen(
        periscope("top", "--api", stack.api, "--interval", "0.5"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200"},  # a pipe has no width; a terminal would say
        preexec_fn=ignore,
    )
    try:
        time.sleep(4)
        assert proc.poll() is None, proc.communicate()  # still running: it is live, not one-shot
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    for name in PODS:
        assert f" {name} " in out, name
