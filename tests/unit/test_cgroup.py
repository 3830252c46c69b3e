"""Golden table for /proc/<pid>/cgroup files: every kubelet/runtime/driver shape we must read."""

from __future__ import annotations

import pytest

from periscope.core.cgroup import CgroupInfo, cgroup_file, cgroup_path, parse_cgroup

U = "5a1d7c3e-0b2f-4c6d-9e8f-1a2b3c4d5e6f"
u = U.replace("-", "_")
C = "3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e"
S = "ab" * 32  # the sandbox (pause) container
STATIC = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def info(pod: str | None, cid: str | None, qos: str | None, runtime: str | None, driver: str | None,
         version: int, path: str) -> dict[str, object]:
    return {"pod_uid": pod, "container_id": cid, "qos": qos, "runtime": runtime, "driver": driver,
            "cgroup_version": version, "path": path}


def v1(path: str, *, systemd_path: str | None = None, unified: str = "/") -> str:
    """A cgroup v1 (hybrid) file: every controller at `path`."""
    ctls = ["hugetlb", "cpuset", "freezer", "net_cls,net_prio", "devices", "memory", "pids", "rdma",
            "perf_event", "blkio", "cpu,cpuacct"]
    lines = [f"{12 - i}:{c}:{path}" for i, c in enumerate(ctls)]
    return "\n".join([*lines, f"1:name=systemd:{systemd_path or path}", f"0::{unified}"]) + "\n"


SD_BURST = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"
SD_BE = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice"
SD_GUAR = f"/kubepods.slice/kubepods-pod{u}.slice"

GOLDEN: list[tuple[str, str, dict[str, object]]] = [
    ("v2 systemd containerd burstable", f"0::{SD_BURST}/cri-containerd-{C}.scope\n",
     info(U, C, "burstable", "containerd", "systemd", 2, f"{SD_BURST}/cri-containerd-{C}.scope")),
    ("v2 systemd containerd besteffort", f"0::{SD_BE}/cri-containerd-{C}.scope\n",
     info(U, C, "besteffort", "containerd", "systemd", 2, f"{SD_BE}/cri-containerd-{C}.scope")),
    ("v2 systemd containerd guaranteed", f"0::{SD_GUAR}/cri-containerd-{C}.scope\n",
     info(U, C, "guaranteed", "containerd", "systemd", 2, f"{SD_GUAR}/cri-containerd-{C}.scope")),
    ("v2 systemd crio", f"0::{SD_BE}/crio-{C}.scope\n",
     info(U, C, "besteffort", "crio", "systemd", 2, f"{SD_BE}/crio-{C}.scope")),
    ("v2 systemd crio + crun", f"0::{SD_BE}/crio-{C}.scope/container\n",
     info(U, C, "besteffort", "crio", "systemd", 2, f"{SD_BE}/crio-{C}.scope/container")),
    ("v2 systemd crio conmon", f"0::{SD_BE}/crio-conmon-{C}.scope\n",
     info(U, None, "besteffort", "crio", "systemd", 2, f"{SD_BE}/crio-conmon-{C}.scope")),
    ("v2 systemd docker (cri-dockerd)", f"0::{SD_GUAR}/docker-{C}.scope\n",
     info(U, C, "guaranteed", "docker", "systemd", 2, f"{SD_GUAR}/docker-{C}.scope")),
    ("v2 cgroupfs containerd burstable", f"0::/kubepods/burstable/pod{U}/{C}\n",
     info(U, C, "burstable", "unknown", "cgroupfs", 2, f"/kubepods/burstable/pod{U}/{C}")),
    ("v2 cgroupfs containerd guaranteed", f"0::/kubepods/pod{U}/{C}\n",
     info(U, C, "guaranteed", "unknown", "cgroupfs", 2, f"/kubepods/pod{U}/{C}")),
    ("v2 cgroupfs crio besteffort", f"0::/kubepods/besteffort/pod{U}/crio-{C}\n",
     info(U, C, "besteffort", "crio", "cgroupfs", 2, f"/kubepods/besteffort/pod{U}/crio-{C}")),
    ("v2 cgroupfs crio + crun", f"0::/kubepods/besteffort/pod{U}/crio-{C}/container\n",
     info(U, C, "besteffort", "crio", "cgroupfs", 2, f"/kubepods/besteffort/pod{U}/crio-{C}/container")),
    ("v2 cgroupfs crio conmon", f"0::/kubepods/pod{U}/crio-conmon-{C}\n",
     info(U, None, "guaranteed", "crio", "cgroupfs", 2, f"/kubepods/pod{U}/crio-conmon-{C}")),
    ("v2 pod level only", f"0::{SD_BURST}\n", info(U, None, "burstable", None, "systemd", 2, SD_BURST)),
    ("v2 sandbox container", f"0::/kubepods/burstable/pod{U}/{S}\n",
     info(U, S, "burstable", "unknown", "cgroupfs", 2, f"/kubepods/burstable/pod{U}/{S}")),
    ("v2 cgroup namespace, systemd",
     f"0::/../../kubepods-burstable-pod{u}.slice/cri-containerd-{C}.scope\n",
     info(U, C, "burstable", "containerd", "systemd", 2,
          f"/../../kubepods-burstable-pod{u}.slice/cri-containerd-{C}.scope")),
    ("v2 cgroup namespace hides the qos level (cgroupfs)", f"0::/../../pod{U}/{C}\n",
     info(U, C, None, "unknown", "cgroupfs", 2, f"/../../pod{U}/{C}")),
    ("v2 cgroup namespace: the container's own view", "0::/\n", info(None, None, None, None, None, 2, "/")),
    ("v2 workload's own child cgroups below the container",
     f"0::{SD_BURST}/cri-containerd-{C}.scope/init.scope\n",
     info(U, C, "burstable", "containerd", "systemd", 2, f"{SD_BURST}/cri-containerd-{C}.scope/init.scope")),
    ("v2 custom cgroup root (systemd)",
     f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{C}.scope\n",
     info(U, C, "besteffort", "containerd", "systemd", 2,
          f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
          f"kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{C}.scope")),
    ("v2 static pod (hash UID)",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice/"
     f"cri-containerd-{C}.scope\n",
     info(STATIC, C, "burstable", "containerd", "systemd", 2,
          f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice/cri-containerd-{C}.scope")),
    ("v2 host process", "0::/system.slice/kubelet.service\n",
     info(None, None, None, None, "systemd", 2, "/system.slice/kubelet.service")),
    ("v2 user manager", "0::/user.slice/user-1000.slice/user@1000.service/init.scope\n",
     info(None, None, None, None, "systemd", 2, "/user.slice/user-1000.slice/user@1000.service/init.scope")),
    ("v2 plain docker container (systemd)", f"0::/system.slice/docker-{C}.scope\n",
     info(None, C, None, "docker", "systemd", 2, f"/system.slice/docker-{C}.scope")),
    ("v1 plain docker container (cgroupfs)", v1(f"/docker/{C}"),
     info(None, C, None, "docker", "cgroupfs", 1, f"/docker/{C}")),
    ("v1 cgroupfs containerd", v1(f"/kubepods/burstable/pod{U}/{C}"),
     info(U, C, "burstable", "unknown", "cgroupfs", 1, f"/kubepods/burstable/pod{U}/{C}")),
    ("v1 systemd crio", v1(f"{SD_GUAR}/crio-{C}.scope"),
     info(U, C, "guaranteed", "crio", "systemd", 1, f"{SD_GUAR}/crio-{C}.scope")),
    ("v1: the pod path is only on some lines",
     "12:rdma:/\n11:memory:/kubepods/besteffort/pod" + U + "/" + C + "\n1:name=systemd:/\n0::/\n",
     info(U, C, "besteffort", "unknown", "cgroupfs", 1, f"/kubepods/besteffort/pod{U}/{C}")),
    ("v1: prefer the line that also names the container",
     f"4:pids:/kubepods/pod{U}\n3:memory:/kubepods/pod{U}/{C}\n1:name=systemd:/kubepods/pod{U}\n",
     info(U, C, "guaranteed", "unknown", "cgroupfs", 1, f"/kubepods/pod{U}/{C}")),
    ("v1 host process",
     "12:memory:/system.slice/sshd.service\n1:name=systemd:/system.slice/sshd.service\n0::/\n",
     info(None, None, None, None, "systemd", 1, "/system.slice/sshd.service")),
    ("trailing blank lines", f"\n0::/kubepods/pod{U}/{C}\n\n",
     info(U, C, "guaranteed", "unknown", "cgroupfs", 2, f"/kubepods/pod{U}/{C}")),
]


@pytest.mark.parametrize(("text", "expected"), [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN])
def test_golden(text: str, expected: dict[str, object]) -> None:
    parsed = parse_cgroup(text)
    assert parsed.to_json() == expected
    assert parsed.version == expected["cgroup_version"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "hello world\n",
        "0:/kubepods\n",
        "x::/kubepods\n",
        "0::kubepods/pod\n",  # paths are always absolute
        '{"Data": {}}',
        f"0::/kubepods/pod{U}\nnot a line\n",
        "Name:\tbash\nState:\tS (sleeping)\n",  # /proc/<pid>/status, not cgroup
    ],
)
def test_not_a_cgroup_file(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cgroup(text)


# ---------------------------------------------------------------- writing (simulated nodes)


@pytest.mark.parametrize(
    ("qos", "runtime", "driver", "crun", "path"),
    [
        ("burstable", "containerd", "systemd", False, f"{SD_BURST}/cri-containerd-{C}.scope"),
        ("besteffort", "crio", "systemd", False, f"{SD_BE}/crio-{C}.scope"),
        ("besteffort", "crio", "systemd", True, f"{SD_BE}/crio-{C}.scope/container"),
        ("guaranteed", "docker", "systemd", False, f"{SD_GUAR}/docker-{C}.scope"),
        ("guaranteed", "containerd", "systemd", False, f"{SD_GUAR}/cri-containerd-{C}.scope"),
        ("burstable", "containerd", "cgroupfs", False, f"/kubepods/burstable/pod{U}/{C}"),
        ("guaranteed", "containerd", "cgroupfs", False, f"/kubepods/pod{U}/{C}"),
        ("besteffort", "crio", "cgroupfs", False, f"/kubepods/besteffort/pod{U}/crio-{C}"),
        ("besteffort", "crio", "cgroupfs", True, f"/kubepods/besteffort/pod{U}/crio-{C}/container"),
    ],
)
def test_cgroup_path_matches_kubelet_layout_and_parses_back(
    qos: str, runtime: str, driver: str, crun: bool, path: str
) -> None:
    written = cgroup_path(U, C, qos, runtime, driver, crun=crun)  # type: ignore[arg-type]
    assert written == path
    for version in (1, 2):
        parsed = parse_cgroup(cgroup_file(written, version))  # type: ignore[arg-type]
        # cgroupfs: containerd and cri-dockerd write the same <pod>/<id>; only CRI-O's prefix tells
        expected_runtime = "unknown" if driver == "cgroupfs" and runtime != "crio" else runtime
        assert parsed == CgroupInfo(U, C, qos, expected_runtime, driver, version, written)  # type: ignore[arg-type]


def test_pod_level_path() -> None:
    assert cgroup_path(U, None, "burstable") == SD_BURST
    assert cgroup_path(U, None, "guaranteed", driver="cgroupfs") == f"/kubepods/pod{U}"


def test_cgroup_file_shapes() -> None:
    assert cgroup_file("/a/b") == "0::/a/b\n"
    lines = cgroup_file("/a/b", 1).splitlines()
    assert "1:name=systemd:/a/b" in lines and "7:memory:/a/b" in lines and lines[-1] == "0::/"
    assert all(line.split(":", 2)[0].isdigit() for line in lines)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pod_uid": "not-a-uid", "container_id": C, "qos": "burstable"},
        {"pod_uid": u, "container_id": C, "qos": "burstable"},  # systemd-escaped form is not a UID
        {"pod_uid": U, "container_id": "abc", "qos": "burstable"},
        {"pod_uid": U, "container_id": C, "qos": "gold"},
        {"pod_uid": U, "container_id": C, "qos": "burstable", "runtime": "rkt"},
        {"pod_uid": U, "container_id": C, "qos": "burstable", "driver": "cgroupv3"},
    ],
)
def test_cgroup_path_rejects_bad_input(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        cgroup_path(**kwargs)  # type: ignore[arg-type]


def test_cgroup_file_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        cgroup_file("relative/path")
    with pytest.raises(ValueError):
        cgroup_file("/a", 3)  # type: ignore[arg-type]
