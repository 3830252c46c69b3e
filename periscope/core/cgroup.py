"""`/proc/<pid>/cgroup` -> pod UID, container ID, QoS class (and back, for the simulator).

Lines are `hierarchy-ID:controllers:path`: cgroup v1 writes one per hierarchy, v2 a single `0::/…`.
The kubelet names the pod level `pod<UID>` (cgroupfs) or `…-pod<UID with _ for ->.slice` (systemd),
under `kubepods[/burstable|/besteffort]` (Guaranteed pods sit directly under kubepods). The runtime
adds a container leaf: containerd `cri-containerd-<id>.scope` or `<parent>/<id>`, CRI-O `crio-<id>`
(`.scope` with systemd; crun adds a `container` child; conmon lives in `crio-conmon-<id>`), docker
`docker-<id>.scope`. Where runc's systemd driver could not place a v1 controller (a hybrid host whose
controllers systemd does not delegate), that line keeps the raw cgroupsPath `<pod>.slice:<prefix>:<id>`
as one component; it is read as `<pod>.slice/<prefix>-<id>.scope`. A reader in a private cgroup
namespace sees `..` for every level above its root, so the parser matches path components, never a
fixed prefix. With the cgroupfs driver containerd and cri-dockerd both leave a bare `<pod>/<id>`: the
path cannot tell them apart, so the runtime is `unknown` there (the pod's containerID scheme tells it:
the watcher's ContainerInfo.runtime).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Qos = Literal["guaranteed", "burstable", "besteffort"]
Runtime = Literal["containerd", "crio", "docker"]
SeenRuntime = Literal["containerd", "crio", "docker", "unknown"]  # what a path can tell
Driver = Literal["systemd", "cgroupfs"]

_HEX_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# Static pods get a hash-derived UID: 32 hex digits without dashes.
_POD = re.compile(rf"^(?P<prefix>(?:.*-)?)pod(?P<uid>{_HEX_UID}|[0-9a-f]{{32}})(?P<slice>\.slice)?$")
_CONTAINER = re.compile(
    r"^(?:(?P<kind>cri-containerd|crio|docker)-)?(?P<id>[0-9a-f]{64})(?P<scope>\.scope)?$"
)
_CONMON = re.compile(r"^crio-conmon-[0-9a-f]{64}(?:\.scope)?$")
# runc's systemd cgroupsPath "slice:prefix:name", left verbatim on controllers systemd does not manage.
_SYSTEMD_SPEC = re.compile(r"^(?P<slice>[^:]+\.slice):(?P<prefix>[^:]+):(?P<name>[^:]+)$")
_LINE = re.compile(r"^(?P<hid>[0-9]+):(?P<controllers>[^:]*):(?P<path>/.*)$")
_RUNTIME: dict[str, Runtime] = {"cri-containerd": "containerd", "crio": "crio", "docker": "docker"}
_QOS_LEVELS: dict[str, Qos] = {"burstable": "burstable", "besteffort": "besteffort", "kubepods": "guaranteed"}


@dataclass(frozen=True, slots=True)
class CgroupInfo:
    pod_uid: str | None
    container_id: str | None
    qos: Qos | None
    runtime: SeenRuntime | None
    driver: Driver | None
    version: Literal[1, 2]
    path: str

    def to_json(self) -> dict[str, str | int | None]:
        """The `periscope inspect cgroup` object."""
        return {
            "pod_uid": self.pod_uid,
            "container_id": self.container_id,
            "qos": self.qos,
            "runtime": self.runtime,
            "driver": self.driver,
            "cgroup_version": self.version,
            "path": self.path,
        }


@dataclass(frozen=True, slots=True)
class _PathInfo:
    pod_uid: str | None
    container_id: str | None
    qos: Qos | None
    runtime: SeenRuntime | None
    driver: Driver | None

    @property
    def score(self) -> int:
        return (2 if self.pod_uid else 0) + (1 if self.container_id else 0)


def parse_cgroup(text: str) -> CgroupInfo:
    """Parse the contents of a `/proc/<pid>/cgroup` file; ValueError if it is not one."""
    lines: list[tuple[int, str, str]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"line {n} is not 'hierarchy-ID:controllers:/path': {line[:80]!r}")
        lines.append((int(m.group("hid")), m.group("controllers"), m.group("path")))
    if not lines:
        raise ValueError("no cgroup lines")
    version: Literal[1, 2] = 2 if all(hid == 0 and not ctl for hid, ctl, _ in lines) else 1

    # Prefer the line that names the pod (and container); on ties the systemd name line, then the
    # controller lines in file order: runtimes put a container in every v1 hierarchy at the same
    # path, while a hybrid host's unified (0::) line usually stays at "/".
    def rank(item: tuple[int, tuple[int, str, str]]) -> tuple[int, int, int]:
        pos, (hid, ctl, path) = item
        pref = 2 if ctl == "name=systemd" else 1 if hid != 0 else 0
        return (_describe(path).score, pref, -pos)

    _, (_, _, path) = max(enumerate(lines), key=rank)
    info = _describe(path)
    return CgroupInfo(info.pod_uid, info.container_id, info.qos, info.runtime, info.driver, version, path)


def _components(path: str) -> list[str]:
    parts: list[str] = []
    for p in path.split("/"):
        if p in ("", ".", ".."):
            continue
        m = _SYSTEMD_SPEC.match(p)
        parts += [m.group("slice"), f"{m.group('prefix')}-{m.group('name')}.scope"] if m else [p]
    return parts


def _describe(path: str) -> _PathInfo:
    parts = _components(path)
    pod_at: int = -1
    pod_uid: str | None = None
    qos: Qos | None = None
    driver: Driver | None = None
    for i, part in enumerate(parts):
        m = _POD.match(part)
        if m is None:
            continue
        pod_at, pod_uid = i, m.group("uid").replace("_", "-")
        if m.group("slice"):
            driver = "systemd"
            # kubepods-burstable-pod<u>.slice: the level is the word before "pod".
            words = m.group("prefix").rstrip("-").split("-")
            qos = _QOS_LEVELS.get(words[-1]) if words[-1] else None
        else:
            driver = "cgroupfs"
            qos = _QOS_LEVELS.get(parts[i - 1]) if i > 0 else None
        break  # the pod level appears once; a nested "pod…" name further down belongs to the workload

    container_id: str | None = None
    runtime: SeenRuntime | None = None
    for part in reversed(parts[pod_at + 1 :]):
        if _CONMON.match(part):
            runtime = "crio"
            break
        c = _CONTAINER.match(part)
        if c is None:
            continue  # crun's "container" child, or cgroups the workload made below its own
        container_id = c.group("id")
        kind = c.group("kind")
        if kind:
            runtime = _RUNTIME[kind]
        elif pod_at >= 0:
            runtime = "unknown"  # <pod>/<id>: containerd or cri-dockerd with cgroupfs, the same path
        elif "docker" in parts:
            runtime = "docker"
        if driver is None:
            driver = "systemd" if c.group("scope") else "cgroupfs"
        break
    if driver is None and any(p.endswith((".slice", ".scope")) for p in parts):
        driver = "systemd"
    return _PathInfo(pod_uid, container_id, qos, runtime, driver)


# ---------------------------------------------------------------- writing (simulated nodes)


def cgroup_path(
    pod_uid: str,
    container_id: str | None,
    qos: Qos,
    runtime: Runtime = "containerd",
    driver: Driver = "systemd",
    *,
    crun: bool = False,
) -> str:
    """The cgroup path the kubelet and runtime give a container (or the pod, without container_id)."""
    if qos not in ("guaranteed", "burstable", "besteffort"):
        raise ValueError(f"unknown QoS class {qos!r}")
    if not re.fullmatch(rf"{_HEX_UID}|[0-9a-f]{{32}}", pod_uid) or "_" in pod_uid:
        raise ValueError(f"not a pod UID: {pod_uid!r}")
    if container_id is not None and not re.fullmatch(r"[0-9a-f]{64}", container_id):
        raise ValueError(f"not a 64-hex container ID: {container_id!r}")
    level = "" if qos == "guaranteed" else qos
    if driver == "systemd":
        escaped = pod_uid.replace("-", "_")
        parts = ["kubepods.slice"]
        if level:
            parts.append(f"kubepods-{level}.slice")
        parts.append(f"kubepods-{level + '-' if level else ''}pod{escaped}.slice")
        leaf = {"containerd": "cri-containerd-{}.scope", "crio": "crio-{}.scope", "docker": "docker-{}.scope"}
    elif driver == "cgroupfs":
        parts = ["kubepods", *([level] if level else []), f"pod{pod_uid}"]
        leaf = {"containerd": "{}", "crio": "crio-{}", "docker": "{}"}
    else:
        raise ValueError(f"unknown cgroup driver {driver!r}")
    if runtime not in leaf:
        raise ValueError(f"unknown container runtime {runtime!r}")
    if container_id is not None:
        parts.append(leaf[runtime].format(container_id))
        if crun and runtime == "crio":
            parts.append("container")
    return "/" + "/".join(parts)


_V1_CONTROLLERS = (
    "hugetlb", "cpuset", "freezer", "net_cls,net_prio", "devices", "memory",
    "pids", "rdma", "perf_event", "blkio", "cpu,cpuacct",
)  # fmt: skip


def cgroup_file(path: str, version: Literal[1, 2] = 2) -> str:
    """The `/proc/<pid>/cgroup` text of a process in `path`: v2 unified, or a v1 hybrid host."""
    if not path.startswith("/"):
        raise ValueError(f"cgroup path must be absolute: {path!r}")
    if version == 2:
        return f"0::{path}\n"
    if version != 1:
        raise ValueError(f"cgroup version must be 1 or 2, not {version!r}")
    n = len(_V1_CONTROLLERS) + 1
    lines = [f"{n - i}:{ctl}:{path}" for i, ctl in enumerate(_V1_CONTROLLERS)]
    # Hybrid hosts also list the (unused) unified hierarchy; containers are not placed in it.
    lines += [f"1:name=systemd:{path}", "0::/"]
    return "\n".join(lines) + "\n"
