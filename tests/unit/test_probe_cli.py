"""`periscope probe` flag handling: bad input is one line on stderr and exit status 2."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from services.probe.cli import command, load_settings


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tick", "soon"], "probe settings: tick"),
        (["--allocation-interval", "-5s"], "probe settings: allocation_interval"),
        (["--nvml-backend", "dcgm"], "probe settings: nvml_backend"),
        (["--bootstrap", " "], "kafka_bootstrap is empty"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("periscope: ") and message in lines[0]
    assert "Traceback" not in result.output


def test_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERISCOPE_NODE_NAME", "from-env")
    monkeypatch.setenv("PERISCOPE_TICK", "2s")
    s = load_settings(node="from-flag", tick=None, checkpoint="/cp", health_port=0)
    assert (s.node_name, s.tick, s.checkpoint_path, s.health_port) == ("from-flag", 2.0, "/cp", 0)
