"""`periscope probe` as its own process against a fake kubelet, the NVML stand-in and a real broker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from periscope.bus.clients import Kafka
from periscope.devkit.launch import free_port
from periscope.sim.kubelet import FakeContainer, FakeDevices, FakeKubelet, FakePod
from periscope.sim.nvml import write_nvml_state
from periscope.sim.procfs import FakeProcfs

GPU = "GPU-5e5e5e5e-1111-2222-3333-444455556666"
REPO = Path(__file__).resolve().parents[2]


async def test_probe_command_serves_health_and_stops_on_sigterm(
    broker: Kafka, tmp_path: Path, unique: str
) -> None:
    kubelet = FakeKubelet(tmp_path / "kubelet" / "pod-resources" / "kubelet.sock")
    await kubelet.start()
    kubelet.set_pods([FakePod("ml", "p", (FakeContainer("c", (FakeDevices("nvidia.com/gpu", (GPU,)),)),))])
    state = tmp_path / "nvml.json"
    write_nvml_state(state, {"gpus": [{"uuid": GPU, "memory_total_mib": 16384}]})
    procfs = FakeProcfs(tmp_path / "proc")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERISCOPE_")}
    env["PERISCOPE_KAFKA_PROFILE"] = "embedded"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.probe",
            "--node",
            f"cli-{unique}",
            "--bootstrap",
            broker.bootstrap,
            "--kubelet-root",
            str(tmp_path / "kubelet"),
            "--proc-root",
            str(procfs.root),
            "--nvml-backend",
            f"fake:{state}",
            "--health-port",
            str(port),
            "--tick",
            "200ms",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        ready = None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=2) as http:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    ready = await http.get("/readyz")
                    if ready.status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
        assert ready is not None and ready.status_code == 200, proc.poll()
        body = ready.json()
        assert body["sources"]["podresources"]["state"] == "ok"
        assert body["sources"]["nvml"]["state"] == "ok"
        assert body["sources"]["checkpoint"]["state"] == "absent"
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 20)
        assert rc == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await kubelet.stop()
