"""`periscope up --secure`: the broker is reachable only through mutual TLS, every service connects that
way, the pipeline reaches ready and the attribution is scored right; no key material in any log line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.support import Run, assert_scored, run_scenario

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def secure(module_tmp: Path) -> Run:
    return run_scenario(module_tmp, "demo", 4, "--idle-window", "20s", "--secure", "--log-level", "debug")


def test_ready_over_mutual_tls_with_every_owner_right(secure: Run) -> None:
    assert re.search(r"^broker: 127\.0\.0\.1:\d+ \(mutual TLS\)$", secure.output, re.M), secure.output[-2000:]
    assert "[up] ready in" in secure.output
    assert_scored(secure)
    assert secure.report["periscope"]["owners"]["share"] == 1.0, secure.report["periscope"]["examples"]


def test_no_key_material_in_the_logs(secure: Run) -> None:
    # Every service logged at DEBUG (aiokafka's requests included); PEM bodies are base64 lines.
    assert "PRIVATE KEY" not in secure.output
    assert not re.search(r"^[A-Za-z0-9+/]{64}$", secure.output, re.M)
