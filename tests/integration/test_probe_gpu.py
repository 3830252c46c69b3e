"""The NVML backend against the real pynvml and driver (skipped on machines without an NVIDIA GPU)."""

from __future__ import annotations

import pynvml
import pytest

from services.probe.nvml import NvmlBackend
from services.probe.xid import XidWatcher

pytestmark = pytest.mark.gpu


def test_real_nvml_readings_are_sane() -> None:
    backend = NvmlBackend(pynvml)
    backend.open()
    try:
        inv = backend.refresh()
        assert inv.gpus and inv.driver_version
        for gpu in inv.gpus:
            assert gpu.uuid.startswith("GPU-") and gpu.memory_mib > 0 and gpu.model
            for mig in gpu.mig_devices:
                assert mig.uuid.startswith("MIG-")
        samples = backend.sample()
        by_uuid = {d.uuid: d for d in samples}
        assert {g.uuid for g in inv.gpus} <= set(by_uuid)
        for d in samples:
            assert isinstance(d.processes, tuple) and not d.lost
            assert d.fb_total_mib is not None and d.fb_total_mib > 0
            assert d.fb_used_mib is not None and 0 <= d.fb_used_mib <= d.fb_total_mib
            if d.mig is None:
                assert d.temp_c is None or 0 < d.temp_c < 120
                assert d.power_w is None or d.power_w >= 0
                assert d.util_pct is None or 0 <= d.util_pct <= 100
            for p in d.processes:
                assert p.pid > 0 and (p.used_mib is None or p.used_mib >= 0)
            # An MPS server found on the device is never reported as one of its processes.
            assert not set(backend.mps_servers.get(d.uuid, ())) & {p.pid for p in d.processes}
        # A second sample asks only for newer per-process samples and still works.
        assert len(backend.sample()) == len(samples)
        watcher = XidWatcher(pynvml, lambda raw: None, wait_ms=100)
        watcher.start(backend.handles())
        watcher.stop()
        assert not watcher.alive
    finally:
        backend.close()
