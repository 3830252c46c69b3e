"""Building the test control plane (devkit/controlplane, a Go program) into a cache outside the checkout.

The binary lands in `${XDG_CACHE_HOME:-~/.cache}/periscope/kube-apiserver-<key>/`, where the key hashes
the program's go.sum together with its go.mod and Go sources: the same dependencies and code are built
once and reused by every later run (and every checkout); a change to any of them builds afresh. A cold
build compiles Kubernetes' apiserver and etcd from the Go module proxy and takes minutes; concurrent
builders wait on a lock for the first one. Without a Go toolchain nothing can be built:
`ControlPlaneUnavailable` says so in one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[3] / "devkit" / "controlplane"
BINARY = "periscope-kube-apiserver"
GO_REQUIRED = "1.26"


class ControlPlaneUnavailable(RuntimeError):
    """The control plane cannot be built or started here; the message is one line saying why."""


class GoMissing(ControlPlaneUnavailable):
    """No Go toolchain (new enough) to build with: the one reason a test tier may skip for."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "periscope"


def source_files(source: Path = SOURCE) -> list[Path]:
    return sorted([source / "go.mod", source / "go.sum", *source.glob("*.go")])


def build_key(source: Path = SOURCE) -> str:
    digest = hashlib.sha256()
    for path in source_files(source):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def binary_path(source: Path = SOURCE) -> Path:
    return cache_root() / f"kube-apiserver-{build_key(source)}" / BINARY


def kubernetes_version(source: Path = SOURCE) -> str:
    """The k8s.io/kubernetes release the program is built from, as its go.mod requires it."""
    found = re.search(r"^\s*k8s\.io/kubernetes\s+(v\S+)", (source / "go.mod").read_text(), re.M)
    return found.group(1) if found else "v0.0.0"


def go_binary() -> str:
    """The `go` on PATH, if it is GO_REQUIRED or newer."""
    go = shutil.which("go")
    if go is None:
        raise GoMissing(
            f"the test control plane needs the Go toolchain ({GO_REQUIRED} or newer) to build "
            "kube-apiserver from source, and `go` was not found on PATH"
        )
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout.strip()
    found = re.match(r"go(\d+)\.(\d+)", out)
    need = tuple(int(x) for x in GO_REQUIRED.split("."))
    if found is None or (int(found.group(1)), int(found.group(2))) < need:
        raise GoMissing(f"the test control plane needs Go {GO_REQUIRED} or newer; {go} is {out or 'unknown'}")
    return go


def _ldflags(source: Path) -> str:
    # What /version reports: the release the code is, not Go's "v0.0.0-master" default.
    version = kubernetes_version(source)
    major, minor = [*version.lstrip("v").split("."), "0", "0"][:2]
    pkg = "k8s.io/component-base/version"
    stamps = {"gitVersion": version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
    return " ".join(["-s", "-w", *(f"-X {pkg}.{k}={v}" for k, v in stamps.items())])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def check_buildable(source: Path = SOURCE) -> None:
    """Raise `ControlPlaneUnavailable` unless `ensure_built` can succeed without building, or has a Go
    toolchain to build with: what a command line checks before it starts anything."""
    if not (source / "go.mod").is_file():
        raise ControlPlaneUnavailable(f"the control plane's Go source is not at {source}")
    if not binary_path(source).is_file():
        go_binary()


def ensure_built(source: Path = SOURCE, say: Callable[[str], None] | None = None) -> Path:
    """The cached binary, built first when this source has none yet."""
    check_buildable(source)
    target = binary_path(source)
    if target.is_file():
        return target
    go = go_binary()
    with _locked(target.parent / ".build.lock"):
        if target.is_file():  # another process built it while we waited
            return target
        if say is not None:
            say(
                f"building the test control plane (kube-apiserver {kubernetes_version(source)} and etcd "
                f"from source) into {target.parent}; the first build takes several minutes"
            )
        started = time.monotonic()
        partial = target.with_suffix(".partial")
        # No VCS stamp: the source sits in the checkout, and the binary must not depend on its git state.
        cmd = [
            go,
            "build",
            "-trimpath",
            "-buildvcs=false",
            "-ldflags",
            _ldflags(source),
            "-o",
            str(partial),
            ".",
        ]
        env = {**os.environ, "CGO_ENABLED": "0"}
        done = subprocess.run(cmd, cwd=source, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise ControlPlaneUnavailable(f"go build of the test control plane failed: {tail}")
        partial.replace(target)
        if say is not None:
            say(f"built {target.name} in {time.monotonic() - started:.0f}s")
    return target
