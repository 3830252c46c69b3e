"""ProbeSettings: env names, derived kubelet paths, durations, validation."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from periscope.settings.probe import ProbeSettings


def test_defaults_follow_the_kubelet_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERISCOPE_KUBELET_ROOT", "/srv/kubelet")
    monkeypatch.setenv("PERISCOPE_NODE_NAME", "gpu-a")
    s = ProbeSettings()
    assert s.node_name == "gpu-a"
    assert s.podresources_socket == "/srv/kubelet/pod-resources/kubelet.sock"
    assert s.checkpoint_path == "/srv/kubelet/device-plugins/kubelet_internal_checkpoint"
    assert (s.tick, s.allocation_interval, s.proc_root, s.nvml_backend) == (1.0, 5.0, "/proc", "pynvml")
    assert (s.health_host, s.health_port, s.clock) == ("127.0.0.1", 9401, "wall")


def test_env_overrides_and_durations(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {
        "TICK": "500ms",
        "ALLOCATION_INTERVAL": "2",
        "NVML_BACKEND": "fake:/x/state.json",
        "PODRESOURCES_SOCKET": "/run/pr.sock",
        "BUFFER_LIMIT": "50",
        "HEALTH_PORT": "0",
        "KAFKA_BOOTSTRAP": "broker:9092",
    }.items():
        monkeypatch.setenv(f"PERISCOPE_{k}", v)
    s = ProbeSettings()
    assert (s.tick, s.allocation_interval, s.nvml_backend) == (0.5, 2.0, "fake:/x/state.json")
    assert (s.podresources_socket, s.buffer_limit, s.health_port, s.kafka_bootstrap) == (
        "/run/pr.sock",
        50,
        0,
        "broker:9092",
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tick", "soon"),
        ("tick", "0s"),
        ("nvml_backend", "dcgm"),
        ("nvml_backend", "fake:"),
        ("health_port", 70000),
        ("buffer_limit", 1),
        ("clock", "sim:abc:2"),
    ],
)
def test_bad_values_are_rejected(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        ProbeSettings(**{field: value})


def test_podresources_interval_defaults_to_two_ticks_within_the_snapshot_period() -> None:
    assert ProbeSettings(tick=1.0).podresources_every() == 2.0
    assert ProbeSettings(tick=0.2, allocation_interval=0.3).podresources_every() == 0.3
    assert ProbeSettings(tick=1.0, podresources_interval="500ms").podresources_every() == 0.5
    with pytest.raises(ValidationError):
        ProbeSettings(podresources_interval="0s")
