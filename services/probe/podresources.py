"""Client of the kubelet PodResources v1 API (grpc.aio over the kubelet's unix socket).

The kubelet deletes and recreates its socket when it restarts, so the client ties its channel to
the identity (device, inode, ctime) of the socket file it connected to: a new file means a new
channel, a missing file means "unavailable" without dialing, and UNAVAILABLE from a call drops the
channel. `watch_socket` polls that identity so the service can re-list as soon as a new socket
appears. Calls go through a client-side token bucket matching the kubelet's limit (100 qps, burst 10).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable

import grpc
from grpc import aio

from periscope.k8s.podresources.v1 import api_pb2 as pb
from periscope.k8s.podresources.v1 import api_pb2_grpc as pb_grpc

SocketId = tuple[int, int, int]

# The kubelet's server limits (k8s.io/kubernetes/pkg/kubelet/apis/podresources DefaultQPS/Burst).
KUBELET_QPS = 100.0
KUBELET_BURST = 10
# The client paces itself a little below them: calls released in time by the client can still reach
# the server bunched together (scheduling jitter), and the server does not forgive that.
CLIENT_QPS = KUBELET_QPS * 0.9
CLIENT_BURST = KUBELET_BURST - 1
_RATE_LIMIT_RETRIES = 3
_MAX_MESSAGE = 16 * 1024 * 1024
# Name used to ask `Get` whether it is enabled: a pod that cannot exist (names are DNS labels).
_PROBE_POD = "periscope..capability-probe"


class PodResourcesUnavailable(Exception):
    """The kubelet cannot be reached: socket absent, connection refused, or a call failed."""


class RateLimiter:
    """Async token bucket: `acquire()` waits until a token is available."""

    def __init__(
        self, qps: float = CLIENT_QPS, burst: int = CLIENT_BURST, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.qps, self.burst, self._now = qps, burst, now
        self._tokens = float(burst)
        self._stamp = now()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        t = self._now()
        self._tokens = min(float(self.burst), self._tokens + (t - self._stamp) * self.qps)
        self._stamp = t

    async def acquire(self) -> None:
        async with self._lock:
            self._refill()
            while self._tokens < 1.0:
                await asyncio.sleep((1.0 - self._tokens) / self.qps)
                self._refill()
            self._tokens -= 1.0


def socket_identity(path: str) -> SocketId | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class PodResourcesClient:
    """List / GetAllocatableResources / Get against the socket at `socket_path`."""

    def __init__(
        self, socket_path: str, *, timeout_s: float = 2.0, limiter: RateLimiter | None = None
    ) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.limiter = limiter or RateLimiter()
        self.connects = 0
        self._channel: aio.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerAsyncStub | None = None
        self._channel_socket: SocketId | None = None
        self._get_mode: str | None = None

    async def _ensure(self) -> pb_grpc.PodResourcesListerAsyncStub:
        current = socket_identity(self.socket_path)
        if current is None:
            await self.close()
            raise PodResourcesUnavailable(f"socket {self.socket_path} is absent")
        if self._stub is None or current != self._channel_socket:
            await self.close()  # never keep a channel to a socket that was replaced
            # A channel of its own connections: by default gRPC shares them between channels to one
            # address, and the new channel would take over a connection to the old kubelet that gRPC
            # has not yet seen closed (its first call fails with "Broken pipe").
            self._channel = aio.insecure_channel(
                f"unix:{self.socket_path}",
                options=[("grpc.max_receive_message_length", _MAX_MESSAGE),
                         ("grpc.use_local_subchannel_pool", 1)],
            )
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)  # type: ignore[assignment]
            self._channel_socket = current
            self._get_mode = None
            self.connects += 1
        assert self._stub is not None
        return self._stub

    async def close(self) -> None:
        channel, self._channel, self._stub, self._channel_socket = self._channel, None, None, None
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close()

    async def _call(self, name: str, request: object) -> object:
        stub = await self._ensure()
        for attempt in range(_RATE_LIMIT_RETRIES + 1):
            await self.limiter.acquire()
            try:
                return await getattr(stub, name)(request, timeout=self.timeout_s)
            except aio.AioRpcError as e:
                code = e.code()
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    await self.close()
                    raise PodResourcesUnavailable(f"{name}: {code.name}: {e.details()}") from e
                # The kubelet's limit is shared with every other client on the node (dcgm-exporter...).
                if code != grpc.StatusCode.RESOURCE_EXHAUSTED or attempt == _RATE_LIMIT_RETRIES:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    async def list_pods(self) -> list[pb.PodResources]:
        resp = await self._call("List", pb.ListPodResourcesRequest())
        assert isinstance(resp, pb.ListPodResourcesResponse)
        return list(resp.pod_resources)

    async def allocatable(self) -> list[pb.ContainerDevices]:
        try:
            resp = await self._call("GetAllocatableResources", pb.AllocatableResourcesRequest())
        except aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:  # kubelet < 1.21
                return []
            raise
        assert isinstance(resp, pb.AllocatableResourcesResponse)
        return list(resp.devices)

    async def get(self, namespace: str, name: str) -> pb.PodResources | None:
        """One pod's resources; None when the pod is unknown or Get is unavailable on this kubelet."""
        try:
            resp = await self._call("Get", pb.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace))
        except aio.AioRpcError as e:
            self._get_mode = _classify_get_error(e)
            return None
        assert isinstance(resp, pb.GetPodResourcesResponse)
        self._get_mode = "enabled"
        return resp.pod_resources

    async def get_mode(self) -> str:
        """ "enabled", "disabled" (feature gate off) or "unimplemented" (kubelet < 1.27); asked once
        per connection, since a restarted kubelet may have other gates."""
        await self._ensure()
        if self._get_mode is None:
            await self.get("", _PROBE_POD)
        return self._get_mode or "enabled"


def _classify_get_error(e: aio.AioRpcError) -> str:
    if e.code() == grpc.StatusCode.UNIMPLEMENTED:
        return "unimplemented"
    if "disabled" in (e.details() or ""):
        return "disabled"
    return "enabled"  # e.g. "pod ... not found": the method works


async def watch_socket(
    path: str,
    on_change: Callable[[SocketId | None], None],
    interval_s: float = 0.1,
    stop: asyncio.Event | None = None,
) -> None:
    """Call `on_change(identity)` whenever the socket file appears, disappears or is replaced.

    Polling the directory entry is portable (no inotify binding in the dependencies) and cheap.
    """
    last = socket_identity(path)
    while stop is None or not stop.is_set():
        await asyncio.sleep(interval_s)
        now = socket_identity(path)
        if now != last:
            last = now
            on_change(now)
