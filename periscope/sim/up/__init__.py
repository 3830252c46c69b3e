"""`periscope up`: the embedded broker, a simulated cluster and every service, each its own process.

The entry point: the scenario was validated before (nothing starts when it is bad); this starts the
`Stack` (periscope.sim.up.stack: what it runs, in which order), prints the ready lines once the API shows
every simulated GPU, then supervises until Ctrl-C, SIGTERM or, with `--exit-at-end`, the scenario's
end. It owns the signals: SIGINT and SIGTERM both interrupt the run, and both are ignored while the
stack stops. Each child has its own process group (periscope.sim.up.child), so Ctrl-C reaches only
this orchestrator, which then stops the children. The options and the snapshot path are re-exported
for the command line.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Any

from periscope.devkit.embedded import BrokerError
from periscope.sim.cluster.model import ClusterModel
from periscope.sim.up.child import Emit
from periscope.sim.up.sampler import snapshots_path, usage_path
from periscope.sim.up.stack import Stack, UpError, UpOptions, banner

# what `periscope up` and `periscope report` use
__all__ = ["UpOptions", "run_up", "snapshots_path", "usage_path"]
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_up(opts: UpOptions, model: ClusterModel, emit: Emit | None = None) -> int:
    """Run the stack; returns the exit status (1 when a service crashed or startup failed)."""
    lock = threading.RLock()

    def out(line: str) -> None:
        with lock:  # one line at a time from the children's pumps and from here
            if emit is not None:
                emit(line)
                return
            with contextlib.suppress(OSError):  # a closed stdout (`| head`) must not stall the pumps
                print(line, flush=True)

    # SIGTERM (a supervisor, `timeout`, `kill`) stops everything as Ctrl-C does. SIGINT is set too:
    # a parent that started us with it ignored (a background job of a script) would otherwise leave
    # Ctrl-C without effect, as Python installs its own handler only when SIGINT was not ignored.
    for sig in _SIGNALS:
        signal.signal(sig, _interrupt)
    stack = Stack(opts, model, out)
    started = time.monotonic()
    try:
        stack.start()
        stack.wait_ready()
        stack.begin()
        with lock:  # the banner in one piece: the children are already logging
            for line in banner(stack):
                out(line)
            out(f"[up] ready in {time.monotonic() - started:.1f}s; scenario clock started")
        stack.supervise()
        stack.record_usage()  # the scenario ended (--exit-at-end); only with --truth
    except KeyboardInterrupt:
        out("[up] interrupted: stopping")
    except (UpError, BrokerError) as e:
        out(f"[up] {e}")
        print(f"periscope: up: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        with _no_interrupts():
            stack.stop()
    if stack.crashed:
        out(f"[up] services that crashed during the run: {', '.join(sorted(set(stack.crashed)))}")
        return 1
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _no_interrupts() -> Any:
    """A second Ctrl-C must not cut the shutdown short and leave children behind."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
