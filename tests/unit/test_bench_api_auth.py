"""The access-control benchmark runs at a tiny size and compares like with like (no timing asserted)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import api_auth, run


def test_auth_on_and_off_serve_the_same_rows_and_report_a_ratio() -> None:
    figures, details = api_auth.run(rows=320, history_min=2, requests=5, rounds=1)
    figs = {f.key: f for f in figures}
    ratio = figs["api_auth_p99_ratio"]
    assert ratio.value is not None and ratio.value > 0 and ratio.goal is not None
    assert set(details["p99_ms"]) == {"off", "cluster", "tenant"} and details["rows"] == 320
    assert "api_auth" in run.SECTIONS


def test_queried_nodes_belong_to_the_namespaced_user() -> None:
    nodes = api_auth._nodes(8 * 60)
    assert nodes and all(int(n.rsplit("-", 1)[1]) % api_auth.NAMESPACES in (0, 1) for n in nodes)
