"""Bounded logs: a failure that repeats is logged when it starts, then at most once per window with a
count, and once when it clears.

Two parts. `RepeatFilter` sits on the process's log handlers, so it also bounds what aiokafka, Faust
and mode log on their own (a dead broker makes them log one line per connection attempt): a warning
or error whose logger, level and message template were already let through less than `window_s` ago
is counted instead of written; the next one after the window is written with the count of those held
back, and a sweep writes one closing line for a failure that held some back and then stopped
repeating for a whole window. `Trouble` is for a service's own view of a failure it can tell is over
(the broker reachable again): `failed()` on every failed attempt, `cleared()` on the first success.
`install()` is called once by every service after its logging is configured.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 30.0
_PASS = "_periscope_repeat_pass"  # set on a record already judged (a record may meet several handlers)


@dataclass(slots=True)
class _Seen:
    logger: str
    level: int
    text: str  # the first message of the run, formatted, for the closing line
    written_at: float
    last_at: float
    held: int = 0


class RepeatFilter(logging.Filter):
    """Holds back warnings and errors that repeat within `window_s` and counts them (thread-safe)."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[tuple[str, int, str], _Seen] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        judged = getattr(record, _PASS, None)
        if judged is not None:
            return bool(judged)
        keep = self._judge(record)
        setattr(record, _PASS, keep)
        return keep

    def _judge(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                self._seen[key] = _Seen(record.name, record.levelno, _text(record), now, now)
                return True
            seen.last_at = now
            if now - seen.written_at < self.window_s:
                seen.held += 1
                return False
            if seen.held:
                record.msg = (f"{_text(record)} [{seen.held} more like this in the last "
                              f"{now - seen.written_at:.0f}s]")
                record.args = ()  # a tuple: some formatters (mode's) rewrite the arguments
            seen.written_at, seen.held = now, 0
            return True

    def sweep(self) -> list[tuple[str, int, str]]:
        """Forget failures quiet for a whole window; (logger, level, closing line) for those that had
        repeats held back since they were last written."""
        now = self.clock()
        closing = []
        with self._lock:
            for key, seen in list(self._seen.items()):
                if now - seen.last_at < self.window_s:
                    continue
                del self._seen[key]
                if seen.held:
                    closing.append((seen.logger, seen.level,
                                    f"stopped repeating ({seen.held} more since last written, none for "
                                    f"{now - seen.last_at:.0f}s): {seen.text}"))
        return closing


def _text(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a bad format string in a library: keep the template
        return str(record.msg)


class Trouble:
    """One repeated failure of this service (say, the broker unreachable), with its own bounded lines."""

    def __init__(self, log: logging.Logger, what: str, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.what, self.window_s, self.clock = log, what, window_s, clock
        self.since: float | None = None
        self.failures = 0
        self._written_at = 0.0
        self._held = 0

    @property
    def active(self) -> bool:
        return self.since is not None

    def failed(self, detail: str) -> None:
        now = self.clock()
        self.failures += 1
        if self.since is None:
            self.since, self._written_at, self._held = now, now, 0
            self.log.warning("%s: %s", self.what, detail, extra={_PASS: True})
        elif now - self._written_at >= self.window_s:
            self.log.warning("%s for %.0fs (%d failed attempts since the last line): %s", self.what,
                             now - self.since, self._held + 1, detail, extra={_PASS: True})
            self._written_at, self._held = now, 0
        else:
            self._held += 1

    def cleared(self) -> None:
        if self.since is None:
            return
        self.log.warning("%s: cleared after %.0fs and %d failed attempts", self.what,
                         self.clock() - self.since, self.failures, extra={_PASS: True})
        self.since, self.failures = None, 0


_installed: RepeatFilter | None = None
_sweeping: threading.Event | None = None  # set to stop the installed filter's sweeper
_install_lock = threading.Lock()


def install(window_s: float = WINDOW_S) -> RepeatFilter:
    """Put one RepeatFilter on every handler of the root logger and start its sweeper (idempotent:
    a second call covers handlers added since, such as Faust's, with the same filter)."""
    global _installed, _sweeping
    with _install_lock:
        if _installed is None:
            _installed, _sweeping = RepeatFilter(window_s), threading.Event()
            threading.Thread(target=_sweeper, args=(_installed, _sweeping), name="log-sweeper",
                             daemon=True).start()
        for handler in logging.getLogger().handlers:
            if _installed not in handler.filters:
                handler.addFilter(_installed)
        return _installed


def uninstall() -> None:
    """Take the filter off the root logger's handlers and stop its sweeper, dropping what it held back:
    for a process that ran a service's main in-process (the tests), so that no closing line of that
    service turns up later in someone else's output."""
    global _installed, _sweeping
    with _install_lock:
        if _installed is None:
            return
        for handler in logging.getLogger().handlers:
            handler.removeFilter(_installed)
        if _sweeping is not None:
            _sweeping.set()
        _installed = _sweeping = None


def _sweeper(repeat: RepeatFilter, stop: threading.Event) -> None:
    while True:
        time.sleep(max(1.0, repeat.window_s / 3))  # py-spy may count it as running (bench/hotspots.py)
        if stop.is_set():
            return
        for logger, level, line in repeat.sweep():
            logging.getLogger(logger).log(level, "%s", line, extra={_PASS: True})
