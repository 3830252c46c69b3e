"""End-to-end fixtures (helpers live in tests.e2e.support)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Path]:
    yield tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
