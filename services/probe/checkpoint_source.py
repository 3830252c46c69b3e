"""Read-only source of CHECKPOINT allocation entries: the device manager's checkpoint file.

The file is the only node-local record with pod UIDs, but it is internal and may be absent (no
device plugin yet, or a kubelet that moved on) or corrupt (a torn write, a foreign format). Either
case is reported as the `checkpoint` source's health and yields no entries, so the snapshot carries
PodResources data alone. A checksum that does not match is treated as the kubelet treats it: the
file is not trusted. The file is parsed again only when its stat identity changes, and once more
when a file read within RACY_NS of its last change has settled: the kubelet replaces it by rename, so
its inode alternates between two, and its mtime has the file system's granularity (a kernel tick, or
a second on ext4 with small inodes), so two writes within one can carry the same identity ("racy", as
git says of its index).

Each entry carries its AllocResp's NVIDIA_VISIBLE_DEVICES (what the container was given): for HAMi's
virtual devices that names the card, which the device IDs may not (periscope.core.allocation).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from periscope.core.model import AllocationEntry, AllocSource, SourceHealth
from periscope.kubelet.checkpoint import CheckpointError, parse_checkpoint, read_checkpoint_file
from services.probe.allocations import is_gpu_resource

_Stamp = tuple[int, int, int, int]
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
RACY_NS = 2_000_000_000  # over the coarsest mtime granularity of a kubelet's file system (1 s)


def _stamp_of(st: os.stat_result) -> _Stamp:
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


class CheckpointSource:
    def __init__(self, path: str, now_ns: Callable[[], int] = time.time_ns) -> None:
        self.path = path
        self.parses = 0
        self._now_ns = now_ns
        self._stamp: _Stamp | None = None
        self._racy_mtime: int | None = None  # the last read's mtime, if it was read within RACY_NS of it
        self._result: tuple[tuple[AllocationEntry, ...], SourceHealth] = (
            (),
            SourceHealth("checkpoint", "absent", f"{path} not read yet"),
        )

    @property
    def stamp(self) -> _Stamp | None:
        """The file's stat identity at the last read (None: absent or unreadable)."""
        return self._stamp

    def changed(self) -> bool:
        """Whether the file differs (stat identity) from what the last read saw, or the last read was
        racy and the file has settled since: one stat, no read."""
        try:
            st = os.stat(self.path)
        except OSError:
            return self._stamp is not None
        return self._differs(_stamp_of(st))

    def _differs(self, stamp: _Stamp) -> bool:
        """`stamp` is not the last read's, or the last read came too soon after a change to trust its
        stamp and that change is now old enough that any later write would carry a later mtime."""
        if stamp != self._stamp:
            return True
        return self._racy_mtime is not None and self._now_ns() - self._racy_mtime >= RACY_NS

    def read(self) -> tuple[tuple[AllocationEntry, ...], SourceHealth]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp = self._racy_mtime = None
            return (), SourceHealth("checkpoint", "absent", f"{self.path} does not exist")
        except OSError as e:
            self._stamp = self._racy_mtime = None
            return (), SourceHealth("checkpoint", "error", f"{self.path}: {e.strerror or e}")
        stamp = _stamp_of(st)
        if self._differs(stamp):
            self._result = self._parse()
            self._stamp = stamp
            self._racy_mtime = st.st_mtime_ns if self._now_ns() - st.st_mtime_ns < RACY_NS else None
        return self._result

    def _parse(self) -> tuple[tuple[AllocationEntry, ...], SourceHealth]:
        self.parses += 1
        try:
            data = read_checkpoint_file(self.path)  # bounded: see MAX_CHECKPOINT_BYTES
        except FileNotFoundError:
            return (), SourceHealth("checkpoint", "absent", f"{self.path} does not exist")
        except OSError as e:
            return (), SourceHealth("checkpoint", "error", f"{self.path}: {e.strerror or e}")
        except CheckpointError as e:
            return (), SourceHealth("checkpoint", "corrupt", str(e))
        try:
            cp = parse_checkpoint(data)
        except CheckpointError as e:
            return (), SourceHealth("checkpoint", "corrupt", str(e))
        if cp.checksum_ok is False:
            return (), SourceHealth("checkpoint", "corrupt", f"{cp.format} checkpoint: checksum mismatch")
        entries = tuple(
            AllocationEntry(
                source=AllocSource.CHECKPOINT,
                container=e.container,
                resource=e.resource,
                device_ids=e.device_ids,
                pod_uid=e.pod_uid,
                visible_devices=_visible(e.alloc),
            )
            for e in cp.entries
            if is_gpu_resource(e.resource) and e.device_ids
        )
        checksum = {True: "checksum ok", None: "checksum not verified"}[cp.checksum_ok]
        return entries, SourceHealth("checkpoint", "ok", f"{cp.format}, {checksum}")


def _visible(alloc: dict[str, Any] | None) -> tuple[str, ...]:
    envs = (alloc or {}).get("envs") or {}
    raw = str(envs.get(VISIBLE_DEVICES_ENV, ""))
    return tuple(v.strip() for v in raw.split(",") if v.strip())
