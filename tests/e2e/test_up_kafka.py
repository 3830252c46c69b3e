"""`periscope up --broker kafka`: the whole stack on Apache Kafka scores as it does on the embedded
broker (the churn scenario: name reuse, restarts, MPS, XIDs), and with `--secure` every service
connects over TLS + SASL/SCRAM as a principal of its own, with ACLs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.support import Run, assert_scored, run_scenario
from tests.kafka_tier import kafka_missing

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


@pytest.fixture(scope="module")
def churn(module_tmp: Path) -> Run:
    if kafka_missing():
        pytest.skip(kafka_missing())
    return run_scenario(module_tmp / "churn", "churn", 4, "--idle-window", "20s", "--broker", "kafka",
                        timeout_s=180)


@pytest.fixture(scope="module")
def secure(module_tmp: Path) -> Run:
    if kafka_missing():
        pytest.skip(kafka_missing())
    return run_scenario(module_tmp / "secure", "demo", 4, "--idle-window", "20s", "--broker", "kafka",
                        "--secure", "--log-level", "debug", timeout_s=180)


def test_churn_on_apache_kafka_scores_as_on_the_embedded_broker(churn: Run) -> None:
    assert re.search(r"^broker: 127\.0\.0\.1:\d+ \(Apache Kafka\)$", churn.output, re.M), churn.output[-2000:]
    assert_scored(churn)
    p = churn.report["periscope"]
    for score in ("owners", "shared_util", "exclusive_util", "reused_names", "xid_owners"):
        assert p[score]["share"] == 1.0, (score, p["examples"])
    assert p["idle"]["precision"] == 1.0 and p["idle"]["recall"] >= 0.8, p["idle"]


def test_secure_apache_kafka_has_a_principal_per_service_and_scores_right(secure: Run) -> None:
    assert re.search(r"^broker: 127\.0\.0\.1:\d+ \(Apache Kafka, TLS \+ SASL/SCRAM-SHA-512, a principal per "
                     r"service with ACLs\)$", secure.output, re.M), secure.output[-2000:]
    assert re.search(r"^kafka credentials: /\S+/kafka-credentials$", secure.output, re.M)
    assert_scored(secure)
    assert secure.report["periscope"]["owners"]["share"] == 1.0, secure.report["periscope"]["examples"]
    # Every service logged at DEBUG (aiokafka's requests included): no key material, no SASL bytes.
    assert "PRIVATE KEY" not in secure.output and "sasl_auth_bytes=b" not in secure.output
