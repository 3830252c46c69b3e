"""The probe and the fake NVML held to the installed nvidia-ml-py.

Static: every NVML function the probe calls (read from its source) exists in `pynvml` and accepts the
probe's arguments; every struct field it reads exists on the real ctypes struct; every error class
and constant it names exists. The fake (`periscope.sim.nvml`) must offer the same names, signatures
and fields. Negative cases show each check fails on a missing name or field.

Dynamic: the probe's NVML backend runs over a copy of the real `pynvml` whose library calls go to a
driver double (tests/unit/nvml_driver.py): MPS, MIG without privileges, a GPU lost mid-sample,
NotSupported metrics, memory not available, PIDs not visible in our /proc, an older driver.
"""

from __future__ import annotations

import ast
import ctypes
import inspect
import re
import time
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

import services.probe.mig_profiles as probe_mig_profiles
import services.probe.nvml as probe_nvml
import services.probe.xid as probe_xid
from periscope.core.model import DeviceSample
from periscope.sim.nvml import FakePynvml, add_xid, fake_pynvml, write_nvml_state
from services.probe.nvml import NvmlBackend
from services.probe.procfs import ProcMapper
from services.probe.xid import RawXid, XidWatcher
from tests.unit.core_builders import alloc, gpu, inventory, node_labels, pod, pr, tel, uid
from tests.unit.nvml_driver import (
    GPU_IS_LOST,
    NO_PERMISSION,
    NOT_SUPPORTED,
    Dev,
    Driver,
    Proc,
    real_pynvml,
)
from tests.unit.test_core_engine import S, last_pod, run

PROBE_SOURCES = (Path(probe_nvml.__file__), Path(probe_xid.__file__), Path(probe_mig_profiles.__file__))
MIB = 1024 * 1024

# The struct fields the probe reads, by the real struct that carries them.
READS: dict[str, tuple[str, ...]] = {
    "c_nvmlProcessInfo_v3_t": ("pid", "usedGpuMemory"),
    "c_nvmlProcessUtilizationSample_t": ("pid", "timeStamp", "smUtil", "memUtil"),
    "c_nvmlMemory_t": ("total", "used"),
    "c_nvmlUtilization_t": ("gpu", "memory"),
    "c_nvmlEventData_t": ("device", "eventType", "eventData", "gpuInstanceId", "computeInstanceId"),
    "c_nvmlGpuInstanceInfo_t": ("profileId", "placement"),
    "c_nvmlGpuInstancePlacement_t": ("start", "size"),
    "c_nvmlGpuInstanceProfileInfo_v2_t": ("id", "sliceCount", "name"),
    "c_nvmlComputeInstanceInfo_t": ("profileId",),
    "c_nvmlComputeInstanceProfileInfo_v2_t": ("id", "sliceCount", "name"),
    "nvmlPciInfo_t": ("busId",),
}
# Attributes of the probe's own objects (and NVMLError.value) whose names are NVML struct fields too.
OWN_ATTRIBUTES = {"handle", "index", "minor", "set", "uuid", "value"}
# Versions of a process-list call the probe uses only when present (older drivers).
OPTIONAL = re.compile(r".*_v2$")


# ---------------------------------------------------------------- what the probe uses, from its source


@dataclass
class NvmlUse:
    calls: dict[str, set[int]] = field(default_factory=dict)  # function -> argument counts used
    errors: set[str] = field(default_factory=set)
    constants: set[str] = field(default_factory=set)
    attributes: set[str] = field(default_factory=set)  # attribute names read, getattr strings included

    def call(self, name: str, arity: int) -> None:
        self.calls.setdefault(name, set()).add(arity)


def probe_use(sources: Iterable[Path] = PROBE_SOURCES) -> NvmlUse:
    use = NvmlUse()
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                use.attributes.add(node.attr)
                if node.attr.startswith("NVMLError"):
                    use.errors.add(node.attr)
                elif re.match(r"NVML_[A-Z_]+$|nvmlEventType\w+$", node.attr):
                    use.constants.add(node.attr)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                use.attributes.add(node.value)
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and re.match(r"nvml[A-Z]", func.attr):
                use.call(func.attr, len(node.args))  # nv.nvmlX(...)
            elif isinstance(func, ast.Attribute) and func.attr in ("_opt", "_metric"):
                # self._opt("nvmlX", *args) / self._metric(errors, "nvmlX", *args)
                # (_metric's own call to _opt passes its argument on: no name of its own)
                strings = [i for i, a in enumerate(node.args) if isinstance(a, ast.Constant)]
                if strings:
                    i = strings[0]
                    use.call(str(node.args[i].value), len(node.args) - i - 1)  # type: ignore[attr-defined]
            elif isinstance(func, ast.Attribute) and func.attr == "_is":
                use.errors.add(f"NVMLError_{node.args[1].value}")  # type: ignore[attr-defined]
            elif isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2:
                arg = node.args[1]
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("NVMLLibraryMismatch"):
                    use.errors.add(str(arg.value))
    for family in probe_nvml._PROCESS_LISTS:  # tried as f"{family}_v3", f"{family}_v2", family
        for name in (f"{family}_v3", f"{family}_v2", family):
            use.call(name, 1)
    return use


# ---------------------------------------------------------------- the checks


def missing_functions(module: Any, use: NvmlUse) -> list[str]:
    """Functions the probe calls that `module` lacks or that cannot take the probe's arguments."""
    problems = []
    for name, arities in sorted(use.calls.items()):
        fn = getattr(module, name, None)
        if fn is None:
            if not OPTIONAL.match(name):
                problems.append(f"{name}: missing")
            continue
        sig = inspect.signature(fn)
        for n in sorted(arities):
            try:
                sig.bind(*range(n))
            except TypeError as e:
                problems.append(f"{name}({n} args): {e}")
    return problems


def missing_errors(module: Any, use: NvmlUse) -> list[str]:
    return sorted(
        e for e in use.errors if not (isinstance(getattr(module, e, None), type)
                                      and issubclass(getattr(module, e), Exception))
    )


def missing_constants(module: Any, use: NvmlUse) -> list[str]:
    return sorted(c for c in use.constants if not hasattr(module, c))


def missing_fields(module: Any, reads: dict[str, tuple[str, ...]] = READS) -> list[str]:
    problems = []
    for struct, names in reads.items():
        cls = getattr(module, struct, None)
        have = {f[0] for f in getattr(cls, "_fields_", ())}
        problems += [f"{struct}.{n}" for n in names if n not in have]
    return problems


def struct_fields(module: Any) -> set[str]:
    out: set[str] = set()
    for obj in vars(module).values():
        if isinstance(obj, type) and issubclass(obj, ctypes.Structure):
            out |= {f[0] for f in getattr(obj, "_fields_", ())}
    return out


# ---------------------------------------------------------------- static conformance


def test_the_probe_reads_calls_from_its_source() -> None:
    use = probe_use()
    assert {"nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetProcessUtilization",
            "nvmlSystemGetProcessName", "nvmlEventSetWait", "nvmlGpuInstanceGetInfo"} <= set(use.calls)
    assert use.calls["nvmlDeviceGetTemperature"] == {2}
    assert {"NVMLError_GpuIsLost", "NVMLError_NotSupported", "NVMLError_Timeout"} <= use.errors


def test_every_call_error_and_constant_of_the_probe_exists_in_pynvml() -> None:
    use = probe_use()
    assert missing_functions(pynvml, use) == []
    assert missing_errors(pynvml, use) == []
    assert missing_constants(pynvml, use) == []


def test_every_struct_field_the_probe_reads_exists_on_the_real_struct() -> None:
    assert missing_fields(pynvml) == []
    assert pynvml.c_nvmlProcessInfo_t is pynvml.c_nvmlProcessInfo_v3_t  # what the _v3 lists return
    read = probe_use().attributes
    declared = {n for names in READS.values() for n in names}
    # The declaration is complete: any struct field name the probe reads is declared (or its own).
    assert (read & struct_fields(pynvml)) - declared - OWN_ATTRIBUTES == set()
    assert declared - read == set()  # and nothing declared goes unread


def test_the_checks_fail_on_a_missing_name_field_or_signature() -> None:
    mutilated = types.ModuleType("pynvml_mutilated")
    mutilated.__dict__.update(vars(pynvml))
    del mutilated.nvmlDeviceGetMPSComputeRunningProcesses_v3
    del mutilated.NVMLError_GpuIsLost
    del mutilated.NVML_TEMPERATURE_GPU

    def temperature(handle: Any) -> int:  # lost its sensor argument
        return 0

    mutilated.nvmlDeviceGetTemperature = temperature

    class Sample(ctypes.Structure):  # smUtil renamed
        _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("sm", ctypes.c_uint),
                    ("memUtil", ctypes.c_uint)]

    mutilated.c_nvmlProcessUtilizationSample_t = Sample
    use = probe_use()
    problems = missing_functions(mutilated, use)
    assert "nvmlDeviceGetMPSComputeRunningProcesses_v3: missing" in problems
    assert any(p.startswith("nvmlDeviceGetTemperature(2 args)") for p in problems)
    assert missing_errors(mutilated, use) == ["NVMLError_GpuIsLost"]
    assert missing_constants(mutilated, use) == ["NVML_TEMPERATURE_GPU"]
    assert missing_fields(mutilated) == ["c_nvmlProcessUtilizationSample_t.smUtil"]


def test_the_fake_offers_what_the_probe_calls_with_real_signatures(tmp_path: Path) -> None:
    fake = fake_pynvml(tmp_path / "nvml.json")
    use = probe_use()
    assert missing_functions(fake, use) == []
    assert missing_errors(fake, use) == []
    assert missing_constants(fake, use) == []
    for name, _ in inspect.getmembers(FakePynvml, inspect.isfunction):
        if name.startswith("nvml"):  # every fake function is a real one, with its parameters
            real = list(inspect.signature(getattr(pynvml, name)).parameters)
            assert list(inspect.signature(getattr(FakePynvml, name)).parameters)[1:] == real, name
    for const in use.constants | {"NVML_COMPUTEMODE_EXCLUSIVE_PROCESS", "NVML_COMPUTEMODE_DEFAULT"}:
        assert getattr(fake, const) == getattr(pynvml, const), const


def test_the_fakes_answers_carry_the_real_structs_fields(tmp_path: Path) -> None:
    path = tmp_path / "nvml.json"
    state: dict[str, Any] = {"gpus": [
        {"uuid": "GPU-a", "processes": [{"pid": 5, "used_mib": 1, "sm_util": 3}], "util_pct": 5},
        {"uuid": "GPU-b", "mig": [{"uuid": "MIG-b", "gi": 1, "ci": 0, "processes": []}]},
    ]}
    add_xid(state, "GPU-a", 79)
    write_nvml_state(path, state)
    nv = fake_pynvml(path)
    nv.nvmlInit()
    a, b = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)

    def fields(struct: str) -> set[str]:
        return {f[0] for f in getattr(pynvml, struct)._fields_}

    assert set(vars(nv.nvmlDeviceGetComputeRunningProcesses_v3(a)[0])) == fields("c_nvmlProcessInfo_v3_t")
    assert set(vars(nv.nvmlDeviceGetProcessUtilization(a, 0)[0])) == fields(
        "c_nvmlProcessUtilizationSample_t"
    )
    assert set(vars(nv.nvmlDeviceGetMemoryInfo(a))) == fields("c_nvmlMemory_t")
    assert set(vars(nv.nvmlDeviceGetUtilizationRates(a))) == fields("c_nvmlUtilization_t")
    info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(b, 1))
    assert set(vars(info)) == fields("c_nvmlGpuInstanceInfo_t")
    assert set(vars(info.placement)) == fields("c_nvmlGpuInstancePlacement_t")
    assert set(READS["nvmlPciInfo_t"]) <= set(vars(nv.nvmlDeviceGetPciInfo(a)))
    events = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(a, nv.nvmlEventTypeXidCriticalError, events)
    add_xid(state, "GPU-a", 48)
    write_nvml_state(path, state)
    assert set(vars(nv.nvmlEventSetWait(events, 1000))) == fields("c_nvmlEventData_t")


# ---------------------------------------------------------------- the backend over the real module

SERVER = 77


def mps_gpu(**kw: Any) -> Dev:
    return Dev(
        "GPU-mps", compute_mode=pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        compute=[Proc(SERVER, 30 * MIB)],  # a real MPS node: the server alone in the compute list
        mps=[Proc(30, 3000 * MIB), Proc(31, 1000 * MIB), Proc(32, None)], **kw,
    )


def sample(driver: Driver, proc_root: Path | None = None) -> tuple[NvmlBackend, dict[str, DeviceSample]]:
    mapper = ProcMapper(str(proc_root)) if proc_root is not None else None
    backend = NvmlBackend(real_pynvml(driver), proc_name=mapper.comm if mapper else None)
    backend.open()
    backend.refresh()
    return backend, {d.uuid: d for d in backend.sample()}


def test_mps_clients_come_from_the_mps_list_and_the_server_is_no_consumer() -> None:
    driver = Driver([mps_gpu(samples=[(30, 45, 9), (31, 15, 3)])], names={SERVER: "nvidia-cuda-mps-server"})
    backend, devices = sample(driver)
    procs = {p.pid: (p.sm_util_pct, p.used_mib) for p in devices["GPU-mps"].processes}
    assert procs == {30: (45.0, 3000.0), 31: (15.0, 1000.0), 32: (0.0, None)}  # 32: memory N/A
    assert backend.mps_servers["GPU-mps"] == (SERVER,) and devices["GPU-mps"].error == ""
    assert "nvmlDeviceGetMPSComputeRunningProcesses_v3" in driver.calls


def test_mps_without_client_utilization_is_split_by_memory_in_the_core() -> None:
    # A driver that charges the clients' work to the server's PID: clients' util unknown.
    driver = Driver([mps_gpu(samples=[(SERVER, 60, 20)])], names={SERVER: "nvidia-cuda-mps-server"})
    _, devices = sample(driver)
    d = devices["GPU-mps"]
    assert {p.pid: p.sm_util_pct for p in d.processes} == {30: None, 31: None, 32: None}
    # The same sample through the core, with 30 in pod 1 and 31 in pod 2, both on MPS replicas.
    owners = {30: uid(1), 31: uid(2)}
    procs = tuple(
        type(p)(pid=p.pid, pod_uid=owners.get(p.pid, ""), sm_util_pct=p.sm_util_pct, used_mib=p.used_mib)
        for p in d.processes if p.pid in owners
    )
    g = gpu(0)
    d = DeviceSample(uuid=g, util_pct=d.util_pct, fb_used_mib=d.fb_used_mib, power_w=d.power_w,
                     processes=procs)
    _, outs = run([
        inventory(), node_labels(0, **{"nvidia.com/gpu.sharing-strategy": "mps"}), pod(1, "a", 0),
        pod(2, "b", 0), alloc(S, pr("ml", "a", (f"{g}::0",)), pr("ml", "b", (f"{g}::1",))), tel(2 * S, d),
    ])
    a, b = (last_pod(outs, uid(n)).rows[0] for n in (1, 2))
    assert (a.share_basis, b.share_basis) == ("memory-weighted", "memory-weighted")
    assert (a.util_pct, b.util_pct) == (37.5, 12.5)  # 50 % split 3000 : 1000
    assert (a.power_w, b.power_w) == (187.5, 62.5)


def test_the_server_named_only_by_proc_is_still_recognised(tmp_path: Path) -> None:
    (tmp_path / str(SERVER)).mkdir()
    (tmp_path / str(SERVER) / "comm").write_text("nvidia-cuda-mps\n")  # 15 characters, as the kernel
    driver = Driver([mps_gpu()], names={})  # NVML cannot name it (NOT_FOUND)
    _, devices = sample(driver, tmp_path)
    assert SERVER not in {p.pid for p in devices["GPU-mps"].processes}


def test_pids_not_visible_in_our_proc_are_kept_without_a_pod(tmp_path: Path) -> None:
    driver = Driver([Dev("GPU-a", compute=[Proc(4242, 500 * MIB)], samples=[(4242, 80, 10)])])
    _, devices = sample(driver, tmp_path)  # an empty /proc: no hostPID
    (p,) = devices["GPU-a"].processes
    assert (p.pid, p.sm_util_pct, p.used_mib) == (4242, 80.0, 500.0)
    mapper = ProcMapper(str(tmp_path))
    assert mapper.lookup(4242) is None and mapper.comm(4242) is None


def test_mig_on_without_privileges_samples_the_instances() -> None:
    migs = [
        Dev("MIG-1", name="NVIDIA A100-SXM4-80GB MIG 3g.40gb", gi=1, profile_id=9, placement=(4, 4),
            total=40 * 1024**3, compute=[Proc(20, 300 * MIB, gi=1, ci=0)]),
        Dev("MIG-2", name="NVIDIA A100-SXM4-80GB MIG 1g.10gb", gi=2, profile_id=19, placement=(0, 1),
            total=10 * 1024**3),
    ]
    parent = Dev("GPU-mig", name="NVIDIA A100-SXM4-80GB", minor=1, mig_mode=1, migs=migs,
                 errors={"nvmlDeviceGetComputeRunningProcesses_v3": NO_PERMISSION,
                         "nvmlDeviceGetMPSComputeRunningProcesses_v3": NO_PERMISSION,
                         "nvmlDeviceGetGraphicsRunningProcesses_v3": NO_PERMISSION})
    backend, devices = sample(Driver([parent]))
    (info,) = backend.inventory.gpus
    assert info.mig_enabled and [(m.uuid, m.profile, m.gi) for m in info.mig_devices] == [
        ("MIG-1", "3g.40gb", 1), ("MIG-2", "1g.10gb", 2)]
    assert [(p.uuid, p.profile_id, p.start, p.size) for p in backend.inventory.placements] == [
        ("MIG-1", 9, 4, 4), ("MIG-2", 19, 0, 1)]
    g = devices["GPU-mig"]
    assert g.util_pct is None and g.processes == () and g.error == ""
    m1 = devices["MIG-1"]
    assert [(p.pid, p.sm_util_pct, p.used_mib) for p in m1.processes] == [(20, None, 300.0)]
    assert m1.error == "" and m1.fb_total_mib == 40 * 1024


def test_a_gpu_lost_mid_sample_marks_only_that_gpu() -> None:
    lost = mps_gpu(errors={"nvmlDeviceGetMPSComputeRunningProcesses_v3": GPU_IS_LOST})
    other = Dev("GPU-b", minor=1, compute=[Proc(9, 10 * MIB)], errors={
        "nvmlDeviceGetPowerUsage": NOT_SUPPORTED, "nvmlDeviceGetTemperature": NOT_SUPPORTED})
    _, devices = sample(Driver([lost, other], names={SERVER: "nvidia-cuda-mps-server"}))
    assert devices["GPU-mps"].lost and "GPU is lost" in devices["GPU-mps"].error
    b = devices["GPU-b"]
    assert not b.lost and b.power_w is None and b.temp_c is None and b.error == ""  # NotSupported
    assert b.util_pct == 50.0 and [p.pid for p in b.processes] == [9]


def test_an_older_driver_without_v3_lists_is_read_through_v2() -> None:
    driver = Driver([mps_gpu()], names={SERVER: "nvidia-cuda-mps-server"},
                    missing=("nvmlDeviceGetComputeRunningProcesses_v3",
                             "nvmlDeviceGetMPSComputeRunningProcesses_v3",
                             "nvmlDeviceGetGraphicsRunningProcesses_v3"))
    _, devices = sample(driver)
    assert {p.pid for p in devices["GPU-mps"].processes} == {30, 31, 32}
    assert "nvmlDeviceGetMPSComputeRunningProcesses_v2" in driver.calls


def test_xids_arrive_through_the_real_event_data_struct() -> None:
    mig = Dev("MIG-1", gi=3, ci=0)
    gpus = [Dev("GPU-a"), Dev("GPU-b", minor=1, mig_mode=1, migs=[mig])]
    driver = Driver(gpus)
    backend, _ = sample(driver)
    got: list[RawXid] = []
    watcher = XidWatcher(backend.nvml, got.append, wait_ms=50)
    watcher.start(backend.handles())
    try:
        assert watcher.registered == ("GPU-a", "GPU-b")
        driver.xids += [(gpus[0], 79, 0xFFFFFFFF, 0xFFFFFFFF), (gpus[1], 31, 3, 0)]
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watcher.stop()
    assert got == [RawXid("GPU-a", 79, None, None), RawXid("GPU-b", 31, 3, 0)]
    assert watcher.error == "" and "nvmlEventSetWait_v2" in driver.calls


@pytest.mark.parametrize("code", [NO_PERMISSION, GPU_IS_LOST])
def test_errors_the_driver_returns_are_the_real_error_classes(code: int) -> None:
    nv = real_pynvml(Driver([Dev("GPU-a", errors={"nvmlDeviceGetPowerUsage": code})]))
    nv.nvmlInit()
    with pytest.raises(nv.NVMLError) as e:
        nv.nvmlDeviceGetPowerUsage(nv.nvmlDeviceGetHandleByIndex(0))
    assert type(e.value).__name__ == {NO_PERMISSION: "NVMLError_NoPermission",
                                      GPU_IS_LOST: "NVMLError_GpuIsLost"}[code]
