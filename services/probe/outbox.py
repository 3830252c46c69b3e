"""Delivery of the probe's events: one sender task draining the bounded buffer through a Publisher.

A failed or timed-out send marks the broker unreachable: the publisher is dropped, a new one is
started after the bus's back-off (periscope.bus.retry), and the unsent message stays at the head of
the buffer, so nothing is lost except what the buffer's drop policy gives up while the broker is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from periscope.bus.recovery import stop_within
from periscope.bus.retry import Backoff
from periscope.freshness import Freshness
from periscope.logs import Trouble
from services.probe.buffer import OutBuffer, Outgoing
from services.probe.metrics import ProbeMetrics

log = logging.getLogger("periscope.probe.outbox")


class PublisherLike(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def send(self, topic: Any, key: str, value: Any) -> None: ...


class Outbox:
    def __init__(
        self,
        buffer: OutBuffer,
        publisher_factory: Callable[[], PublisherLike],
        metrics: ProbeMetrics,
        *,
        send_timeout: float = 5.0,
        backoff: Backoff | None = None,
        stale_after: float = 30.0,
    ) -> None:
        self.buffer = buffer
        self.factory = publisher_factory
        self.metrics = metrics
        self.send_timeout = send_timeout
        self.backoff = backoff if backoff is not None else Backoff()
        self.connected = False
        self.last_error = ""
        self.sent = 0
        self._publisher: PublisherLike | None = None
        self._wake = asyncio.Event()
        self._enqueued: dict[int, float] = {}
        self.freshness = Freshness(stale_after)  # from the last publish
        self.trouble = Trouble(log, "broker unreachable, buffering")

    def data_age_s(self) -> float:
        """How long what waits in the buffer has gone without a publish (0 when nothing waits)."""
        return self.freshness.age_s() if len(self.buffer) else 0.0

    def put(self, msg: Outgoing) -> None:
        self._enqueued[id(msg)] = time.monotonic()
        victim = self.buffer.push(msg)
        if victim is not None:
            self._enqueued.pop(id(victim), None)
            self.metrics.dropped.labels(self.metrics.node, victim.kind.value).inc()
        self.metrics.buffered.labels(self.metrics.node).set(len(self.buffer))
        self._wake.set()

    async def _connect(self) -> bool:
        pub: PublisherLike | None = None
        try:
            pub = self.factory()  # a new client each time: it reads a rotated password file
            await asyncio.wait_for(pub.start(), self.send_timeout)
        except Exception as e:  # broker down: any failure to start means "not connected"
            self.last_error = f"connect: {e!r}"
            self.trouble.failed(f"{self.last_error}; {len(self.buffer)} events buffered")
            await self._close(pub)
            return False
        self._publisher = pub
        self.connected = True
        self.metrics.broker_up.labels(self.metrics.node).set(1)
        return True

    async def _close(self, pub: PublisherLike | None) -> None:
        if pub is not None:
            # A stalled broker can keep stop() waiting for good; the publisher is abandoned then.
            await stop_within(pub, 2.0)

    async def _disconnect(self) -> None:
        pub, self._publisher = self._publisher, None
        self.connected = False
        self.metrics.broker_up.labels(self.metrics.node).set(0)
        await self._close(pub)

    async def _send_one(self, msg: Outgoing) -> bool:
        assert self._publisher is not None
        try:
            await asyncio.wait_for(self._publisher.send(msg.topic, msg.key, msg.value), self.send_timeout)
        except (TypeError, ValueError) as e:  # cannot be encoded: retrying will not help
            log.error("dropping unencodable %s event: %s", msg.kind.value, e)
            self.buffer.discard(msg)
            self.metrics.dropped.labels(self.metrics.node, "unencodable").inc()
            return True
        except Exception as e:  # timeout or broker error: reconnect
            self.last_error = f"send: {e!r}"
            return False
        self.buffer.discard(msg)
        self.freshness.touch()
        self.trouble.cleared()
        started = self._enqueued.pop(id(msg), None)
        if started is not None:
            self.metrics.publish_latency.labels(self.metrics.node, msg.topic.name).observe(
                time.monotonic() - started
            )
        self.metrics.published.labels(self.metrics.node, msg.topic.name).inc()
        self.metrics.buffered.labels(self.metrics.node).set(len(self.buffer))
        self.sent += 1
        return True

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                if self._publisher is None:
                    if not await self._connect():
                        await self.backoff.sleep(stop)
                        continue
                    self.backoff.reset()
                msg = self.buffer.peek()
                if msg is None:
                    self._wake.clear()
                    waiter = asyncio.ensure_future(self._wake.wait())
                    stopper = asyncio.ensure_future(stop.wait())
                    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    stopper.cancel()
                    continue
                if not await self._send_one(msg):
                    self.trouble.failed(f"{self.last_error}; {len(self.buffer)} events buffered")
                    await self._disconnect()
        finally:
            if self._publisher is not None:  # a clean stop sends what is still buffered, briefly
                with contextlib.suppress(Exception):
                    await self.flush(min(self.send_timeout, 3.0))
            await self._disconnect()

    async def flush(self, timeout_s: float) -> bool:
        """Send what is buffered (used at shutdown); True when everything went out."""
        deadline = time.monotonic() + timeout_s
        while len(self.buffer) and time.monotonic() < deadline:
            if self._publisher is None:
                return False
            msg = self.buffer.peek()
            if msg is not None and not await self._send_one(msg):
                await self._disconnect()
                return False
        return not len(self.buffer)

