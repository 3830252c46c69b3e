"""Integration fixtures: one broker of each kind for the whole test run, every registry topic created.

`broker` is the embedded broker (starts in ~0.1 s; quick tests that need no Apache Kafka behaviour);
`any_broker` runs a test once on each: the embedded broker and Apache Kafka (KRaft, from the project's
cached distribution, ~10 s to start once per session). Without java (or, before the first run, mvn)
the Apache Kafka variants skip with one reason. Each fixture yields the `Kafka` connection clients
are built from; topic state is shared, so tests use unique names and keys.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from periscope.bus.admin import ensure_topics
from periscope.bus.clients import Kafka
from periscope.devkit.brokers import KINDS, LocalBroker
from tests.kafka_tier import kafka_missing


def _start(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    broker = LocalBroker(kind, tmp_path_factory.mktemp(f"{kind}-broker"))  # type: ignore[arg-type]
    broker.start()
    try:
        asyncio.run(ensure_topics(broker.client()))
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def embedded_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    yield from _start("embedded", tmp_path_factory)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    missing = kafka_missing()
    if missing:
        pytest.skip(missing)
    yield from _start("kafka", tmp_path_factory)


@pytest.fixture(scope="session")
def broker(embedded_broker: LocalBroker) -> Kafka:
    """The embedded broker's connection."""
    return embedded_broker.client()


@pytest.fixture(params=KINDS)
def broker_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def local_broker(broker_kind: str, request: pytest.FixtureRequest) -> LocalBroker:
    """The session's broker of the kind this test variant runs on."""
    found: LocalBroker = request.getfixturevalue(f"{broker_kind}_broker")
    return found


@pytest.fixture
def any_broker(local_broker: LocalBroker) -> Kafka:
    """Each broker's connection in turn: the test runs on both."""
    return local_broker.client()


@pytest.fixture
def unique() -> str:
    """A short unique string for group ids, keys and topic names of one test."""
    return uuid.uuid4().hex[:10]
