"""`python -m periscope.sim.controlplane [--kubeconfig PATH] [--runtime-config S] [--build-only]`.

Builds the test control plane if this checkout's build is not cached yet, starts it, writes an
administrator's kubeconfig and waits for Ctrl-C. Without Go (1.26+): one line, exit 2; a build or
start that fails: one line, exit 1.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from periscope.sim.controlplane.build import ControlPlaneUnavailable, GoMissing, ensure_built
from periscope.sim.controlplane.process import ControlPlane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m periscope.sim.controlplane",
        description="Run a real kube-apiserver with etcd on loopback.",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=Path("controlplane.kubeconfig"),
        help="where to write the administrator's kubeconfig",
    )
    parser.add_argument(
        "--runtime-config",
        default="",
        help="kube-apiserver --runtime-config, e.g. resource.k8s.io/v1=false,resource.k8s.io/v1beta1=true",
    )
    parser.add_argument(
        "--build-only", action="store_true", help="build (or find) the binary, print its path"
    )
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(f"controlplane: {line}", file=sys.stderr, flush=True)

    try:
        if args.build_only:
            print(ensure_built(say=say))
            return 0
        plane = ControlPlane(runtime_config=args.runtime_config, say=say).start()
    except GoMissing as e:  # the one thing a user must supply: exit 2, as for bad input
        print(f"periscope: controlplane: {e}", file=sys.stderr)
        return 2
    except ControlPlaneUnavailable as e:
        print(f"periscope: controlplane: {e}", file=sys.stderr)
        return 1
    try:
        path = plane.write_kubeconfig(args.kubeconfig)
        print(
            f"apiserver: {plane.server}\nkubeconfig: {path}\netcd: {plane.etcd}\nCtrl-C stops it.", flush=True
        )
        done = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: done.set())
        while not done.wait(0.5):
            if not plane.running():
                print(f"periscope: controlplane: exited: {plane.log_tail()}", file=sys.stderr)
                return 1
        return 0
    finally:
        plane.stop()


if __name__ == "__main__":
    sys.exit(main())
