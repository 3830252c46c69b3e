"""Joiner settings and the `periscope join` command line: defaults, env, flags, and bad input."""

from __future__ import annotations

import os
from typing import Any

import pytest
from pydantic import ValidationError

from periscope.cli.errors import InputError
from periscope.cli.main import main
from periscope.core.changes import ChangeConfig
from periscope.core.engine import EngineConfig
from periscope.core.rows import RowConfig
from periscope.core.watermark import ALL_STREAMS, OWNER_STREAMS
from periscope.settings.joiner import JoinerSettings
from services.joiner.app import create_app
from services.joiner.cli import load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PERISCOPE_"):
            monkeypatch.delenv(name)


def test_defaults_are_the_documented_ones_and_make_the_default_engine() -> None:
    s = JoinerSettings()
    assert (s.app_id, s.web_host, s.web_port, s.data_dir) == ("periscope-joiner", "127.0.0.1", 9403, "")
    assert (s.window, s.window_keep, s.idle_window, s.idle_threshold) == (60.0, 3600.0, 600.0, 5.0)
    assert (s.lateness, s.state_persist_interval, s.kafka_profile) == (0.9, 5.0, "kafka")
    assert s.heartbeat == 5.0
    # Joined in event-time order across the node's topics (live outputs equal replay's), by default.
    assert s.engine_config() == EngineConfig(align=ALL_STREAMS)
    assert (s.align, s.max_hold) == ("all", 600.0)


@pytest.mark.parametrize(("profile", "wait_ms", "idempotent", "compression"), [
    ("kafka", 500, True, "lz4"), ("embedded", 100, False, None)])
async def test_the_worker_clients_follow_the_broker_profile(profile: str, wait_ms: int, idempotent: bool,
                                                            compression: str | None) -> None:
    # Faust itself would build its consumer with a 1.5 s fetch wait (which a broker that does not answer
    # a waiting fetch early sits out) and its producer idempotent only in transactions.
    app = create_app(JoinerSettings(kafka_profile=profile, kafka_bootstrap="127.0.0.1:1"),
                     announce=lambda _line: None, partitions=12)
    consumer = app.consumer._thread._create_worker_consumer(app.transport)
    producer = app.producer._new_producer()
    try:
        assert consumer._fetch_max_wait_ms == wait_ms
        assert (producer._txn_manager is not None) == idempotent
        assert producer._compression_type == compression
        assert app.conf.topic_partitions == 12
    finally:
        await consumer.stop()
        await producer.stop()


def test_environment_durations_become_the_engine_config(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"WINDOW": "30s", "WINDOW_KEEP": "2h", "IDLE_WINDOW": "5m", "IDLE_THRESHOLD": "2.5",
           "LATENESS": "500ms", "STATE_PERSIST_INTERVAL": "2", "WEB_PORT": "0", "APP_ID": "j-1",
           "HEARTBEAT": "30s", "ALIGN": "owners", "MAX_HOLD": "2m"}
    for k, v in env.items():
        monkeypatch.setenv("PERISCOPE_" + k, v)
    s = JoinerSettings()
    assert s.engine_config() == EngineConfig(
        rows=RowConfig(window_ms=30_000, window_keep_ms=7_200_000, idle_window_ms=300_000,
                       idle_threshold_pct=2.5),
        lateness_ms=500,
        changes=ChangeConfig(heartbeat_ms=30_000),
        align=OWNER_STREAMS,
        max_hold_ms=120_000,
    )
    assert (s.state_persist_interval, s.web_port, s.app_id) == (2.0, 0, "j-1")


@pytest.mark.parametrize(("field", "value"), [
    ("window", "0s"), ("window", "soon"), ("idle_threshold", 101), ("web_port", 70000),
    ("lateness", -1), ("state_persist_interval", "0"), ("session_timeout", "100ms"), ("app_id", "a b"),
    ("window_keep", "10s"), ("kafka_profile", "tansu"), ("heartbeat", "-1s"),
    ("heartbeat", "often"), ("align", "some"), ("max_hold", "0s"),
])
def test_invalid_values_are_refused(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        JoinerSettings(**{field: value})


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERISCOPE_IDLE_WINDOW", "20m")
    monkeypatch.setenv("PERISCOPE_KAFKA_BOOTSTRAP", "env:9092")
    s = load_settings(bootstrap="flag:9092", web_port=0, idle_window="90s", idle_threshold=1.0)
    assert (s.kafka_bootstrap, s.web_port, s.idle_window, s.idle_threshold) == ("flag:9092", 0, 90.0, 1.0)
    assert load_settings().idle_window == 1200.0


def test_a_bad_setting_is_one_input_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match="idle_window"):
        load_settings(idle_window="ten minutes")
    monkeypatch.setenv("PERISCOPE_LOG_LEVEL", "chatty")
    with pytest.raises(InputError, match="log_level"):
        load_settings()


@pytest.mark.parametrize("argv", [
    ["--idle-window", "ten"], ["--idle-threshold", "200"], ["--idle-threshold", "lots"], ["--web-port", "-1"],
    ["--no-such-flag"],
])
def test_bad_command_line_exits_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["join", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("periscope: ") and err.count("\n") == 1 and "Traceback" not in err


def test_help_names_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["join", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert all(f in out for f in ("--bootstrap", "--web-port", "--idle-window", "--idle-threshold"))
