"""XID watcher: an NVML event set waited on in its own thread (nvmlEventSetWait blocks).

Each XID is handed to `on_xid` from the watcher thread; the service forwards it into its event
loop at once. Errors never end the thread: a failing wait is recorded in `error` and retried.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

_NO_INSTANCE = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class RawXid:
    gpu_uuid: str
    code: int
    gi: int | None = None
    ci: int | None = None


class XidWatcher:
    def __init__(self, nvml: Any, on_xid: Callable[[RawXid], None], *, wait_ms: int = 250) -> None:
        self.nvml = nvml
        self.on_xid = on_xid
        self.wait_ms = wait_ms
        self.registered: tuple[str, ...] = ()
        self.error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, handles: Iterable[Any]) -> None:
        """Register every GPU that supports XID events and start waiting."""
        nv = self.nvml
        event_set = nv.nvmlEventSetCreate()
        registered: list[str] = []
        for h in handles:
            try:
                if int(nv.nvmlDeviceGetSupportedEventTypes(h)) & nv.nvmlEventTypeXidCriticalError:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, event_set)
                    registered.append(str(nv.nvmlDeviceGetUUID(h)))
            except nv.NVMLError as e:  # e.g. NotSupported in some VMs: that GPU gives no XIDs
                self.error = f"register: {e}"
        self.registered = tuple(registered)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(event_set,), name="xid-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self, event_set: Any) -> None:
        nv = self.nvml
        try:
            while not self._stop.is_set():
                try:
                    data = nv.nvmlEventSetWait(event_set, self.wait_ms)
                except nv.NVMLError as e:
                    if not isinstance(e, nv.NVMLError_Timeout):
                        self.error = f"wait: {e}"
                        self._stop.wait(1.0)
                    continue
                if not int(data.eventType) & nv.nvmlEventTypeXidCriticalError:
                    continue
                try:
                    uuid = str(nv.nvmlDeviceGetUUID(data.device))
                except nv.NVMLError as e:
                    self.error = f"uuid of xid device: {e}"
                    continue
                gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
                self.on_xid(
                    RawXid(
                        gpu_uuid=uuid,
                        code=int(data.eventData),
                        gi=None if gi == _NO_INSTANCE else gi,
                        ci=None if ci == _NO_INSTANCE else ci,
                    )
                )
        finally:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(event_set)
