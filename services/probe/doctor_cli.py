"""`periscope doctor [--json] [--root DIR]`: check every source the probe needs on this node.

Settings are the probe's own (`PERISCOPE_*`); `--root` re-bases them on a node filesystem tree: the
kubelet root is `<root>/var/lib/kubelet` (or `<root>/kubelet`, the simulator's layout), /proc is
`<root>/proc`, and a `<root>/nvml.json` (a simulated node's NVML state) selects the fake NVML.
Exit 0 when the probe can work (warnings allowed), 1 when a check fails, 2 on bad input.

What the sources answer is not trusted on its way to the terminal: every line is printed without
escape sequences or control characters (a GPU, process or error text may carry them), and the checks
together get one deadline (`--timeout`): a kubelet socket, driver or /proc file that never answers
ends doctor with one line instead of holding it.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import click

from periscope import config
from periscope.cli.errors import InputError
from periscope.cli.terminal import printable
from periscope.settings.probe import ProbeSettings
from services.probe.doctor import DoctorReport, diagnose


def settings_for(root: str | None, nvml_backend: str | None) -> ProbeSettings:
    """The probe's settings, re-based on `root` when given; bad values are one InputError line."""
    overrides: dict[str, Any] = {}
    if root is not None:
        base = Path(root)
        # os.path: a name too long is "not a directory", not an error; "" would be the working directory.
        if not root or not os.path.isdir(root):
            raise InputError(f"--root {root}: not a directory")
        kubelet = base / "var" / "lib" / "kubelet"
        if not os.path.isdir(kubelet) and os.path.isdir(base / "kubelet"):
            kubelet = base / "kubelet"
        overrides.update(
            kubelet_root=str(kubelet),
            podresources_socket=str(kubelet / "pod-resources" / "kubelet.sock"),
            checkpoint_path=str(kubelet / "device-plugins" / "kubelet_internal_checkpoint"),
            proc_root=str(base / "proc"),
        )
        if nvml_backend is None and os.path.isfile(base / "nvml.json"):
            overrides["nvml_backend"] = f"fake:{base / 'nvml.json'}"
    if nvml_backend is not None:
        overrides["nvml_backend"] = nvml_backend
    return config.load_settings(ProbeSettings, "doctor", error=InputError, **overrides)


_BREAKS = str.maketrans("\t\n\r\v\f", "     ")  # a detail spanning lines still prints as one


def render(report: DoctorReport) -> str:
    """One line per check: status, name, what was found and, unless ok, the fix."""
    width = max((len(c.name) for c in report.checks), default=0)
    lines = []
    for c in report.checks:
        line = f"{c.status:<4}  {c.name:<{width}}  {c.detail}"
        if c.status != "ok" and c.fix:
            line += f" -- fix: {c.fix}"
        lines.append(printable(line.translate(_BREAKS)))
    n = report.counts()
    verdict = "the probe can work here" if report.ok else "the probe cannot work here"
    lines.append(f"{verdict} ({n['ok']} ok, {n['warn']} warn, {n['fail']} fail)")
    return "\n".join(lines)


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of lines.")
@click.option(
    "--root",
    default=None,
    metavar="DIR",
    help="A node filesystem tree to check instead of this node (var/lib/kubelet, proc; or a "
    "simulated node's directory).",
)
@click.option(
    "--nvml-backend", default=None, metavar="pynvml|fake:PATH", help="NVML source [default pynvml]."
)
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 3600), default=60.0, show_default=True,
              help="Seconds all the checks together may take.")
def command(as_json: bool, root: str | None, nvml_backend: str | None, timeout_s: float) -> int:
    """Check every source the probe needs on this node (PodResources, checkpoint, NVML, /proc): one
    line each, ok / warn / fail with the fix. Exit 0 when the probe can work, 1 when it cannot."""
    settings = settings_for(root, nvml_backend)
    report = within(timeout_s, settings)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else render(report))
    return 0 if report.ok else 1


class NoAnswer(click.ClickException):
    """A source did not answer within the deadline: exit 1, one line."""

    exit_code = 1


def within(timeout_s: float, settings: ProbeSettings) -> DoctorReport:
    """`diagnose` on a thread of its own, waited for `timeout_s`: an NVML call or a read of a FIFO
    cannot be cancelled, so a hung check is left behind (a daemon thread) and reported."""
    done: list[DoctorReport] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(asyncio.run(diagnose(settings)))
        except BaseException as e:  # handed to the main thread, which reports it as its own
            failed.append(e)

    worker = threading.Thread(target=run, name="doctor", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if failed:
        raise failed[0]
    if not done:
        raise NoAnswer(f"doctor: the checks did not finish within {timeout_s:g}s (--timeout): a source hangs "
                       "(the kubelet socket, the NVIDIA driver or a file under the /proc root)")
    return done[0]
