"""The probe finds an NVML stand-in by the name in NVML_BACKEND through the `periscope.nvml` entry points,
never by importing the development kit (import-linter forbids that import)."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

from services.probe.nvml_source import ENTRY_POINTS, UnknownBackend, load_nvml


def test_the_kit_registers_its_fake() -> None:
    registered = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINTS)}
    assert registered["fake"] == "periscope.sim.nvml:fake_pynvml"


def test_fake_backend_is_the_registered_factory_given_the_state_file(tmp_path: Path) -> None:
    from periscope.sim.nvml import FakePynvml, write_nvml_state

    state = tmp_path / "nvml.json"
    write_nvml_state(state, {"driver": "550.54.15", "cuda": 12040, "gpus": []})
    nvml = load_nvml(f"fake:{state}")
    assert isinstance(nvml, FakePynvml)
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 0


def test_an_unregistered_name_is_an_import_error_naming_it() -> None:
    with pytest.raises(UnknownBackend, match=r"no NVML backend 'dcgm' is installed \(registered: .*fake"):
        load_nvml("dcgm:localhost:5555")
    assert issubclass(UnknownBackend, ImportError)  # the probe and doctor report it as a missing pynvml
