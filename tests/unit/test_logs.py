"""Bounded logs: a repeated failure is written when it starts, then at most once per window with a count,
and once when it clears; third-party loggers (aiokafka) are bounded by the same filter."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from periscope.logs import RepeatFilter, Trouble


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        assert isinstance(record.args, tuple | dict)  # Faust's formatter maps over them
        self.lines.append(f"{record.name} {record.levelname} {record.getMessage()}")


@pytest.fixture
def setup() -> Iterator[tuple[Clock, RepeatFilter, Lines]]:
    clock = Clock()
    repeat = RepeatFilter(30.0, clock)
    handler = Lines()
    handler.addFilter(repeat)
    for name in ("aiokafka", "periscope.test"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    yield clock, repeat, handler
    for name in ("aiokafka", "periscope.test"):
        logger = logging.getLogger(name)
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


Setup = tuple[Clock, RepeatFilter, Lines]


def test_a_library_failure_logged_once_per_window_with_a_count(setup: Setup) -> None:
    clock, repeat, out = setup
    log = logging.getLogger("aiokafka")
    for i in range(1000):  # one connection attempt every 10 ms for 10 s
        log.error("Unable connect to node with id %s: %s", 1, f"attempt {i}")
        clock.t += 0.01
    assert out.lines == ["aiokafka ERROR Unable connect to node with id 1: attempt 0"]
    clock.t += 21  # 31 s after the first line
    log.error("Unable connect to node with id %s: %s", 1, "again")
    assert len(out.lines) == 2
    assert out.lines[1].startswith("aiokafka ERROR Unable connect to node with id 1: again [999 more like")
    # Then it stops: one closing line once it was quiet for a window, and nothing more after.
    assert repeat.sweep() == []
    log.error("Unable connect to node with id %s: %s", 1, "last")  # held back
    clock.t += 31
    closing = repeat.sweep()
    assert len(closing) == 1 and closing[0][0] == "aiokafka" and "stopped repeating (1 more" in closing[0][2]
    assert repeat.sweep() == []


def test_different_messages_and_info_are_not_held_back(setup: Setup) -> None:
    _, _, out = setup
    log = logging.getLogger("periscope.test")
    log.warning("a %s", 1)
    log.warning("b %s", 1)
    log.info("progress %s", 1)
    log.info("progress %s", 2)
    assert len(out.lines) == 4


def test_a_record_met_by_two_handlers_is_judged_once(setup: Setup) -> None:
    _, repeat, out = setup
    second = Lines()
    second.addFilter(repeat)
    log = logging.getLogger("periscope.test")
    log.addHandler(second)
    try:
        log.warning("broker down")
        assert out.lines == second.lines == ["periscope.test WARNING broker down"]
    finally:
        log.removeHandler(second)


def test_trouble_starts_repeats_with_a_count_and_clears(setup: Setup) -> None:
    clock, _, out = setup
    trouble = Trouble(logging.getLogger("periscope.test"), "broker unreachable", 30.0, clock)
    trouble.cleared()  # nothing to clear
    for _ in range(100):
        trouble.failed("connect: timed out")
        clock.t += 0.5
    # 50 s of failures: the first line, then one 30 s later with the count of attempts it stands for.
    assert len(out.lines) == 2
    assert out.lines[0] == "periscope.test WARNING broker unreachable: connect: timed out"
    assert "for 30s (60 failed attempts since the last line)" in out.lines[1]
    trouble.cleared()
    trouble.cleared()
    assert len(out.lines) == 3
    assert out.lines[2] == ("periscope.test WARNING broker unreachable: cleared after 50s and 100 failed "
                            "attempts")
    trouble.failed("again")
    assert out.lines[3] == "periscope.test WARNING broker unreachable: again"


def test_uninstall_takes_the_filter_off_and_stops_its_sweeper() -> None:
    import threading

    from periscope import logs

    root, handler = logging.getLogger(), Lines()
    root.addHandler(handler)
    try:
        installed = logs.install(window_s=3.0)
        assert installed in handler.filters
        sweepers = [t for t in threading.enumerate() if t.name == "log-sweeper" and t.is_alive()]
        logs.uninstall()
        assert installed not in handler.filters
        for t in sweepers:
            t.join(5)
            assert not t.is_alive()
        assert logs.install(window_s=3.0) is not installed  # a later install starts afresh
        logs.uninstall()
        logs.uninstall()  # once more: nothing installed, nothing to do
    finally:
        root.removeHandler(handler)
