"""Host PID -> pod UID, container ID and QoS class, from `<proc_root>/<pid>/cgroup`.

NVML reports host PIDs; the probe reads the host's /proc (hostPID) or a copy mounted elsewhere
(`proc_root`). Results are cached per PID together with the process start time (field 22 of
`/proc/<pid>/stat`), so a PID recycled by the kernel for a new process is looked up again instead of
being attributed to the pod that owned the old process. A known process costs one small `stat` read
per tick, through plain file descriptors (no path objects, no text decoding); its cgroup file is read
once per (PID, start time).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from periscope.core.cgroup import parse_cgroup
from periscope.core.model import SourceHealth

_STARTTIME_FIELD = 22
# A stat line is 52 numbers and a command name of at most 64 bytes: well under this.
_STAT_MAX = 4096


@dataclass(frozen=True, slots=True)
class ProcIdentity:
    pod_uid: str = ""
    container_id: str = ""
    qos: str = ""


NOT_IN_POD = ProcIdentity()


def start_time(stat_text: str | bytes) -> int:
    """Field 22 (starttime, clock ticks since boot) of a /proc/<pid>/stat line.

    The command name (field 2) is in parentheses and may itself contain spaces and ')', so fields
    are counted from the last ')'.
    """
    data = stat_text.encode() if isinstance(stat_text, str) else stat_text
    rest = data[data.rindex(b")") + 1 :].split()
    return int(rest[_STARTTIME_FIELD - 3])


def _read_small(path: str) -> bytes:
    """A /proc file of at most a few hundred bytes, in one read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, _STAT_MAX)
    finally:
        os.close(fd)


class ProcMapper:
    def __init__(self, proc_root: str) -> None:
        self.root = Path(proc_root)
        self._prefix = str(self.root)
        self._cache: dict[int, tuple[int, ProcIdentity]] = {}
        self.lookups = 0
        self.cgroup_reads = 0
        self.last_error = ""

    def lookup(self, pid: int) -> ProcIdentity | None:
        """The identity of `pid`, or None when the process is gone or unreadable."""
        self.lookups += 1
        stat = f"{self._prefix}/{pid}/stat"
        try:
            started = start_time(_read_small(stat))
        except FileNotFoundError:
            self._cache.pop(pid, None)
            return None
        except (OSError, ValueError, IndexError) as e:
            self.last_error = f"{stat}: {e}"
            return None
        cached = self._cache.get(pid)
        if cached is not None and cached[0] == started:
            return cached[1]
        base = self.root / str(pid)
        try:
            text = (base / "cgroup").read_text()
        except FileNotFoundError:
            self._cache.pop(pid, None)
            return None
        except OSError as e:
            self.last_error = f"{base / 'cgroup'}: {e}"
            return None
        self.cgroup_reads += 1
        try:
            info = parse_cgroup(text)
            ident = ProcIdentity(info.pod_uid or "", info.container_id or "", info.qos or "")
        except ValueError:
            ident = NOT_IN_POD  # not a pod process, or a cgroup file we cannot read
        self._cache[pid] = (started, ident)
        return ident

    def comm(self, pid: int) -> str | None:
        """The command name of `pid` (`comm`, else the name in `stat`), or None when unreadable."""
        base = self.root / str(pid)
        try:
            return (base / "comm").read_text().strip()
        except OSError:
            pass
        try:
            stat = (base / "stat").read_text()
            return stat[stat.index("(") + 1 : stat.rindex(")")]
        except (OSError, ValueError):
            return None

    def prune(self, live: Iterable[int]) -> None:
        """Forget PIDs that are no longer on any GPU."""
        keep = set(live)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]

    def health(self) -> SourceHealth:
        if not self.root.is_dir():
            return SourceHealth("procfs", "absent", f"{self.root} is not a directory")
        if self.last_error:
            return SourceHealth("procfs", "error", self.last_error)
        return SourceHealth("procfs", "ok")
