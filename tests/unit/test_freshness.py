"""Ready means fresh: the API's /readyz and periscope_api_ready follow the data's age and the broker's
reachability, /healthz does not; the shared Freshness clock; the settings; `up`'s line for a lost broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from periscope.devkit.brokers import lost_line
from periscope.freshness import Freshness
from periscope.settings.api import ApiSettings
from periscope.settings.joiner import JoinerSettings
from periscope.settings.probe import ProbeSettings
from services.api.status import ConsumerStatus
from services.api.view import View
from tests.unit.test_api_app import client, get


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def test_freshness_ages_from_the_start_and_from_each_touch() -> None:
    clock = Clock()
    f = Freshness(30.0, clock)
    clock.t += 30
    assert f.age_s() == 30 and not f.stale()
    clock.t += 0.5
    assert f.stale()
    f.touch()
    assert f.age_s() == 0 and not f.stale()


async def test_readyz_is_503_while_stale_and_healthz_stays_200() -> None:
    status = ConsumerStatus(group_id="g", ready=True, connected=True, stale_after_s=30.0)
    now = time.monotonic()
    status.newest_at = now - 1
    async with client(View(), status) as c:
        body = await get(c, "/readyz")
        assert body["ready"] is True and body["stale"] is False and 1 <= body["data_age_s"] < 30
        status.newest_at = now - 31  # no new attribution for longer than API_STALE_AFTER
        body = await get(c, "/readyz", 503)
        assert body["ready"] is False and body["stale"] is True and body["data_age_s"] >= 31
        assert await get(c, "/healthz") == {"status": "ok"}
        metrics = (await c.get("/metrics")).text
        assert "periscope_api_ready 0.0" in metrics
        age = next(float(line.split()[1]) for line in metrics.splitlines()
                   if line.startswith("periscope_api_data_age_seconds "))
        assert age >= 31
        status.newest_at = time.monotonic()
        assert (await get(c, "/readyz"))["ready"] is True
        status.error = "TimeoutError: "  # the broker stopped answering: fresh data or not, not ready
        body = await get(c, "/readyz", 503)
        assert body["stale"] is True and body["error"] == "TimeoutError: "


def test_a_view_that_never_took_an_attribution_ages_from_its_start() -> None:
    # A start time that 5 s adds to exactly (a clock's reading + 5 - that reading can exceed 5).
    status = ConsumerStatus(ready=True, stale_after_s=5.0, started_at=1000.0)
    assert not status.is_stale(status.started_at + 5)
    assert status.is_stale(status.started_at + 5.1)
    assert status.serving(status.started_at + 1) and not status.serving(status.started_at + 6)


def test_stale_after_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERISCOPE_API_STALE_AFTER", "45s")
    monkeypatch.setenv("PERISCOPE_STALE_AFTER", "1500ms")
    assert ApiSettings().api_stale_after == 45.0
    assert ProbeSettings(node_name="n").stale_after == 1.5
    assert JoinerSettings().stale_after == 1.5
    assert ApiSettings(api_stale_after="2").api_stale_after == 2.0
    for bad in ("0s", "-1", "soon"):
        with pytest.raises(ValidationError):
            ApiSettings(api_stale_after=bad)


class Exited:
    def __init__(self, status: int | None) -> None:
        self.exit_status = status

    def running(self) -> bool:
        return self.exit_status is None


def test_a_lost_broker_is_one_line_that_says_history_was_lost() -> None:
    assert lost_line("embedded", None) is None
    assert lost_line("embedded", Exited(None)) is None  # type: ignore[arg-type]
    line = lost_line("embedded", Exited(-9))  # type: ignore[arg-type]
    assert line is not None and "\n" not in line
    assert line.startswith("the embedded broker was killed by signal 9; every topic and its history "
                           "were lost")
    assert "stopping every service" in line
    assert (lost_line("embedded", Exited(1)) or "").startswith("the embedded broker exited (1);")  # type: ignore[arg-type]


def test_a_lost_apache_kafka_names_its_log_and_keeps_no_claim_of_lost_history() -> None:
    line = lost_line("kafka", Exited(-9), Path("/var/tmp/kafka/server.log"))  # type: ignore[arg-type]
    assert line == ("Apache Kafka was killed by signal 9 (its log: /var/tmp/kafka/server.log): stopping "
                    "every service")
