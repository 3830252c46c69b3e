"""Where the joiner's time goes: a py-spy sampling profile of one worker working through the backlog,
and a cProfile of the pure core in steady state (after an hour of history).

py-spy is not a project dependency: `--profile` uses it when it is installed (`pip install py-spy`
into the venv) and says so when it is not. Paths in the report are made relative to the repository or
to site-packages, so the output names no machine-specific location.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import re
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.joiner import one_worker_run
from bench.workload import T0_MS, NodeShape, cluster_events
from periscope.core import engine

_FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def short(path: str) -> str:
    """A path relative to the repository, site-packages or the standard library."""
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in path:
            return ("stdlib/" if "python3.11/" in marker else "") + path.split(marker, 1)[1]
    root = str(Path(__file__).resolve().parent.parent) + "/"
    return path.removeprefix(root) if path.startswith(root) else Path(path).name


def _frame(raw: str) -> str:
    m = _FRAME.match(raw.strip())
    if not m:
        return raw.strip()
    return f"{m.group('fn')} ({short(m.group('file'))})"


def _package(frame: str) -> str:
    """The package a frame's file belongs to: `periscope/core`, `faust`, `stdlib/asyncio`, ..."""
    path = frame.rsplit("(", 1)[-1].rstrip(")")
    parts = path.split("/")
    if parts[0] == "stdlib" or (parts[0] in ("periscope", "services") and len(parts) > 2):
        return "/".join(parts[:2])
    return parts[0] if len(parts) > 1 else path


# Leaf frames of a thread that waits: the event loop in its poll, the log sweeper in its sleep, a thread on
# a condition. py-spy leaves out idle threads by their OS state, which it cannot always read (it counted
# these as running), so a sample whose leaf is one of them is counted as waiting, not as work.
WAITING = frozenset({
    "EpollSelector.select (stdlib/selectors.py)", "_PollLikeSelector.select (stdlib/selectors.py)",
    "_sweeper (periscope/logs.py)", "Condition.wait (stdlib/threading.py)",
})


def summarize_collapsed(text: str, top: int = 40) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's raw (collapsed) output, over the
    samples that were work (`waiting_pct`: the share left out as WAITING)."""
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    pkg_c: Counter[str] = Counter()
    callers: dict[str, Counter[str]] = {}
    total = waiting = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";")]
        if frames[-1] in WAITING:
            waiting += n
            continue
        total += n
        self_c[frames[-1]] += n
        # The nearest caller in project code (or the frame above the leaf), to say who pays.
        mine = [f for f in frames[:-1] if "(periscope/" in f or "(services/" in f]
        via = " <- ".join(reversed(frames[-3:-1])) + (f" <- ... {mine[-1]}" if mine else "")
        callers.setdefault(frames[-1], Counter())[via] += n
        pkg_c[_package(frames[-1])] += n
        for f in set(frames):
            incl_c[f] += n
    if not total:
        return {"samples": 0}

    def pct(c: Counter[str], only_project: bool) -> list[dict[str, Any]]:
        rows = [(f, n) for f, n in c.most_common()
                if not only_project or "(periscope/" in f or "(services/" in f]
        return [{"function": f, "pct": round(100 * n / total, 1)} for f, n in rows[:top]]

    hot = pct(self_c, False)
    for row in hot[:8]:
        row["callers"] = [{"via": v, "pct": round(100 * n / total, 1)}
                          for v, n in callers[row["function"]].most_common(3)]
    return {"samples": total, "waiting_pct": round(100 * waiting / (total + waiting), 1),
            "self_by_package": pct(pkg_c, False), "self": hot, "inclusive_project": pct(incl_c, True)}


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


async def joiner_profile(bootstrap: str, tmp: Path, expected: int, timeout_s: float) -> dict[str, Any]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(spy, os.X_OK):
        return {"skipped": "py-spy is not installed (pip install py-spy into the venv to profile)"}
    out = tmp / "joiner-profile.txt"
    wrap = [spy, "record", "--format", "raw", "--nolineno", "--full-filenames", "-r", "200", "-o", str(out),
            "--"]
    run = await one_worker_run(bootstrap, tmp, expected, None, timeout_s, wrap=wrap)
    worker = run.pop("worker")
    for child in _children(worker.proc.pid):  # stop the worker itself; py-spy then writes its output
        os.kill(child, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while worker.proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    worker.stop()
    if not out.exists():
        return {"skipped": "py-spy wrote no profile", "log": worker.log()[-500:]}
    summary = summarize_collapsed(out.read_text())
    summary["setup"] = (f"py-spy record at 200 Hz of one worker over the whole backlog ({expected} device-"
                        f"samples), waiting threads' samples excluded (`waiting_pct`); rate while profiled "
                        f"{run['device_samples_per_s']:.0f} device-samples/s")
    return summary


def top_self(work: Callable[[], object], n: int = 3) -> str:
    """The n functions with the most self time while `work` runs under cProfile, as one line."""
    prof = cProfile.Profile()
    prof.enable()
    work()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values()) or 1.0
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    return ", ".join(f"{fn} ({short(file)}) {100 * v[2] / total:.0f}%" for (file, _, fn), v in rows)


def core_profile(nodes: int = 2, minutes: int = 60, measure_min: int = 3, top: int = 20) -> dict[str, Any]:
    events = [ev for _, ev in cluster_events(nodes, minutes * 60, NodeShape())]
    cut = (minutes - measure_min) * 60_000 + T0_MS
    states: dict[str, engine.NodeState] = {}
    for ev in events:
        if ev.meta.time_ms >= cut:
            break
        st = states.get(ev.meta.node) or states.setdefault(ev.meta.node, engine.new_state(ev.meta.node))
        engine.apply(st, ev)
    rest = [ev for ev in events if ev.meta.time_ms >= cut]
    prof = cProfile.Profile()
    prof.enable()
    for ev in rest:
        engine.apply(states[ev.meta.node], ev)
    prof.disable()
    stats = pstats.Stats(prof)
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    samples = len([e for e in rest if type(e).__name__ == "NodeTelemetry"]) * NodeShape().gpus
    return {
        "setup": f"cProfile of engine.step over {measure_min} min of ticks for {nodes} nodes after "
                 f"{minutes - measure_min} min of history ({samples} device-samples)",
        "self": [{"function": f"{fn} ({short(file)}:{line})", "pct": round(100 * v[2] / total, 1),
                  "calls": v[1], "us_per_device_sample": round(v[2] / samples * 1e6, 2)}
                 for (file, line, fn), v in rows[:top]],
    }
