"""`periscope up --retention`: how much history the stack's broker keeps, so that a long run stays
bounded. Apache Kafka gets the retention (and segments short enough for it to apply) as topic
settings; the embedded broker, which applies none, is renewed once per retention period
(tests/integration/test_broker_retention.py, tests/e2e/test_up_retention.py)."""

from __future__ import annotations

from typing import Any

import pytest

from periscope.bus import topics
from periscope.sim.cluster.model import ClusterModel
from periscope.sim.scenario import load_scenario
from periscope.sim.up.stack import Stack, UpOptions
from tests.unit.test_hostile_cli import cli, one_line


def _plan(retention_ms: int) -> Any:
    stack = Stack(UpOptions(retention_ms=retention_ms), ClusterModel(load_scenario("demo")), print)
    try:
        return stack.topic_plan()
    finally:
        stack.workdir.rmdir()


def test_every_topic_up_creates_keeps_the_retention_and_rolls_segments_within_it() -> None:
    plan = _plan(3_600_000)
    for topic in topics.ALL:
        configs = plan.configs(topic)
        assert configs["retention.ms"] == "3600000", topic.name
        assert configs["segment.ms"] == "900000", topic.name  # a quarter: deletion lags at most that
    assert _plan(120_000).configs(topics.ALL[0])["segment.ms"] == "60000"  # never below a minute


def test_zero_keeps_everything_as_the_production_defaults_do() -> None:
    plan = _plan(0)
    assert "segment.ms" not in plan.configs(topics.ALL[0])
    assert plan.retention_ms["input"] == 7 * 86_400_000


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    monkeypatch.setattr("periscope.sim.cli.run_up", lambda opts, model: seen.append(opts) or 0)
    return seen


@pytest.mark.parametrize(("value", "ms"), [(None, 3_600_000), ("10m", 600_000), ("0", 0), ("2h", 7_200_000)])
def test_the_flag(value: str | None, ms: int, started: list[Any]) -> None:
    args = ["up", "--api-port", "0", "--broker-port", "0", *(["--retention", value] if value else [])]
    code, _, err = cli(*args)
    assert (code, err) == (0, "")
    assert started[0].retention_ms == ms


@pytest.mark.parametrize(("value", "problem"), [("30s", "at least 1m"), ("forever", "not a duration"),
                                                ("9" * 400, "not a duration")])
def test_a_bad_retention_is_one_line(value: str, problem: str, started: list[Any]) -> None:
    code, out, err = cli("up", "--api-port", "0", "--broker-port", "0", "--retention", value)
    one_line(code, out, err, 2, "--retention", problem)
    assert started == []
