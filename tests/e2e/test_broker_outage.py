"""`periscope up` through broker outages, as a user would cause them: the embedded broker paused
(SIGSTOP/SIGCONT: memory kept) while an XID happens, the broker killed, and Ctrl-C while it is paused."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.e2e.support import marked_pids
from tests.e2e.test_up_lifecycle import Up, wait_gone

pytestmark = pytest.mark.slow


def _broker_pid(token: str) -> int:
    for pid in marked_pids(token):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"--listener-url" in f.read():
                return pid
    raise AssertionError("no embedded broker among the processes of this run")


def _worker0(c: httpx.Client) -> set[str]:
    """UIDs of the worker-0 pods with an active row now."""
    items = c.get("/v1/pods", params={"namespace": "batch"}).json()["items"]
    return {r["pod_uid"] for r in items if r["pod"] == "worker-0" and r["active"]}


def _lines_after(up: Up, count_from: int) -> list[str]:
    while not up.lines.empty():
        up.seen.append(up.lines.get_nowait())
    return up.seen[count_from:]


def test_killed_broker_stops_everything_within_30s_with_one_line_and_bounded_logs() -> None:
    up = Up("--speed", "2")
    try:
        up.wait_for(r"^\[up\] ready in", 60)
        before = len(up.seen)
        killed = time.monotonic()
        os.kill(_broker_pid(up.token), signal.SIGKILL)
        up.wait_for(r"^\[up\] the embedded broker was killed by signal 9; every topic and its history were "
                    r"lost with it: stopping every service", 30)
        rc = up.proc.wait(max(1.0, 30 - (time.monotonic() - killed)))
        assert rc != 0
        assert time.monotonic() - killed < 30
        assert wait_gone(up.token, 5) == []
        time.sleep(0.5)  # the pump thread drains what was written before the exit
        after = _lines_after(up, before)
        # Before: one line per connection attempt from every service (2,336 lines in 10 s).
        assert len(after) < 80, "\n".join(after)
    finally:
        up.cleanup()


def test_ctrl_c_ends_within_10s_while_the_broker_is_paused() -> None:
    up = Up("--speed", "2")
    try:
        up.wait_for(r"^\[up\] ready in", 60)
        broker = _broker_pid(up.token)
        os.kill(broker, signal.SIGSTOP)
        time.sleep(8)  # long enough for every service to be waiting on the broker
        pressed = time.monotonic()
        os.killpg(up.proc.pid, signal.SIGINT)
        up.proc.wait(15)
        assert time.monotonic() - pressed < 10
        assert wait_gone(up.token, 5) == []
    finally:
        with_pid = [p for p in marked_pids(up.token)]
        for pid in with_pid:  # a stopped process ignores SIGKILL only until it is continued
            os.kill(pid, signal.SIGCONT)
        up.cleanup()


def test_xid_during_a_paused_broker_reaches_the_api_with_the_owner_at_its_time() -> None:
    """churn: an XID at 35 s on churn-a GPU 0, owned then by the second worker-0 (20 s - 45 s); the
    broker is paused from about 25 s for 45 s, longer than every client's request timeout."""
    up = Up("--scenario", "churn", "--speed", "1")
    try:
        api = up.wait_for(r"^api: (http://127\.0\.0\.1:\d+)$", 90).group(1)
        up.wait_for(r"^\[up\] ready in", 30)
        started = time.monotonic()
        with httpx.Client(base_url=api, timeout=10) as c:
            assert c.get("/readyz").status_code == 200
            first = _worker0(c)  # the scenario clock has just started: the first worker-0 (0 s - 20 s)
            time.sleep(20)
            broker = _broker_pid(up.token)
            os.kill(broker, signal.SIGSTOP)
            try:
                stale_by = time.monotonic() + 30
                while c.get("/readyz").status_code == 200:  # a view that no longer moves is not ready
                    assert time.monotonic() < stale_by, "/readyz stayed 200 with the broker paused"
                    time.sleep(0.5)
                metrics = c.get("/metrics").text
                age = next(float(line.split()[1]) for line in metrics.splitlines()
                           if line.startswith("periscope_api_data_age_seconds "))
                assert age > 5
                time.sleep(max(0.0, started + 65 - time.monotonic()))
            finally:
                os.kill(broker, signal.SIGCONT)
            deadline = time.monotonic() + 90
            item = None
            while time.monotonic() < deadline:
                items = [x for x in c.get("/v1/xid").json()["items"] if x.get("code") == 13]
                if items and c.get("/readyz").status_code == 200:
                    item = items[0]
                    break
                time.sleep(1)
            assert item is not None, "the XID from the outage never reached /v1/xid (or /readyz stayed 503)"
            owners = item["owners"]
            assert [(o["namespace"], o["pod"]) for o in owners] == [("batch", "worker-0")], item
            # The worker-0 of the XID's time: neither the first one (stopped at 20 s) nor the one running
            # now (started at 45 s or 70 s), which is who an owner looked up at query time would name.
            # Ready comes back with the first new record, before the backlog is worked off: wait for the
            # view to show the worker-0 that runs now before comparing.
            owner = owners[0]["pod_uid"]
            caught_up = time.monotonic() + 60
            while owner in (now := _worker0(c)) and time.monotonic() < caught_up:
                time.sleep(1)
            assert first and now and owner not in first | now, (item, first, now)
            # ...and the owner named is the one that ran at the XID's time, not a later instance.
            rows = c.get(f"/v1/pods/{owner}").json()["rows"]
            assert rows and min(r["first_seen"] for r in rows) <= item["at"], (item, rows)
        os.killpg(up.proc.pid, signal.SIGINT)
        assert up.proc.wait(15) == 0
    finally:
        up.cleanup()
