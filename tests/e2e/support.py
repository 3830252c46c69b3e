"""End-to-end helpers: run `periscope up` as a user would (a separate process) and score the run.

Each scenario runs once per module, accelerated with --speed, with --truth so the API is sampled at
every tick; tests then assert on the accuracy report and on the recorded API answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from periscope.sim.report.accounting import compare
from periscope.sim.report.score import ReportOptions, Truth, build_report, parse_time
from periscope.sim.report.text import read_jsonl

STALE_VIEW_S = 10.0  # scenario seconds between a snapshot and its view's as_of that count as behind
MARKER = "PERISCOPE_E2E_TEST_RUN"  # not PERISCOPE_-settings: up passes other variables through


def periscope(*args: str) -> list[str]:
    return [sys.executable, "-m", "periscope.cli.main", *args]


def marked_env(token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERISCOPE_")}
    env["E2E_RUN_MARKER"] = token
    env["PYTHONUNBUFFERED"] = "1"
    return env


def marked_pids(token: str) -> list[int]:
    """Processes whose environment carries this run's marker (everything `up` started inherits it)."""
    needle = f"E2E_RUN_MARKER={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat", "rb") as s:
                        if s.read().rsplit(b")", 1)[1].split()[0] != b"Z":  # zombies hold nothing
                            found.append(int(entry))
        except OSError:
            continue
    return found


@dataclass
class Run:
    rc: int
    output: str
    truth: Truth
    snapshots: list[dict[str, Any]]
    report: dict[str, Any]

    @property
    def final(self) -> dict[str, Any]:
        return next(s for s in reversed(self.snapshots) if s["kind"] == "final")

    def snaps(self) -> list[dict[str, Any]]:
        return [s for s in self.snapshots if s["kind"] == "snapshot"]

    def story(self, limit: int = 60) -> str:
        """For a failure message: what `up` said (faults, restarts), the services' warnings and errors,
        and when the API's view fell behind the scenario clock and caught up again."""
        said = [line for line in self.output.splitlines()
                if line.startswith("[up]") or any(w in line for w in ("WARNING", "ERROR", "Traceback"))]
        start, behind, lags = None, False, []
        for s in self.snaps():
            start = s["at_ms"] if start is None else start
            as_of = parse_time(s.get("as_of"))
            lag_s = (s["at_ms"] - as_of) / 1000 if as_of is not None else None
            late = lag_s is None or lag_s > STALE_VIEW_S
            if late != behind:
                at, how = (s["at_ms"] - start) // 1000, "no data" if lag_s is None else f"{lag_s:.1f}s"
                lags.append(f"{at}s: {'behind' if late else 'current'} ({how})")
                behind = late
        return "\n".join([*said[:limit], "API view against the scenario clock: " + ", ".join(lags)])


def run_scenario(tmp: Path, scenario: str, speed: float, *extra: str, timeout_s: float = 110) -> Run:
    token = uuid.uuid4().hex
    tmp.mkdir(parents=True, exist_ok=True)
    truth = tmp / "truth.jsonl"
    args = periscope(
        "up",
        "--scenario",
        scenario,
        "--speed",
        str(speed),
        "--api-port",
        "0",
        "--broker-port",
        "0",
        "--truth",
        str(truth),
        "--exit-at-end",
        *extra,
    )
    try:
        proc = subprocess.run(args, env=marked_env(token), capture_output=True, text=True, timeout=timeout_s)
    finally:
        leftovers = marked_pids(token)
    assert not leftovers, f"processes left behind by periscope up: {leftovers}"
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    t = Truth(read_jsonl(truth))
    snaps = read_jsonl(truth.with_name("truth.api.jsonl"))
    report = build_report(t, snaps, ReportOptions())
    usage = truth.with_name("truth.usage.json")  # `periscope usage` over the run, as `up` ran it
    report["accounting"] = compare(t, json.loads(usage.read_text())) if usage.is_file() else None
    return Run(proc.returncode, output, t, snaps, report)


def pod_rows(snapshot: dict[str, Any], pod: str) -> list[dict[str, Any]]:
    return [r for r in snapshot.get("pods") or [] if r.get("pod") == pod]


def assert_scored(run: Run, min_coverage: float = 0.8) -> None:
    """The run was sampled at (almost) every tick, so a 100 % score means something."""
    assert run.report["snapshots"] >= min_coverage * run.report["ticks"], run.report
    assert run.report["periscope"]["owners"]["total"] > 0
    assert_checked(run)


def assert_checked(run: Run) -> None:
    """Answers a lagging simulator kept from being checked stay few: the score is of most of the run."""
    owners, behind = run.report["periscope"]["owners"]["total"], run.report["simulator_behind"]
    assert behind["unscored"] <= owners // 10, (behind, owners)
