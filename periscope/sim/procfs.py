"""A /proc-shaped tree for simulated nodes: `<root>/<pid>/cgroup`, `stat` and `comm`.

The simulator keeps one `FakeProcfs` per node and registers the host PIDs its simulated GPU
processes have:

    procfs = FakeProcfs(root / "gpu-a" / "proc")
    procfs.add_pod_process(4242, pod_uid="5a1d...", container_id="ab12...(64 hex)", qos="burstable",
                           runtime="containerd", driver="systemd")
    procfs.add_host_process(999, "/system.slice/nvidia-persistenced.service")
    procfs.remove(4242)

Cgroup paths come from `periscope.core.cgroup` (the same shapes the kubelet, containerd and CRI-O
create). Every file is written to a temporary name and renamed, so a probe reading concurrently never
sees half a file. `stat` carries a start time (field 22) that changes when a PID is re-used.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from periscope.core.cgroup import Driver, Qos, Runtime, cgroup_file, cgroup_path


def atomic_write(path: Path, data: str | bytes, mtime_ns: int | None = None) -> None:
    """Replace a file so that a reader sees the old or the new content, never a part (temp + rename),
    with the given mtime if any. A few lines of the standard library; no dependency offers more for a
    single writer."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    if mtime_ns is not None:
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, path)


def stat_line(pid: int, comm: str, start_time: int, ppid: int = 1) -> str:
    """A /proc/<pid>/stat line (52 fields) with the given start time in field 22."""
    fields = ["S", str(ppid), str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(start_time)]
    fields += ["0"] * (52 - 2 - len(fields))
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


class FakeProcfs:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._next_start = 100_000

    def add_process(
        self, pid: int, cgroup_text: str, *, comm: str = "python", start_time: int | None = None
    ) -> int:
        """Write a process with a literal cgroup file; returns its start time."""
        if start_time is None:
            self._next_start += 137  # strictly increasing: a re-used PID always gets a new start time
            start_time = self._next_start
        d = self.root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        comm = comm[:15]  # the kernel keeps 15 characters
        atomic_write(d / "cgroup", cgroup_text)
        atomic_write(d / "stat", stat_line(pid, comm, start_time))
        atomic_write(d / "comm", comm + "\n")
        return start_time

    def add_pod_process(
        self,
        pid: int,
        *,
        pod_uid: str,
        container_id: str,
        qos: Qos = "burstable",
        runtime: Runtime = "containerd",
        driver: Driver = "systemd",
        cgroup_version: Literal[1, 2] = 2,
        comm: str = "python",
        start_time: int | None = None,
    ) -> int:
        """A process inside a pod's container, with the cgroup path that runtime/driver produce."""
        path = cgroup_path(pod_uid, container_id, qos, runtime=runtime, driver=driver)
        return self.add_process(
            pid, cgroup_file(path, version=cgroup_version), comm=comm, start_time=start_time
        )

    def add_host_process(
        self,
        pid: int,
        path: str = "/system.slice/nvidia-persistenced.service",
        *,
        comm: str = "daemon",
        start_time: int | None = None,
    ) -> int:
        """A process outside Kubernetes (cgroup v2 single line)."""
        return self.add_process(pid, f"0::{path}\n", comm=comm, start_time=start_time)

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid), ignore_errors=True)

    def pids(self) -> list[int]:
        return sorted(int(p.name) for p in self.root.iterdir() if p.name.isdigit())
