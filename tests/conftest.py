"""Shared test configuration."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from periscope.core import frozen

HERE = Path(__file__).parent

# The core's frozen classes refuse assignment at run time under test, as they did before they skipped
# that guard for speed (periscope/core/frozen.py): set before any test module builds them.
frozen.GUARDED = True


def _has_nvidia_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        import pynvml

        pynvml.nvmlInit()
        n = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
        return n > 0
    except Exception:
        return False


# Run order, whole files at a time: the tiers that play scenarios in real time first, the unit tests last.
# `make test` hands files to pytest-xdist workers in collection order (--dist loadfile
# --no-loadscope-reorder), so a long end-to-end file started last would be the run's tail.
TIER_ORDER = ("e2e", "controlplane", "integration", "unit")
# An end-to-end file runs a whole `periscope up` stack, about 0.7 of a core: three at once on 2 cores
# starved each other past their time limits. Under xdist they go in this many lanes (a lane's files run
# one after another on one worker) while the other workers take the rest of the suite.
E2E_LANES = 2


def _tier_rank(item: pytest.Item) -> int:
    tier = item.path.parent.name if item.path.parent.parent == HERE else ""
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With --dist loadfile: files in collection order (never by size), the e2e files in E2E_LANES lanes."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Lanes(LoadFileScheduling):  # type: ignore[misc]
        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            self.lanes: dict[str, str] = {}

        def _split_scope(self, nodeid: str) -> str:
            scope: str = super()._split_scope(nodeid)
            if not scope.startswith("tests/e2e/"):
                return scope
            if scope not in self.lanes:  # alternate, in collection order: the lanes come out even enough
                self.lanes[scope] = f"e2e lane {len(self.lanes) % E2E_LANES}"
            return self.lanes[scope]

    config.option.loadscopereorder = False  # the order is ours (above), not the count of tests per file
    return Lanes(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.kafka_tier import on_kafka

    items.sort(key=_tier_rank)  # stable: files and tests keep their order within a tier
    # pytest-xdist workers each collect and must agree on every id: an object's address in a
    # parametrized id (a default repr) differs between processes and stops the whole run.
    addressed = [item.nodeid for item in items if re.search(r" at 0x[0-9a-f]+>", item.nodeid)]
    if addressed:
        raise pytest.UsageError(f"test ids with a memory address (differ per process): {addressed[:3]}")

    for item in items:  # the variants that run on Apache Kafka are counted in the summary
        if on_kafka(item):
            item.add_marker(pytest.mark.kafka)
    if any("gpu" in item.keywords for item in items) and not _has_nvidia_gpu():
        skip = pytest.mark.skip(reason="no NVIDIA GPU with a driver on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line: how many tests ran on Apache Kafka (the real-Kafka tier) and how they ended."""
    counts: dict[str, int] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            if "kafka" not in getattr(report, "keywords", {}):
                continue
            if outcome == "passed" and report.when != "call":
                continue
            counts[outcome] = counts.get(outcome, 0) + 1
    if counts:
        terminalreporter.write_line("Apache Kafka tier: " + ", ".join(f"{n} {o}" for o, n in counts.items()))


@pytest.fixture(autouse=True)
def _service_logging_left_behind() -> Any:
    """A test that runs a service's main in-process installs its repeat filter on this process's
    logging; taken off after the test, its sweeper does not write the test's held-back failures into
    a later test's output (a unit test's deliberate stall read like a real one in CI logs)."""
    yield
    from periscope import logs

    logs.uninstall()
