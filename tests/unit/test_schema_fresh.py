"""The committed protobuf code must be what `make proto` generates from protos/ right now."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from periscope.schema.generate import ROOT, generate

pytest.importorskip("grpc_tools")


def stale_files(produced: list[Path], out: Path) -> list[str]:
    """Generated files that are missing from the tree or differ from the committed ones."""
    stale = []
    for rel in produced:
        committed = ROOT / rel
        if not committed.exists():
            stale.append(rel.as_posix())
        elif rel.name != "__init__.py" and committed.read_bytes() != (out / rel).read_bytes():
            stale.append(rel.as_posix())  # package __init__ files may carry code of their own
    return stale


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    produced = generate(out=tmp_path)
    dirs = {p.parent.as_posix() for p in produced if p.name.endswith("_pb2.py")}
    assert {"periscope/v1", "periscope/k8s/podresources/v1", "periscope/k8s/deviceplugin/v1beta1"} <= dirs
    stale = stale_files(produced, tmp_path)
    assert not stale, f"generated code is stale or missing, run `make proto`: {stale}"


def test_a_proto_change_is_detected(tmp_path: Path) -> None:
    root, out = tmp_path / "root", tmp_path / "out"
    shutil.copytree(ROOT / "protos", root / "protos")
    proto = root / "protos" / "k8s" / "deviceplugin" / "v1beta1" / "api.proto"
    proto.write_text(proto.read_text() + "\nmessage AddedWithoutMakeProto {\n  string x = 1;\n}\n")
    stale = stale_files(generate(root=root, out=out), out)
    assert "periscope/k8s/deviceplugin/v1beta1/api_pb2.py" in stale
