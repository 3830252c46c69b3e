"""Shared test configuration."""

from __future__ import annotations

import shutil

import pytest


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.kafka_tier import on_kafka

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
