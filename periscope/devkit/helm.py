"""Helm for the chart's tests and for developers: the `helm` command, built from source once.

The Go module in helm_tool/ pins helm.sh/helm/v3 (go.mod, with every dependency's hash in go.sum).
`go build` turns it into `${XDG_CACHE_HOME:-~/.cache}/periscope/helm-<version>-<hash>/helm`, keyed by
those two files and the build flags, and it is reused afterwards. The flags are the ones of Helm's own
Makefile: the version `helm version` prints, and the Kubernetes version that `helm template` and
`helm lint` assume, taken from the client-go that Helm is built with. Without Go (1.26 or newer)
`HelmUnavailable` says so in one line.

    python -m periscope.devkit.helm                                # build if needed, print the path
    python -m periscope.devkit.helm lint deploy/helm/periscope     # run helm with these arguments
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from periscope.devkit.apache_kafka import cache_root

TOOL = Path(__file__).with_name("helm_tool")
_INSTALL_HINT = "install Go 1.26 or newer (https://go.dev/doc/install) and put `go` on PATH"
_GO_FALLBACK = Path("/usr/local/go/bin/go")  # where the official Go archive installs it


class HelmUnavailable(RuntimeError):
    """helm cannot be built here (no Go, or the build failed); the message is one line."""


def _required(module: str, gomod: str) -> str:
    found = re.search(rf"^\s*{re.escape(module)} (v\S+)", gomod, re.MULTILINE)
    if found is None:
        raise HelmUnavailable(f"{TOOL / 'go.mod'} does not require {module}")
    return found.group(1)


def helm_version(tool: Path = TOOL) -> str:
    return _required("helm.sh/helm/v3", (tool / "go.mod").read_text())


def ldflags(tool: Path = TOOL) -> str:
    """Helm's Makefile: the version, and Kubernetes 1.<client-go minor> as the default capabilities."""
    gomod = (tool / "go.mod").read_text()
    minor = _required("k8s.io/client-go", gomod).split(".")[1]
    flags = ["-s", "-w", f"-X helm.sh/helm/v3/internal/version.version={helm_version(tool)}"]
    for pkg in ("pkg/lint/rules", "pkg/chartutil"):
        flags += [f"-X helm.sh/helm/v3/{pkg}.k8sVersionMajor=1",
                  f"-X helm.sh/helm/v3/{pkg}.k8sVersionMinor={minor}"]
    return " ".join(flags)


def _go() -> str:
    found = shutil.which("go") or (str(_GO_FALLBACK) if os.access(_GO_FALLBACK, os.X_OK) else None)
    if found is None:
        raise HelmUnavailable(f"building helm needs Go on PATH: {_INSTALL_HINT}")
    return found


def home(tool: Path = TOOL) -> Path:
    digest = hashlib.sha256()
    for part in ((tool / "go.mod").read_bytes(), (tool / "go.sum").read_bytes(), ldflags(tool).encode()):
        digest.update(part)
    return cache_root() / f"helm-{helm_version(tool)}-{digest.hexdigest()[:12]}"


def binary(tool: Path = TOOL) -> Path:
    """The helm executable, built on first use (minutes on a small machine) and reused afterwards.

    A lock keeps two first uses (two test sessions) from building into the same place at once."""
    where = home(tool)
    helm = where / "helm"
    if (where / "complete").exists():
        return helm
    go = _go()
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (where / "complete").exists():
            return helm
        staging = Path(tempfile.mkdtemp(prefix="build-", dir=where))
        # Pinned and local: the go.sum hashes, this Go (no toolchain download), no go.work around us.
        env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOWORK": "off",
               "GOFLAGS": "-mod=readonly -buildvcs=false"}
        argv = [go, "build", "-trimpath", "-ldflags", ldflags(tool), "-o", str(staging / "helm"),
                "helm.sh/helm/v3/cmd/helm"]
        started = time.monotonic()
        done = subprocess.run(argv, cwd=tool, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise HelmUnavailable(f"go build of helm {helm_version(tool)} failed: " + " | ".join(tail))
        (staging / "helm").rename(helm)
        shutil.rmtree(staging, ignore_errors=True)
        (where / "complete").write_text(f"{helm_version(tool)} built in {time.monotonic() - started:.0f}s\n")
    return helm


def main(argv: list[str]) -> int:
    try:
        helm = binary()
    except HelmUnavailable as e:
        print(f"periscope: helm: {e}", file=sys.stderr)
        return 1
    if not argv:
        print(helm)
        return 0
    return subprocess.run([str(helm), *argv], check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
