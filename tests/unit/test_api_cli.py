"""`periscope api` flags and settings: bad input is one clear error, never a traceback."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from periscope.settings.api import ApiSettings
from services.api import cli


def test_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    s = ApiSettings()
    assert (s.api_host, s.api_port, s.api_group_prefix) == ("127.0.0.1", 8080, "periscope-api-")
    monkeypatch.setenv("PERISCOPE_API_PORT", "9999")
    monkeypatch.setenv("PERISCOPE_API_GROUP_PREFIX", "team-a-")
    monkeypatch.setenv("PERISCOPE_KAFKA_BOOTSTRAP", "kafka:9092")
    s = cli.load_settings(None, None, None, None)
    assert (s.api_port, s.api_group_prefix, s.kafka_bootstrap) == (9999, "team-a-", "kafka:9092")
    s = cli.load_settings("0.0.0.0", 8081, "b:1", None)  # flags win over env
    assert (s.api_host, s.api_port, s.kafka_bootstrap) == ("0.0.0.0", 8081, "b:1")


@pytest.mark.parametrize(
    ("env", "value", "needle"),
    [
        ("PERISCOPE_API_PORT", "eighty", "api_port"),
        ("PERISCOPE_API_PORT", "70000", "api_port"),
        ("PERISCOPE_LOG_LEVEL", "loud", "log_level"),
        ("PERISCOPE_KAFKA_BOOTSTRAP", " ", "kafka_bootstrap"),
        ("PERISCOPE_API_RETENTION", "forever", "api_retention"),
        ("PERISCOPE_API_RETENTION", "0s", "api_retention"),
    ],
)
def test_bad_settings_are_one_input_error(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, needle: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(cli.InputError) as e:
        cli.load_settings(None, None, None, None)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_help_names_the_flags() -> None:
    r = CliRunner().invoke(cli.command, ["--help"])
    assert r.exit_code == 0
    for flag in ("--host", "--port", "--bootstrap", "--group-prefix"):
        assert flag in r.output


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    from periscope.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["api", *args])
    err = capsys.readouterr().err
    return int(e.value.code or 0), [ln for ln in err.splitlines() if ln.strip()]


def test_busy_port_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code, lines = run_main(capsys, "--port", str(port), "--bootstrap", "127.0.0.1:1")
    assert code == 2 and len(lines) == 1
    assert "cannot listen" in lines[0] and str(port) in lines[0]


@pytest.mark.parametrize("args", [["--port", "99999"], ["--port", "http"], ["--bogus"]])
def test_bad_flags_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, lines = run_main(capsys, *args)
    assert code == 2 and len(lines) == 1 and "Traceback" not in lines[0]
