"""A resource the cluster does not serve (an optional CRD) is said once in the log, not at every retry,
while every retry still notifies Unavailable; other refusals stay warnings."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from periscope.bus.retry import Backoff
from services.kube_watcher.watch import Notification, ResourceWatch, Unavailable


def _refusing(status: int, reason: str) -> Any:
    def list_fn(**_: Any) -> Any:
        raise ApiException(status=status, reason=reason)  # what the client raises for the answer

    return list_fn


class _Records(logging.Handler):
    """Our own handler on the watch's logger: what the watch logs, before any process-wide filter on
    the root's handlers (a service's `logs.install()`, run by an earlier test, collapses repeats there)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _run(status: int, reason: str, retries: int) -> tuple[list[Notification], list[logging.LogRecord]]:
    logger = logging.getLogger("services.kube_watcher.watch")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        return _watch(status, reason, retries), handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _watch(status: int, reason: str, retries: int) -> list[Notification]:
    seen: list[Notification] = []
    w = ResourceWatch("gpuclusters", _refusing(status, reason), seen.append, unavailable_retry_s=0.01,
                      backoff=Backoff(initial_s=0.01, max_s=0.01))
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while len(seen) < retries and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    t.join(5)
    return seen


def test_not_served_is_logged_once_across_retries() -> None:
    seen, records = _run(404, "Not Found", retries=4)
    assert len(seen) >= 4 and all(isinstance(n, Unavailable) and n.status == 404 for n in seen)
    said = [r for r in records if "gpuclusters" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO and "not served" in said[0].getMessage()


def test_other_refusals_stay_warnings() -> None:
    seen, records = _run(403, "Forbidden", retries=2)
    assert len(seen) >= 2
    warned = [r for r in records if r.levelno == logging.WARNING and "403 Forbidden" in r.getMessage()]
    assert len(warned) >= 2
