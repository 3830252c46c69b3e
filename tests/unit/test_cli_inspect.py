"""The `periscope` entry point, run as a real process: output contracts and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from periscope.cli.main import COMMANDS
from periscope.kubelet.checkpoint import checkpoint_to_json, parse_checkpoint

DATA = Path(__file__).parent / "data"
BIN = Path(sys.executable).parent / "periscope"
U = "5a1d7c3e-0b2f-4c6d-9e8f-1a2b3c4d5e6f"
C = "3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e"

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="the periscope console script is not installed")


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True, timeout=60)


def assert_input_error(proc: subprocess.CompletedProcess[str], *mentions: str) -> str:
    """Exit 2, nothing on stdout, exactly one `periscope: ...` line on stderr naming the input."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("periscope: ")
    for m in mentions:
        assert m in lines[0]
    assert proc.stdout == ""
    return lines[0]


def test_help_lists_every_command() -> None:
    proc = run("--help")
    assert proc.returncode == 0 and proc.stderr == ""
    for name in COMMANDS:
        assert f"\n  {name} " in proc.stdout
    bare = run()
    assert bare.returncode == 0 and "Commands:" in bare.stdout


@pytest.mark.parametrize(
    "args", [["inspect"], ["inspect", "checkpoint"], ["inspect", "cgroup"], ["inspect", "device-id"]]
)
def test_inspect_help(args: list[str]) -> None:
    proc = run(*args, "--help")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith(f"Usage: periscope {' '.join(args)}")


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "inspect"])
def test_other_commands_help_or_one_line_when_absent(name: str) -> None:
    proc = run(name, "--help")
    if proc.returncode == 0:
        assert f"Usage: periscope {name}" in proc.stdout
    else:
        assert_input_error(proc, f"command '{name}' is not available")


def run_with_extra_command(module: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import periscope.cli.main as m\n"
        f"m.COMMANDS['ghost'] = ({module!r}, 'command', 'a command from elsewhere')\n"
        "m.main(['ghost', '--help'])\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_missing_command_module_exits_2_with_one_line(tmp_path: Path) -> None:
    line = assert_input_error(run_with_extra_command("periscope.no_such_module", tmp_path), "'ghost'")
    assert "module periscope.no_such_module is missing" in line
    # the module is there but one of its dependencies is not
    (tmp_path / "ghost_cli.py").write_text("import no_such_dependency_xyz\n")
    line = assert_input_error(run_with_extra_command("ghost_cli", tmp_path), "'ghost'")
    assert "needs module no_such_dependency_xyz" in line
    # the module imports but has no click command by that name
    (tmp_path / "empty_cli.py").write_text("command = 42\n")
    assert_input_error(run_with_extra_command("empty_cli", tmp_path), "no click command")


# ---------------------------------------------------------------- inspect checkpoint


@pytest.mark.parametrize("name", ["checkpoint_v2_published", "checkpoint_v2_numa", "checkpoint_v1"])
def test_checkpoint_json(name: str) -> None:
    proc = run("inspect", "checkpoint", DATA / name, "--json")
    assert proc.returncode == 0 and proc.stderr == ""
    got = json.loads(proc.stdout)
    assert got == checkpoint_to_json(parse_checkpoint((DATA / name).read_bytes()))
    assert got["checksum_ok"] is True
    assert list(got) == ["format", "checksum_ok", "entries", "registered", "boot_id"]
    assert list(got["entries"][0]) == ["pod_uid", "container", "resource", "device_ids", "numa", "alloc"]


def test_checkpoint_json_values() -> None:
    got = json.loads(run("inspect", "checkpoint", DATA / "checkpoint_v2_numa", "--json").stdout)
    assert got["format"] == "v2"
    assert [e["numa"] for e in got["entries"]][1] == {
        "0": ["GPU-0b6ab3a2-5b6c-4f4e-9d55-2a1f3c4d5e60"],
        "1": ["GPU-0b6ab3a2-5b6c-4f4e-9d55-2a1f3c4d5e60", "GPU-1c7bc4b3-6c7d-405f-8e66-3b2a4d5e6f71"],
    }
    assert got["entries"][2]["alloc"] is None


def test_checkpoint_table() -> None:
    proc = run("inspect", "checkpoint", DATA / "checkpoint_v2_numa")
    assert proc.returncode == 0 and proc.stderr == ""
    out = proc.stdout
    assert "format v2, checksum ok, 3 entries" in out
    for text in (
        U,
        "trainer",
        "nvidia.com/mig-1g.10gb",
        "GPU-1c7bc4b3-6c7d-405f-8e66-3b2a4d5e6f71::2",
        "Registered devices",
        "0: 1, 1: 2",
    ):
        assert text in out


def test_checkpoint_table_reports_mismatch(tmp_path: Path) -> None:
    f = tmp_path / "kubelet_internal_checkpoint"
    f.write_bytes((DATA / "checkpoint_v2_published").read_bytes().replace(b'"app"', b'"app2"'))
    proc = run("inspect", "checkpoint", f)
    assert proc.returncode == 0 and "checksum MISMATCH" in proc.stdout


def test_checkpoint_bad_inputs(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert "no such file" in assert_input_error(run("inspect", "checkpoint", missing), str(missing))
    assert "directory" in assert_input_error(run("inspect", "checkpoint", tmp_path), str(tmp_path))
    corrupt = tmp_path / "kubelet_internal_checkpoint"
    corrupt.write_bytes(b'{"Data":{"PodDeviceEntries":[{"PodUID":"x"')  # a torn write
    assert "corrupt" in assert_input_error(run("inspect", "checkpoint", corrupt, "--json"), str(corrupt))
    corrupt.write_bytes(b"\x00\xff\x13garbage")
    assert "corrupt" in assert_input_error(run("inspect", "checkpoint", corrupt), str(corrupt))


# ---------------------------------------------------------------- inspect cgroup / device-id


def test_cgroup_json(tmp_path: Path) -> None:
    f = tmp_path / "cgroup"
    u = U.replace("-", "_")
    path = (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{C}.scope"
    )
    f.write_text(f"0::{path}\n")
    proc = run("inspect", "cgroup", f)
    assert proc.returncode == 0 and proc.stderr == ""
    assert json.loads(proc.stdout) == {
        "pod_uid": U, "container_id": C, "qos": "burstable", "runtime": "containerd", "driver": "systemd",
        "cgroup_version": 2, "path": path,
    }  # fmt: skip


def test_cgroup_bad_inputs(tmp_path: Path) -> None:
    missing = tmp_path / "cgroup"
    assert_input_error(run("inspect", "cgroup", missing), str(missing))
    assert_input_error(run("inspect", "cgroup", tmp_path), str(tmp_path))
    f = tmp_path / "status"
    f.write_text("Name:\tbash\nState:\tS (sleeping)\n")
    assert "not a cgroup file" in assert_input_error(run("inspect", "cgroup", f), str(f))
    f.write_bytes(b"\xff\xfe\x00binary")
    assert "not a cgroup file" in assert_input_error(run("inspect", "cgroup", f), str(f))


def test_device_id_json() -> None:
    proc = run("inspect", "device-id", "MIG-GPU-8a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d/1/0")
    assert proc.returncode == 0 and proc.stderr == ""
    assert json.loads(proc.stdout) == {
        "kind": "mig", "uuid": "MIG-GPU-8a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d/1/0", "replica": None,
        "parent_uuid": "GPU-8a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d", "gi": 1, "ci": 0, "index": None,
        "minor": None,
    }  # fmt: skip
    gke = json.loads(run("inspect", "device-id", "nvidia0/gi1").stdout)
    assert gke["kind"] == "gke-mig" and gke["index"] == 0 and gke["gi"] == 1
    assert gke["minor"] == 0  # GKE's number is the device minor


@pytest.mark.parametrize("bad", ["bogus", "GPU-123::x", "nvidia0/gi"])
def test_device_id_bad(bad: str) -> None:
    assert_input_error(run("inspect", "device-id", bad), repr(bad))


@pytest.mark.parametrize(
    ("args", "mention"),
    [
        (["inspect", "checkpoint"], "Missing argument"),
        (["inspect", "checkpoint", "x", "--bogus"], "--bogus"),
        (["inspect", "nosuch"], "nosuch"),
        (["nosuch"], "nosuch"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str], mention: str) -> None:
    assert_input_error(run(*args), mention)
