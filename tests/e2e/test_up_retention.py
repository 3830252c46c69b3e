"""`periscope up` bounds the embedded broker's memory: once per `--retention` it is replaced by a fresh,
empty one at the same address, the services restart, and the pipeline shows every GPU again."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from periscope.devkit.embedded import metadata_ready
from tests.e2e.test_broker_outage import _broker_pid
from tests.e2e.test_up_lifecycle import Up, wait_gone

pytestmark = pytest.mark.slow


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_the_embedded_broker_is_renewed_once_per_retention_period() -> None:
    up = Up("--speed", "2", "--retention", "1m")
    try:
        api = up.wait_for(r"^api: (http://127\.0\.0\.1:\d+)$", 60).group(1)
        broker = up.wait_for(r"^broker: (127\.0\.0\.1:\d+)$", 5).group(1)
        first = _broker_pid(up.token)
        up.wait_for(r"^\[up\] embedded broker: replacing it after 1m \(--retention\)", 120)
        grown = _rss_mib(first)  # the services stop first: the old broker is still there
        up.wait_for(r"^\[up\] embedded broker replaced; the pipeline is ready again after [\d.]+s$", 90)
        second = _broker_pid(up.token)
        assert second != first
        r = httpx.get(f"{api}/v1/gpus", timeout=10)
        assert r.status_code == 200 and len(r.json()["items"]) == 5  # the whole pipeline, again
        assert _rss_mib(second) < grown, (grown, _rss_mib(second))
        assert not [line for line in up.seen if "exited with status" in line]  # no crash counted
        host, port = broker.split(":")
        assert metadata_ready(host, int(port))  # at the address users were given
        os.killpg(up.proc.pid, signal.SIGINT)
        assert up.proc.wait(45) == 0
        assert wait_gone(up.token, 5) == []
    finally:
        up.cleanup()
