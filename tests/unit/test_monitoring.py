"""deploy/monitoring: the PrometheusRule and ServiceMonitor (checked structurally: no schema is bundled
for prometheus-operator kinds), the alerts with promtool, the runbook links and the Grafana dashboard.

The dashboard's queries are run against a real Prometheus in tests/e2e/test_operator_views.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from periscope.core.findings import health_findings
from periscope.core.model import SourceHealth
from services.api.status import ConsumerStatus
from services.probe.metrics import ProbeMetrics
from tests.unit.test_api_metrics import scrape
from tests.unit.test_api_samples import pod, row, sample_view
from tests.unit.test_deploy import _find, _flavour

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "monitoring"
DASHBOARD = MONITORING / "periscope-dashboard.json"
RULE = MONITORING / "prometheusrule.yaml"
ALERT_TESTS = REPO / "tests" / "monitoring" / "alerts.test.yaml"
RUNBOOK = REPO / "docs" / "runbook.md"
ALERTS = {
    "PeriscopeGpuAllocatedIdle", "PeriscopeXidWithOwner", "PeriscopeSourceUnhealthy",
    "PeriscopeUnattributedUsage", "PeriscopePipelineStale", "PeriscopeDeadLettersGrowing",
}
PROMTOOL = shutil.which("promtool")
NEEDS_PROMTOOL = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not on PATH (Debian/Ubuntu: apt-get install prometheus)"
)


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def queries() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULE.read_text())["spec"]["groups"]
    return groups


def test_the_component_adds_the_rule_the_service_monitor_and_the_dashboard() -> None:
    docs = _flavour("monitoring")
    rule = _find(docs, "PrometheusRule", "periscope")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["namespace"] == "periscope"
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"} and set(rule["spec"]) == {"groups"}
    monitor = _find(docs, "ServiceMonitor", "periscope-api")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    svc = _find(docs, "Service", "periscope-api")
    assert monitor["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [svc["metadata"]["namespace"]]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]} and endpoint["path"] == "/metrics"
    # The API serves HTTPS with access control on: the scrape verifies it and sends a token that may
    # read /metrics and nothing else.
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"]["name"] == "periscope-api-tls"
    token = endpoint["authorization"]["credentials"]["name"]
    secret = _find(docs, "Secret", token)
    assert secret["type"] == "kubernetes.io/service-account-token"
    role = _find(docs, "ClusterRole", "periscope-metrics-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert svc["metadata"]["labels"].items() >= monitor["spec"]["selector"]["matchLabels"].items()
    cm = _find(docs, "ConfigMap", "periscope-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["periscope-dashboard.json"]) == dashboard()


def test_every_alert_has_severity_summary_description_and_a_runbook_section() -> None:
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", RUNBOOK.read_text(), re.MULTILINE)
    }
    seen = set()
    for group in rule_groups():
        assert set(group) == {"name", "rules"}
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            seen.add(rule["alert"])
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}
            notes = rule["annotations"]
            assert set(notes) == {"summary", "description", "runbook_url"}, rule["alert"]
            page, _, anchor = notes["runbook_url"].partition("#")
            assert page == "docs/runbook.md" and anchor in anchors, notes["runbook_url"]
    assert seen == ALERTS


async def test_every_series_the_dashboard_and_alerts_use_is_exported() -> None:
    view = sample_view()
    for f in health_findings("gpu-a", view.as_of_ms, [SourceHealth("nvml", "error")]):
        view.apply(f)
    # A pod with DCGM profiling values (the sample view has none: its series would not be exported).
    profiled = row("GPU-c0", sm_active_pct=40.0, sm_occupancy_pct=20.0, tensor_active_pct=30.0,
                   dram_active_pct=10.0)
    view.apply(pod("uid-dcgm", "ml", "prof-0", "gpu-c", profiled))
    status = ConsumerStatus(ready=True, connected=True, lag={("periscope.attribution.v1", 0): 3})
    exported = set(await scrape(view, status))
    # The probes' own /metrics (the dcgm-exporter scrapes panel reads them).
    probe = ProbeMetrics("gpu-a")
    probe.dcgm_scrapes.labels("gpu-a", "ok").inc()
    exported |= {s.name for fam in probe.registry.collect() for s in fam.samples}
    exprs = queries() + [r["expr"] for g in rule_groups() for r in g["rules"]]
    used = {n for e in exprs for n in re.findall(r"\b(periscope_[a-z_]+)", e)}
    assert used and used <= exported, used - exported


def test_the_dashboard_has_the_variables_and_panels_operators_need() -> None:
    d = dashboard()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert {"namespace", "node"} <= set(variables)
    for name in ("namespace", "node"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    titles = {p["title"] for p in panels()}
    assert {
        "GPU owners by pod", "Per-pod GPU utilization", "Per-pod GPU memory", "Per-pod GPU power",
        "Split on shared GPUs", "Idle pods", "Wasted GPU-hours by namespace",
        "XIDs with the owner at the time", "MIG layout", "Data age", "Consumer lag", "Dead letters",
        "Source health", "Top namespaces by idle GPU-hours", "GPU efficiency by namespace",
        "Per-pod SM activity (DCGM)", "Per-pod SM occupancy (DCGM)", "Per-pod tensor pipe activity (DCGM)",
        "Per-pod DRAM activity (DCGM)", "dcgm-exporter scrapes by result",
    } <= titles
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels():
        assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
    pod_panels = [p for p in panels() if "periscope_pod_" in p["targets"][0]["expr"]]
    assert pod_panels and all('namespace=~"$namespace"' in p["targets"][0]["expr"] for p in pod_panels)


@NEEDS_PROMTOOL
def test_promtool_accepts_the_rules_and_every_alert_passes_its_unit_tests(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    check = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{len(ALERTS)} rules found" in check.stdout
    cases = yaml.safe_load(ALERT_TESTS.read_text())
    tested = {t["alertname"] for case in cases["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == ALERTS  # each alert is shown to fire at least once
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    run = subprocess.run(
        [PROMTOOL, "test", "rules", ALERT_TESTS.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
