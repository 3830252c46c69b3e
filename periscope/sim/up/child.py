"""One child process of `periscope up`: a service, the simulator or anything else the stack runs.

A `Child` starts its argv in its own process group (so Ctrl-C reaches only the orchestrator) with
PR_SET_PDEATHSIG set by a launcher before exec (so a killed orchestrator takes it along), pumps its
combined stdout/stderr line by line to an `Emit` callback as `[name] line` with terminal control codes
stripped, and stops it by signalling the whole group: SIGTERM first, SIGKILL once the grace period
is over, always reaping it. It also remembers whether an exit was asked for, which the stack's
supervision reads.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# The broker's own launcher: PR_SET_PDEATHSIG with SIGKILL, not SIGTERM, because with the orchestrator gone
# the broker goes too, and a graceful shutdown would wait on it (the joiner's consumer group leave)
# long after nobody is left to care.
from periscope.devkit.launch import with_parent_death

Emit = Callable[[str], None]
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(eq=False, repr=False)  # no repr: the environment may hold a user's secrets
class Child:
    """One service process; its output lines are emitted as `[name] line`."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    emit: Emit
    stdin: bool = False
    proc: subprocess.Popen[str] | None = field(default=None, init=False)
    expected_exit: bool = field(default=False, init=False)

    def start(self) -> None:
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.expected_exit = False
        # Spawned from the main thread only: PDEATHSIG follows the thread that forked the child.
        self.proc = subprocess.Popen(
            with_parent_death(self.argv), env=self.env, cwd=self.cwd, text=True, bufsize=1, errors="replace",
            stdin=subprocess.PIPE if self.stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, process_group=0, close_fds=True,
        )
        log = f"log-{self.name}"
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True, name=log).start()

    def _pump(self, stream: IO[str] | None) -> None:
        for line in stream or ():
            text = _ANSI.sub("", line).rstrip()  # cursor/colour codes of Faust's console output
            if text:
                self.emit(f"[{self.name}] {text}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def send(self, line: str) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()

    def terminate(self) -> None:
        """Ask the whole process group to stop (SIGTERM); `finish` waits for it."""
        proc = self.proc
        if proc is None:
            return
        self.expected_exit = True
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)

    def finish(self, deadline: float) -> None:
        """Wait until `deadline` (monotonic), then SIGKILL the group; always reaped."""
        proc = self.proc
        if proc is None:
            return
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.emit(f"[up] {self.name} did not stop in time; killing it")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # also leftovers of a group whose leader is gone
        proc.wait()
        self.proc = None

    def stop(self, grace_s: float = 8.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after the grace period; always reaped."""
        self.terminate()
        self.finish(time.monotonic() + grace_s)
