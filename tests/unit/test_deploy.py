"""Deployment artefacts: Kubernetes manifests, kustomize overlays, docker-compose.yml and Dockerfile.

The manifests are rendered twice: by a small in-Python kustomize subset (resources, components,
JSON-6902 and strategic-merge patches on named lists), which always runs, and by kubectl/kustomize when
one is on PATH, which must agree with it. Every rendering is validated against the Kubernetes OpenAPI
schemas (strict: unknown fields fail) and checked for the security properties docs/deploy.md promises.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from periscope.bus.settings import ServiceSettings
from periscope.settings.catalog import variables

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = REPO / "docker-compose.yml"
DOCS = REPO / "docs" / "deploy.md"
K8S_VERSIONS = ("1.29", "1.37")  # oldest and newest schema sets we promise to stay valid for
CORE_KINDS = {
    "Namespace", "ConfigMap", "ServiceAccount", "Service", "DaemonSet", "Deployment", "StatefulSet",
    "Job", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "NetworkPolicy", "Secret",
}
# prometheus-operator kinds of deploy/monitoring: no schema is bundled, tests/unit/test_monitoring.py
# checks them structurally; Strimzi's KafkaUsers of components/kafka-acls: tests/unit/test_bus_edge.py.
CRD_KINDS = {"PrometheusRule", "ServiceMonitor", "KafkaUser"}
WORKLOADS = {"DaemonSet", "Deployment", "StatefulSet", "Job"}
PROBE = ("DaemonSet", "periscope-probe")
MICROK8S_ROOT = "/var/snap/microk8s/common/var/lib/kubelet"
K0S_ROOT = "/var/lib/k0s/kubelet"
Doc = dict[str, Any]


# ---- a minimal kustomize ---------------------------------------------------------------------------

def _load_all(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _kustomization(kdir: Path) -> Doc:
    data = yaml.safe_load((kdir / "kustomization.yaml").read_text())
    assert isinstance(data, dict), kdir
    return data


def _json_patch(doc: Doc, ops: list[Doc]) -> Doc:
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        key: Any = parts[-1]
        if isinstance(parent, list):
            key = len(parent) if key == "-" else int(key)
        if op["op"] == "test":
            assert parent[key] == op["value"], f"JSON-patch test failed at {op['path']}"
        elif op["op"] == "replace":
            assert key in parent if isinstance(parent, dict) else key < len(parent), op["path"]
            parent[key] = op["value"]
        elif op["op"] == "remove":
            del parent[key]
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(key, op["value"])
            else:
                parent[key] = op["value"]
        else:
            raise AssertionError(f"unsupported JSON-patch op {op['op']}")
    return doc


def _merge(base: Any, patch: Any) -> Any:
    """Strategic merge for what the components use: maps recurse, lists of named maps merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(
        isinstance(x, dict) and "name" in x for x in base + patch
    ):
        merged = {x["name"]: x for x in base}
        for item in patch:
            merged[item["name"]] = _merge(merged[item["name"]], item) if item["name"] in merged else item
        return list(merged.values())
    return patch


def _matches(doc: Doc, target: Doc) -> bool:
    meta = doc["metadata"]
    return (
        doc["kind"] == target["kind"]
        and meta["name"] == target.get("name", meta["name"])
        and meta.get("namespace") == target.get("namespace", meta.get("namespace"))
    )


def _apply_patches(patches: list[Doc], docs: list[Doc]) -> list[Doc]:
    for entry in patches:
        body = yaml.safe_load(entry["patch"])
        hits = [i for i, d in enumerate(docs) if _matches(d, entry["target"])]
        assert hits, f"patch target {entry['target']} matches no resource"
        for i in hits:
            docs[i] = _json_patch(docs[i], body) if isinstance(body, list) else _merge(docs[i], body)
    return docs


def _generated_config_maps(kdir: Path, kust: Doc) -> list[Doc]:
    """configMapGenerator with `files` and unhashed names (what the monitoring component uses)."""
    out = []
    for gen in kust.get("configMapGenerator", []):
        options = gen.get("options", {})
        assert options.get("disableNameSuffixHash") is True, f"{kdir}: hashed names are not supported"
        meta: Doc = {"name": gen["name"], "labels": options.get("labels", {})}
        if "namespace" in gen:
            meta["namespace"] = gen["namespace"]
        data = {Path(f).name: (kdir / f).read_text() for f in gen["files"]}
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    return out


def _apply_component(cdir: Path, docs: list[Doc]) -> list[Doc]:
    comp = _kustomization(cdir)
    assert comp["kind"] == "Component", cdir
    docs = docs + [d for entry in comp.get("resources", []) for d in _load_all(cdir / entry)]
    docs += _generated_config_maps(cdir, comp)
    return _apply_patches(comp.get("patches", []), docs)


def _render(kdir: Path) -> list[Doc]:
    kust = _kustomization(kdir)
    assert kust["kind"] == "Kustomization", kdir
    docs: list[Doc] = []
    for entry in kust.get("resources", []):
        path = kdir / entry
        docs += _render(path) if path.is_dir() else _load_all(path)
    for entry in kust.get("components", []):
        docs = _apply_component(kdir / entry, docs)
    return _apply_patches(kust.get("patches", []), docs)


def _with_component(name: str) -> list[Doc]:
    return _apply_component(DEPLOY / "components" / name, _render(DEPLOY / "base"))


_RENDERERS: dict[str, Callable[[], list[Doc]]] = {
    "base": lambda: _render(DEPLOY / "base"),
    "overlays/kafka-kraft": lambda: _render(DEPLOY / "overlays" / "kafka-kraft"),
    "overlays/microk8s": lambda: _render(DEPLOY / "overlays" / "microk8s"),
    "components/k0s": lambda: _with_component("k0s"),
    "components/kafka-security": lambda: _with_component("kafka-security"),
    "components/kafka-acls": lambda: _with_component("kafka-acls"),
    "components/leader-election": lambda: _with_component("leader-election"),
    "components/no-runtime-class": lambda: _with_component("no-runtime-class"),
    "components/gke": lambda: _with_component("gke"),
    "components/eks": lambda: _with_component("eks"),
    "components/aks": lambda: _with_component("aks"),
    "components/mig-monitor": lambda: _with_component("mig-monitor"),
    "monitoring": lambda: _apply_component(DEPLOY / "monitoring", _render(DEPLOY / "base")),
}
COMPONENT_FLAVOURS = {f for f in _RENDERERS if f.startswith("components/")} | {"monitoring"}


@functools.cache
def _rendered(flavour: str) -> str:
    return json.dumps(_RENDERERS[flavour]())


def _flavour(flavour: str) -> list[Doc]:
    """A fresh copy of one rendering (rendered once per test run)."""
    docs: list[Doc] = json.loads(_rendered(flavour))
    return docs


FLAVOURS = sorted(_RENDERERS)
_VALIDATED: set[tuple[str, str]] = set()  # the flavours share most documents: validate each once


def _find(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _pods(docs: list[Doc]) -> Iterator[tuple[Doc, Doc]]:
    for d in docs:
        if d["kind"] in WORKLOADS:
            yield d, d["spec"]["template"]["spec"]


def _containers(pod: Doc) -> list[Doc]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _env(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


# ---- files and kustomizations -------------------------------------------------------------------------

def test_every_kustomization_references_existing_parseable_files() -> None:
    kdirs = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))
    assert {p.relative_to(DEPLOY).as_posix() for p in kdirs} >= {
        "base", "overlays/kafka-kraft", "overlays/microk8s", "components/microk8s", "components/k0s",
        "monitoring",
    }
    for kdir in kdirs:
        kust = _kustomization(kdir)
        assert kust["kind"] in {"Kustomization", "Component"}, kdir
        for entry in [*kust.get("resources", []), *kust.get("components", [])]:
            path = (kdir / entry).resolve()
            assert path.is_relative_to(DEPLOY), f"{kdir}: {entry} leaves deploy/"
            assert (path / "kustomization.yaml").is_file() or (path.is_file() and _load_all(path)), entry
        for patch in kust.get("patches", []):
            assert isinstance(yaml.safe_load(patch["patch"]), list | dict), kdir
    listed = {
        (kdir / e).resolve() for kdir in kdirs for e in _kustomization(kdir).get("resources", [])
    }
    chart = DEPLOY / "helm"  # the Helm chart (tests/unit/test_helm.py) is no kustomize input
    for manifest in DEPLOY.rglob("*.yaml"):  # nothing lies around unreferenced
        if manifest.is_relative_to(chart):
            continue
        assert manifest.name == "kustomization.yaml" or manifest.resolve() in listed, manifest


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_manifests_validate_against_kubernetes_schemas(flavour: str, version: str) -> None:
    docs = _flavour(flavour)
    assert docs
    for doc in docs:
        # Only built-in kinds: a CRD instance here would need its own schema, so it must be a choice.
        if doc["kind"] in CRD_KINDS:
            continue
        assert doc["kind"] in CORE_KINDS, f"{doc['kind']} has no bundled schema"
        key = (version, json.dumps(doc, sort_keys=True))
        if key not in _VALIDATED:
            kubernetes_validate.validate(doc, version, strict=True)
            _VALIDATED.add(key)
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), "duplicate resources"


def _kustomize_cmd() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


def _by_name(value: Any) -> Any:
    """Lists of named maps become maps, so that a merge's item order does not count as a difference."""
    if isinstance(value, dict):
        return {k: _by_name(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(x, dict) and "name" in x for x in value):
        return {x["name"]: _by_name(x) for x in value}
    if isinstance(value, list):
        return [_by_name(x) for x in value]
    return value


@pytest.mark.skipif(_kustomize_cmd() is None, reason="neither kustomize nor kubectl on PATH")
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_kustomize_renders_what_the_python_renderer_does(flavour: str, tmp_path: Path) -> None:
    cmd = _kustomize_cmd()
    assert cmd is not None
    target = DEPLOY / flavour
    if flavour in COMPONENT_FLAVOURS:  # a component needs a kustomization that uses it
        rel = Path(*[".."] * len(tmp_path.parts[1:])) / DEPLOY.relative_to("/")
        (tmp_path / "kustomization.yaml").write_text(
            yaml.safe_dump({"resources": [str(rel / "base")], "components": [str(rel / flavour)]})
        )
        target = tmp_path
    out = subprocess.run([*cmd, str(target)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]

    def key(d: Doc) -> tuple[str, str, str]:
        return (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])

    assert sorted(map(key, rendered)) == sorted(map(key, _flavour(flavour)))
    ours = {key(d): _by_name(d) for d in _flavour(flavour)}
    for doc in rendered:
        assert _by_name(doc) == ours[key(doc)], key(doc)


# ---- settings names ---------------------------------------------------------------------------------

def test_every_periscope_variable_is_a_settings_field() -> None:
    pattern = re.compile(r"PERISCOPE_[A-Z0-9_]*[A-Z0-9]")
    sources = [*DEPLOY.rglob("*.yaml"), COMPOSE, DOCS]
    used = {name: path for path in sources for name in pattern.findall(path.read_text())}
    assert {"PERISCOPE_KAFKA_BOOTSTRAP", "PERISCOPE_KUBELET_ROOT", "PERISCOPE_API_PORT"} <= set(used)
    # Every command's settings class (periscope.settings.catalog: the services, replay, top, the topics job).
    known = variables()
    assert {"PERISCOPE_NODE_NAME", "PERISCOPE_APP_ID", "PERISCOPE_API_PORT", "PERISCOPE_TOPIC_PARTITIONS"} \
        <= known
    unknown = {name: str(path.relative_to(REPO)) for name, path in used.items() if name not in known}
    assert not unknown, f"not a settings field: {unknown}"


# ---- security properties ----------------------------------------------------------------------------

@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_pod_except_the_probe_meets_the_restricted_profile(flavour: str) -> None:
    pods = [(w, p) for w, p in _pods(_flavour(flavour)) if (w["kind"], w["metadata"]["name"]) != PROBE]
    assert len(pods) >= 4
    for workload, pod in pods:
        where = f"{flavour}: {workload['kind']}/{workload['metadata']['name']}"
        assert workload["metadata"]["namespace"] == "periscope", where
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"].get("runAsUser", 1) != 0, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert not any(pod.get(k) for k in ("hostPID", "hostNetwork", "hostIPC")), where
        assert not any("hostPath" in v for v in pod.get("volumes", [])), where
        assert pod["enableServiceLinks"] is False, where
        for c in _containers(pod):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc.get("privileged", False) is False and sc.get("runAsUser", 1) != 0, where


def _gpu_nodes(*terms: Doc) -> Doc:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [t]} for t in terms]}}}  # fmt: skip


# What each managed-cloud component changes on the probe, exactly (the sources are in each component):
# the GPU-node selection, the RuntimeClass, extra env, host mounts, tolerations and privileges.
GPU_PRESENT = {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
PLATFORM: dict[str, Doc] = {
    "components/gke": {
        "affinity": _gpu_nodes({"key": "cloud.google.com/gke-accelerator", "operator": "Exists"}),
        "runtime_class": None, "env": {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"},
        "host": {"nvidia-install-dir": ({"path": "/home/kubernetes/bin/nvidia", "type": "Directory"},
                                        "/usr/local/nvidia")},
        "privileged": True,
    },
    "components/eks": {
        "affinity": _gpu_nodes(
            {"key": "eks.amazonaws.com/instance-gpu-manufacturer", "operator": "In", "values": ["nvidia"]},
            {"key": "karpenter.k8s.aws/instance-gpu-manufacturer", "operator": "In", "values": ["nvidia"]},
            GPU_PRESENT,
        ),
        "runtime_class": None,
    },
    "components/aks": {
        "affinity": _gpu_nodes(
            {"key": "kubernetes.azure.com/accelerator", "operator": "In", "values": ["nvidia"]}, GPU_PRESENT
        ),
        "runtime_class": None,
        "tolerations": [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
    },
    "components/no-runtime-class": {"runtime_class": None},
    "components/mig-monitor": {"env": {"NVIDIA_MIG_MONITOR_DEVICES": "all"},
                               "add_capabilities": ["SYS_ADMIN"]},
}  # fmt: skip


def test_every_component_is_rendered_and_documented() -> None:
    components = {p.parent.name for p in (DEPLOY / "components").glob("*/kustomization.yaml")}
    assert {f"components/{c}" for c in components} - {"components/microk8s"} <= set(_RENDERERS)
    text = DOCS.read_text()
    assert all(f"components/{c}" in text for c in components)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_probe_gets_only_what_it_needs(flavour: str) -> None:
    docs = _flavour(flavour)
    ds = _find(docs, *PROBE)
    assert ds["metadata"]["namespace"] == "periscope-node"
    pod = ds["spec"]["template"]["spec"]
    platform = PLATFORM.get(flavour, {})
    assert pod["hostPID"] is True and not pod.get("hostNetwork") and not pod.get("hostIPC")
    if "affinity" in platform:  # nodes without GPU Feature Discovery's label: the platform's own
        assert "nodeSelector" not in pod and pod["affinity"] == platform["affinity"]
    else:
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and "affinity" not in pod
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"},
                                  *platform.get("tolerations", [])]  # fmt: skip
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod.get("runtimeClassName") == platform.get("runtime_class", "nvidia")
    (c,) = pod["containers"]
    sc = c["securityContext"]
    # uid 0 only for connect() on the root-owned socket; docs/deploy.md says so and why. Privileged only
    # where the platform injects no GPU device into a pod that requests none (GKE: docs/deploy.md).
    privileged = platform.get("privileged", False)
    assert sc["runAsUser"] == 0 and sc["privileged"] is privileged
    assert sc["allowPrivilegeEscalation"] is privileged  # the apiserver rejects privileged without it
    capabilities = {"drop": ["ALL"], **({"add": platform["add_capabilities"]} if "add_capabilities" in
                                        platform else {})}  # fmt: skip
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == capabilities
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any("gpu" in r for r in {**c["resources"]["limits"], **c["resources"]["requests"]})
    env = _env(c)
    assert env["PERISCOPE_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["PERISCOPE_PROC_ROOT"]["value"] == "/proc"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    for name, value in platform.get("env", {}).items():
        assert env[name] == {"name": name, "value": value}
    root = {"overlays/microk8s": MICROK8S_ROOT, "components/k0s": K0S_ROOT}.get(flavour, "/var/lib/kubelet")
    assert env["PERISCOPE_KUBELET_ROOT"]["value"] == root
    host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    extra = platform.get("host", {})
    assert host == {
        "pod-resources": {"path": f"{root}/pod-resources", "type": "Directory"},
        "device-plugins": {"path": f"{root}/device-plugins", "type": "Directory"},
        **{name: hp for name, (hp, _) in extra.items()},
    }
    for name, (_, inside) in extra.items():  # the platform's driver directory, read-only
        assert {"name": name, "mountPath": inside, "readOnly": True} in c["volumeMounts"]
        host.pop(name)
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    for name, hp in host.items():  # mounted read-only where the probe looks for them
        assert mounts[name] == {"name": name, "mountPath": hp["path"], "readOnly": True}
    assert not any(".sock" in p for p in [*(h["path"] for h in host.values()), *mounts])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_container_has_requests_and_limits(flavour: str) -> None:
    for workload, pod in _pods(_flavour(flavour)):
        for c in _containers(pod):
            for kind in ("requests", "limits"):
                assert set(c["resources"][kind]) == {"cpu", "memory"}, (workload["metadata"]["name"], c)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_rbac_reads_only_and_leases_live_in_their_own_role(flavour: str) -> None:
    docs = _flavour(flavour)
    role = _find(docs, "ClusterRole", "periscope-kube-watcher")
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {
        ("", "pods"), ("", "nodes"), ("nvidia.com", "clusterpolicies"),
        ("nvidia.com", "gpuclusters"), ("resource.k8s.io", "resourceclaims"),
    }
    # What the watcher calls: list and watch (services/kube_watcher/service.py), never get.
    assert all(rule["verbs"] == ["list", "watch"] for rule in role["rules"])
    watcher = _env(_find(docs, "Deployment", "periscope-kube-watcher")["spec"]["template"]["spec"]
                   ["containers"][0])
    # The operand DaemonSets: in the GPU Operator's namespace only, the one the watcher is told.
    operands = _find(docs, "Role", "periscope-kube-watcher-operands")
    assert operands["metadata"]["namespace"] == watcher["PERISCOPE_OPERATOR_NAMESPACE"]["value"]
    assert operands["rules"] == [
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["list", "watch"]}]
    binding = _find(docs, "RoleBinding", "periscope-kube-watcher-operands")
    assert binding["metadata"]["namespace"] == operands["metadata"]["namespace"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "periscope-kube-watcher-operands"}
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "periscope-kube-watcher", "namespace": "periscope"}]
    roles = [d for d in docs if d["kind"] == "Role" and d is not operands]
    assert (watcher["PERISCOPE_LEADER_ELECTION"]["value"] == "true") == bool(roles)
    for r in roles:
        assert r["metadata"]["namespace"] == watcher["PERISCOPE_LEASE_NAMESPACE"]["value"]
        lease = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}
        assert r["rules"] == [
            {**lease, "verbs": ["create"]},
            {**lease, "resourceNames": [watcher["PERISCOPE_LEASE_NAME"]["value"]],
             "verbs": ["get", "update"]},
        ]


TOKEN_HOLDERS = {"periscope-kube-watcher", "periscope-api"}  # the API's token only creates reviews


def test_only_the_watcher_and_the_api_get_an_api_token() -> None:
    docs = _flavour("overlays/kafka-kraft")
    for sa in (d for d in docs if d["kind"] == "ServiceAccount"):
        expected = sa["metadata"]["name"] in TOKEN_HOLDERS
        assert sa["automountServiceAccountToken"] is expected, sa["metadata"]["name"]
    for workload, pod in _pods(docs):
        expected = workload["metadata"]["name"] in TOKEN_HOLDERS
        assert pod["automountServiceAccountToken"] is expected, workload["metadata"]["name"]
        _find(docs, "ServiceAccount", pod["serviceAccountName"])
    binding = _find(docs, "ClusterRoleBinding", "periscope-kube-watcher")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "periscope-kube-watcher", "namespace": "periscope"}
    ]


def test_namespaces_carry_pod_security_labels_and_hold_the_right_things() -> None:
    docs = _flavour("overlays/kafka-kraft")
    labels = {d["metadata"]["name"]: d["metadata"]["labels"] for d in docs if d["kind"] == "Namespace"}
    assert labels["periscope"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["periscope-node"]["pod-security.kubernetes.io/enforce"] == "privileged"
    namespaced = [d for d in docs if d["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}]
    operator = {("Role", "periscope-kube-watcher-operands"),
                ("RoleBinding", "periscope-kube-watcher-operands")}
    assert {(d["kind"], d["metadata"]["name"]) for d in namespaced
            if d["metadata"]["namespace"] == "gpu-operator"} == operator  # the operator's own namespace
    namespaced = [d for d in namespaced if d["metadata"]["namespace"] != "gpu-operator"]
    assert {d["metadata"]["namespace"] for d in namespaced} == set(labels)
    node_side = {(d["kind"], d["metadata"]["name"]) for d in namespaced
                 if d["metadata"]["namespace"] == "periscope-node"}
    assert node_side == {PROBE, ("ServiceAccount", "periscope-probe"), ("ConfigMap", "periscope-config"),
                         ("NetworkPolicy", "periscope-probe")}


def test_kafka_bootstrap_comes_from_the_config_map_and_the_overlay_points_it_at_its_broker() -> None:
    for flavour, expected in (("base", "kafka.kafka.svc:9092"),
                              ("overlays/kafka-kraft", "kafka.periscope.svc:9092")):
        docs = _flavour(flavour)
        maps = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "periscope-config"]
        assert {m["metadata"]["namespace"] for m in maps} == {"periscope", "periscope-node"}
        assert {m["data"]["PERISCOPE_KAFKA_BOOTSTRAP"] for m in maps} == {expected}
        for _, pod in _pods(docs):
            for c in pod["containers"]:
                if c["image"].startswith("periscope"):
                    assert c["envFrom"] == [{"configMapRef": {"name": "periscope-config"}}]
    kafka = _find(_flavour("overlays/kafka-kraft"), "StatefulSet", "kafka")
    env = _env(kafka["spec"]["template"]["spec"]["containers"][0])
    assert env["KAFKA_ADVERTISED_LISTENERS"]["value"] == "PLAINTEXT://kafka.periscope.svc:9092"
    assert env["KAFKA_PROCESS_ROLES"]["value"] == "broker,controller"
    assert kafka["spec"]["template"]["spec"]["enableServiceLinks"] is False


def test_api_is_reachable_on_its_port_only() -> None:
    docs = _flavour("base")
    api = _find(docs, "Deployment", "periscope-api")["spec"]["template"]["spec"]["containers"][0]
    port = int(_env(api)["PERISCOPE_API_PORT"]["value"])
    assert _env(api)["PERISCOPE_API_HOST"]["value"] == "0.0.0.0"
    assert [p["containerPort"] for p in api["ports"]] == [port]
    svc = _find(docs, "Service", "periscope-api")
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(port, "https")]
    policy = _find(docs, "NetworkPolicy", "periscope-api")["spec"]
    assert policy["podSelector"]["matchLabels"] == svc["spec"]["selector"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    # Not from any pod: from namespaces, or pods, that are labelled for it.
    access = {"periscope.io/api-access": "true"}
    assert policy["ingress"] == [{
        "from": [{"namespaceSelector": {"matchLabels": access}},
                 {"namespaceSelector": {}, "podSelector": {"matchLabels": access}}],
        "ports": [{"port": port, "protocol": "TCP"}],
    }]


DNS = {(53, "UDP"), (53, "TCP")}
KAFKA = {(9092, "TCP")}
APISERVER = {(443, "TCP"), (6443, "TCP"), (16443, "TCP")}
# component -> (its pods' ingress ports, where it may connect to): nothing else, in either direction.
TRAFFIC = {
    "probe": ({9401}, DNS | KAFKA | {(9400, "TCP")}),  # 9400: the node's dcgm-exporter
    "kube-watcher": ({9402}, DNS | KAFKA | APISERVER),
    "joiner": ({9403}, DNS | KAFKA),
    "api": ({8080}, DNS | KAFKA | APISERVER),
    "topics": (set(), DNS | KAFKA),
}


def _policy_ports(rules: list[Doc]) -> set[Any]:
    return {(p["port"], p["protocol"]) for rule in rules for p in rule["ports"]}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_component_has_a_network_policy_for_both_directions(flavour: str) -> None:
    docs = _flavour(flavour)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for workload, pod in _pods(docs):
        labels = pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        component = labels["app.kubernetes.io/component"]
        mine = [p for p in policies if p["metadata"]["namespace"] == workload["metadata"]["namespace"]
                and all(pod_labels.get(k) == v for k, v in p["spec"]["podSelector"]["matchLabels"].items())]
        assert len(mine) == 1, (flavour, workload["metadata"]["name"], len(mine))
        spec = mine[0]["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"], component
        if component == "kafka":
            continue  # the overlay's own broker: test_kafka_takes_only_periscope_and_labelled_clients
        ingress, egress = TRAFFIC[component]
        assert {p for p, _ in _policy_ports(spec.get("ingress", []))} == ingress, component
        assert _policy_ports(spec["egress"]) == egress, component
        for rule in spec["egress"]:  # by port; the only destinations are outside these manifests
            assert set(rule) == {"ports"}, component
        if component != "api":  # the API names who may connect; the rest serve only health checks
            assert all(set(rule) == {"ports"} for rule in spec.get("ingress", [])), component
        for container in pod["containers"]:  # every port a container serves is one its policy admits
            assert {p["containerPort"] for p in container.get("ports", [])} <= ingress, component


def test_kafka_takes_only_periscope_and_labelled_clients() -> None:
    spec = _find(_flavour("overlays/kafka-kraft"), "NetworkPolicy", "kafka")["spec"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": 9092, "protocol": "TCP"}]
    ours = {"app.kubernetes.io/part-of": "periscope"}
    assert rule["from"] == [
        {"podSelector": {"matchLabels": ours}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "periscope-node"}},
         "podSelector": {"matchLabels": ours}},
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"periscope.io/kafka-client": "true"}}},
    ]
    assert _policy_ports(spec["egress"]) == DNS | KAFKA


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_api_checks_access_with_reviews_only_and_serves_tls(flavour: str) -> None:
    docs = _flavour(flavour)
    pod = _find(docs, "Deployment", "periscope-api")["spec"]["template"]["spec"]
    api = pod["containers"][0]
    env = _env(api)
    assert env["PERISCOPE_API_AUTH"]["value"] == "kubernetes"
    cert, key = env["PERISCOPE_API_TLS_CERTFILE"]["value"], env["PERISCOPE_API_TLS_KEYFILE"]["value"]
    (mount,) = [m for m in api["volumeMounts"] if cert.startswith(m["mountPath"] + "/")]
    assert key.startswith(mount["mountPath"] + "/") and mount["readOnly"] is True
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert vol["secret"]["secretName"] == "periscope-api-tls" and not vol["secret"].get("optional")
    for probe in ("livenessProbe", "readinessProbe"):
        assert api[probe]["httpGet"]["scheme"] == "HTTPS", probe
    assert [p["name"] for p in api["ports"]] == ["https"]
    # The API's service account may create the two reviews and nothing else.
    role = _find(docs, "ClusterRole", "periscope-api-reviewer")
    assert role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ]
    bound = [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s["name"] == "periscope-api" for s in d["subjects"])]
    assert [b["roleRef"]["name"] for b in bound] == ["periscope-api-reviewer"]
    sa = {"kind": "ServiceAccount", "name": "periscope-api", "namespace": "periscope"}
    assert bound[0]["subjects"] == [sa]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_example_viewer_roles_only_read(flavour: str) -> None:
    docs = _flavour(flavour)
    ns_viewer = _find(docs, "ClusterRole", "periscope-namespace-viewer")
    read_pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    assert ns_viewer["rules"] == [read_pods]
    cluster = _find(docs, "ClusterRole", "periscope-cluster-viewer")
    assert cluster["rules"] == [
        read_pods,
        {"nonResourceURLs": ["/v1/policy", "/metrics"], "verbs": ["get"]},
    ]
    # Examples: nothing binds them, so installing Periscope grants no one anything.
    bindings = [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert not any(b["roleRef"]["name"].endswith("-viewer") for b in bindings)
    # The cluster-scoped URLs the API reviews are exactly the ones the example grants.
    from services.api.auth import CLUSTER_PATHS

    assert set(cluster["rules"][1]["nonResourceURLs"]) == CLUSTER_PATHS


def test_topic_job_runs_the_bus_admin_module() -> None:
    job = _find(_flavour("base"), "Job", "periscope-topics")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "python", "-m", "periscope.bus.admin"
    ]
    spec = importlib.util.find_spec("periscope.bus.admin")
    assert spec is not None and spec.origin is not None, "periscope.bus.admin does not exist yet"
    assert '__name__ == "__main__"' in Path(spec.origin).read_text(), "periscope.bus.admin has no __main__"


# ---- docker-compose.yml and Dockerfile -------------------------------------------------------------

COMPOSE_SERVICE_KEYS = {
    "build", "image", "read_only", "cap_drop", "security_opt", "tmpfs", "environment", "ports",
    "volumes", "healthcheck", "restart", "entrypoint", "command", "depends_on", "profiles",
    "network_mode", "pid", "user", "deploy",
}


def test_compose_file_has_kafka_every_service_and_the_profiles() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    assert set(compose) <= {"name", "services", "volumes"} | {k for k in compose if k.startswith("x-")}
    services: dict[str, Doc] = compose["services"]
    assert set(services) == {"kafka", "topics", "joiner", "api", "watcher", "probe", "sim"}
    profiles = {name: s.get("profiles", []) for name, s in services.items()}
    assert profiles == {"kafka": [], "topics": [], "joiner": [], "api": [], "watcher": ["cluster"],
                        "probe": ["cluster"], "sim": ["sim"]}
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "CLUSTER_ID" in kafka["environment"]
    commands = {"joiner": ["join"], "api": ["api"], "watcher": ["watch"], "probe": ["probe"]}
    for name, svc in services.items():
        assert set(svc) <= COMPOSE_SERVICE_KEYS, (name, set(svc) - COMPOSE_SERVICE_KEYS)
        env = svc.get("environment", {})
        assert all(isinstance(v, str) for v in env.values()), name  # no YAML booleans/numbers
        for dep in svc.get("depends_on", {}):
            assert dep in services, (name, dep)
        if name == "kafka":
            continue
        assert svc["image"].startswith("periscope:") and svc["build"] == "."
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in svc["security_opt"], name
        assert svc.get("user") == ("0:0" if name == "probe" else None), name
        if name in commands:
            assert svc["command"] == commands[name]
            assert "PERISCOPE_KAFKA_BOOTSTRAP" in env, name
    assert services["topics"]["entrypoint"] == ["python", "-m", "periscope.bus.admin"]
    assert services["sim"]["command"][:3] == ["up", "--scenario", "demo"]
    probe = services["probe"]
    assert probe["pid"] == "host"
    assert all(v.endswith(":ro") and ".sock" not in v for v in probe["volumes"])
    named = {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])}
    assert set(compose["volumes"]) == {v for v in named if not v.startswith(("$", "/", "."))}


def test_dockerfile_builds_a_slim_non_root_image_with_the_periscope_entry_point() -> None:
    text = (REPO / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.MULTILINE)
    assert [alias for _, alias in stages] == ["builder", "runtime"]
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.MULTILINE)
    assert "-c constraints.txt" in text and "COPY --from=builder /opt/venv /opt/venv" in text
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", users[-1]), "numeric non-root USER"
    assert re.search(r'^ENTRYPOINT \["periscope"\]', text, re.MULTILINE)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


def test_kafka_security_component_mounts_the_secret_and_sets_the_variables() -> None:
    docs = _flavour("components/kafka-security")
    maps = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "periscope-config"]
    assert {m["metadata"]["namespace"] for m in maps} == {"periscope", "periscope-node"}
    settings = ServiceSettings.model_validate(
        {k.removeprefix("PERISCOPE_").lower(): v for k, v in maps[0]["data"].items()})
    assert all(m["data"] == maps[0]["data"] for m in maps)
    security = settings.kafka_security()
    assert (security.protocol, security.mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
    assert "PERISCOPE_KAFKA_SASL_USERNAME" not in maps[0]["data"]  # each component names its own
    files = {security.cafile, security.password_file}
    assert all(f.startswith("/etc/periscope/kafka/") for f in files)
    from periscope.bus.acls import SERVICES

    principal = {"periscope-probe": "probe", "periscope-kube-watcher": "watcher",
                 "periscope-joiner": "joiner", "periscope-api": "api", "periscope-topics": "admin"}
    seen = set()
    for workload, pod in _pods(docs):
        where = workload["metadata"]["name"]
        assert any(e.get("configMapRef", {}).get("name") == "periscope-config"
                   for c in pod["containers"] for e in c.get("envFrom", [])), where
        (volume,) = [v for v in pod["volumes"] if v["name"] == "kafka-credentials"]
        # one principal per component: its own Secret, and its own name
        assert volume["secret"]["secretName"] == f"periscope-kafka-{principal[where]}", where
        for c in pod["containers"]:
            (mount,) = [m for m in c["volumeMounts"] if m["name"] == "kafka-credentials"]
            # a directory mount (no subPath): a rotated Secret reaches the password file
            assert mount == {"name": "kafka-credentials", "mountPath": "/etc/periscope/kafka",
                             "readOnly": True}
            user = _env(c)["PERISCOPE_KAFKA_SASL_USERNAME"]["value"]
            assert user == f"periscope-{principal[where]}", where
            seen.add(user)
        assert {"/etc/periscope/kafka/" + f.rsplit("/", 1)[1] for f in files} == files
    assert seen == {f"periscope-{s}" for s in SERVICES}  # the principals the ACL table grants
    # no credential is shipped in the manifests
    assert not [d for d in docs if d["kind"] == "Secret"]
