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
    """Stop an aiokafka client, giving up after `timeout_s` (True when it stopped in time)."""
    try:
        await asyncio.wait_for(client.stop(), timeout_s)
    except asyncio.CancelledError:
        raise
    except TimeoutError:
        log.warning("a Kafka client did not stop within %.0fs after a broker stall; abandoned", timeout_s)
        return False
    except Exception as e:  # stopping a client of a dead broker may fail in many ways; it is gone either way
        log.debug("stopping a Kafka client failed: %r", e)
    return True
