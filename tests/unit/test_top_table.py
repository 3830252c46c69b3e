"""`periscope top`: the table as a pure function of the API's answers (golden text), and the CLI's bad input.

The command against a real API over HTTP is in tests/e2e/test_operator_views.py.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from periscope.cli.top_table import Snapshot, render_text, rows, sort_rows

A0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
A1 = "GPU-a1a1a1a1-0000-4000-8000-000000000000"
B0 = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
MIG = "MIG-cccccccc-0000-4000-8000-000000000000"


def gpu(uuid: str, node: str, index: int, util: float | None = None) -> dict[str, Any]:
    return {"gpu_uuid": uuid, "node": node, "index": index, "util_pct": util, "fb_used_mib": 100.0,
            "power_w": 60.0}


def pod(uid: str, ns: str, name: str, node: str, device: str, util: float | None, mem: float,
        power: float | None = 100.0, mig: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"pod_uid": uid, "namespace": ns, "pod": name, "container": "main", "node": node,
            "device_id": device, "gpu_uuid": A0 if mig else device.split("::")[0], "mig": mig,
            "util_pct": util, "fb_used_mib": mem, "power_w": power}


SNAP = Snapshot(
    gpus=[gpu(A0, "gpu-a", 0), gpu(A1, "gpu-a", 1, 3.0), gpu(B0, "gpu-b", 0, 55.0)],
    pods=[
        pod("11111111-aaaa", "ml", "train-0", "gpu-a", MIG, None, 9000.0, None,
            {"uuid": MIG, "profile": "3g.40gb", "gi": 1, "ci": 0}),
        pod("22222222-bbbb", "web", "infer-a", "gpu-b", B0 + "::0", 35.0, 2000.0),
        pod("33333333-cccc", "web", "infer-b", "gpu-b", B0 + "::1", 20.0, 3000.0),
        pod("44444444-dddd", "notebooks", "jupyter", "gpu-b", B0 + "::2", 0.0, 500.0, 5.0),
    ],
    idle=[{"pod_uid": "44444444-dddd", "device_id": B0 + "::2", "wasted_gpu_hours": 1.25}],
    as_of="2026-11-22T04:05:06.789Z",
)

GOLDEN = """\
as of 2026-11-22T04:05:06.789Z   GPUs 3   pods holding GPUs 4   idle 1 (1.25 GPU-h wasted)
NODE   GPU         DEVICE       NAMESPACE  POD      UID       CONTAINER  UTIL%  MEM MiB  POWER W  IDLE GPU-h
gpu-a  0 aaaaaaaa  3g.40gb 1/0  ml         train-0  11111111  main           -     9000        -           -
gpu-a  1 a1a1a1a1  free         -          -        -         -              3      100       60           -
gpu-b  0 bbbbbbbb  replica 0    web        infer-a  22222222  main          35     2000      100           -
gpu-b  0 bbbbbbbb  replica 1    web        infer-b  33333333  main          20     3000      100           -
gpu-b  0 bbbbbbbb  replica 2    notebooks  jupyter  44444444  main           0      500        5        1.25
"""


def test_the_table_lists_every_held_device_and_every_free_gpu() -> None:
    assert render_text(SNAP) == GOLDEN


def test_minutes_of_waste_do_not_read_as_none() -> None:
    # An idle window of a few seconds wastes thousandths of a GPU-hour: "0.00" would read as nothing.
    snap = Snapshot(gpus=SNAP.gpus, pods=SNAP.pods, as_of=SNAP.as_of,
                    idle=[{"pod_uid": "44444444-dddd", "device_id": B0 + "::2", "wasted_gpu_hours": 0.0028}])
    text = render_text(snap)
    assert text.splitlines()[0].endswith("idle 1 (0.0028 GPU-h wasted)")
    assert text.splitlines()[-1].endswith(" 0.0028")


@pytest.mark.parametrize(
    ("sort", "order"),
    [
        ("util", ["infer-a", "infer-b", "-", "jupyter", "train-0"]),  # unknown utilization last
        ("memory", ["train-0", "infer-b", "infer-a", "jupyter", "-"]),
        ("idle", ["jupyter", "train-0", "-", "infer-a", "infer-b"]),
    ],
)
def test_sorting(sort: str, order: list[str]) -> None:
    assert [r.pod for r in sort_rows(rows(SNAP), sort)] == order
    lines = render_text(SNAP, sort).splitlines()[2:]  # the printed table follows the same order
    named = [p for p in order if p != "-"]
    assert [next((p for p in named if f" {p} " in line), "-") for line in lines] == order


def test_a_namespace_filter_leaves_free_gpus_out() -> None:
    snap = Snapshot(SNAP.gpus, [p for p in SNAP.pods if p["namespace"] == "web"], [], SNAP.as_of, "web")
    assert [r.pod for r in sort_rows(rows(snap), None)] == ["infer-a", "infer-b"]
    assert "free" not in render_text(snap)


def periscope_top(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "periscope.cli.main", "top", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--api", "localhost:8080", "--once"], "not an http(s) URL"),
        (["--sort", "cost", "--once"], "--sort"),
        (["--interval", "0", "--once"], "--interval"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], needle: str) -> None:
    out = periscope_top(*args)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 1 and needle in out.stderr, out.stderr


def test_an_unreachable_api_is_one_line_and_exit_1() -> None:
    out = periscope_top("--api", "http://127.0.0.1:9", "--once")
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1
    assert "cannot reach the API at http://127.0.0.1:9" in out.stderr


def test_the_table_reads_the_apis_contract_nulls_included() -> None:
    """Fed the golden API answers (tests/unit/data/golden): a holder the apiserver never named shows `-`
    for its namespace and pod, a device ID that names no GPU shows no GPU, and nothing reads `None`."""
    import json
    from pathlib import Path

    golden = Path(__file__).parent / "data" / "golden"

    def items(name: str) -> list[dict[str, Any]]:
        return list(json.loads((golden / f"api-{name}.json").read_text())["items"])

    pods = [p for p in items("pods") if p["active"]]
    text = render_text(Snapshot(gpus=items("gpus"), pods=pods, idle=items("idle"), as_of=None))
    assert "None" not in text
    checkpoint_only = next(r for r in rows(Snapshot(gpus=items("gpus"), pods=pods, idle=[], as_of=None))
                           if r.node == "gpu-b" and r.device == "whole")
    assert (checkpoint_only.namespace, checkpoint_only.pod) == ("-", "-")
    unresolved = next(r for r in rows(Snapshot(gpus=items("gpus"), pods=pods, idle=[], as_of=None))
                      if r.container == "cuda" and r.gpu == "")
    assert unresolved.pod == "gke-7"


def test_mig_util_and_dcgm_columns_when_the_exporter_is_scraped() -> None:
    train = pod("11111111-aaaa", "ml", "train-0", "gpu-a", MIG, 92.0, 9000.0, None,
                {"uuid": MIG, "profile": "3g.40gb", "gi": 1, "ci": 0})
    train |= {"sm_active_pct": 87.4, "tensor_active_pct": 55.2, "dram_active_pct": 36.8, "sources": ["dcgm"]}
    snap = Snapshot(gpus=[gpu(A0, "gpu-a", 0)], pods=[train], idle=[], as_of="2026-11-22T04:05:06.789Z")
    assert render_text(snap) == """\
as of 2026-11-22T04:05:06.789Z   GPUs 1   pods holding GPUs 1   idle 0 (0.00 GPU-h wasted)
NODE   GPU         DEVICE       NAMESPACE  POD      UID       CONTAINER  UTIL%  SM%  TENSOR%  DRAM%  MEM MiB  POWER W  IDLE GPU-h
gpu-a  0 aaaaaaaa  3g.40gb 1/0  ml         train-0  11111111  main          92   87       55     37     9000        -           -
"""  # noqa: E501 - the table is wider than a source line
