"""A fake kubelet PodResources endpoint: the real `v1.PodResourcesLister` gRPC service on a unix socket.

The simulator runs one `FakeKubelet` per simulated node, all in one asyncio loop:

    kubelet = FakeKubelet(root / "gpu-a" / "pod-resources" / "kubelet.sock")
    await kubelet.start()
    kubelet.set_allocatable([("nvidia.com/gpu", "GPU-8a1b...")])
    kubelet.set_pods([FakePod("ml", "train-0", (FakeContainer("cuda", (FakeDevices("nvidia.com/gpu",
        ("GPU-8a1b...",)),)),))])
    await kubelet.restart(down_s=0.5)   # socket deleted, absent for 0.5 s, then recreated
    await kubelet.stop()

State setters and attributes are plain synchronous; the next RPC sees the new state. Behaviour follows
the kubelet's server_v1.go: `List` returns every pod set here; `Get` answers according to the `get_mode`
attribute ("enabled", "disabled" = feature gate off, "unimplemented" = a kubelet older than 1.27);
`dynamic_resources` is filled in only while the attribute `dynamic_resources` is true (the
KubeletPodResourcesDynamicResources gate). Like the kubelet, the server rate-limits every call
(100 qps, burst 10) and rejects excess calls with RESOURCE_EXHAUSTED; `rejected` counts them and
`calls` counts accepted calls per method.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import grpc
from grpc import aio

from periscope.k8s.podresources.v1 import api_pb2 as pb
from periscope.k8s.podresources.v1 import api_pb2_grpc as pb_grpc


@dataclass(frozen=True, slots=True)
class FakeDevices:
    """One resource's devices in a container (ContainerDevices)."""

    resource: str
    device_ids: tuple[str, ...]
    numa: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class FakeClaimDevice:
    """One allocated DRA device (ClaimResource): the (driver, pool, device) triple."""

    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class FakeClaim:
    claim_name: str
    claim_namespace: str
    devices: tuple[FakeClaimDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class FakeContainer:
    name: str
    devices: tuple[FakeDevices, ...] = ()
    claims: tuple[FakeClaim, ...] = ()


@dataclass(frozen=True, slots=True)
class FakePod:
    namespace: str
    name: str
    containers: tuple[FakeContainer, ...] = ()


class KubeletBucket:
    """Token bucket like golang.org/x/time/rate: `qps` tokens per second, at most `burst` saved.
    By hand: no direct dependency has one; mode's TokenBucket (under Faust) lets burst + 1 through.
    `now` is the clock it reads (tests replay call times through it)."""

    def __init__(self, qps: float, burst: int, now: Callable[[], float] = time.monotonic) -> None:
        self.qps, self.burst, self._now = qps, burst, now
        self.tokens = float(burst)
        self.stamp = now()

    def allow(self) -> bool:
        now = self._now()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.qps)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def _devices_pb(devices: Iterable[FakeDevices]) -> list[pb.ContainerDevices]:
    out = []
    for d in devices:
        topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in d.numa]) if d.numa else None
        out.append(pb.ContainerDevices(resource_name=d.resource, device_ids=d.device_ids, topology=topo))
    return out


def _claims_pb(claims: Iterable[FakeClaim]) -> list[pb.DynamicResource]:
    return [
        pb.DynamicResource(claim_name=c.claim_name, claim_namespace=c.claim_namespace, claim_resources=[
            pb.ClaimResource(driver_name=d.driver, pool_name=d.pool, device_name=d.device,
                             share_id=d.share_id, cdi_devices=[pb.CDIDevice(name=n) for n in d.cdi_devices])
            for d in c.devices])
        for c in claims
    ]


class FakeKubelet(pb_grpc.PodResourcesListerServicer):
    """PodResources gRPC server on `socket_path`; see the module docstring for the simulator API."""

    def __init__(self, socket_path: str | Path, *, rate_limit: bool = True) -> None:
        self.socket_path = Path(socket_path)
        self.get_mode: Literal["enabled", "disabled", "unimplemented"] = "enabled"
        self.dynamic_resources = True
        self.rate_limit = rate_limit
        self.pods: tuple[FakePod, ...] = ()
        self.allocatable: tuple[FakeDevices, ...] = ()
        self.calls: Counter[str] = Counter()
        self.rejected = 0
        self._bucket = KubeletBucket(100.0, 10)
        self._server: aio.Server | None = None

    # ------------------------------------------------------------------ state

    def set_pods(self, pods: Iterable[FakePod]) -> None:
        self.pods = tuple(pods)

    def set_allocatable(self, devices: Iterable[FakeDevices | tuple[str, str]]) -> None:
        """Accept FakeDevices, or (resource, device_id) pairs, one ContainerDevices per device."""
        self.allocatable = tuple(d if isinstance(d, FakeDevices) else FakeDevices(d[0], (d[1],))
                                 for d in devices)

    def _pod_pb(self, pod: FakePod) -> pb.PodResources:
        dra = self.dynamic_resources
        containers = [pb.ContainerResources(name=c.name, devices=_devices_pb(c.devices),
                                            dynamic_resources=_claims_pb(c.claims if dra else ()))
                      for c in pod.containers]
        return pb.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)

    # ------------------------------------------------------------------ the gRPC service

    async def _admit(self, method: str, context: aio.ServicerContext) -> None:  # type: ignore[type-arg]
        if self.rate_limit and not self._bucket.allow():
            self.rejected += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        self.calls[method] += 1

    async def List(self, request, context):  # type: ignore[no-untyped-def]
        await self._admit("List", context)
        return pb.ListPodResourcesResponse(pod_resources=[self._pod_pb(p) for p in self.pods])

    async def GetAllocatableResources(self, request, context):  # type: ignore[no-untyped-def]
        await self._admit("GetAllocatableResources", context)
        return pb.AllocatableResourcesResponse(devices=_devices_pb(self.allocatable))

    async def Get(self, request, context):  # type: ignore[no-untyped-def]
        if self.get_mode == "unimplemented":
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method Get")
        await self._admit("Get", context)
        if self.get_mode == "disabled":
            await context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        for p in self.pods:
            if p.name == request.pod_name and p.namespace == request.pod_namespace:
                return pb.GetPodResourcesResponse(pod_resources=self._pod_pb(p))
        await context.abort(grpc.StatusCode.UNKNOWN,
                            f"pod {request.pod_name} in namespace {request.pod_namespace} not found")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._server is not None:
            return
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)  # a stale socket from a previous run, as the kubelet does
        server = aio.server()
        pb_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace=None)
        self.socket_path.unlink(missing_ok=True)

    async def restart(self, down_s: float = 0.0) -> None:
        """What a kubelet restart looks like to a client: the socket file is deleted, and after
        `down_s` seconds a new server creates a new socket at the same path."""
        await self.stop()
        if down_s > 0:
            await asyncio.sleep(down_s)
        await self.start()
