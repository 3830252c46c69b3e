"""`periscope up` with relative paths, as a user in their own directory types them: the scenario and the
truth file are found and written there, although every child runs in a directory of its own."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from periscope.sim.report.text import read_jsonl
from tests.e2e.support import marked_env, marked_pids, periscope

pytestmark = pytest.mark.slow

SCENARIO = """\
duration: 8s
nodes:
  - name: gpu-a
    gpus: [{model: NVIDIA T4, memory_mib: 15360}]
pods:
  - {namespace: ml, name: train, node: gpu-a, containers: [{name: c, util_pct: 50}]}
"""


def test_relative_scenario_and_truth_paths(tmp_path: Path) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "one.yaml").write_text(SCENARIO)
    token = uuid.uuid4().hex
    try:
        proc = subprocess.run(
            periscope("up", "--scenario", "scenarios/one.yaml", "--truth", "truth.jsonl", "--speed", "2",
                      "--api-port", "0", "--broker-port", "0", "--exit-at-end"),
            cwd=tmp_path, env=marked_env(token), capture_output=True, text=True, timeout=120,
        )
    finally:
        left = marked_pids(token)
    assert not left, f"processes left behind: {left}"
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "periscope up: one: 1 nodes, 1 GPUs, 1 pods" in proc.stdout
    truth = read_jsonl(tmp_path / "truth.jsonl")  # written by the simulator, from its own directory
    assert truth and (tmp_path / "truth.api.jsonl").exists()
