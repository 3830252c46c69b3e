"""Two watcher replicas with leader election on a Lease of the fake apiserver: one publishes, and the
other takes over when the leader stops."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from periscope.bus.admin import ensure_topics
from periscope.bus.clients import Kafka
from periscope.bus.producer import Publisher
from periscope.bus.topics import NODES, PODS, POLICY, Topic
from periscope.settings.watcher import WatcherSettings
from periscope.sim.apiserver import FakeApiServer
from services.kube_watcher.leader import FOLLOWER, LEADER, LeaseElector, run_elected
from services.kube_watcher.service import KubeWatcher


class PrivateTopics:
    """Each replica's real Publisher, writing to per-test copies of the registry topics."""

    def __init__(self, publisher: Publisher, suffix: str) -> None:
        self.publisher, self.suffix = publisher, suffix
        self.sent: list[str] = []  # topic names, in publish order

    async def send(self, topic: Topic, key: str, value: Any) -> None:
        await self.publisher.send(dataclasses.replace(topic, name=f"{topic.name}.{self.suffix}"), key, value)
        self.sent.append(topic.name)


WATCHER_TOPICS = (PODS, NODES, POLICY)


async def wait_until(cond: Any, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def test_lease_compare_and_swap(tmp_path: Path) -> None:
    with FakeApiServer() as server:
        client = k8s_config.new_client_from_config(config_file=str(server.write_kubeconfig(tmp_path / "kc")))
        api = k8s.CoordinationV1Api(client)
        a = LeaseElector(api, "default", "lock", "replica-a", duration_s=1)
        b = LeaseElector(api, "default", "lock", "replica-b", duration_s=1)
        assert a.try_acquire_or_renew() == LEADER  # creates the Lease
        assert b.try_acquire_or_renew() == FOLLOWER
        assert a.try_acquire_or_renew() == LEADER  # renews
        lease = server.get("leases", "default", "lock")
        assert lease is not None and lease["spec"]["holderIdentity"] == "replica-a"
        a.release()
        assert b.try_acquire_or_renew() == LEADER  # released: no need to wait for expiry
        lease = server.get("leases", "default", "lock")
        assert lease is not None and lease["spec"]["holderIdentity"] == "replica-b"
        assert lease["spec"]["leaseTransitions"] == 1


@pytest.mark.parametrize("leader_exit", ["clean-stop", "crash"])
async def test_two_replicas_one_publisher_and_failover(
    tmp_path: Path, broker: Kafka, unique: str, leader_exit: str
) -> None:
    await ensure_topics(broker, [dataclasses.replace(t, name=f"{t.name}.{unique}") for t in WATCHER_TOPICS])
    async with Publisher(broker, "replica-a") as pub_a, Publisher(broker, "replica-b") as pub_b:
        sinks = {"a": PrivateTopics(pub_a, unique), "b": PrivateTopics(pub_b, unique)}
        await _two_replicas(tmp_path, sinks, crash=leader_exit == "crash")


async def _two_replicas(tmp_path: Path, sinks: dict[str, PrivateTopics], crash: bool) -> None:
    with FakeApiServer(bookmark_interval_s=0.2) as server:
        server.upsert("nodes", {"metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.present": "true"}}})
        kubeconfig = str(server.write_kubeconfig(tmp_path / "kubeconfig"))
        replicas = []
        for name in ("a", "b"):
            settings = WatcherSettings(
                kubeconfig=kubeconfig,
                leader_election=True,
                identity=name,
                lease_duration=2,
                lease_renew=0.3,
                watch_timeout=5,
                unavailable_retry=0.3,
            )
            client = k8s_config.new_client_from_config(config_file=kubeconfig)
            sink = sinks[name]
            stop = asyncio.Event()
            watcher = KubeWatcher(settings, sink, client=client)
            replicas.append((sink, stop, asyncio.create_task(run_elected(settings, client, watcher, stop))))
        await wait_until(lambda: any(r[0].sent for r in replicas))
        await asyncio.sleep(1.0)  # several renew rounds: the follower must stay quiet
        leader = next(i for i, r in enumerate(replicas) if r[0].sent)
        follower = 1 - leader
        assert not replicas[follower][0].sent
        # The leader stops and releases the Lease, or dies holding it (then the Lease must expire first):
        # either way the follower takes over and publishes a full snapshot.
        if crash:
            replicas[leader][2].cancel()
            await asyncio.gather(replicas[leader][2], return_exceptions=True)
        else:
            replicas[leader][1].set()
            await asyncio.wait_for(replicas[leader][2], 15)
        published = len(sinks["ab"[leader]].sent)
        await wait_until(lambda: NODES.name in replicas[follower][0].sent)
        lease = server.get("leases", "default", "periscope-kube-watcher")
        assert lease is not None and lease["spec"]["holderIdentity"] == "ab"[follower]
        assert len(sinks["ab"[leader]].sent) == published  # the old leader published nothing more
        replicas[follower][1].set()
        await asyncio.wait_for(replicas[follower][2], 15)
