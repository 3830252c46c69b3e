"""The Helm chart deploy/helm/periscope, rendered by a real `helm` (periscope.devkit.helm builds it once).

`helm lint` is clean; `helm template` renders for the defaults and every preset, and each rendering
validates against the Kubernetes schemas; values.schema.json rejects unknown keys; and for every
configuration that deploy/ also has, the chart renders the same objects as kustomize (the Python
renderer of tests/unit/test_deploy.py), differing only as DOCUMENTED_DIFFERENCES says, so the two
cannot drift apart.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from periscope.bus.admin import TopicSettings
from periscope.devkit import helm as helm_build
from periscope.devkit.helm import HelmUnavailable, binary, home
from tests.unit.test_deploy import (
    CORE_KINDS,
    DEPLOY,
    K8S_VERSIONS,
    WORKLOADS,
    _apply_component,
    _by_name,
    _flavour,
    _render,
)

CHART = DEPLOY / "helm" / "periscope"
DOCS = DEPLOY.parent / "docs" / "deploy.md"
CRD_KINDS = {"PrometheusRule", "ServiceMonitor", "KafkaUser"}
Doc = dict[str, Any]


# A cold first use builds helm (minutes on 2 cores), past the suite's per-test timeout; warm runs keep it.
pytestmark = [] if (home() / "complete").exists() else [pytest.mark.timeout(1800)]


@functools.cache
def _built() -> tuple[str, str]:
    """(the helm binary, "") or ("", why there is none): tried once per session."""
    try:
        return str(binary()), ""
    except HelmUnavailable as e:
        return "", f"Helm tier skipped: {e}"


def _helm() -> str:
    helm, why = _built()
    if not helm:
        pytest.skip(why)
    return helm


def _run(*args: str, values: Doc | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        json.dump(values or {}, f)  # JSON is YAML, and keeps every type exact
        f.flush()
        argv = [_helm(), *args, *(["-f", f.name] if values is not None else [])]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if check:
        assert out.returncode == 0, out.stderr
    return out


@functools.cache
def _template_json(values: str) -> str:
    out = _run("template", "periscope", str(CHART), values=json.loads(values))
    return json.dumps([d for d in yaml.safe_load_all(out.stdout) if d])


def _chart(values: Doc | None = None) -> list[Doc]:
    """One rendering of the chart (rendered once per test run; a fresh copy each call)."""
    docs: list[Doc] = json.loads(_template_json(json.dumps(values or {}, sort_keys=True)))
    return docs


def _find(docs: list[Doc], kind: str, name: str) -> Doc:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _config(docs: list[Doc]) -> Doc:
    """The shared settings: both copies of periscope-config, asserted equal."""
    copies = [d["data"] for d in docs
              if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "periscope-config"]
    assert len(copies) == 2 and copies[0] == copies[1]
    return copies[0]


# Every preset: its values, and the kustomize flavour it must equal (None: the chart alone has it).
SASL = {"mechanism": "SCRAM-SHA-512", "username": "periscope", "passwordKey": "password"}
SECURE = {"kafka": {"securityProtocol": "SASL_SSL", "tls": {"caKey": "ca.crt"}, "sasl": SASL}}
PRESETS: dict[str, tuple[Doc, str | None]] = {
    "default": ({}, "base"),
    "gke": ({"platform": "gke"}, "components/gke"),
    "eks": ({"platform": "eks"}, "components/eks"),
    "aks": ({"platform": "aks"}, "components/aks"),
    "microk8s": ({"platform": "microk8s"}, "components/microk8s"),
    "k0s": ({"platform": "k0s"}, "components/k0s"),
    "mig-monitor": ({"probe": {"migMonitor": True}}, "components/mig-monitor"),
    "no-runtime-class": ({"probe": {"runtimeClassName": ""}}, "components/no-runtime-class"),
    "kafka-security": ({"kafka": {**SECURE["kafka"], "perComponentPrincipals": True}},
                       "components/kafka-security"),
    "leader-election": ({"watcher": {"leaderElection": True}}, "components/leader-election"),
    "monitoring": ({"monitoring": {"enabled": True}}, "monitoring"),
    "kafka-acls": ({"kafka": {"strimziUsers": {"create": True}}}, "components/kafka-acls"),
    "per-component-mtls": ({"kafka": {"securityProtocol": "SSL", "perComponentPrincipals": True, "tls": {
        "caKey": "ca.crt", "certKey": "tls.crt", "keyKey": "tls.key"}}}, None),
    "per-component-sasl": ({"kafka": {"securityProtocol": "SASL_SSL", "perComponentPrincipals": True,
                                      "strimziUsers": {"create": True}}}, None),
    "no-auth-no-tls": ({"api": {"auth": "none", "tls": {"enabled": False}},
                        "monitoring": {"enabled": True}}, None),
    "everything": ({"platform": "gke", "probe": {"migMonitor": True}, "watcher": {"leaderElection": True},
                    "joiner": {"replicas": 4}, "api": {"replicas": 2}, "imagePullSecrets": ["regcred"],
                    "image": {"repository": "registry.example.com/periscope", "tag": "0.2.0"},
                    "monitoring": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
                    "namespaces": {"main": "gpu-attribution", "node": "gpu-attribution-node"},
                    "topics": {"partitions": 8, "replicationFactor": 3, "minInsyncReplicas": 2}, **SECURE},
                   None),
}


def _kustomize(flavour: str) -> list[Doc]:
    if flavour == "components/microk8s":  # only inside overlays/microk8s there (with a bundled Kafka)
        return _apply_component(DEPLOY / "components" / "microk8s", _render(DEPLOY / "base"))
    return _flavour(flavour)


# ---- lint, render, validate -------------------------------------------------------------------------

def test_the_chart_lints_clean_in_strict_mode() -> None:
    for name in ("default", "gke", "kafka-security", "everything"):
        out = _run("lint", "--strict", str(CHART), values=PRESETS[name][0], check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "0 chart(s) failed" in out.stdout, out.stdout
        assert not re.search(r"\[(WARNING|ERROR)\]", out.stdout + out.stderr), out.stdout + out.stderr


_VALIDATED: set[tuple[str, str]] = set()


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_renders_objects_valid_for_kubernetes(preset: str) -> None:
    docs = _chart(PRESETS[preset][0])
    assert docs
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        assert doc["kind"] in CORE_KINDS, f"{doc['kind']} has no bundled schema"
        for version in K8S_VERSIONS:
            key = (version, json.dumps(doc, sort_keys=True))
            if key not in _VALIDATED:
                kubernetes_validate.validate(doc, version, strict=True)
                _VALIDATED.add(key)
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), "duplicate resources"


# ---- the chart renders what kustomize does ----------------------------------------------------------

HELM_LABELS = {"helm.sh/chart": "periscope-0.1.0", "app.kubernetes.io/managed-by": "Helm",
               "app.kubernetes.io/instance": "periscope", "app.kubernetes.io/version": "0.1.0"}
TOPIC_ENV = {  # the topics Job's settings, spelled out in values.yaml with TopicSettings' defaults
    "PERISCOPE_TOPIC_PARTITIONS": "4", "PERISCOPE_TOPIC_REPLICATION_FACTOR": "1",
    "PERISCOPE_TOPIC_MIN_INSYNC_REPLICAS": "1", "PERISCOPE_INPUT_RETENTION": "7d",
    "PERISCOPE_OUTPUT_RETENTION": "1d", "PERISCOPE_DEADLETTER_RETENTION": "7d",
    "PERISCOPE_TOPIC_COMPRESSION": "lz4",
}
HOOK = {"helm.sh/hook": "post-install,post-upgrade", "helm.sh/hook-delete-policy": "before-hook-creation"}
DOCUMENTED_DIFFERENCES = """
1. every object's metadata.labels add Helm's four standard labels (HELM_LABELS);
2. the Namespaces are annotated helm.sh/resource-policy: keep (uninstall keeps your Secrets);
3. every pod template is annotated checksum/config (a changed periscope-config rolls the pods);
4. the topics Job is a post-install/post-upgrade hook (HOOK), and its container sets the seven topic
   settings of values.yaml, whose defaults equal TopicSettings' (TOPIC_ENV).
"""


def _undo_documented(doc: Doc) -> Doc:
    """The chart's object less DOCUMENTED_DIFFERENCES, each asserted present and exact on the way."""
    doc = copy.deepcopy(doc)
    meta = doc["metadata"]
    where = f"{doc['kind']}/{meta['name']}"
    assert {k: meta["labels"].pop(k, None) for k in HELM_LABELS} == HELM_LABELS, where
    annotations = meta.get("annotations", {})
    if doc["kind"] == "Namespace":
        assert annotations.pop("helm.sh/resource-policy") == "keep", where
    if doc["kind"] in WORKLOADS:
        template = doc["spec"]["template"]["metadata"]
        assert re.fullmatch(r"[0-9a-f]{64}", template["annotations"].pop("checksum/config")), where
        if not template["annotations"]:
            del template["annotations"]
    if doc["kind"] == "Job":
        assert {k: annotations.pop(k, None) for k in HOOK} == HOOK, where
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if e["name"] in TOPIC_ENV}
        assert env == TOPIC_ENV, where
        container["env"] = [e for e in container["env"] if e["name"] not in TOPIC_ENV]
        if not container["env"]:
            del container["env"]
    if "annotations" in meta and not annotations:
        del meta["annotations"]
    return doc


def _key(doc: Doc) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


@pytest.mark.parametrize("preset", sorted(p for p, (_, flavour) in PRESETS.items() if flavour))
def test_the_chart_renders_what_kustomize_does(preset: str) -> None:
    values, flavour = PRESETS[preset]
    assert flavour is not None
    theirs = {_key(d): _by_name(d) for d in _kustomize(flavour)}
    ours = {_key(d): _by_name(_undo_documented(d)) for d in _chart(values)}
    assert sorted(ours) == sorted(theirs)
    for key, doc in ours.items():
        assert doc == theirs[key], key


def test_the_documented_topic_defaults_are_the_topic_jobs_own() -> None:
    env = {k.removeprefix("PERISCOPE_").lower(): v for k, v in TOPIC_ENV.items()}
    settings = TopicSettings.model_validate(env)
    assert settings.plan() == TopicSettings().plan()


def test_the_equivalence_compare_catches_a_difference() -> None:
    """The comparison itself can fail: a changed field, or a documented difference gone missing."""
    chart, base = _chart(), {_key(d): _by_name(d) for d in _kustomize("base")}
    api = _find(chart, "Deployment", "periscope-api")
    api["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "1Gi"
    assert _by_name(_undo_documented(api)) != base[_key(api)]
    job = _find(chart, "Job", "periscope-topics")
    del job["metadata"]["annotations"]["helm.sh/hook"]
    with pytest.raises(AssertionError):
        _undo_documented(job)


# ---- what values change -----------------------------------------------------------------------------

def test_the_schema_rejects_unknown_keys_and_bad_values() -> None:
    bad: list[Doc] = [
        {"probe": {"nodeSelecter": {"a": "b"}}},  # a typo, nested
        {"joinr": {"replicas": 2}},  # a typo, top level
        {"kafka": {"tls": {"caFile": "ca.crt"}}},  # the environment variable's word, not the value's
        {"platform": "gcp"},
        {"kafka": {"bootstrap": "kafka.kafka.svc"}},  # no port
        {"topics": {"inputRetention": "7 days"}},
        {"joiner": {"replicas": "2"}},
        {"api": {"resources": {"requests": {"cpu": "100m", "memroy": "1Gi"}}}},  # deep in a quantity map
    ]
    for values in bad:
        out = _run("template", "periscope", str(CHART), values=values, check=False)
        assert out.returncode != 0, values
        assert "values don't meet the specifications of the schema" in out.stderr, out.stderr


def _schema_objects(node: Any, path: str = "$") -> list[tuple[str, Doc]]:
    if isinstance(node, dict):
        here = [(path, node)] if "properties" in node else []
        return here + [x for k, v in node.items() for x in _schema_objects(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [x for i, v in enumerate(node) for x in _schema_objects(v, f"{path}[{i}]")]
    return []


def test_every_object_of_the_schema_forbids_unknown_keys_and_lists_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    objects = _schema_objects(schema)
    assert len(objects) >= 15  # the top, every group of values, and the shared definitions
    for path, node in objects:
        assert node.get("additionalProperties") is False, path
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(schema["properties"]) - {"global"} == set(values)  # global: only a parent chart's
    assert set(schema["required"]) == set(values)


def test_combinations_the_schema_cannot_see_fail_with_a_reason() -> None:
    cases = [
        ({"kafka": {"securityProtocol": "SSL", "tls": {"certKey": "tls.crt"}}}, "go together"),
        ({"kafka": {"tls": {"caKey": "ca.crt"}}}, "use SSL or SASL_SSL"),
        ({"kafka": {"perComponentPrincipals": True}}, "needs authentication"),
        ({"joiner": {"replicas": 5}}, "exceeds topics.partitions"),
        ({"topics": {"replicationFactor": 1, "minInsyncReplicas": 2}}, "larger than"),
    ]
    for values, reason in cases:
        out = _run("template", "periscope", str(CHART), values=values, check=False)
        assert out.returncode != 0 and reason in out.stderr, (values, out.stderr)


def _pods(docs: list[Doc]) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] in WORKLOADS}


def test_a_settings_change_rolls_every_pod_and_a_replica_or_topic_change_none() -> None:
    before = _pods(_chart())
    moved = _pods(_chart({"kafka": {"bootstrap": "other.kafka.svc:9092"}}))
    scaled = _pods(_chart({"joiner": {"replicas": 2}}))
    assert set(before) == {"periscope-probe", "periscope-kube-watcher", "periscope-joiner", "periscope-api",
                           "periscope-topics"}
    topics = _pods(_chart({"topics": {"partitions": 8, "inputRetention": "30d"}}))
    for name, pod in before.items():
        assert pod["metadata"]["annotations"] != moved[name]["metadata"]["annotations"], name
        assert pod == scaled[name], name
        assert (pod == topics[name]) is (name != "periscope-topics"), name  # only the Job changes


def test_the_topic_settings_reach_the_job_as_the_topic_job_reads_them() -> None:
    topics = {"partitions": 12, "replicationFactor": 3, "minInsyncReplicas": 2, "inputRetention": "30d",
              "outputRetention": "36h", "deadletterRetention": "14d", "compression": "zstd"}
    job = _find(_chart({"topics": topics}), "Job", "periscope-topics")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"].removeprefix("PERISCOPE_").lower(): e["value"] for e in container["env"]}
    plan = TopicSettings.model_validate(env).plan()
    assert (plan.partitions, plan.replication_factor, plan.min_insync_replicas, plan.compression) == (
        12, 3, 2, "zstd")
    assert plan.retention_ms == {"input": 30 * 86_400_000, "output": 36 * 3_600_000,
                                 "deadletter": 14 * 86_400_000}


def test_per_component_principals_mount_only_their_own_secret() -> None:
    docs = _chart(PRESETS["per-component-sasl"][0])
    principal = {"periscope-probe": "probe", "periscope-kube-watcher": "watcher",
                 "periscope-joiner": "joiner", "periscope-api": "api", "periscope-topics": "admin"}
    for name, template in _pods(docs).items():
        pod = template["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "kafka-credentials"]
        assert volume["secret"] == {"secretName": f"periscope-kafka-{principal[name]}"}, name
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PERISCOPE_KAFKA_SASL_USERNAME"] == f"periscope-{principal[name]}", name
    config = _config(docs)
    assert "PERISCOPE_KAFKA_SASL_USERNAME" not in config
    assert config["PERISCOPE_KAFKA_SASL_PASSWORD_FILE"] == "/etc/periscope/kafka/password"
    users = {d["metadata"]["name"] for d in docs if d["kind"] == "KafkaUser"}
    assert users == {f"periscope-{p}" for p in principal.values()}


def test_network_policies_follow_the_kafka_bootstrap_and_the_operator_namespace() -> None:
    docs = _chart({"kafka": {"bootstrap": "b-1.msk:9096,b-2.msk:9096,b-3.msk:9094"},
                   "watcher": {"operatorNamespace": "nvidia-gpu-operator"}})
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["name"] for p in policies} == {
        "periscope-probe", "periscope-kube-watcher", "periscope-joiner", "periscope-api", "periscope-topics"}
    for policy in policies:
        kafka = policy["spec"]["egress"][1]
        assert kafka == {"ports": [{"port": 9096, "protocol": "TCP"}, {"port": 9094, "protocol": "TCP"}]}
    role = _find(docs, "Role", "periscope-kube-watcher-operands")
    assert role["metadata"]["namespace"] == "nvidia-gpu-operator"
    assert _find(docs, "RoleBinding", "periscope-kube-watcher-operands")["metadata"]["namespace"] == (
        "nvidia-gpu-operator")


def test_the_probe_reaches_the_nodes_dcgm_exporter_when_given_its_url() -> None:
    url = "http://$(HOST_IP):9400/metrics"
    docs = _chart({"probe": {"dcgmExporterUrl": url, "dcgmExporterPort": 9500}})
    pod = _find(docs, "DaemonSet", "periscope-probe")["spec"]["template"]["spec"]
    env = [e["name"] for e in pod["containers"][0]["env"]]
    values = {e["name"]: e for e in pod["containers"][0]["env"]}
    # HOST_IP first: a $(VAR) reference expands only from variables defined before it
    assert env.index("HOST_IP") < env.index("PERISCOPE_DCGM_EXPORTER_URL")
    assert values["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert values["PERISCOPE_DCGM_EXPORTER_URL"]["value"] == url
    egress = _find(docs, "NetworkPolicy", "periscope-probe")["spec"]["egress"]
    assert {"ports": [{"port": 9500, "protocol": "TCP"}]} in egress
    default = _find(_chart(), "DaemonSet", "periscope-probe")["spec"]["template"]["spec"]
    assert "PERISCOPE_DCGM_EXPORTER_URL" not in {e["name"] for e in default["containers"][0]["env"]}
    out = _run("template", "periscope", str(CHART), values={"probe": {"dcgmExporterUrl": "10.0.0.1:9400"}},
               check=False)
    assert out.returncode != 0 and "values don't meet the specifications of the schema" in out.stderr


def test_mutual_tls_sets_the_client_certificate_and_no_sasl() -> None:
    config = _config(_chart(PRESETS["per-component-mtls"][0]))
    assert config == {
        "PERISCOPE_KAFKA_BOOTSTRAP": "kafka.kafka.svc:9092", "PERISCOPE_LOG_LEVEL": "INFO",
        "PERISCOPE_KAFKA_SECURITY_PROTOCOL": "SSL",
        "PERISCOPE_KAFKA_SSL_CAFILE": "/etc/periscope/kafka/ca.crt",
        "PERISCOPE_KAFKA_SSL_CERTFILE": "/etc/periscope/kafka/tls.crt",
        "PERISCOPE_KAFKA_SSL_KEYFILE": "/etc/periscope/kafka/tls.key",
    }


def test_an_api_without_tls_or_access_control_gets_no_token_and_plain_http() -> None:
    docs = _chart(PRESETS["no-auth-no-tls"][0])
    pod = _find(docs, "Deployment", "periscope-api")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (api,) = pod["containers"]
    assert {e["name"]: e["value"] for e in api["env"]}["PERISCOPE_API_AUTH"] == "none"
    assert api["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    roles = {d["metadata"]["name"] for d in docs if d["kind"].startswith("ClusterRole")}
    assert roles == {"periscope-kube-watcher", "periscope-metrics-reader"}  # nothing of the API's
    (endpoint,) = _find(docs, "ServiceMonitor", "periscope-api")["spec"]["endpoints"]
    assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint


def _values_of(node: Any, key: str) -> list[Any]:
    if isinstance(node, dict):
        here = [v for k, v in node.items() if k == key]
        return here + [x for v in node.values() for x in _values_of(v, key)]
    if isinstance(node, list):
        return [x for v in node for x in _values_of(v, key)]
    return []


def test_other_namespaces_reach_every_reference() -> None:
    docs = [d for d in _chart(PRESETS["everything"][0]) if d["kind"] != "KafkaUser"]  # those live with Kafka
    operator = [d for d in docs if d["metadata"].get("namespace") == "gpu-operator"]  # the operator's own
    assert {(d["kind"], d["metadata"]["name"]) for d in operator} == {
        ("Role", "periscope-kube-watcher-operands"), ("RoleBinding", "periscope-kube-watcher-operands")}
    docs = [d for d in docs if d not in operator]
    assert set(_values_of(operator, "namespace")) == {"gpu-operator", "gpu-attribution"}  # its subject
    assert set(_values_of(docs, "namespace")) == {"gpu-attribution", "gpu-attribution-node"}
    monitor = _find(docs, "ServiceMonitor", "periscope-api")["spec"]
    assert monitor["namespaceSelector"] == {"matchNames": ["gpu-attribution"]}
    assert monitor["endpoints"][0]["tlsConfig"]["serverName"] == "periscope-api.gpu-attribution.svc"
    assert monitor["selector"]["matchLabels"] == _find(docs, "Service", "periscope-api")["spec"]["selector"]
    watcher = _find(docs, "Deployment", "periscope-kube-watcher")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "PERISCOPE_LEASE_NAMESPACE", "value": "gpu-attribution"} in watcher["env"]
    assert {n["metadata"]["name"] for n in docs if n["kind"] == "Namespace"} == {
        "gpu-attribution", "gpu-attribution-node"}


# ---- NOTES and docs ---------------------------------------------------------------------------------

def _notes(values: Doc, tmp_path: Path) -> str:
    """NOTES.txt as Helm prints it after an install. `helm install --dry-run` would contact a cluster,
    so a copy of the chart renders the notes' template into a ConfigMap that `helm template` shows."""
    chart = tmp_path / "periscope"
    shutil.copytree(CHART, chart)
    assert (chart / "templates" / "NOTES.txt").read_text().strip() == '{{- include "periscope.notes" . }}'
    (chart / "templates" / "notes-shown.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n'
        'data: {notes: {{ include "periscope.notes" . | quote }}}\n')
    out = _run("template", "periscope", str(chart), "--show-only", "templates/notes-shown.yaml",
               values=values)
    notes: str = yaml.safe_load(out.stdout)["data"]["notes"]
    return notes


def test_notes_tell_how_to_reach_the_api_and_the_web_view(tmp_path: Path) -> None:
    notes = _notes({}, tmp_path)
    assert "kubectl -n periscope port-forward svc/periscope-api 8080:8080" in notes
    assert "https://localhost:8080/#token=TOKEN" in notes
    assert "PERISCOPE_API_TOKEN=$TOKEN periscope top --api https://localhost:8080" in notes
    assert "Secret periscope-api-tls in periscope" in notes
    values = {"api": {"auth": "none", "tls": {"enabled": False}}, "namespaces": {"main": "gpu"}}
    plain = _notes(values, tmp_path / "2")
    assert "kubectl -n gpu port-forward svc/periscope-api 8080:8080" in plain
    assert "open http://localhost:8080/ in a browser" in plain and "#token" not in plain
    assert "WARNING: api.auth=none" in plain


def _leaves(values: Doc, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in values.items():
        if isinstance(value, dict) and value and key != "resources":
            out |= _leaves(value, f"{prefix}{key}.")
        else:
            out.add(f"{prefix}{key}")
    return out


def test_every_value_is_documented_in_deploy_md() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    text = DOCS.read_text()
    missing = sorted(k for k in _leaves(values) if f"`{k}`" not in text)
    assert not missing, f"docs/deploy.md does not mention: {missing}"


CHART_FILES = {  # the chart's copies of deploy/'s files (a chart must hold its files itself)
    "prometheusrule.yaml": DEPLOY / "monitoring" / "prometheusrule.yaml",
    "periscope-dashboard.json": DEPLOY / "monitoring" / "periscope-dashboard.json",
    "kafka-users.yaml": DEPLOY / "components" / "kafka-acls" / "kafka-users.yaml",
}


def test_the_charts_files_are_copies_of_deploys() -> None:
    files = CHART / "files"
    assert {p.name for p in files.iterdir()} == set(CHART_FILES)
    for name, source in CHART_FILES.items():
        copy_ = files / name
        assert not copy_.is_symlink(), f"{copy_}: Helm warns about links on every command"
        assert copy_.read_bytes() == source.read_bytes(), f"changed: cp {source} {copy_}"


# ---- building helm ----------------------------------------------------------------------------------

def test_helm_is_the_pinned_version_with_the_kubernetes_version_of_its_client_go() -> None:
    gomod = (helm_build.TOOL / "go.mod").read_text()
    assert re.search(r"^tool helm.sh/helm/v3/cmd/helm$", gomod, re.MULTILINE)
    minor = re.search(r"k8s.io/client-go v0\.(\d+)\.", gomod)
    assert minor is not None and f"chartutil.k8sVersionMinor={minor.group(1)}" in helm_build.ldflags()
    out = _run("version", "--template", "{{.Version}}")
    assert out.stdout == helm_build.helm_version() == "v3.22.0"
    assert home().name.startswith("helm-v3.22.0-") and home().parent.name == "periscope"


def test_without_go_the_build_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there
    monkeypatch.setenv("PATH", str(tmp_path))  # no go on PATH ...
    monkeypatch.setattr(helm_build, "_GO_FALLBACK", tmp_path / "go")  # ... nor where Go installs itself
    with pytest.raises(HelmUnavailable, match=r"^building helm needs Go on PATH: install Go 1\.26"):
        binary()
    assert helm_build.main(["version"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("periscope: helm: building helm needs Go") and err.count("\n") == 1
