"""Apache Kafka with its own security: TLS + SASL/SCRAM-SHA-512 on the client listener, one principal per
service, the standard authorizer with periscope.bus.acls' grants. Nobody but the joiner can write the
output topics, so a probe (or anyone holding its credentials) cannot forge what the API serves."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from periscope.bus import topics as t
from periscope.bus.admin import ensure_topics
from periscope.bus.producer import Publisher
from periscope.devkit.secure_kafka import SecureKafka
from tests.kafka_tier import kafka_missing
from tests.unit.test_api_samples import gpu, pod

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    if kafka_missing():
        pytest.skip(kafka_missing())
    broker = SecureKafka(tmp_path_factory.mktemp("secure-kafka"))
    broker.start()
    try:
        asyncio.run(ensure_topics(broker.client("admin")))
        yield broker
    finally:
        broker.stop()


async def _write(broker: SecureKafka, service: str, topic: t.Topic, value: object) -> None:
    async with Publisher(broker.client(service), f"acl-test-{service}", request_timeout_ms=10_000) as pub:
        await asyncio.wait_for(pub.send(topic, "forged-key", value), 30)


def test_the_probe_principal_cannot_forge_outputs(secure: SecureKafka) -> None:
    forged = gpu("GPU-phantom")
    for topic, value in ((t.ATTRIBUTION, pod("uid-forged", "ml")), (t.GPUS, forged)):
        with pytest.raises(TopicAuthorizationFailedError):
            asyncio.run(_write(secure, "probe", topic, value))


@pytest.mark.parametrize(("service", "topic", "allowed"), [
    ("joiner", t.GPUS, True),  # the one writer of the outputs
    ("watcher", t.GPUS, False),
    ("api", t.ATTRIBUTION, False),  # the API only reads
    ("watcher", t.TELEMETRY, False),  # node topics are the probes'
    ("probe", t.PODS, False),  # cluster topics are the watcher's
])
def test_each_principal_writes_only_its_own_topics(secure: SecureKafka, service: str, topic: t.Topic,
                                                    allowed: bool) -> None:
    value = gpu("GPU-acl") if topic.role == "output" else pod("uid-acl", "ml")
    if topic is t.TELEMETRY or topic is t.PODS:
        from tests.integration.test_bus import samples

        value = samples("node-acl")["NodeTelemetry" if topic is t.TELEMETRY else "PodEvent"]
    if allowed:
        asyncio.run(_write(secure, service, topic, value))
    else:
        with pytest.raises(TopicAuthorizationFailedError):
            asyncio.run(_write(secure, service, topic, value))


def test_the_credentials_directory_has_one_env_file_per_principal(secure: SecureKafka, tmp_path: Path
                                                                  ) -> None:
    directory = secure.credentials(tmp_path / "creds")
    assert sorted(p.name for p in directory.iterdir()) == [
        "admin.env", "api.env", "ca.crt", "joiner.env", "probe.env", "watcher.env"]
    probe = dict(line.split("=", 1) for line in (directory / "probe.env").read_text().splitlines())
    assert probe["PERISCOPE_KAFKA_SASL_USERNAME"] == "periscope-probe"
    assert probe["PERISCOPE_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert probe["PERISCOPE_KAFKA_SSL_CAFILE"] == str(directory / "ca.crt")
    assert oct((directory / "probe.env").stat().st_mode & 0o777) == "0o600"
    # The admin principal's settings, read by the topics job exactly as a deployment would.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERISCOPE_")}
    env.update(line.split("=", 1) for line in (directory / "admin.env").read_text().splitlines())
    done = subprocess.run([sys.executable, "-m", "periscope.bus.admin"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert probe["PERISCOPE_KAFKA_SASL_PASSWORD"] not in done.stdout + done.stderr


def test_a_wrong_password_is_one_line_without_it(secure: SecureKafka, tmp_path: Path) -> None:
    settings = secure.settings("api") | {"kafka_sasl_password": "not-the-password"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERISCOPE_")}
    env.update({f"PERISCOPE_{k.upper()}": v for k, v in settings.items()})
    done = subprocess.run([sys.executable, "-m", "periscope.bus.admin"], env=env, capture_output=True,
                          text=True, timeout=60)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "SASL SCRAM-SHA-512 authentication of user periscope-api failed" in lines[0]
    assert "not-the-password" not in done.stderr + done.stdout

