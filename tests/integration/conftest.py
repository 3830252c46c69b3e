"""Integration fixtures: one embedded broker for the whole test run (it starts in ~0.1 s, but topic
state is shared), with every registry topic created."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from periscope.bus.admin import ensure_topics
from periscope.bus.broker import EmbeddedBroker


@pytest.fixture(scope="session")
def broker() -> Iterator[str]:
    """Bootstrap "127.0.0.1:PORT" of an embedded broker on a free port with all topics created."""
    with EmbeddedBroker() as b:
        asyncio.run(ensure_topics(b.bootstrap))
        yield b.bootstrap


@pytest.fixture
def unique() -> str:
    """A short unique string for group ids, keys and topic names of one test."""
    return uuid.uuid4().hex[:10]
