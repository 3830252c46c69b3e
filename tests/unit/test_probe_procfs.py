"""Host PID -> pod identity through a /proc-shaped tree, with PID-reuse protection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from periscope.sim.procfs import FakeProcfs, stat_line
from services.probe.procfs import NOT_IN_POD, ProcIdentity, ProcMapper, start_time

UID_A = "5a1d3c2e-8f4b-4c1a-9e2d-0123456789ab"
UID_B = "0f9e8d7c-6b5a-4321-8765-fedcba987654"
CID_A = "a" * 63 + "1"
CID_B = "b" * 63 + "2"


def test_start_time_counts_fields_after_the_last_parenthesis() -> None:
    line = stat_line(42, "evil) S 1 2 (name", 987654)
    assert start_time(line) == 987654
    real = "1 (systemd) S 0 1 1 0 -1 4194560 5 6 7 8 9 10 11 12 20 0 1 0 33 1000 2000 18446744073709551615"
    assert start_time(real) == 33
    assert start_time(real.encode()) == 33  # the mapper reads the file as bytes


@pytest.mark.parametrize(
    ("runtime", "driver", "version", "qos"),
    [
        ("containerd", "systemd", 2, "burstable"),
        ("containerd", "cgroupfs", 2, "guaranteed"),
        ("crio", "systemd", 2, "besteffort"),
        ("crio", "cgroupfs", 1, "burstable"),
        ("containerd", "systemd", 1, "guaranteed"),
    ],
)
def test_pod_processes_resolve_for_each_runtime_and_driver(
    tmp_path: Path, runtime: Any, driver: Any, version: Any, qos: Any
) -> None:
    procfs = FakeProcfs(tmp_path / "proc")
    procfs.add_pod_process(
        4242,
        pod_uid=UID_A,
        container_id=CID_A,
        qos=qos,
        runtime=runtime,
        driver=driver,
        cgroup_version=version,
    )
    mapper = ProcMapper(str(tmp_path / "proc"))
    assert mapper.lookup(4242) == ProcIdentity(UID_A, CID_A, qos)


def test_host_process_has_no_pod_and_missing_process_is_none(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add_host_process(7)
    mapper = ProcMapper(str(tmp_path))
    assert mapper.lookup(7) == NOT_IN_POD
    assert mapper.lookup(8) is None
    assert mapper.health().state == "ok"


def test_cache_hit_until_the_pid_is_reused(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add_pod_process(100, pod_uid=UID_A, container_id=CID_A)
    mapper = ProcMapper(str(tmp_path))
    assert mapper.lookup(100) == ProcIdentity(UID_A, CID_A, "burstable")
    assert mapper.lookup(100) == ProcIdentity(UID_A, CID_A, "burstable")
    assert mapper.cgroup_reads == 1
    # The old process exits and the kernel hands PID 100 to a process of another pod.
    procfs.remove(100)
    procfs.add_pod_process(100, pod_uid=UID_B, container_id=CID_B, qos="besteffort")
    assert mapper.lookup(100) == ProcIdentity(UID_B, CID_B, "besteffort")
    assert mapper.cgroup_reads == 2


def test_prune_forgets_pids_no_longer_on_a_gpu(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add_pod_process(1, pod_uid=UID_A, container_id=CID_A)
    procfs.add_pod_process(2, pod_uid=UID_B, container_id=CID_B)
    mapper = ProcMapper(str(tmp_path))
    mapper.lookup(1)
    mapper.lookup(2)
    mapper.prune([2])
    mapper.lookup(1)
    mapper.lookup(2)
    assert mapper.cgroup_reads == 3


def test_unparseable_cgroup_is_not_a_pod(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add_process(5, "this is not a cgroup file\n")
    assert ProcMapper(str(tmp_path)).lookup(5) == NOT_IN_POD


def test_missing_proc_root_is_reported(tmp_path: Path) -> None:
    mapper = ProcMapper(str(tmp_path / "nope"))
    assert mapper.lookup(1) is None
    assert mapper.health().state == "absent"
