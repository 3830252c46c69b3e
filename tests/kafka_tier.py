"""The Apache Kafka tier: whether it can run here, and the count of its tests in pytest's summary."""

from __future__ import annotations

import functools

import pytest

from periscope.bus.clients import Kafka
from periscope.bus.profile import EMBEDDED
from periscope.devkit.apache_kafka import KafkaUnavailable, distribution


@functools.cache
def kafka_missing() -> str:
    """Why Apache Kafka cannot run here (one line), or "" when it can (its jars are resolved now)."""
    try:
        distribution()
    except KafkaUnavailable as e:
        return f"Apache Kafka tier skipped: {e}"
    return ""


def on_kafka(item: pytest.Item) -> bool:
    """A test variant that runs on Apache Kafka (parametrized broker `kafka`, or marked `kafka`)."""
    callspec = getattr(item, "callspec", None)
    kind = callspec.params.get("broker_kind") if callspec is not None else None
    return kind == "kafka" or item.get_closest_marker("kafka") is not None


def settings_of(kafka: Kafka) -> dict[str, str]:
    """A service's settings (keyword arguments of its settings class) for reaching `kafka`."""
    out = {"kafka_bootstrap": kafka.bootstrap, "kafka_profile": kafka.profile.name,
           "kafka_security_protocol": kafka.security.protocol}
    return out


def embedded(bootstrap: str) -> Kafka:
    """The connection to an embedded broker the test started itself."""
    return Kafka(bootstrap, profile=EMBEDDED)

