"""The node probe: samples its sources and publishes node-keyed events through the outbox.

Loops (one asyncio task each; blocking NVML and /proc work runs in a worker thread):
- telemetry, every `tick`: one NodeTelemetry with every GPU and MIG instance and their processes,
  each process labelled with pod UID / container ID / QoS from /proc;
- allocations: every `tick` one stat of the checkpoint, and one before and after each telemetry sample
  (a changed checkpoint is polled first, and a change during the sample takes it again after the poll,
  so a pod's first sample is never published ahead of the snapshot that gives it its devices: its GPU
  time is not lost to unattributed usage); PodResources is asked
  when the checkpoint changed or is unusable, at once when the kubelet socket appears, vanishes or is
  replaced, and otherwise every `podresources_interval` (see services/probe/kubelet.py): an AllocationSnapshot
  when it changed, and every `allocation_interval` regardless (with a fresh poll);
- XIDs from the NVML event thread, published as they arrive;
- DeviceInventory at start, whenever the hardware or a source's health changes, and at least every
  PERISCOPE_INVENTORY_INTERVAL (1h) all the same (the API checks GPU states against it).
Every event carries EventMeta(node, "probe/<node>", epoch = start time, seq), and its time is the
wall clock read once at sampling: `clock` is the only clock read for event time (injectable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from periscope.bus import topics
from periscope.clock import clock_from_setting
from periscope.core.model import (
    AllocationSnapshot,
    DeviceInventory,
    DeviceSample,
    Meta,
    MigRef,
    NodeTelemetry,
    SourceHealth,
    XidEvent,
)
from periscope.settings.probe import ProbeSettings
from services.probe.buffer import Kind, OutBuffer, Outgoing
from services.probe.dcgm import DcgmSource
from services.probe.health import HealthServer
from services.probe.kubelet import AllocationReader
from services.probe.metrics import ProbeMetrics
from services.probe.nvml import NvmlBackend
from services.probe.nvml_source import load_nvml
from services.probe.outbox import Outbox, PublisherLike
from services.probe.procfs import ProcMapper
from services.probe.xid import RawXid, XidWatcher

log = logging.getLogger("periscope.probe")
Clock = Callable[[], int]
_NVML_RETRY_S = 10.0


def default_publisher(settings: ProbeSettings) -> Callable[[], PublisherLike]:
    from periscope.bus.producer import Publisher

    # Each publisher is built anew (after a broker failure too), so it reads a rotated password file.
    return lambda: Publisher(settings.kafka(), f"periscope-probe-{settings.node_name}")


class Probe:
    def __init__(
        self,
        settings: ProbeSettings,
        *,
        nvml: Any | None = None,
        publisher_factory: Callable[[], PublisherLike] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = s = settings
        self.node = s.node_name
        self.source = f"probe/{s.node_name}"
        # Injected for tests; otherwise the configured clock (wall, or the simulator's scaled one).
        self.clock = clock or clock_from_setting(s.clock).now_ms
        self.epoch = self.clock()
        self._seq = 0
        self.metrics = ProbeMetrics(s.node_name)
        self.buffer = OutBuffer(s.buffer_limit)
        self.outbox = Outbox(
            self.buffer, publisher_factory or default_publisher(s), self.metrics, send_timeout=s.send_timeout,
            stale_after=s.stale_after,
        )
        self.procs = ProcMapper(s.proc_root)
        self.nvml = NvmlBackend(
            nvml if nvml is not None else load_nvml(s.nvml_backend),
            proc_name=self.procs.comm,
            identify=self.procs.lookup,
        )
        self.allocations = AllocationReader(
            s.podresources_socket,
            s.checkpoint_path,
            s.node_name,
            allocatable_every=s.allocation_interval,
            poll_every=s.podresources_every(),
        )
        self.health_server = HealthServer(
            s.health_host, s.health_port, live=self._live, ready=self._ready, metrics=self._metrics
        )
        self.xids = XidWatcher(self.nvml.nvml, self._xid_from_thread)
        self.dcgm = (
            DcgmSource(s.dcgm_exporter_url, s.dcgm_every(), s.dcgm_timeout, s.dcgm_max_bytes)
            if s.dcgm_exporter_url else None
        )
        self.nvml_health = SourceHealth("nvml", "unavailable", "not initialised")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._kubelet_changed = asyncio.Event()
        self._polling = asyncio.Lock()  # one allocation poll at a time (both loops may start one)
        self._last_inventory: tuple[Any, ...] | None = None
        self._last_inventory_at = 0.0
        self._last_health: tuple[SourceHealth, ...] = ()
        self._last_snapshot: tuple[Any, ...] | None = None
        self._last_snapshot_at = 0.0
        self._nvml_retry_at = 0.0
        self._started = False

    # ------------------------------------------------------------------ events

    def _meta(self, time_ms: int | None = None) -> Meta:
        self._seq += 1
        at = self.clock() if time_ms is None else time_ms
        return Meta(node=self.node, source=self.source, epoch=self.epoch, seq=self._seq, time_ms=at)

    def _put(self, kind: Kind, topic: topics.Topic, value: object) -> None:
        self.outbox.put(Outgoing(kind, topic, self.node, value))

    def health(self) -> tuple[SourceHealth, ...]:
        mig = self.nvml.mig_health()
        dcgm = (self.dcgm.health,) if self.dcgm is not None else ()
        return (*self.allocations.health(), self.nvml_health, *((mig,) if mig else ()), self.procs.health(),
                *dcgm)

    def _publish_inventory(self, force: bool = False) -> None:
        inv, health = self.nvml.inventory, self.health()
        key = (
            inv.gpus,
            inv.driver_version,
            inv.cuda_driver_version,
            tuple((h.source, h.state) for h in health),
        )
        if health != self._last_health:  # the gauges only move when a source's health does
            self._last_health = health
            self.metrics.set_health(health)
        due = time.monotonic() - self._last_inventory_at >= self.settings.inventory_interval
        if not force and not due and key == self._last_inventory:
            return
        self._last_inventory, self._last_inventory_at = key, time.monotonic()
        self._put(
            Kind.INVENTORY,
            topics.INVENTORY,
            DeviceInventory(
                meta=self._meta(),
                gpus=inv.gpus,
                health=health,
                driver_version=inv.driver_version,
                cuda_driver_version=inv.cuda_driver_version,
            ),
        )

    # ------------------------------------------------------------------ NVML

    async def _open_nvml(self) -> None:
        if self.nvml.opened or time.monotonic() < self._nvml_retry_at:
            return
        try:
            await asyncio.to_thread(self.nvml.open)
            inv = await asyncio.to_thread(self.nvml.refresh)
        except Exception as e:  # NvmlUnavailable (no driver yet) or worse: report, retry later, keep running
            self.nvml.close()
            self.nvml_health = SourceHealth("nvml", "unavailable", str(e))
            self._nvml_retry_at = time.monotonic() + _NVML_RETRY_S
            return
        self.nvml_health = SourceHealth("nvml", "error" if inv.errors else "ok", "; ".join(inv.errors))
        await asyncio.to_thread(self._restart_xids)

    def _restart_xids(self) -> None:
        self.xids.stop()
        try:
            self.xids.start(self.nvml.handles())
        except Exception as e:  # event sets unsupported: telemetry still works
            log.warning("XID events unavailable: %s", e)

    def _xid_from_thread(self, raw: RawXid) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_xid, raw)

    def _on_xid(self, raw: RawXid) -> None:
        mig: MigRef | None = None
        if raw.gi is not None:
            mig = self.nvml.inventory.mig_ref(raw.gpu_uuid, raw.gi, raw.ci or 0) or MigRef(
                uuid="", gi=raw.gi, ci=raw.ci or 0
            )
        self.metrics.xids.labels(self.node).inc()
        self._put(
            Kind.XID, topics.XID, XidEvent(meta=self._meta(), gpu_uuid=raw.gpu_uuid, code=raw.code, mig=mig)
        )

    def _sample(self) -> tuple[DeviceSample, ...]:
        """NVML sample with pod identity on every process (worker thread): the backend labels each
        process from /proc as it builds it."""
        devices = self.nvml.sample()
        self.procs.prune(p.pid for d in devices for p in d.processes)
        if self.dcgm is not None:
            devices = self.dcgm.annotate(devices)
            self.metrics.dcgm_devices.labels(self.node).set(sum(d.dcgm is not None for d in devices))
        return devices

    async def _allocations_changed(self) -> bool:
        """Poll the allocations if the checkpoint changed (one stat; the device manager allocated).
        Never waits on a poll in progress: a kubelet that does not answer must not stall the samples."""
        if self._polling.locked() or not self.allocations.checkpoint.changed():
            return False
        await self._poll_allocations()
        return True

    async def _sample_after_allocations(self) -> tuple[int, tuple[DeviceSample, ...]]:
        """A sample taken after the allocations it may show: a changed checkpoint is polled first, and
        when it changed while sampling, the sample is taken again after the poll."""
        await self._allocations_changed()
        at = self.clock()  # the sample's event time: when it was taken, not when it was sent
        devices = await asyncio.to_thread(self._sample)
        if await self._allocations_changed():
            at = self.clock()
            devices = await asyncio.to_thread(self._sample)
        return at, devices

    async def _telemetry_loop(self) -> None:
        refresh_every = max(1, round(self.settings.allocation_interval / self.settings.tick))
        n = 0
        while not self._stop.is_set():
            started = time.monotonic()
            await self._open_nvml()
            if self.nvml.opened:
                try:
                    at, devices = await self._sample_after_allocations()
                    self._put(
                        Kind.TELEMETRY, topics.TELEMETRY, NodeTelemetry(meta=self._meta(at), devices=devices)
                    )
                    n += 1
                    if n % refresh_every == 0 or any(d.lost for d in devices):
                        before = {g.uuid for g in self.nvml.inventory.gpus}
                        inv = await asyncio.to_thread(self.nvml.refresh)
                        self.nvml_health = SourceHealth(
                            "nvml", "error" if inv.errors else "ok", "; ".join(inv.errors)
                        )
                        if {g.uuid for g in inv.gpus} != before:
                            await asyncio.to_thread(self._restart_xids)
                except Exception as e:  # one bad sample must not end the loop
                    log.exception("telemetry sample failed")
                    self.nvml_health = SourceHealth("nvml", "error", str(e))
            self._publish_inventory()
            await self._sleep(self.settings.tick - (time.monotonic() - started))

    # ------------------------------------------------------------------ dcgm-exporter

    async def _dcgm_loop(self) -> None:
        """Scrape the exporter every interval (its own loop: a slow exporter never delays a sample)."""
        src = self.dcgm
        assert src is not None
        while not self._stop.is_set():
            started = time.monotonic()
            await asyncio.to_thread(src.scrape)
            self.metrics.dcgm_scrapes.labels(self.node, src.last_result).inc()
            self.metrics.dcgm_scrape_seconds.labels(self.node).observe(src.last_duration_s)
            await self._sleep(src.interval_s - (time.monotonic() - started))

    # ------------------------------------------------------------------ allocations

    async def _allocation_loop(self) -> None:
        # Every tick costs one stat of the checkpoint; the gRPC poll runs only when it may see something
        # new (AllocationReader.due), when the socket changed, soon after a failure, and when the
        # unchanged snapshot is due again (every allocation_interval, with a fresh List).
        kick = False
        while not self._stop.is_set():
            self._kubelet_changed.clear()
            retry_soon = False
            resend = time.monotonic() - self._last_snapshot_at >= self.settings.allocation_interval
            if kick or resend or self.allocations.due():
                retry_soon = await self._poll_allocations()
            delay = 0.2 if retry_soon else self.settings.tick
            kick = retry_soon
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wait_any(self._kubelet_changed, self._stop), delay)
            kick = kick or self._kubelet_changed.is_set()

    async def _poll_allocations(self) -> bool:
        async with self._polling:
            return await self._poll_allocations_now()

    async def _poll_allocations_now(self) -> bool:
        view = await self.allocations.poll(self.nvml.inventory)
        key = (view.entries, view.allocatable, view.health)
        due = time.monotonic() - self._last_snapshot_at >= self.settings.allocation_interval
        if key != self._last_snapshot or due:
            self._last_snapshot, self._last_snapshot_at = key, time.monotonic()
            self._put(
                Kind.ALLOCATION,
                topics.ALLOCATIONS,
                AllocationSnapshot(
                    meta=self._meta(), entries=view.entries, allocatable=view.allocatable, health=view.health
                ),
            )
        self._publish_inventory()
        return view.retry_soon

    # ------------------------------------------------------------------ health endpoints

    def _live(self) -> tuple[bool, dict[str, Any]]:
        alive = self._started and all(not t.done() for t in self._tasks)
        return alive, {"ok": alive}

    def _metrics(self) -> bytes:
        self.metrics.data_age.labels(self.node).set(self.outbox.data_age_s())
        return self.metrics.render()

    def _ready(self) -> tuple[bool, dict[str, Any]]:
        health = {h.source: {"state": h.state, "detail": h.detail} for h in self.health()}
        allocation_ok = any(health[s]["state"] == "ok" for s in ("podresources", "checkpoint"))
        nvml_ok = health["nvml"]["state"] != "unavailable"  # "error": some GPUs fail, the others report
        age = self.outbox.data_age_s()
        fresh = age <= self.settings.stale_after
        self.metrics.data_age.labels(self.node).set(age)
        ready = self._live()[0] and self.outbox.connected and fresh and allocation_ok and nvml_ok
        return ready, {
            "ready": ready,
            "data_age_s": round(age, 3),
            "stale": not fresh,
            "sources": health,
            "broker": "connected" if self.outbox.connected else "disconnected",
            "buffered": len(self.buffer),
            "dropped": dict(self.buffer.dropped),
        }

    # ------------------------------------------------------------------ lifecycle

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), max(seconds, 0.0))

    @staticmethod
    async def _wait_any(*events: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    @property
    def health_port(self) -> int:
        return self.health_server.port

    async def start(self) -> None:
        """Start serving: first inventory and snapshot are enqueued before this returns."""
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        await self.health_server.start()
        await self._open_nvml()
        await self._poll_allocations()
        self._publish_inventory(force=True)
        self._tasks = [
            asyncio.create_task(self.outbox.run(self._stop), name="probe-outbox"),
            asyncio.create_task(self._telemetry_loop(), name="probe-telemetry"),
            asyncio.create_task(self._allocation_loop(), name="probe-allocations"),
            asyncio.create_task(
                self.allocations.watch(self._kubelet_changed.set, self._stop), name="probe-socket"
            ),
        ]
        if self.dcgm is not None:
            self._tasks.append(asyncio.create_task(self._dcgm_loop(), name="probe-dcgm"))
        self._started = True

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.to_thread(self.xids.stop)
        for t in self._tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(t, 10.0)
        self._tasks = []
        self._started = False
        await self.allocations.close()
        self.nvml.close()
        if self.dcgm is not None:
            self.dcgm.close()
        await self.health_server.stop()

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()
