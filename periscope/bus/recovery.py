"""Bounds on calls to a broker that may have stalled rather than gone away.

A paused broker (SIGSTOP, a frozen VM, a long GC pause) keeps its connections open and answers
nothing, so a client call waits for its full request timeout, and aiokafka's `stop()` can then wait on
fetch tasks that never finish (seen with a consumer whose metadata request failed during a 45 s pause:
`stop()` still had not returned a minute after the broker resumed). Every service therefore bounds
the calls it makes on its own schedule and throws a stuck client away instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)

# Longer than a healthy call takes on a loaded machine, short enough that a stall is noticed quickly.
CALL_TIMEOUT_S = 10.0


class Stoppable(Protocol):
    async def stop(self) -> Any: ...


async def stop_within(client: Stoppable, timeout_s: float = CALL_TIMEOUT_S) -> bool:
    """Stop an aiokafka client, giving up after `timeout_s` (True when it stopped in time).

    The stop runs as a task of its own and is left running when it takes too long: `wait_for` would
    cancel it and then wait for the cancellation, which a client stuck on a dead broker may never finish.
    """
    task = asyncio.ensure_future(client.stop())
    task.add_done_callback(_retrieve)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        log.warning("a Kafka client did not stop within %.0fs after a broker stall; abandoned", timeout_s)
        _abandoned.add(task)  # keep a reference until it ends, so it is not collected mid-way
        task.add_done_callback(_abandoned.discard)
        return False
    return True


_abandoned: set[asyncio.Future[Any]] = set()


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:  # a client of a dead broker may fail to stop
        log.debug("stopping a Kafka client failed: %r", task.exception())
