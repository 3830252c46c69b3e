"""`periscope doctor` against a simulated node: the simulator's PodResources server on a real unix
socket (real gRPC), its checkpoint file, its /proc tree and its NVML state read through the fake
module the probe loads. Healthy: exit 0; a broken socket, checkpoint or NVML: exit 1 with that
source's `fail` line."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from periscope.sim.cluster.model import ClusterModel
from periscope.sim.cluster.node import NodeSim, node_paths
from periscope.sim.nvml import fake_pynvml, read_nvml_state, write_nvml_state
from periscope.sim.scenario import load_scenario
from services.probe.doctor import DoctorReport, diagnose
from services.probe.doctor_cli import render, settings_for

NODE = "gpu-a"  # demo: time-sliced A100s, a v2 checkpoint


@pytest.fixture
async def node() -> AsyncIterator[NodeSim]:
    # A short directory: a unix socket path must fit in 107 bytes, pytest's tmp_path may not.
    workdir = Path(tempfile.mkdtemp(prefix="doctor-"))
    model = ClusterModel(load_scenario("demo"))
    index = [n.name for n in model.scenario.nodes].index(NODE)
    sim = NodeSim(model, NODE, index, node_paths(workdir, NODE))
    await sim.start()
    sim.apply(10_000)
    try:
        yield sim
    finally:
        await sim.kubelet.stop()
        await sim.dcgm.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def root_of(sim: NodeSim) -> Path:
    return sim.paths.proc_root.parent


async def run_cli(*args: str, dcgm_url: str = "") -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERISCOPE_")}
    if dcgm_url:
        env["PERISCOPE_DCGM_EXPORTER_URL"] = dcgm_url
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "periscope.cli.main", "doctor", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def doctor(sim: NodeSim, dcgm_url: str | None = None) -> DoctorReport:
    settings = settings_for(str(root_of(sim)), None)
    url = sim.dcgm.url if dcgm_url is None else dcgm_url  # the node's simulated dcgm-exporter
    return await diagnose(settings.model_copy(update={"dcgm_exporter_url": url}))


def by_name(report: DoctorReport) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.detail) for c in report.checks}


async def test_healthy_simulated_node_passes(node: NodeSim) -> None:
    report = await doctor(node)
    checks = by_name(report)
    assert report.ok, render(report)
    assert [c.name for c in report.checks] == [
        "podresources.socket", "podresources.list", "podresources.allocatable", "podresources.get",
        "podresources.dra", "checkpoint", "nvml.init", "nvml.gpus", "nvml.mig", "nvml.mps",
        "nvml.process_util", "nvml.xid", "procfs.hostpid", "procfs.cgroup", "dcgm.exporter", "dcgm.profiling",
    ]  # fmt: skip
    assert {s for s, _ in checks.values()} == {"ok"}, render(report)
    gpus = node.model.gpus[NODE]
    assert checks["nvml.init"][1] == "driver 550.54.15, CUDA 12.4"
    assert checks["nvml.gpus"][1].startswith(f"{len(gpus)} GPUs: ")
    assert checks["checkpoint"][1].startswith("v2, checksum ok")
    pods = node.model.alive(10_000, NODE)
    assert f"List answered: {len(pods)} pods" in checks["podresources.list"][1]
    pids = sum(len(c.pids) for p in pods for c in p.containers)
    assert checks["procfs.hostpid"][1].startswith(f"{pids}/{pids} GPU process PIDs visible")
    assert f"{pids}/{pids} GPU processes map to pods" in checks["procfs.cgroup"][1]
    assert checks["nvml.xid"][1] == f"XID events registered on {len(gpus)}/{len(gpus)} GPUs"

    assert checks["dcgm.profiling"][1].startswith("profiling fields DRAM_ACTIVE, GR_ENGINE_ACTIVE")
    assert checks["dcgm.profiling"][1].endswith("; 4 MIG instances")

    rc, out, err = await run_cli("--root", str(root_of(node)), dcgm_url=node.dcgm.url)
    assert rc == 0, out + err
    lines = out.splitlines()
    assert len(lines) == len(report.checks) + 1
    assert all(line.split()[0] == "ok" for line in lines[:-1])
    assert lines[-1] == f"the probe can work here ({len(report.checks)} ok, 0 warn, 0 fail)"


async def test_json_shape(node: NodeSim) -> None:
    rc, out, _ = await run_cli("--json", "--root", str(root_of(node)), dcgm_url=node.dcgm.url)
    assert rc == 0
    doc = json.loads(out)
    assert set(doc) == {"ok", "summary", "checks", "inputs"}
    assert doc["ok"] is True and doc["summary"] == {"ok": len(doc["checks"]), "warn": 0, "fail": 0}
    for check in doc["checks"]:
        assert set(check) == {"name", "status", "detail", "fix"} and check["status"] == "ok"
    assert doc["inputs"]["nvml_backend"] == f"fake:{node.paths.nvml_state}"
    assert doc["inputs"]["podresources_socket"] == str(node.paths.socket)
    assert doc["inputs"]["dcgm_exporter_url"] == node.dcgm.url


async def test_dcgm_exporter_problems_warn_with_the_fix(node: NodeSim) -> None:
    # not configured on a node with MIG: MIG slices would show no util
    report = await doctor(node, dcgm_url="")
    status, detail = by_name(report)["dcgm.exporter"]
    assert report.ok and status == "warn" and "PERISCOPE_DCGM_EXPORTER_URL is not set" in detail
    # garbage: answers, but not Prometheus text
    node.dcgm.mode = "garbage"
    status, detail = by_name(await doctor(node))["dcgm.exporter"]
    assert status == "warn" and ("not Prometheus text" in detail or "no DCGM_* series" in detail)
    # no profiling fields: the GPU (or DCGM's profiling module) does not provide them
    node.dcgm.mode = "ok"
    kept = [line for line in node.dcgm.text.splitlines() if "DCGM_FI_PROF_" not in line]
    node.dcgm.text = "\n".join(kept) + "\n"
    report = await doctor(node)
    assert by_name(report)["dcgm.exporter"][0] == "ok"
    status, detail = by_name(report)["dcgm.profiling"]
    fix = next(c.fix for c in report.checks if c.name == "dcgm.profiling")
    assert status == "warn" and "no DCGM_FI_PROF_* field" in detail and "do not support profiling" in fix
    # down: connection refused; the probe still works (exit 0)
    url = node.dcgm.url
    await node.dcgm.stop()
    rc, out, _ = await run_cli("--root", str(root_of(node)), dcgm_url=url)
    line = next(x for x in out.splitlines() if x.split()[1] == "dcgm.exporter")
    assert rc == 0 and line.startswith("warn") and "ConnectError" in line and "9400" in line


async def test_missing_socket_fails(node: NodeSim) -> None:
    await node.kubelet.stop()  # the kubelet is down: its socket file is gone
    rc, out, _ = await run_cli("--root", str(root_of(node)))
    assert rc == 1
    line = next(x for x in out.splitlines() if x.split()[1] == "podresources.socket")
    assert line.startswith("fail") and f"{node.paths.socket} does not exist -- fix: mount" in line
    assert out.splitlines()[-1].startswith("the probe cannot work here")


async def test_stale_socket_fails_on_list(node: NodeSim) -> None:
    await node.kubelet.stop()
    import socket

    with socket.socket(socket.AF_UNIX) as s:  # a socket file nobody serves
        s.bind(str(node.paths.socket))
        checks = by_name(await doctor(node))
    assert checks["podresources.socket"][0] == "ok"
    assert (
        checks["podresources.list"][0] == "fail" and "List did not answer" in checks["podresources.list"][1]
    )


async def test_corrupt_checkpoint_fails(node: NodeSim) -> None:
    node.corrupt_checkpoint(10_000, 60_000)  # a torn write
    rc, out, _ = await run_cli("--root", str(root_of(node)))
    assert rc == 1
    line = next(x for x in out.splitlines() if x.split()[1] == "checkpoint")
    assert line.startswith("fail") and "corrupt: not JSON" in line and "-- fix:" in line


async def test_checksum_mismatch_fails(node: NodeSim) -> None:
    raw = node.paths.checkpoint.read_bytes()
    node.paths.checkpoint.write_bytes(raw.replace(b'"ContainerName":"', b'"ContainerName":"x', 1))
    report = await doctor(node)
    assert not report.ok
    assert by_name(report)["checkpoint"] == ("fail", "corrupt: v2 checkpoint: checksum mismatch")


async def test_absent_checkpoint_is_a_warning(node: NodeSim) -> None:
    node.paths.checkpoint.unlink()
    report = await doctor(node)
    assert report.ok and by_name(report)["checkpoint"][0] == "warn"


async def test_broken_nvml_fails(node: NodeSim) -> None:
    state = node.paths.nvml_state
    state.unlink()  # no driver: nvmlInit cannot load it
    rc, out, _ = await run_cli("--root", str(root_of(node)), "--nvml-backend", f"fake:{state}")
    assert rc == 1
    line = next(x for x in out.splitlines() if x.split()[1] == "nvml.init")
    assert line.startswith("fail") and "nvmlInit: Driver Not Loaded" in line and "NVIDIA runtime" in line


async def test_no_gpus_fails(node: NodeSim) -> None:
    state = read_nvml_state(node.paths.nvml_state)
    write_nvml_state(node.paths.nvml_state, {**state, "gpus": []})
    checks = by_name(await doctor(node))
    assert checks["nvml.gpus"] == ("fail", "NVML sees no GPUs")


async def test_pids_outside_our_proc_fail_hostpid(node: NodeSim) -> None:
    for pid in node.procfs.pids():
        node.procfs.remove(pid)  # a probe without hostPID sees only its own container
    checks = by_name(await doctor(node))
    assert checks["procfs.hostpid"][0] == "fail" and checks["procfs.hostpid"][1].startswith("0/")


async def test_nvml_module_is_injectable(node: NodeSim) -> None:
    """The NVML module can be handed in (the seam the probe uses), as tests of real structs do."""
    settings = settings_for(str(root_of(node)), "pynvml")  # would need a driver if it were loaded
    report = await diagnose(settings, nvml=fake_pynvml(node.paths.nvml_state))
    assert by_name(report)["nvml.init"][0] == "ok"


async def test_mps_daemon_and_exclusive_mode(node: NodeSim) -> None:
    node.procfs.add_host_process(4321, "/system.slice/kubepods.slice", comm="nvidia-cuda-mps")
    checks = by_name(await doctor(node))
    assert checks["nvml.mps"][0] == "ok" and "nvidia-cuda-mps (pid 4321)" in checks["nvml.mps"][1]


async def test_bad_input_exits_2(tmp_path: Path) -> None:
    rc, out, err = await run_cli("--root", str(tmp_path / "nope"))
    assert rc == 2 and out == "" and err.strip() == f"periscope: --root {tmp_path / 'nope'}: not a directory"
    rc, _, err = await run_cli("--nvml-backend", "nvml9")
    assert rc == 2 and err.count("\n") == 1 and "nvml_backend" in err
