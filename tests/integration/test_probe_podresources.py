"""PodResources client against the fake kubelet: real gRPC over a unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from periscope.kubelet.checkpoint import render_checkpoint
from periscope.sim.kubelet import (
    FakeClaim,
    FakeClaimDevice,
    FakeContainer,
    FakeDevices,
    FakeKubelet,
    FakePod,
    KubeletBucket,
)
from services.probe.kubelet import AllocationReader
from services.probe.nvml import NvmlInventory
from services.probe.podresources import (
    KUBELET_BURST,
    KUBELET_QPS,
    PodResourcesClient,
    PodResourcesUnavailable,
    RateLimiter,
    watch_socket,
)

GPU = "GPU-8a1b2c3d-0000-1111-2222-333344445555"
POD = FakePod(
    "ml",
    "train-0",
    (
        FakeContainer(
            "cuda",
            devices=(FakeDevices("nvidia.com/gpu", (GPU + "::1",), numa=(0,)),),
            claims=(FakeClaim("c1", "ml", (FakeClaimDevice("gpu.nvidia.com", "node-a", "gpu-0"),)),),
        ),
    ),
)


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[FakeKubelet]:
    k = FakeKubelet(tmp_path / "pod-resources" / "kubelet.sock")
    await k.start()
    k.set_pods([POD])
    k.set_allocatable([("nvidia.com/gpu", GPU + "::0"), ("nvidia.com/gpu", GPU + "::1")])
    yield k
    await k.stop()


async def test_list_allocatable_and_get(kubelet: FakeKubelet) -> None:
    client = PodResourcesClient(str(kubelet.socket_path))
    try:
        pods = await client.list_pods()
        assert [(p.namespace, p.name) for p in pods] == [("ml", "train-0")]
        c = pods[0].containers[0]
        assert list(c.devices[0].device_ids) == [GPU + "::1"]
        assert c.dynamic_resources[0].claim_resources[0].device_name == "gpu-0"
        alloc = await client.allocatable()
        assert [i for d in alloc for i in d.device_ids] == [GPU + "::0", GPU + "::1"]
        assert await client.get_mode() == "enabled"
        got = await client.get("ml", "train-0")
        assert got is not None and got.name == "train-0"
        assert await client.get("ml", "nope") is None
    finally:
        await client.close()


@pytest.mark.parametrize("mode", ["disabled", "unimplemented"])
async def test_get_unavailable_is_a_mode_not_an_error(kubelet: FakeKubelet, mode: str) -> None:
    kubelet.get_mode = mode
    kubelet.dynamic_resources = False
    client = PodResourcesClient(str(kubelet.socket_path))
    try:
        assert await client.get_mode() == mode
        assert await client.get("ml", "train-0") is None
        pods = await client.list_pods()
        assert len(pods[0].containers[0].dynamic_resources) == 0
    finally:
        await client.close()


async def test_restart_means_a_new_channel_and_no_stale_answers(kubelet: FakeKubelet) -> None:
    client = PodResourcesClient(str(kubelet.socket_path))
    try:
        await client.list_pods()
        assert client.connects == 1
        await kubelet.stop()
        with pytest.raises(PodResourcesUnavailable):
            await client.list_pods()
        kubelet.set_pods([])
        await kubelet.start()
        assert await client.list_pods() == []
        assert client.connects == 2
        await kubelet.restart(down_s=0.05)
        assert await client.list_pods() == []
        assert client.connects == 3
    finally:
        await client.close()


async def test_a_new_socket_gets_a_new_connection_even_while_the_old_one_lives(
    kubelet: FakeKubelet,
) -> None:
    """A new channel must dial the new socket. gRPC shares connections between channels to one
    address by default, so after a kubelet restart the new channel could send its first call down
    the old connection before gRPC saw it close: "Stream removed (Broken pipe)" (seen in CI; in a
    loop here, about one restart in 100). Here the old server keeps running and another channel keeps the old
    connection open, so a shared connection would answer with the old kubelet's pods."""
    client = PodResourcesClient(str(kubelet.socket_path))
    successor = FakeKubelet(kubelet.socket_path)
    # Another channel to the old socket, as another client in the process could hold: it keeps the
    # old connection in gRPC's shared pool.
    other = PodResourcesClient(str(kubelet.socket_path))
    try:
        assert len(await client.list_pods()) == 1
        assert len(await other.list_pods()) == 1
        await successor.start()  # unlinks the socket and binds a new one at the same path
        successor.set_pods([])
        assert await client.list_pods() == []
        assert client.connects == 2
        assert successor.calls["List"] == 1 and kubelet.calls["List"] == 2
    finally:
        await client.close()
        await other.close()
        await successor.stop()


class RecordingLimiter(RateLimiter):
    """The client's own limiter, noting when it lets each call go."""

    def __init__(self) -> None:
        super().__init__()
        self.granted: list[float] = []

    async def acquire(self) -> None:
        await super().acquire()
        self.granted.append(time.monotonic())


def kubelet_would_reject(stamps: list[float]) -> int:
    """How many of calls made at `stamps` the kubelet's token bucket (the fake's) turns away, had they
    reached it then."""
    clock = [stamps[0]]
    bucket = KubeletBucket(KUBELET_QPS, KUBELET_BURST, now=lambda: clock[0])
    rejected = 0
    for t in stamps:
        clock[0] = t
        rejected += not bucket.allow()
    return rejected


async def test_client_stays_under_the_kubelet_rate_limit(kubelet: FakeKubelet) -> None:
    limiter = RecordingLimiter()
    client = PodResourcesClient(str(kubelet.socket_path), limiter=limiter)
    try:
        started = time.monotonic()
        answers = await asyncio.gather(*(client.list_pods() for _ in range(40)))
        elapsed = time.monotonic() - started
    finally:
        await client.close()
    assert all(len(a) == 1 for a in answers)
    # The client's pacing is the kubelet's rule with room to spare. What the server sees can still come
    # bunched (both ends share one event loop here, and scheduling jitter under load moves calls);
    # those rare rejections are retried, which the next test shows.
    assert len(limiter.granted) == 40 + kubelet.rejected
    assert kubelet_would_reject(limiter.granted) == 0
    assert kubelet.calls["List"] == 40
    assert elapsed >= 0.25  # 10 from the burst, 30 more at 100 qps


async def test_client_retries_calls_the_kubelet_rejects(kubelet: FakeKubelet) -> None:
    """Another client on the node (dcgm-exporter, a second agent) spent the kubelet's budget: a call
    turned away with RESOURCE_EXHAUSTED is tried again and answered."""
    from grpc import aio

    from periscope.k8s.podresources.v1 import api_pb2, api_pb2_grpc

    client = PodResourcesClient(str(kubelet.socket_path))
    ours_rejected = 0
    try:
        async with aio.insecure_channel(f"unix:{kubelet.socket_path}") as channel:
            other = api_pb2_grpc.PodResourcesListerStub(channel)
            for _ in range(20):  # until one of ours arrives before the kubelet's bucket refilled
                await asyncio.sleep(0.15)  # a full bucket again
                before = kubelet.rejected
                while kubelet.rejected == before:
                    with contextlib.suppress(aio.AioRpcError):
                        await other.List(api_pb2.ListPodResourcesRequest())
                before = kubelet.rejected
                assert [p.name for p in await client.list_pods()] == ["train-0"]
                ours_rejected += kubelet.rejected - before
                if ours_rejected:
                    break
    finally:
        await client.close()
    assert ours_rejected >= 1


async def test_fake_kubelet_rejects_bursts_like_the_kubelet(kubelet: FakeKubelet) -> None:
    from grpc import aio

    from periscope.k8s.podresources.v1 import api_pb2, api_pb2_grpc

    async with aio.insecure_channel(f"unix:{kubelet.socket_path}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        results = await asyncio.gather(
            *(stub.List(api_pb2.ListPodResourcesRequest()) for _ in range(30)), return_exceptions=True
        )
    failed = [r for r in results if isinstance(r, aio.AioRpcError)]
    assert failed and len(failed) == kubelet.rejected
    assert all(r.details() == "rejected by rate limit" for r in failed)
    assert kubelet.calls["List"] == 30 - len(failed)


async def test_watch_socket_sees_delete_and_recreate(kubelet: FakeKubelet) -> None:
    seen: list[object] = []
    stop = asyncio.Event()
    task = asyncio.create_task(
        watch_socket(str(kubelet.socket_path), seen.append, interval_s=0.02, stop=stop)
    )
    try:
        await asyncio.sleep(0.05)
        await kubelet.stop()
        await asyncio.sleep(0.1)
        await kubelet.start()
        await asyncio.sleep(0.1)
    finally:
        stop.set()
        await task
    assert len(seen) == 2 and seen[0] is None and seen[1] is not None


async def test_allocatable_is_asked_again_only_when_it_may_have_changed(
    kubelet: FakeKubelet, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    checkpoint.write_bytes(render_checkpoint([], {"nvidia.com/gpu": [GPU + "::0", GPU + "::1"]}))
    now = [1000.0]
    reader = AllocationReader(
        str(kubelet.socket_path), str(checkpoint), "node-a", allocatable_every=5.0, now=lambda: now[0]
    )
    inventory = NvmlInventory(gpus=())

    async def poll() -> tuple[tuple[str, str], ...]:
        view = await reader.poll(inventory)
        assert {h.source: h.state for h in view.health}["podresources"] == "ok"
        return view.allocatable

    try:
        assert len(await poll()) == 2
        assert len(await poll()) == 2
        assert (kubelet.calls["List"], kubelet.calls["GetAllocatableResources"]) == (2, 1)
        # A device plugin registered a device: the kubelet rewrites its checkpoint.
        kubelet.set_allocatable([("nvidia.com/gpu", GPU + f"::{i}") for i in range(3)])
        checkpoint.write_bytes(render_checkpoint([], {"nvidia.com/gpu": [GPU + f"::{i}" for i in range(3)]}))
        assert len(await poll()) == 3
        assert kubelet.calls["GetAllocatableResources"] == 2
        # A change the checkpoint does not show is still picked up within `allocatable_every`.
        kubelet.set_allocatable([("nvidia.com/gpu", GPU + "::0")])
        now[0] += 4.9
        assert len(await poll()) == 3
        now[0] += 0.1
        assert len(await poll()) == 1
        # A restarted kubelet (new socket, new channel) is asked at once.
        await kubelet.restart(down_s=0.05)
        kubelet.set_allocatable([("nvidia.com/gpu", GPU + "::1"), ("nvidia.com/gpu", GPU + "::2")])
        assert len(await poll()) == 2
        assert kubelet.calls["GetAllocatableResources"] == 4
    finally:
        await reader.close()


async def test_a_poll_is_due_on_checkpoint_change_unusable_checkpoint_or_period(
    kubelet: FakeKubelet, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    checkpoint.write_bytes(render_checkpoint([], {}))
    now = [1000.0]
    reader = AllocationReader(
        str(kubelet.socket_path), str(checkpoint), "node-a", poll_every=2.0, now=lambda: now[0]
    )
    try:
        assert reader.due()  # never polled
        await reader.poll(NvmlInventory(gpus=()))
        assert not reader.due()
        now[0] += 1.9
        assert not reader.due()
        now[0] += 0.1
        assert reader.due()  # the period: a pod's end or a DRA claim shows without a checkpoint write
        await reader.poll(NvmlInventory(gpus=()))
        checkpoint.write_bytes(render_checkpoint([], {"nvidia.com/gpu": [GPU + "::0"]}))
        assert reader.due()  # the device manager wrote its checkpoint: an allocation changed
        await reader.poll(NvmlInventory(gpus=()))
        assert not reader.due()
        checkpoint.write_bytes(b'{"Data": ')  # torn: says nothing about changes, so poll every time
        await reader.poll(NvmlInventory(gpus=()))
        assert reader.due()
        checkpoint.unlink()
        await reader.poll(NvmlInventory(gpus=()))
        assert reader.due()
    finally:
        await reader.close()
