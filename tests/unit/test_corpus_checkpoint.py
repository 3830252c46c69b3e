"""Golden tests over kubelet device-manager checkpoints in the layouts real kubelets write
(corpus/checkpoints.yaml names each file's source): v1 and v2, NUMA and "-1", MIG, time-slicing replicas,
each NVIDIA device-list strategy in AllocResp, BootID, a non-GPU resource beside the GPUs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from periscope.kubelet.checkpoint import checkpoint_to_json, parse_checkpoint
from services.probe.checkpoint_source import CheckpointSource

CORPUS = Path(__file__).parent / "data" / "corpus"
FILES: list[dict[str, Any]] = yaml.safe_load((CORPUS / "checkpoints.yaml").read_text())["files"]
_ALLOC_KEYS = ("envs", "mounts", "annotations", "cdi_devices")


def test_every_checkpoint_file_is_listed_with_its_source() -> None:
    listed = {(CORPUS / f["file"]).resolve() for f in FILES}
    on_disk = {p.resolve() for p in (CORPUS / "checkpoints").iterdir()}
    assert on_disk <= listed
    for f in FILES:
        assert (CORPUS / f["file"]).is_file() and len(f["source"]) > 40, f["file"]


@pytest.mark.parametrize("case", FILES, ids=[f["file"] for f in FILES])
def test_checkpoint_golden(case: dict[str, Any]) -> None:
    raw = (CORPUS / case["file"]).read_bytes()
    got = checkpoint_to_json(parse_checkpoint(raw))
    want = case["expect"]
    assert (got["format"], got["checksum_ok"], got["boot_id"]) == (
        want["format"], want["checksum_ok"], want["boot_id"]
    )  # fmt: skip
    assert {k: len(v) for k, v in got["registered"].items()} == want["registered"]
    if "entries" in want:
        assert len(got["entries"]) == len(want["entries"])
        for g, w in zip(got["entries"], want["entries"], strict=True):
            assert {k: g[k] for k in ("pod_uid", "container", "resource", "device_ids", "numa")} == {
                k: w[k] for k in ("pod_uid", "container", "resource", "device_ids", "numa")
            }
            assert g["alloc"] is not None
            for key in _ALLOC_KEYS:  # what is not named must be empty, as the plugin left it
                assert g["alloc"][key] == w.get(key, {} if key in ("envs", "annotations") else []), key


@pytest.mark.parametrize("case", FILES, ids=[f["file"] for f in FILES])
def test_probe_reads_only_the_gpu_entries(case: dict[str, Any]) -> None:
    entries, health = CheckpointSource(str(CORPUS / case["file"])).read()
    assert health.state == "ok" and health.detail.endswith("checksum ok")
    assert len(entries) == case["expect"]["probe_gpu_entries"]
    assert all(e.resource.startswith("nvidia.com/") and e.pod_uid for e in entries)


@pytest.mark.parametrize("case", [f for f in FILES if f["expect"].get("entries")], ids=lambda f: f["file"])
def test_an_edited_file_fails_its_checksum(case: dict[str, Any]) -> None:
    doc = json.loads((CORPUS / case["file"]).read_bytes())
    doc["Data"]["PodDeviceEntries"][0]["ContainerName"] += "x"
    assert parse_checkpoint(json.dumps(doc, separators=(",", ":")).encode()).checksum_ok is False


def test_files_are_go_encoding_json_output() -> None:
    """Compact, keys in struct order, no trailing newline: what json.Marshal + WriteFile leave."""
    for f in FILES:
        raw = (CORPUS / f["file"]).read_bytes()
        assert (
            not raw.endswith(b"\n") and b": " not in raw and raw.startswith(b'{"Data":{"PodDeviceEntries":')
        )
