"""The kube_watcher service: list/watch threads -> ClusterState -> Publisher.

Each resource is listed and watched by the blocking official client in its own thread; notifications
cross into the event loop through one queue and are applied in arrival order by a single task, so
per-source sequence numbers grow in publish order. A publish that fails is retried (same event, same
order) until the broker takes it: a lost DELETED would leave a ghost pod downstream.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from periscope.bus.retry import Backoff
from periscope.bus.topics import Topic
from periscope.logs import Trouble
from services.kube_watcher.discovery import ServedVersion, dra_claims
from services.kube_watcher.settings import WatcherSettings
from services.kube_watcher.state import KINDS, ClusterState, Outgoing
from services.kube_watcher.watch import Notification, ResourceWatch

log = logging.getLogger(__name__)


class Sink(Protocol):
    async def send(self, topic: Topic, key: str, value: Any) -> None: ...


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def api_client(settings: WatcherSettings) -> k8s.ApiClient:
    """From the kubeconfig when one is set, else the in-cluster service account."""
    if settings.kubeconfig:
        return k8s_config.new_client_from_config(config_file=settings.kubeconfig)
    cfg = k8s.Configuration()
    k8s_config.load_incluster_config(client_configuration=cfg)
    return k8s.ApiClient(cfg)


class KubeWatcher:
    def __init__(
        self,
        settings: WatcherSettings,
        sink: Sink,
        *,
        client: k8s.ApiClient | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.settings = settings
        self.sink = sink
        self.client = client if client is not None else api_client(settings)
        self.clock = clock
        self.epoch = clock()  # process start: consumers tell restarts apart by it
        self.state = ClusterState(
            epoch=self.epoch, clock=clock, operator_namespace=settings.operator_namespace
        )
        self.watches: list[ResourceWatch] = []
        self.claims_version: ServedVersion = dra_claims(self.client)
        self._threads: list[threading.Thread] = []
        self.published = 0
        self.publish_failures = 0
        self.handle_errors = 0
        self.publishing_ok = True
        self._trouble = Trouble(log, "broker unreachable")

    def _build(self, notify: Callable[[Notification], None]) -> list[ResourceWatch]:
        core, apps = k8s.CoreV1Api(self.client), k8s.AppsV1Api(self.client)
        custom = k8s.CustomObjectsApi(self.client)
        opts: dict[str, Any] = {
            "watch_timeout_s": max(1, int(self.settings.watch_timeout)),
            "unavailable_retry_s": self.settings.unavailable_retry,
            "page_size": self.settings.list_page_size,
        }
        nodes = ResourceWatch("nodes", core.list_node, notify, **opts)
        # DRA claims in the newest resource.k8s.io version served (v1, v1beta2 on 1.33, v1beta1 on 1.32).
        claims = ResourceWatch("resourceclaims", self.claims_version, notify, **opts)
        # Pods last: with GPU nodes and claims known, the first pod snapshot is already complete.
        pods = ResourceWatch(
            "pods", core.list_pod_for_all_namespaces, notify, after=(nodes.synced, claims.synced), **opts
        )
        policies = ResourceWatch(
            "clusterpolicies",
            partial(custom.list_cluster_custom_object, "nvidia.com", "v1", "clusterpolicies"),
            notify,
            **opts,
        )
        gpuclusters = ResourceWatch(  # GPU Operator v26.7's DRA stack: one or the other is in use
            "gpuclusters",
            partial(custom.list_cluster_custom_object, "nvidia.com", "v1alpha1", "gpuclusters"),
            notify,
            **opts,
        )
        daemonsets = ResourceWatch(
            "daemonsets",
            partial(apps.list_namespaced_daemon_set, self.settings.operator_namespace),
            notify,
            **opts,
        )
        return [nodes, claims, pods, policies, gpuclusters, daemonsets]

    async def run(self, stop: asyncio.Event) -> None:
        """Watch and publish until `stop` is set."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Notification] = asyncio.Queue()

        def notify(note: Notification) -> None:  # called from the watch threads
            if not loop.is_closed():
                loop.call_soon_threadsafe(queue.put_nowait, note)

        self.watches = self._build(notify)
        self._threads = [
            threading.Thread(target=w.run, name=f"watch-{w.kind}", daemon=True) for w in self.watches
        ]
        for t in self._threads:
            t.start()
        pump = asyncio.create_task(self._pump(queue))
        try:
            await stop.wait()
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            await self.close()

    async def close(self) -> None:
        for w in self.watches:
            w.stop()
        threads = self._threads

        def join() -> None:
            for t in threads:
                t.join(5)

        await asyncio.to_thread(join)
        self._threads = []

    async def _pump(self, queue: asyncio.Queue[Notification]) -> None:
        while True:
            note = await queue.get()
            try:
                outs = self.state.handle(note)
            except Exception:  # one malformed object must not stop the watcher
                self.handle_errors += 1
                log.exception("could not map a %s notification; skipped", note.kind)
                continue
            for out in outs:
                await self._publish(out)

    async def _publish(self, out: Outgoing) -> None:
        backoff = Backoff()
        while True:
            try:
                await self.sink.send(out.topic, out.key, out.value)
                self.published += 1
                self.publishing_ok = True
                self._trouble.cleared()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.publish_failures += 1
                self.publishing_ok = False
                self._trouble.failed(f"publishing to {out.topic.name} failed ({exc}); retrying the same "
                                     "event")
                await backoff.sleep()

    # ------------------------------------------------------------------ health
    def live(self) -> tuple[bool, dict[str, Any]]:
        alive = {t.name: t.is_alive() for t in self._threads}
        return all(alive.values()) and bool(alive), {"threads": alive}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        body = {
            "listed": sorted(self.state.reported),
            "waiting_for": sorted(set(KINDS) - self.state.reported),
            "publishing": self.publishing_ok,
            "crd": self.state.crd,
            "dra_available": self.state.dra_available,
            "dra_version": self.claims_version.group_version,  # "" while none is served
        }
        return self.state.synced and self.publishing_ok, body

    def metrics(self) -> str:
        lines = [
            "# HELP periscope_watcher_events_published_total Events published to the bus.",
            "# TYPE periscope_watcher_events_published_total counter",
            f"periscope_watcher_events_published_total {self.published}",
            "# HELP periscope_watcher_publish_failures_total Failed publish attempts (retried).",
            "# TYPE periscope_watcher_publish_failures_total counter",
            f"periscope_watcher_publish_failures_total {self.publish_failures}",
            "# HELP periscope_watcher_mapping_errors_total Notifications skipped because mapping failed.",
            "# TYPE periscope_watcher_mapping_errors_total counter",
            f"periscope_watcher_mapping_errors_total {self.handle_errors}",
            "# HELP periscope_watcher_tracked_pods GPU pods currently tracked.",
            "# TYPE periscope_watcher_tracked_pods gauge",
            f"periscope_watcher_tracked_pods {len(self.state.tracked)}",
            "# HELP periscope_watcher_dra_api_info The resource.k8s.io version ResourceClaims are read in.",
            "# TYPE periscope_watcher_dra_api_info gauge",
        ]
        if self.claims_version.version:
            lines.append(f'periscope_watcher_dra_api_info{{version="{self.claims_version.version}"}} 1')
        for name in ("lists", "watches", "events", "bookmarks", "expired", "errors"):
            lines += [
                f"# HELP periscope_watcher_{name}_total Watch loop {name} per resource.",
                f"# TYPE periscope_watcher_{name}_total counter",
            ]
            lines += [
                f'periscope_watcher_{name}_total{{resource="{w.kind}"}} {getattr(w.stats, name)}'
                for w in self.watches
            ]
        return "\n".join(lines) + "\n"
