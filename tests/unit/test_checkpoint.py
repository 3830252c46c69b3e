"""Device-manager checkpoint: golden files, the kubelet's checksum, corrupt input, round trips."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from periscope.kubelet.checkpoint import (
    Checkpoint,
    CheckpointEntry,
    CheckpointError,
    checkpoint_to_json,
    parse_checkpoint,
    render_checkpoint,
)

DATA = Path(__file__).parent / "data"

G0 = "GPU-0b6ab3a2-5b6c-4f4e-9d55-2a1f3c4d5e60"
G1 = "GPU-1c7bc4b3-6c7d-405f-8e66-3b2a4d5e6f71"
MIG = "MIG-7d3e5f60-1a2b-5c3d-9e4f-6a7b8c9d0e1f"
P1 = "5a1d7c3e-0b2f-4c6d-9e8f-1a2b3c4d5e6f"
P2 = "c0ffee00-1111-4222-8333-944455556666"
P3 = "0badf00d-aaaa-4bbb-8ccc-dddddddddddd"


def load(name: str) -> bytes:
    return (DATA / name).read_bytes()


def dev(path: str) -> dict[str, str]:
    return {"container_path": path, "host_path": path, "permissions": "rw"}


# A file written by a real kubelet (v2, two GPUs on NUMA node 1), as published in a public write-up.
PUBLISHED_V2 = {
    "format": "v2",
    "checksum_ok": True,
    "entries": [
        {
            "pod_uid": "9a15d2b5-c152-46b9-96e0-d57032629e1f",
            "container": "app",
            "resource": "nvidia.com/gpu",
            "device_ids": [
                "GPU-9b341c59-f96b-ba85-c137-78c3652fea65",
                "GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841",
            ],
            "numa": {
                "1": ["GPU-9b341c59-f96b-ba85-c137-78c3652fea65", "GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841"]
            },
            "alloc": {
                "envs": {
                    "NVIDIA_VISIBLE_DEVICES": "GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841,"
                    "GPU-9b341c59-f96b-ba85-c137-78c3652fea65"
                },
                "mounts": [],
                "devices": [
                    dev("/dev/nvidiactl"),
                    dev("/dev/nvidia-uvm"),
                    dev("/dev/nvidia-uvm-tools"),
                    dev("/dev/nvidia-modeset"),
                    dev("/dev/nvidia1"),
                    dev("/dev/nvidia2"),
                ],
                "annotations": {},
                "cdi_devices": [],
            },
        }
    ],
    "registered": {
        "nvidia.com/gpu": [
            "GPU-77a702db-e37f-3a74-d46d-c5713f66058c",
            "GPU-9b341c59-f96b-ba85-c137-78c3652fea65",
            "GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841",
        ]
    },
    "boot_id": None,
}


def test_published_v2_file_golden() -> None:
    assert checkpoint_to_json(parse_checkpoint(load("checkpoint_v2_published"))) == PUBLISHED_V2


def test_published_files_checksums_are_reproduced() -> None:
    # Both checksums were computed by kubelets; matching them proves the spew/FNV reproduction.
    assert parse_checkpoint(load("checkpoint_v2_published")).checksum_ok is True
    empty = parse_checkpoint(load("checkpoint_empty_published"))
    assert empty == Checkpoint(
        "v2", True, (), {"nvidia.com/gpu": ("GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0",)}
    )


def test_render_reproduces_the_kubelets_bytes() -> None:
    raw = load("checkpoint_v2_published")
    cp = parse_checkpoint(raw)
    assert render_checkpoint(cp.entries, cp.registered) == raw
    empty = load("checkpoint_empty_published")
    cp = parse_checkpoint(empty)
    assert render_checkpoint(cp.entries, cp.registered) == empty


def test_tampered_file_is_a_checksum_mismatch_not_corrupt() -> None:
    raw = load("checkpoint_v2_published").replace(b'"ContainerName":"app"', b'"ContainerName":"app2"')
    cp = parse_checkpoint(raw)
    assert cp.checksum_ok is False
    assert cp.entries[0].container == "app2"


def test_v2_numa_golden() -> None:
    got = checkpoint_to_json(parse_checkpoint(load("checkpoint_v2_numa")))
    assert got == {
        "format": "v2",
        "checksum_ok": True,
        "entries": [
            {
                "pod_uid": P1,
                "container": "cuda",
                "resource": "nvidia.com/mig-1g.10gb",
                "device_ids": [MIG],
                "numa": {"-1": [MIG]},  # no topology
                "alloc": {
                    "envs": {"NVIDIA_VISIBLE_DEVICES": MIG},
                    "mounts": [],
                    "devices": [dev("/dev/nvidia0")],
                    "annotations": {
                        f"cdi.k8s.io/nvidia-device-plugin_{P1}": f"k8s.device-plugin.nvidia.com/mig={MIG}"
                    },
                    "cdi_devices": [],
                },
            },
            {
                "pod_uid": P2,
                "container": "trainer",
                "resource": "nvidia.com/gpu",
                "device_ids": [G0, G1],  # G0 sits on NUMA 0 and 1, listed once
                "numa": {"0": [G0], "1": [G0, G1]},
                "alloc": {
                    "envs": {"NVIDIA_VISIBLE_DEVICES": f"{G0},{G1}"},
                    "mounts": [
                        {"container_path": "/mps", "host_path": "/run/nvidia/mps", "read_only": False}
                    ],
                    "devices": [],
                    "annotations": {},
                    "cdi_devices": [f"nvidia.com/gpu={G0}"],
                },
            },
            {
                "pod_uid": P3,
                "container": "sidecar",
                "resource": "nvidia.com/gpu.shared",
                "device_ids": [f"{G1}::2"],
                "numa": {"1": [f"{G1}::2"]},
                "alloc": None,  # AllocResp null
            },
        ],
        "registered": {
            "nvidia.com/gpu": [G0, G1],
            "nvidia.com/gpu.shared": [f"{G1}::0", f"{G1}::1", f"{G1}::2"],
            "nvidia.com/mig-1g.10gb": [MIG],
        },
        "boot_id": "4e1b2f3a-9c8d-4e7f-a6b5-0c1d2e3f4a5b",
    }


def test_v1_golden() -> None:
    cp = parse_checkpoint(load("checkpoint_v1"))
    assert checkpoint_to_json(cp) == {
        "format": "v1",
        "checksum_ok": True,
        "entries": [
            {
                "pod_uid": P1,
                "container": "cuda",
                "resource": "nvidia.com/gpu",
                "device_ids": [G0, G1],
                "numa": {},  # v1 records no topology
                "alloc": {
                    "envs": {"NVIDIA_VISIBLE_DEVICES": f"{G0},{G1}"},
                    "mounts": [],
                    "devices": [],
                    "annotations": {},
                    "cdi_devices": [],
                },
            },
            {
                "pod_uid": P2,
                "container": "app",
                "resource": "nvidia.com/gpu",
                "device_ids": [],
                "numa": {},
                "alloc": None,
            },
        ],
        "registered": {"nvidia.com/gpu": [G0, G1]},
        "boot_id": None,
    }


def test_v1_checksum_uses_the_v2_type_names() -> None:
    from periscope.kubelet.checkpoint import _spew

    raws = [("u", "c", "r", ["a", "b"], b"\x01\x02")]
    dump = _spew(raws, {"r": ["a"]}, "v1")  # type: ignore[arg-type]
    assert dump == (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"
        "[{PodUID:(string)u ContainerName:(string)c ResourceName:(string)r DeviceIDs:([]string)[a b] "
        "AllocResp:([]uint8)[1 2]}] RegisteredDevices:(map[string][]string)map[r:[a]]}"
    )
    v2 = _spew([("u", "c", "r", {-1: ["a"], 0: None}, None)], None, "v2")
    assert v2 == (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"
        "[{PodUID:(string)u ContainerName:(string)c ResourceName:(string)r "
        "DeviceIDs:(checkpoint.DevicesPerNUMA)map[-1:[a] 0:<nil>] AllocResp:([]uint8)<nil>}] "
        "RegisteredDevices:(map[string][]string)<nil>}"
    )


def entry_doc(**over: object) -> bytes:
    e: dict[str, object] = {
        "PodUID": P1,
        "ContainerName": "c",
        "ResourceName": "nvidia.com/gpu",
        "DeviceIDs": {"0": [G0]},
        "AllocResp": None,
    }
    e.update(over)
    e = {k: v for k, v in e.items() if v != "<absent>"}
    return json.dumps({"Data": {"PodDeviceEntries": [e], "RegisteredDevices": {}}, "Checksum": 1}).encode()


def test_alloc_missing_empty_or_undecodable() -> None:
    assert parse_checkpoint(entry_doc(AllocResp="<absent>")).entries[0].alloc is None
    empty = parse_checkpoint(entry_doc(AllocResp="")).entries[0].alloc
    assert empty == {"envs": {}, "mounts": [], "devices": [], "annotations": {}, "cdi_devices": []}
    # valid base64 of bytes that are no protobuf: not a corrupt file, just no alloc
    garbage = parse_checkpoint(entry_doc(AllocResp=base64.b64encode(b"\xff\xff\xff").decode()))
    assert garbage.entries[0].alloc is None and garbage.checksum_ok is False
    # not base64 at all: the kubelet's dump cannot be rebuilt, so the checksum is unknown
    not_b64 = parse_checkpoint(entry_doc(AllocResp="%%%"))
    assert not_b64.entries[0].alloc is None and not_b64.checksum_ok is None


def test_no_checksum_means_unknown() -> None:
    doc = json.loads(load("checkpoint_v2_published"))
    del doc["Checksum"]
    assert parse_checkpoint(json.dumps(doc).encode()).checksum_ok is None


def test_numa_keys_are_normalised_and_ordered() -> None:
    cp = parse_checkpoint(entry_doc(DeviceIDs={"1": [G1], "-1": [MIG], "+0": [G0]}))
    assert cp.entries[0].numa == {"-1": (MIG,), "0": (G0,), "1": (G1,)}
    assert cp.entries[0].device_ids == (MIG, G0, G1)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x01\x02\xff\xfe",
        b'{"Data":{"PodDeviceEntries":[{"PodUID":"x"',  # truncated write
        b"[]",
        b"null",
        b'{"Checksum": 5}',
        b'{"Data": []}',
        b'{"Data": {"PodDeviceEntries": {}}}',
        b'{"Data": {"PodDeviceEntries": [5]}}',
        b'{"Data": {"RegisteredDevices": []}}',
        b'{"Data": {"RegisteredDevices": {"r": [1]}}}',
        b'{"Data": {}, "Checksum": "abc"}',
        b'{"Data": {}, "Checksum": -1}',
        b'{"Data": {}, "Checksum": 1.5}',
        b'{"Data": {}, "Checksum": NaN}',
        b'{"Data": {}, "BootID": 7}',
        entry_doc(PodUID=5),
        entry_doc(DeviceIDs={"x": [G0]}),
        entry_doc(DeviceIDs={"0": G0}),
        entry_doc(DeviceIDs="GPU-0"),
        entry_doc(AllocResp=5),
        # one v1 entry and one v2 entry: neither format
        b'{"Data": {"PodDeviceEntries": [{"DeviceIDs": ["a"]}, {"DeviceIDs": {"0": ["b"]}}]}}',
    ],
)
def test_corrupt_bytes_raise(data: bytes) -> None:
    with pytest.raises(CheckpointError) as err:
        parse_checkpoint(data)
    assert isinstance(err.value, ValueError) and str(err.value)


# ---------------------------------------------------------------- round trips through render


ENTRIES = (
    CheckpointEntry(
        P1,
        "cuda",
        "nvidia.com/gpu",
        (G0,),
        {"0": (G0,)},
        {
            "envs": {"A": "1"},
            "mounts": [],
            "devices": [dev("/dev/nvidia0")],
            "annotations": {"k": "v"},
            "cdi_devices": [],
        },
    ),
    # device_ids follow the NUMA order (-1 first), each device once
    CheckpointEntry(P2, "w", "nvidia.com/gpu", (G1, G0), {"-1": (G1,), "0": (G0, G1)}, None),
    CheckpointEntry(
        P3, "<odd> & \u00e9\u2028\n", "nvidia.com/gpu.shared", (f"{G1}::0",), {"1": (f"{G1}::0",)}, None
    ),
)
REGISTERED = {"nvidia.com/gpu": (G0, G1), "nvidia.com/gpu.shared": (f"{G1}::0", f"{G1}::1")}


@pytest.mark.parametrize("fmt", ["v2", "v1"])
def test_round_trip(fmt: str) -> None:
    raw = render_checkpoint(ENTRIES, REGISTERED, fmt, boot_id="b")  # type: ignore[arg-type]
    cp = parse_checkpoint(raw)
    assert cp.format == fmt and cp.checksum_ok is True and cp.registered == REGISTERED
    expected = (
        ENTRIES
        if fmt == "v2"
        else tuple(
            CheckpointEntry(e.pod_uid, e.container, e.resource, e.device_ids, {}, e.alloc) for e in ENTRIES
        )
    )
    assert cp.entries == expected
    assert cp.boot_id == ("b" if fmt == "v2" else "")
    assert render_checkpoint(cp.entries, cp.registered, fmt) == render_checkpoint(ENTRIES, REGISTERED, fmt)  # type: ignore[arg-type]


def test_render_matches_go_encoding_details() -> None:
    raw = render_checkpoint(ENTRIES, REGISTERED)
    text = raw.decode()
    assert "\\u003codd\\u003e \\u0026 \u00e9\\u2028\\n" in text  # Go's HTML-safe escaping
    assert f'"DeviceIDs":{{"-1":["{G1}"],"0":' in text  # map keys sorted as strings
    assert text.startswith('{"Data":{"PodDeviceEntries":[{"PodUID":') and " " not in text.split("odd")[0]


def test_render_without_topology_or_entries() -> None:
    cp = parse_checkpoint(render_checkpoint([CheckpointEntry(P1, "c", "r", (G0,))], {}))
    assert cp.entries[0].numa == {"-1": (G0,)} and cp.checksum_ok is True
    raw = render_checkpoint([], {"r": ()})
    assert raw.startswith(b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"r":[]}}')
    assert parse_checkpoint(raw) == Checkpoint("v2", True, (), {"r": ()})
    with pytest.raises(ValueError):
        render_checkpoint([], {}, "v3")  # type: ignore[arg-type]


def test_ambiguous_null_device_ids_follow_the_checksum() -> None:
    v1 = render_checkpoint([CheckpointEntry(P1, "c", "r", ())], {}, "v1")
    assert b'"DeviceIDs":[]' in v1
    nulled = v1.replace(b'"DeviceIDs":[]', b'"DeviceIDs":null')
    # [] and null dump differently, so re-render the v1 checksum for the null form by hand
    from periscope.kubelet.checkpoint import _checksum

    raw = [(P1, "c", "r", None, None)]
    doc = json.loads(nulled)
    doc["Checksum"] = _checksum(raw, {}, "v1")  # type: ignore[arg-type]
    cp = parse_checkpoint(json.dumps(doc).encode())
    assert cp.format == "v1" and cp.checksum_ok is True
    doc["Checksum"] = _checksum(raw, {}, "v2")  # type: ignore[arg-type]
    cp = parse_checkpoint(json.dumps(doc).encode())
    assert cp.format == "v2" and cp.checksum_ok is True
