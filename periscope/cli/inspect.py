"""`periscope inspect`: look at the node-local inputs the probe reads, one file or ID at a time."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from periscope.cli.errors import InputError, read_input_file
from periscope.core.cgroup import parse_cgroup
from periscope.core.deviceid import parse_device_id
from periscope.kubelet.checkpoint import (
    MAX_CHECKPOINT_BYTES,
    Checkpoint,
    CheckpointError,
    checkpoint_to_json,
    parse_checkpoint,
)


def _print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2))


@click.group("inspect")
def inspect() -> None:
    """Parse a kubelet checkpoint, a /proc/<pid>/cgroup file or a kubelet device ID."""


@inspect.command("checkpoint", short_help="Parse a kubelet device-manager checkpoint.")
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def checkpoint(path: str, as_json: bool) -> None:
    """Parse a kubelet device-manager checkpoint (kubelet_internal_checkpoint), read-only."""
    data = read_input_file(path, "checkpoint", limit=MAX_CHECKPOINT_BYTES)
    try:
        cp = parse_checkpoint(data)
    except CheckpointError as exc:
        raise InputError(f"checkpoint {path}: corrupt: {exc}") from None
    if as_json:
        _print_json(checkpoint_to_json(cp))
    else:
        _print_tables(cp, path)


@inspect.command("cgroup", short_help="Parse a /proc/<pid>/cgroup file.")
@click.argument("path")
def cgroup(path: str) -> None:
    """Parse a /proc/<pid>/cgroup file: pod UID, container ID, QoS class (JSON)."""
    data = read_input_file(path, "cgroup file", limit=1024 * 1024)
    try:
        info = parse_cgroup(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"cgroup file {path}: not a cgroup file (not text)") from None
    except ValueError as exc:
        raise InputError(f"cgroup file {path}: not a cgroup file ({exc})") from None
    _print_json(info.to_json())


@inspect.command("device-id", short_help="Parse a kubelet device ID.")
@click.argument("device_id", metavar="ID")
def device_id(device_id: str) -> None:
    """Parse a kubelet device ID (GPU-..., GPU-...::3, MIG-..., MIG-GPU-.../gi/ci, nvidia0/gi1) (JSON)."""
    try:
        parsed = parse_device_id(device_id)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    _print_json(parsed.to_json())


def _print_tables(cp: Checkpoint, path: str) -> None:
    # A fixed width when piped: rich's 80-column default would fold every UUID.
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    checksum = {True: "ok", False: "MISMATCH", None: "not verified"}[cp.checksum_ok]
    head = Text(f"{path}: format {cp.format}, checksum {checksum}, {len(cp.entries)} entries")
    if cp.boot_id:
        head.append(f", boot ID {cp.boot_id}")
    console.print(head)

    table = Table(title="Allocations", title_justify="left")
    for col in ("pod UID", "container", "resource", "device IDs", "NUMA", "AllocResp"):
        table.add_column(col, overflow="fold")
    for e in cp.entries:
        numa = ", ".join(f"{node}: {len(ids)}" for node, ids in e.numa.items()) or "-"
        table.add_row(
            Text(e.pod_uid), Text(e.container), Text(e.resource),
            Text("\n".join(e.device_ids) or "-"), Text(numa), Text(_alloc_summary(e.alloc)),
        )  # fmt: skip
    console.print(table)

    reg = Table(title="Registered devices", title_justify="left")
    reg.add_column("resource")
    reg.add_column("count", justify="right")
    reg.add_column("device IDs", overflow="fold")
    for resource, ids in sorted(cp.registered.items()):
        reg.add_row(Text(resource), str(len(ids)), Text("\n".join(ids) or "-"))
    console.print(reg)


def _alloc_summary(alloc: dict[str, Any] | None) -> str:
    if alloc is None:
        return "-"
    parts = [f"{k}={v}" for k, v in alloc["envs"].items()]
    for key in ("devices", "mounts", "annotations"):
        if alloc[key]:
            parts.append(f"{key}: {len(alloc[key])}")
    if alloc.get("cdi_devices"):
        parts.append("CDI " + ", ".join(alloc["cdi_devices"]))
    return "\n".join(parts) or "empty"
