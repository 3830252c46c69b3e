"""What the kubelet says is allocated on this node: PodResources (with DRA) plus the checkpoint.

`AllocationReader.poll()` asks both sources and returns the entries, the allocatable devices and
the health of `podresources`, `checkpoint` and `dra`. While the PodResources socket is absent or
refuses calls, its state is "unavailable" and none of its entries are returned: data from before
the outage is never re-published as if current, and the checkpoint (if readable) stands alone.

A poll costs gRPC calls, so the service polls when `due()`: the device manager rewrites its
checkpoint whenever it allocates devices (a new pod), so a changed checkpoint file (one stat) means
"poll now"; so does a checkpoint that is absent or unusable (nothing to signal with), and otherwise a
poll is due every `poll_every` seconds, which bounds how late a change the checkpoint does not show
(a pod's end: the file keeps ended pods until the next admission; DRA claims) reaches the snapshot.
The service also polls at once when the socket is replaced (kubelet restart) and soon after a failure.

The allocatable devices change only when a device plugin registers or reports a device change, which
the kubelet also records in the checkpoint (`RegisteredDevices`), so `GetAllocatableResources` is
asked again only on a new channel, when the checkpoint changed, after a failed poll, and otherwise
every `allocatable_every` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from grpc import aio

from periscope.core.model import AllocationEntry, AllocSource, SourceHealth
from services.probe.allocations import allocatable_devices, dra_resolver, podresources_entries, sort_entries
from services.probe.checkpoint_source import CheckpointSource
from services.probe.nvml import NvmlInventory
from services.probe.podresources import (
    PodResourcesClient,
    PodResourcesUnavailable,
    socket_identity,
    watch_socket,
)

log = logging.getLogger("periscope.probe.kubelet")


@dataclass(frozen=True, slots=True)
class AllocationView:
    entries: tuple[AllocationEntry, ...]
    allocatable: tuple[tuple[str, str], ...]
    health: tuple[SourceHealth, ...]
    retry_soon: bool = False  # the socket exists but the call failed: the kubelet may be starting


class AllocationReader:
    def __init__(
        self,
        socket_path: str,
        checkpoint_path: str,
        node: str,
        *,
        allocatable_every: float = 5.0,
        poll_every: float = 2.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.client = PodResourcesClient(socket_path)
        self.checkpoint = CheckpointSource(checkpoint_path)
        self.allocatable_every = allocatable_every
        self.poll_every = poll_every
        self._now = now
        self._polled_at: float | None = None
        # The last GetAllocatableResources answer and what it was asked under: (connects, checkpoint
        # stamp, time); None when it must be asked again.
        self._allocatable: tuple[tuple[str, str], ...] | None = None
        self._allocatable_key: tuple[int, object] = (0, None)
        self._allocatable_at = 0.0
        self._health: tuple[SourceHealth, ...] = (
            SourceHealth("podresources", "unavailable", "not polled yet"),
            SourceHealth("checkpoint", "absent", "not read yet"),
            SourceHealth("dra", "unavailable", "not polled yet"),
        )

    def health(self) -> tuple[SourceHealth, ...]:
        return self._health

    def due(self) -> bool:
        """Whether a poll may see something new (see the module doc): cheap, no gRPC."""
        if self._polled_at is None or self._now() - self._polled_at >= self.poll_every:
            return True
        checkpoint_ok = any(h.source == "checkpoint" and h.state == "ok" for h in self._health)
        return not checkpoint_ok or self.checkpoint.changed()

    async def poll(self, inventory: NvmlInventory) -> AllocationView:
        self._polled_at = self._now()
        cp_entries, cp_health = self.checkpoint.read()
        entries: list[AllocationEntry] = list(cp_entries)
        allocatable: tuple[tuple[str, str], ...] = ()
        retry = False
        try:
            pods = await self.client.list_pods()
            allocatable = await self._allocatable_devices()
            get_mode = await self.client.get_mode()
        except PodResourcesUnavailable as e:
            self._allocatable = None
            retry = socket_identity(self.client.socket_path) is not None
            pr_health = SourceHealth("podresources", "unavailable", str(e))
            dra_health = SourceHealth("dra", "unavailable", "podresources unavailable")
        except aio.AioRpcError as e:
            self._allocatable = None
            retry = True
            pr_health = SourceHealth("podresources", "error", f"{e.code().name}: {e.details()}")
            dra_health = SourceHealth("dra", "unavailable", "podresources failed")
        else:
            pr = podresources_entries(pods, dra_resolver(inventory))
            entries.extend(pr)
            pr_health = SourceHealth("podresources", "ok", f"get={get_mode}")
            dra_health = self._dra_health(pr, get_mode)
        self._health = (pr_health, cp_health, dra_health)
        return AllocationView(sort_entries(entries), allocatable, self._health, retry)

    async def _allocatable_devices(self) -> tuple[tuple[str, str], ...]:
        """GetAllocatableResources, asked again only when it may have changed (see the module doc)."""
        key = (self.client.connects, self.checkpoint.stamp)
        now = self._now()
        stale = now - self._allocatable_at >= self.allocatable_every
        if self._allocatable is None or key != self._allocatable_key or stale:
            self._allocatable = allocatable_devices(await self.client.allocatable())
            self._allocatable_key, self._allocatable_at = key, now
        return self._allocatable

    @staticmethod
    def _dra_health(entries: list[AllocationEntry], get_mode: str) -> SourceHealth:
        # The kubelet fills dynamic_resources only with KubeletPodResourcesDynamicResources on; that gate
        # went beta together with KubeletPodResourcesGet, so Get's state is the best available hint.
        if any(e.source is AllocSource.DRA for e in entries):
            bad = sorted({e.device for e in entries if e.source is AllocSource.DRA and not e.device_ids})
            if bad:  # their rows say unresolved; this says which, and the nvml/mig health why
                shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
                why = f"{len(bad)} DRA devices not resolved to NVML devices: {shown}"
                return SourceHealth("dra", "error", why)
            return SourceHealth("dra", "ok", "")
        if get_mode == "enabled":
            return SourceHealth("dra", "ok", "no claims")
        return SourceHealth("dra", "disabled", f"PodResources Get {get_mode}; dynamic_resources likely off")

    async def watch(self, on_change: Callable[[], None], stop: asyncio.Event) -> None:
        await watch_socket(self.client.socket_path, lambda _ident: on_change(), stop=stop)

    async def close(self) -> None:
        await self.client.close()
