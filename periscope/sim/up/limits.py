"""How large a scenario `periscope up` runs on one machine, checked before anything starts.

Every simulated node is a probe process of its own (about 70 MiB), every GPU a device the simulator,
the probes and the joiner handle each tick, every pod state the simulator and joiner keep. A scenario
beyond a limit is refused (exit 2) with one line naming the limit, what it protects and the flag
that raises it; the defaults run the built-in scenarios with room to spare.
"""

from __future__ import annotations

from dataclasses import dataclass

from periscope.sim.scenario import Scenario

PROBE_MIB = 70  # resident size of one probe process, measured under `periscope up`


@dataclass(frozen=True, slots=True)
class UpLimits:
    nodes: int = 16
    gpus: int = 256
    pods: int = 5000


DEFAULT_LIMITS = UpLimits()


class LimitExceeded(ValueError):
    """The scenario is larger than a limit; the message names it and how to raise it."""


def check_limits(scenario: Scenario, limits: UpLimits) -> None:
    """LimitExceeded for the first limit the scenario is beyond; nothing has been started."""
    gpus = sum(len(n.gpus) for n in scenario.nodes)
    found = (  # (flag suffix, what is counted, count, limit, why it is limited)
        ("nodes", "nodes", len(scenario.nodes), limits.nodes,
         f"each node is a probe process of about {PROBE_MIB} MiB, so {len(scenario.nodes)} would take about "
         f"{len(scenario.nodes) * PROBE_MIB / 1024:.1f} GiB"),
        ("gpus", "GPUs", gpus, limits.gpus,
         "every GPU is sampled by the simulator, its probe and the joiner each tick"),
        ("pods", "pods", len(scenario.pods), limits.pods,
         "the simulator and the joiner keep every pod's state"),
    )
    for flag, noun, count, limit, why in found:
        if count > limit:
            raise LimitExceeded(
                f"scenario {scenario.source}: {count} {noun} is over up's limit of {limit} ({why}); "
                f"raise it with --max-{flag} {count}"
            )
