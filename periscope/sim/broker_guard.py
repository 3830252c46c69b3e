"""What `periscope up` does when its embedded broker dies: it stops everything and says why.

The embedded broker keeps its topics in memory, so a broker that died took every event, changelog and
committed offset with it. Restarting it would leave each service holding state that no longer exists
on the bus (a joiner whose recovered marks are ahead of empty topics, an API whose view has nothing
behind it); a clean stop with a non-zero status is the honest answer, and the one line says so.
"""

from __future__ import annotations

from periscope.bus.broker import EmbeddedBroker

# Services get this long to stop before they are killed, then the simulator, then the broker: Ctrl-C
# (or a dead broker) ends `periscope up` within 10 s even when a service cannot reach the broker.
SERVICES_GRACE_S = 6.0
SIM_GRACE_S = 2.0
BROKER_GRACE_S = 1.0


def broker_lost(broker: EmbeddedBroker | None) -> str | None:
    """The line to print when the broker process has exited, else None."""
    if broker is None or broker.running():
        return None
    status = broker.exit_status
    how = f"was killed by signal {-status}" if status is not None and status < 0 else f"exited ({status})"
    return (f"the embedded broker {how}; every topic and its history were lost with it: stopping every "
            "service (run periscope up again to start afresh)")
