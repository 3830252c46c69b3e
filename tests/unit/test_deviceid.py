"""Golden table for kubelet device IDs: each input must parse to exactly this JSON."""

from __future__ import annotations

import pytest

from periscope.core.deviceid import DeviceId, parse_device_id

U = "8a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d"
M = "d9a47cfb-1c2d-5e6f-7a8b-9c0d1e2f3a4b"

GOLDEN: list[tuple[str, dict[str, object], str]] = [
    (f"GPU-{U}", {"kind": "gpu", "uuid": f"GPU-{U}", "replica": None, "parent_uuid": None,
                  "gi": None, "ci": None, "index": None, "minor": None}, f"GPU-{U}"),
    (f"GPU-{U}::0", {"kind": "gpu", "uuid": f"GPU-{U}", "replica": 0, "parent_uuid": None,
                     "gi": None, "ci": None, "index": None, "minor": None}, f"GPU-{U}"),
    (f"GPU-{U}::3", {"kind": "gpu", "uuid": f"GPU-{U}", "replica": 3, "parent_uuid": None,
                     "gi": None, "ci": None, "index": None, "minor": None}, f"GPU-{U}"),
    (f"GPU-{U.upper()}", {"kind": "gpu", "uuid": f"GPU-{U.upper()}", "replica": None, "parent_uuid": None,
                          "gi": None, "ci": None, "index": None, "minor": None}, f"GPU-{U.upper()}"),
    (f"MIG-{M}", {"kind": "mig", "uuid": f"MIG-{M}", "replica": None, "parent_uuid": None,
                  "gi": None, "ci": None, "index": None, "minor": None}, f"MIG-{M}"),
    (f"MIG-{M}::2", {"kind": "mig", "uuid": f"MIG-{M}", "replica": 2, "parent_uuid": None,
                     "gi": None, "ci": None, "index": None, "minor": None}, f"MIG-{M}"),
    (f"MIG-GPU-{U}/1/0", {"kind": "mig", "uuid": f"MIG-GPU-{U}/1/0", "replica": None,
                          "parent_uuid": f"GPU-{U}", "gi": 1, "ci": 0, "index": None, "minor": None},
     f"MIG-GPU-{U}/1/0"),
    (f"MIG-GPU-{U}/13/2::4", {"kind": "mig", "uuid": f"MIG-GPU-{U}/13/2", "replica": 4,
                              "parent_uuid": f"GPU-{U}", "gi": 13, "ci": 2, "index": None, "minor": None},
     f"MIG-GPU-{U}/13/2"),
    # HAMi's virtual devices: the card's UUID and a slot (pkg/device-plugin/.../rm/devices.go, "%v-%v").
    (f"GPU-{U}-0", {"kind": "gpu", "uuid": f"GPU-{U}", "replica": 0, "parent_uuid": None,
                    "gi": None, "ci": None, "index": None, "minor": None}, f"GPU-{U}"),
    (f"GPU-{U}-9", {"kind": "gpu", "uuid": f"GPU-{U}", "replica": 9, "parent_uuid": None,
                    "gi": None, "ci": None, "index": None, "minor": None}, f"GPU-{U}"),
    # GKE: the number is the device minor, not the NVML index (`index` is its older name in the JSON).
    ("nvidia0", {"kind": "gke-gpu", "uuid": None, "replica": None, "parent_uuid": None,
                 "gi": None, "ci": None, "index": 0, "minor": 0}, "nvidia0"),
    ("nvidia12", {"kind": "gke-gpu", "uuid": None, "replica": None, "parent_uuid": None,
                  "gi": None, "ci": None, "index": 12, "minor": 12}, "nvidia12"),
    ("nvidia0/gi1", {"kind": "gke-mig", "uuid": None, "replica": None, "parent_uuid": None,
                     "gi": 1, "ci": None, "index": 0, "minor": 0}, "nvidia0/gi1"),
    ("nvidia0/vgpu3", {"kind": "gke-gpu", "uuid": None, "replica": 3, "parent_uuid": None,
                       "gi": None, "ci": None, "index": 0, "minor": 0}, "nvidia0"),
    ("nvidia1/gi2/vgpu0", {"kind": "gke-mig", "uuid": None, "replica": 0, "parent_uuid": None,
                           "gi": 2, "ci": None, "index": 1, "minor": 1}, "nvidia1/gi2"),
]


@pytest.mark.parametrize(("raw", "expected", "base"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden(raw: str, expected: dict[str, object], base: str) -> None:
    parsed = parse_device_id(raw)
    assert parsed.to_json() == expected
    assert list(parsed.to_json()) == ["kind", "uuid", "replica", "parent_uuid", "gi", "ci", "index", "minor"]
    assert parsed.raw == raw
    assert parsed.base == base


def test_gpu_uuid_names_the_physical_gpu() -> None:
    assert parse_device_id(f"GPU-{U}::3").gpu_uuid == f"GPU-{U}"
    assert parse_device_id(f"MIG-GPU-{U}/1/0").gpu_uuid == f"GPU-{U}"
    # A modern MIG UUID does not contain its parent: only NVML can tell.
    assert parse_device_id(f"MIG-{M}").gpu_uuid is None
    assert parse_device_id("nvidia0").gpu_uuid is None


def test_value_object() -> None:
    expected = DeviceId(raw=f"GPU-{U}::1", kind="gpu", uuid=f"GPU-{U}", replica=1)
    assert parse_device_id(f"GPU-{U}::1") == expected
    assert hash(parse_device_id("nvidia0")) == hash(parse_device_id("nvidia0"))


GARBAGE = [
    "",
    " ",
    f" GPU-{U}",
    f"GPU-{U}\n",
    "GPU-",
    "GPU-aaa",
    "gpu-" + U,
    f"GPU-{U}::",
    f"GPU-{U}::x",
    f"GPU-{U}::-1",
    f"GPU-{U}::01",
    f"GPU-{U}::1::2",
    f"GPU-{U}-extra",
    f"GPU-{U}-01",
    f"GPU-{U}--1",
    f"GPU-{U}-3::1",
    f"MIG-{M}-3",
    f"MIG-{M}x",
    f"MIG-GPU-{U}/1",
    f"MIG-GPU-{U}/1/0/2",
    f"MIG-GPU-{U}/a/0",
    f"MIG-GPU-{U}",
    "nvidia",
    "nvidiaX",
    "nvidia0/",
    "nvidia0/gi",
    "nvidia0/ci1",
    "nvidia0/vgpu3/gi1",
    "nvidia00",
    "0",
    "1:0",
    "gpu-0",
    "example.com/foo",
    U,
]


@pytest.mark.parametrize("raw", GARBAGE)
def test_garbage_is_rejected(raw: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_device_id(raw)
    assert str(err.value)  # says why


def test_non_string_is_rejected() -> None:
    with pytest.raises(ValueError):
        parse_device_id(7)  # type: ignore[arg-type]
