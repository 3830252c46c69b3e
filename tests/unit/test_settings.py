"""The settings classes as one whole: the generated page lists every variable and is current, every
duration and count is checked, the one loader reports one line, and `periscope up` checks each child's
settings with that child's own class."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from periscope.config import SettingsError, env_for, load_settings
from periscope.settings import docs
from periscope.settings.catalog import CATALOG, variables
from periscope.settings.joiner import JoinerSettings
from periscope.settings.probe import ProbeSettings
from periscope.settings.replay import ReplaySettings

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [cls for _, cls in CATALOG]


def test_the_settings_page_is_current() -> None:
    assert docs.PAGE == ROOT / "docs" / "settings.md"
    assert docs.PAGE.read_text() == docs.render(), "stale: run `python -m periscope.settings.docs`"


def test_the_page_lists_every_variable() -> None:
    # A variable several commands read (PERISCOPE_WINDOW: join and replay) is listed under each.
    listed = re.findall(r"^\| `(PERISCOPE_[A-Z0-9_]+)` \|", docs.render(), flags=re.M)
    assert set(listed) == variables()
    common = re.findall(r"^\| `(PERISCOPE_KAFKA_BOOTSTRAP)` \|", docs.render(), flags=re.M)
    assert len(common) == 1  # what every service reads is listed once, under "every service"


def test_every_variable_the_code_names_is_a_setting() -> None:
    """A PERISCOPE_* name written in the library or an application is one some settings class reads
    (a family written `PERISCOPE_KAFKA_*` or a placeholder `PERISCOPE_<NAME>` aside)."""
    named: set[str] = set()
    for top in ("periscope", "services"):
        for path in (ROOT / top).rglob("*.py"):
            named |= set(re.findall(r"PERISCOPE_[A-Z][A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*<])", path.read_text()))
    assert named - variables() == set()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_duration_refuses_negative_and_garbage(cls: type[BaseSettings]) -> None:
    durations = docs._durations(cls)
    for name in durations:
        for bad in ("-1s", "-0.5", "soon", "1x"):
            with pytest.raises(ValidationError):
                cls.model_validate({name: bad})


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_count_and_number_refuses_negative(cls: type[BaseSettings]) -> None:
    for name, field in cls.model_fields.items():
        if field.annotation in (int, int | None, float, float | None):
            with pytest.raises(ValidationError):
                cls.model_validate({name: -1})


@pytest.mark.parametrize("name", ["window", "window_keep", "idle_window"])
def test_replay_refuses_a_zero_window(name: str) -> None:
    with pytest.raises(ValidationError):
        ReplaySettings.model_validate({name: 0})


def test_replay_keeps_the_engine_checks_beside_its_own() -> None:
    # ReplaySettings once had a validator named like EngineSettings' and so dropped its checks.
    for name in ("lateness", "heartbeat", "replay_lookback"):
        with pytest.raises(ValidationError):
            ReplaySettings.model_validate({name: -1})


def test_the_loader_names_the_setting_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERISCOPE_WINDOW", "0")
    with pytest.raises(SettingsError, match=r"^replay settings: window: must be longer than 0s$"):
        load_settings(ReplaySettings, "replay")
    with pytest.raises(SettingsError, match=r"^PERISCOPE_WINDOW: must be longer than 0s$"):
        load_settings(ReplaySettings, "replay", naming="variable")
    monkeypatch.setenv("PERISCOPE_WINDOW", "1m")
    monkeypatch.setenv("PERISCOPE_LOG_LEVEL", "loud")
    with pytest.raises(SettingsError, match=r"^join settings: log_level: 'loud' is not one of"):
        load_settings(JoinerSettings, "join")
    monkeypatch.setenv("PERISCOPE_LOG_LEVEL", "debug")
    # A flag left unset (None) does not hide the environment's value.
    assert load_settings(JoinerSettings, "join", web_port=None, window=None).window == 60.0


def test_a_child_setting_is_checked_with_the_childs_own_class(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_for(ProbeSettings, tick=0.5, node_name="n1", health_port=0) == {
        "tick": "0.5", "node_name": "n1", "health_port": "0"}
    with pytest.raises(SettingsError, match="ProbeSettings has no setting 'tik'"):
        env_for(ProbeSettings, tik="1")
    with pytest.raises(SettingsError, match="JoinerSettings: window"):
        env_for(JoinerSettings, window="0")
    # Checked without the launcher's own environment: a bad variable there is not the child's.
    monkeypatch.setenv("PERISCOPE_TICK", "never")
    assert env_for(ProbeSettings, node_name="n1") == {"node_name": "n1"}
