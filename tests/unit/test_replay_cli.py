"""`periscope replay` input checks: every bad flag, time or setting is one line and exit status 2."""

from __future__ import annotations

import pytest

from periscope.cli.main import main
from periscope.replay.settings import ReplaySettings

OK_RANGE = ["--from", "2026-11-22T04:00:00Z", "--to", "2026-11-22T05:00:00Z"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--bootstrap", "127.0.0.1:9", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.mark.parametrize("args,needle", [
    ([], "give --from and --to"),
    (["--from", "2026-11-22T04:00:00Z"], "give --from and --to"),
    (["--at", "2026-11-22T04:00:00Z", "--from", "2026-11-22T04:00:00Z"], "cannot be combined"),
    (["--from", "yesterday", "--to", "2026-11-22T05:00:00Z"], "--from: not an RFC 3339 time"),
    (["--at", "2026-11-22T25:00:00Z"], "--at: not an RFC 3339 time"),
    (["--from", "2026-11-22T06:00:00Z", "--to", "2026-11-22T05:00:00Z"], "is after --to"),
    ([*OK_RANGE, "--format", "yaml"], "'yaml' is not one of"),
    ([*OK_RANGE, "--lookback", "forever"], "--lookback: not a duration"),
    ([*OK_RANGE, "--window-lookback", "-5m"], "--window-lookback"),
    ([*OK_RANGE, "--no-such-flag"], "No such option"),
    ([*OK_RANGE, "--workers", "-1"], "--workers"),
    ([*OK_RANGE, "--workers", "many"], "--workers"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(args, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("periscope: ") and needle in err


def test_bad_bootstrap(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--bootstrap", "localhost", *OK_RANGE])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--bootstrap: not HOST:PORT" in err


def test_bad_setting_in_the_environment(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERISCOPE_REPLAY_LOOKBACK", "sometime")
    code, _, err = run(OK_RANGE, capsys)
    assert code == 2 and err.count("\n") == 1 and "PERISCOPE_REPLAY_LOOKBACK" in err
    monkeypatch.setenv("PERISCOPE_REPLAY_LOOKBACK", "1h")
    monkeypatch.setenv("PERISCOPE_REPLAY_WORKERS", "-2")
    code, _, err = run(OK_RANGE, capsys)
    assert code == 2 and err.count("\n") == 1 and "PERISCOPE_REPLAY_WORKERS" in err


def test_help_names_the_modes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert all(flag in out for flag in ("--from", "--to", "--at", "--gpu", "--pod", "--node", "--format",
                                        "--workers"))


def test_settings_share_the_joiner_names_and_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERISCOPE_WINDOW", "10s")
    monkeypatch.setenv("PERISCOPE_IDLE_WINDOW", "120")
    monkeypatch.setenv("PERISCOPE_LATENESS", "3s")
    monkeypatch.setenv("PERISCOPE_REPLAY_LOOKBACK", "2h")
    monkeypatch.setenv("PERISCOPE_HEARTBEAT", "20s")
    s = ReplaySettings()
    cfg = s.engine_config()
    assert (cfg.rows.window_ms, cfg.rows.idle_window_ms, cfg.lateness_ms) == (10_000, 120_000, 3000)
    assert cfg.changes.heartbeat_ms == 20_000
    assert s.ms("replay_lookback") == 7_200_000 and s.ms("replay_window_lookback") == 600_000
