"""The control plane's build and life: cached by its sources, reused without Go, one line without
Go, and never outliving the process that started it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from periscope.sim.controlplane import build
from periscope.sim.controlplane.build import GoMissing, binary_path, build_key, ensure_built
from tests.controlplane.conftest import needs_controlplane

PYTHON_ONLY = str(Path(sys.executable).parent)  # a PATH with python and no go


def test_the_cache_key_follows_go_sum_go_mod_and_the_go_sources(tmp_path: Path) -> None:
    src = tmp_path / "controlplane"
    shutil.copytree(build.SOURCE, src)
    key = build_key(src)
    assert key == build_key(build.SOURCE) and binary_path(src).parent.name == f"kube-apiserver-{key}"
    assert "kube-apiserver" in binary_path(src).name
    for name in ("go.sum", "go.mod", "main.go"):
        path = src / name
        original = path.read_bytes()
        path.write_bytes(original + b"\n// changed\n")
        assert build_key(src) != key, name
        path.write_bytes(original)
    (src / "README").write_text("not a source")  # anything else leaves the build as it is
    assert build_key(src) == key


def test_a_cached_build_is_reused_without_go(monkeypatch: pytest.MonkeyPatch) -> None:
    needs_controlplane()
    target = ensure_built()
    before = target.stat().st_mtime_ns
    monkeypatch.setenv("PATH", PYTHON_ONLY)
    assert ensure_built() == target and target.stat().st_mtime_ns == before


def test_without_go_the_module_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": PYTHON_ONLY, "XDG_CACHE_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "periscope.sim.controlplane", "--build-only"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr.count("\n") == 1 and "Go toolchain" in proc.stderr and "`go` was not found" in proc.stderr
    )


def test_a_go_older_than_needed_is_no_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "go"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho go1.19.8\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(GoMissing, match=r"needs Go 1\.26 or newer; .* is go1\.19\.8"):
        build.go_binary()


def test_the_control_plane_dies_with_its_owner(tmp_path: Path) -> None:
    needs_controlplane()
    owner = textwrap.dedent("""
        import sys, time
        from periscope.sim.controlplane.process import ControlPlane
        plane = ControlPlane().start()
        print(plane._proc.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", owner],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        assert _alive(child)
        os.kill(proc.pid, signal.SIGKILL)  # no cleanup runs in the owner
        proc.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the control plane outlived its owner"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
