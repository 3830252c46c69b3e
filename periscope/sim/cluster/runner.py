"""The simulator process: `python -m periscope.sim.cluster.runner CONFIG.json`, started by `periscope up`.

It serves a scenario's cluster through the real interfaces the services read (per node the kubelet
socket, device-manager checkpoint, /proc tree and NVML state of `node`; for the cluster the
apiserver objects of `kube_objects`), frozen at scenario time 0 until `start <sim_ms>` arrives on
stdin, so every service can come up first; then the `simulator` applies each tick and writes the
ground truth. Faults of the node itself (kubelet-restart, checkpoint-corrupt) are executed there;
process restarts are the orchestrator's (`periscope up` reads the same fault schedule). It writes
`ready.json` into the work directory once everything serves; stdin EOF (the orchestrator is gone),
`stop`, SIGTERM or SIGINT ends it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from periscope.sim.cluster.simulator import Simulator


def _read_commands(sim: Simulator, loop: asyncio.AbstractEventLoop) -> None:
    """Orchestrator commands on stdin: `start <sim_ms>`, `stop`; EOF means the orchestrator is gone."""
    for line in sys.stdin:
        parts = line.split()
        if parts[:1] == ["start"] and len(parts) == 2 and parts[1].isdigit():
            loop.call_soon_threadsafe(sim.begin, int(parts[1]))
        elif parts[:1] == ["stop"]:
            break
    loop.call_soon_threadsafe(sim.stop)


async def _main(config: dict[str, Any]) -> None:
    sim = Simulator(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sim.stop)
    threading.Thread(target=_read_commands, args=(sim, loop), daemon=True, name="commands").start()
    try:
        await sim.run()
    finally:
        await sim.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m periscope.sim.cluster.runner CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    config = json.loads(Path(args[0]).read_text())
    asyncio.run(_main(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
