"""`periscope up --api-auth --scenario tenants`: the whole stack with access control against the
simulated apiserver, read as alice (team-a, team-d) and ops (cluster-wide)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.e2e.support import periscope
from tests.e2e.test_up_lifecycle import Up

pytestmark = pytest.mark.slow

ALICE = {"Authorization": "Bearer alice-token"}
OPS = {"Authorization": "Bearer ops-token"}
MINE = {"team-a", "team-d"}


def _owners(gpu: dict[str, object]) -> list[dict[str, str]]:
    migs = gpu["mig_devices"]
    assert isinstance(migs, list) and isinstance(gpu["owners"], list)
    return [*gpu["owners"], *(o for m in migs for o in m["owners"])]


def test_each_user_reads_only_what_it_may() -> None:
    up = Up("--scenario", "tenants", "--api-auth", "--speed", "4")
    try:
        api = up.wait_for(r"^api: (http://127\.0\.0\.1:\d+)$", 90).group(1)
        up.wait_for(r"^\[up\] ready in", 90)
        with httpx.Client(base_url=api, timeout=10) as c:
            # Both XIDs (20 s and 40 s of scenario time) are in once ops sees two.
            deadline = time.monotonic() + 60
            while len(c.get("/v1/xid", headers=OPS).json()["items"]) < 2:
                assert time.monotonic() < deadline, "the XIDs never showed up"
                time.sleep(0.5)

            r = c.get("/v1/pods")
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
            assert c.get("/healthz").status_code == 200

            mine = c.get("/v1/pods", headers=ALICE).json()["items"]
            assert {p["namespace"] for p in mine} == MINE
            every = c.get("/v1/pods", headers=OPS).json()["items"]
            assert {p["namespace"] for p in every} == {"team-a", "team-b", "team-c", "team-d"}
            other = next(p["pod_uid"] for p in every if p["namespace"] not in MINE)
            assert c.get(f"/v1/pods/{other}", headers=ALICE).status_code == 404
            assert c.get(f"/v1/pods/{other}", headers=OPS).status_code == 200

            gpus = c.get("/v1/gpus", headers=ALICE).json()["items"]
            assert {o["namespace"] for g in gpus for o in _owners(g)} == MINE
            assert sum(g["hidden_owners"] for g in gpus) > 0
            xids = c.get("/v1/xid", headers=ALICE).json()["items"]
            assert len(xids) == 2 and all(o["namespace"] in MINE for x in xids for o in x["owners"])
            assert sum(x["hidden_owners"] for x in xids) == 2  # team-b shared both GPUs that failed

            assert c.get("/v1/policy", headers=ALICE).status_code == 403
            assert c.get("/v1/policy", headers=OPS).status_code == 200
        os.killpg(up.proc.pid, signal.SIGINT)
        assert up.proc.wait(45) == 0
    finally:
        up.cleanup()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--api-auth: scenario demo has no user with cluster: true"),
    ],
)
def test_api_auth_bad_combinations_exit_2_with_one_line(args: tuple[str, ...], message: str) -> None:
    proc = subprocess.run(
        periscope("up", "--api-port", "0", "--broker-port", "0", "--api-auth", *args),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stderr == f"periscope: {message}\n"
