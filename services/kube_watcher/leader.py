"""Optional leader election on a coordination.k8s.io/v1 Lease, so two watcher replicas can run and
only one publishes.

The rules follow client-go's leaderelection: a Lease names its holder and is renewed every
`lease_renew`; a candidate takes it over only once `renewTime + leaseDurationSeconds` has passed,
and every write is a compare-and-swap on resourceVersion (a 409 means somebody else won). A leader
that cannot renew for a full lease duration stops publishing before a successor can start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from datetime import UTC, datetime, timedelta

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from periscope.settings.watcher import WatcherSettings
from services.kube_watcher.service import KubeWatcher

log = logging.getLogger(__name__)
LEADER, FOLLOWER, ERROR = "leader", "follower", "error"


class LeaseElector:
    def __init__(
        self, api: k8s.CoordinationV1Api, namespace: str, name: str, identity: str, duration_s: float
    ) -> None:
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.duration_s = max(1, round(duration_s))

    def _spec(self, now: datetime, acquired: datetime, transitions: int) -> k8s.V1LeaseSpec:
        return k8s.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=self.duration_s,
            acquire_time=acquired,
            renew_time=now,
            lease_transitions=transitions,
        )

    def try_acquire_or_renew(self) -> str:
        """One round: LEADER when we hold the lease now, FOLLOWER when someone else validly does."""
        now = datetime.now(UTC)
        try:
            try:
                lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=5)
            except ApiException as e:
                if e.status != 404:
                    raise
                body = k8s.V1Lease(
                    metadata=k8s.V1ObjectMeta(name=self.name, namespace=self.namespace),
                    spec=self._spec(now, now, 0),
                )
                self.api.create_namespaced_lease(self.namespace, body, _request_timeout=5)
                return LEADER
            spec = lease.spec or k8s.V1LeaseSpec()
            holder = spec.holder_identity or ""
            renewed = spec.renew_time or spec.acquire_time
            expires = renewed + timedelta(seconds=spec.lease_duration_seconds or 0) if renewed else now
            if holder and holder != self.identity and expires > now:
                return FOLLOWER
            mine = holder == self.identity
            transitions = (spec.lease_transitions or 0) + (0 if mine else 1)
            lease.spec = self._spec(now, (spec.acquire_time or now) if mine else now, transitions)
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=5)
            return LEADER
        except ApiException as e:
            if e.status == 409:  # lost the compare-and-swap: another candidate wrote first
                return FOLLOWER
            log.warning("lease %s/%s: %s %s", self.namespace, self.name, e.status, e.reason)
            return ERROR
        except Exception as e:  # unreachable apiserver
            log.warning("lease %s/%s: %s", self.namespace, self.name, e)
            return ERROR

    def release(self) -> None:
        """Give the lease up on a clean stop so the other replica need not wait for it to expire."""
        with contextlib.suppress(Exception):
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=5)
            if lease.spec is not None and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=5)


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def run_elected(
    settings: WatcherSettings, api_client: k8s.ApiClient, watcher: KubeWatcher, stop: asyncio.Event
) -> None:
    """Run `watcher` only while this replica holds the Lease; until `stop` is set."""
    elector = LeaseElector(
        k8s.CoordinationV1Api(api_client),
        settings.lease_namespace,
        settings.lease_name,
        settings.identity or default_identity(),
        settings.lease_duration,
    )
    while not stop.is_set():
        if await asyncio.to_thread(elector.try_acquire_or_renew) != LEADER:
            await _sleep(stop, settings.lease_renew)
            continue
        log.info("became leader (%s)", elector.identity)
        inner = asyncio.Event()
        task = asyncio.create_task(watcher.run(inner))
        try:
            await _lead(settings, elector, stop)
        finally:  # also on cancellation: never leave a publishing watcher behind
            inner.set()
            await asyncio.gather(task, return_exceptions=True)
    await asyncio.to_thread(elector.release)


async def _lead(settings: WatcherSettings, elector: LeaseElector, stop: asyncio.Event) -> None:
    """Keep renewing; return when stopping or when the lease is (or may be) lost."""
    last_renew = time.monotonic()
    while not stop.is_set():
        await _sleep(stop, settings.lease_renew)
        if stop.is_set():
            return
        outcome = await asyncio.to_thread(elector.try_acquire_or_renew)
        if outcome == LEADER:
            last_renew = time.monotonic()
        # Step down before the lease can expire in anyone else's eyes.
        elif (
            outcome == FOLLOWER
            or time.monotonic() - last_renew > settings.lease_duration - settings.lease_renew
        ):
            log.warning("lost the lease (%s); no longer publishing", outcome)
            return
