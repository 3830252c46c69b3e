"""`periscope watch`: bad input is one line and exit 2; a real run publishes, reports ready, and stops
cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from periscope.bus import codec, topics
from periscope.bus.admin import ensure_topics
from periscope.bus.clients import Kafka
from periscope.cli.main import main
from periscope.core.model import PodEvent, PolicyEvent
from periscope.devkit.embedded import EmbeddedBroker
from periscope.devkit.launch import free_port
from periscope.sim.apiserver import FakeApiServer
from tests.kafka_tier import embedded

REPO = Path(__file__).resolve().parents[2]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["watch", *args])
    captured = capsys.readouterr()
    return int(exc.value.code or 0), captured.out, captured.err


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--kubeconfig", "/nonexistent/kubeconfig"], {}, "kubeconfig /nonexistent/kubeconfig: no such file"),
        (["--health-port", "70000"], {}, "--health-port"),
        ([], {"PERISCOPE_WATCH_TIMEOUT": "soon"}, "watch_timeout"),
        ([], {"PERISCOPE_LEASE_RENEW": "-1s"}, "lease_renew"),
        ([], {"PERISCOPE_OPERATOR_NAMESPACE": " "}, "operator_namespace"),
        ([], {"PERISCOPE_CLOCK": "sim:abc:1"}, "clock setting"),
        ([], {"PERISCOPE_LOG_LEVEL": "loud"}, "log_level"),
        ([], {}, "no kubeconfig given"),  # and not inside a cluster
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str],
    env: dict[str, str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("PERISCOPE_KUBECONFIG", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err


def test_help_names_the_settings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    for flag in ("--kubeconfig", "--bootstrap", "--operator-namespace", "--leader-election", "--health-port"):
        assert flag in out


@pytest.fixture
def own_broker() -> Iterator[Kafka]:
    """A broker of its own: the command publishes to the registry topics, which tests share."""
    with EmbeddedBroker() as b:
        kafka = embedded(b.bootstrap)
        asyncio.run(ensure_topics(kafka, (topics.PODS, topics.NODES, topics.POLICY)))
        yield kafka


async def read_until(kafka: Kafka, want: set[type], timeout: float = 30.0) -> list[object]:
    by_name = {t.name: t for t in (topics.PODS, topics.NODES, topics.POLICY)}
    consumer = kafka.consumer(*by_name, client_id="test-read")
    await consumer.start()
    got: list[object] = []
    try:
        deadline = time.monotonic() + timeout
        while not want.issubset({type(v) for v in got}):
            assert time.monotonic() < deadline, f"only got {got}"
            for tp, batch in (await consumer.getmany(timeout_ms=200)).items():
                got += [codec.decode(by_name[tp.topic], r.value) for r in batch if r.value is not None]
        return got
    finally:
        await consumer.stop()


async def test_watch_command_end_to_end(own_broker: Kafka, tmp_path: Path) -> None:
    port = free_port()
    with FakeApiServer(crd_installed=False) as server:
        server.upsert("nodes", {"metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.present": "true"}}})
        server.upsert(
            "pods",
            {
                "metadata": {"name": "train-0", "namespace": "ml", "uid": "uid-cli"},
                "spec": {"nodeName": "gpu-a", "containers": [{"name": "c"}]},
            },
        )
        env = {**os.environ, "PYTHONPATH": str(REPO), "PERISCOPE_LOG_LEVEL": "warning",
               "PERISCOPE_KAFKA_PROFILE": "embedded"}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from periscope.cli.main import main; main()",
                "watch",
                "--kubeconfig",
                str(server.write_kubeconfig(tmp_path / "kubeconfig")),
                "--bootstrap",
                own_broker.bootstrap,
                "--health-port",
                str(port),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            got = await read_until(own_broker, {PodEvent, PolicyEvent})
            pods = [e for e in got if isinstance(e, PodEvent)]
            assert pods[0].pod.uid == "uid-cli" and pods[0].meta.node == "gpu-a"
            policy = next(e for e in got if isinstance(e, PolicyEvent))
            assert policy.crd == "not-installed"
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                for _ in range(100):
                    ready = await http.get("/readyz")
                    if ready.status_code == 200:
                        break
                    await asyncio.sleep(0.1)
                assert ready.status_code == 200, ready.text
                assert (await http.get("/healthz")).status_code == 200
                metrics = (await http.get("/metrics")).text
                assert "periscope_watcher_events_published_total" in metrics
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()[-2000:]


@pytest.mark.parametrize("content", ["garbage: [", "apiVersion: v1\n"])
def test_malformed_kubeconfig_is_one_line(
    content: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    code, _, err = run_cli(["--kubeconfig", str(path)], capsys)
    assert code == 2 and err.startswith(f"periscope: kubeconfig {path}: ") and len(err.splitlines()) == 1
