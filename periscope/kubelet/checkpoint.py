"""The kubelet device-manager checkpoint (`device-plugins/kubelet_internal_checkpoint`).

It is the only node-local record that ties pod *UIDs* to device IDs (PodResources gives names only),
and it keeps each container's `ContainerAllocateResponse` (AllocResp). It is an internal format:
read it, never trust it blindly, never write the real one.

Layouts. v2 (kubelet >= 1.20): `{"Data": {"PodDeviceEntries": [{PodUID, ContainerName, ResourceName,
DeviceIDs: {"<numa>": [ids]}, AllocResp: base64}], "RegisteredDevices": {res: [ids]}}, "Checksum": N,
"BootID"?}`; a device without topology sits under NUMA "-1", one on several nodes under each.
v1 (<= 1.19) has a flat `DeviceIDs` list and carries no topology.

Checksum. The kubelet stores FNV-32a over a go-spew `%#v` dump of `Data` (`hashutil.DeepHashObject`,
config: SortKeys, DisableMethods). `_spew` reproduces that dump for exactly these Go types; for v1 it
replays the kubelet's trick of dumping the V1 types and renaming them to the v2 names. The result
matches checksums written by real kubelets (the unit tests carry two published files). When the
dump cannot be reproduced (an AllocResp that is not base64) or no checksum is stored, `checksum_ok`
is None: a mismatch is reported as data, and never makes a structurally valid file "corrupt".

Size. A kubelet's checkpoint is kilobytes (one entry of a few hundred bytes per container and
resource), while parsing costs about 20 times the file's size in memory and a second per MiB or two:
`read_checkpoint_file` reads at most MAX_CHECKPOINT_BYTES of a regular file and refuses a larger one
unread, so no file placed where the checkpoint belongs can take a node's memory.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from google.protobuf.message import DecodeError

from periscope.k8s.deviceplugin.v1beta1 import api_pb2

Format = Literal["v2", "v1"]
# One raw entry as Go holds it after json.Unmarshal: None is Go's nil.
_DeviceIDs = list[str] | dict[int, list[str] | None] | None
_Raw = tuple[str, str, str, _DeviceIDs, bytes | None]
_ENTRY_KEYS = ("PodUID", "ContainerName", "ResourceName", "DeviceIDs", "AllocResp")


# 110 pods (the kubelet's default maximum) x 8 GPUs x about 500 bytes is 440 KiB; ten times that.
MAX_CHECKPOINT_BYTES = 4 * 1024 * 1024


class CheckpointError(ValueError):
    """The bytes are not a device-manager checkpoint (not JSON, or not its structure)."""


class CheckpointTooLarge(CheckpointError):
    """The file is larger than any checkpoint a kubelet writes; it was not read."""


def read_checkpoint_file(path: str, limit: int = MAX_CHECKPOINT_BYTES) -> bytes:
    """A checkpoint file's bytes. CheckpointTooLarge beyond `limit` (the file is not read), CheckpointError
    for what is not a regular file (a FIFO or a device cannot stall or flood the reader), OSError when
    it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError("not a regular file")
        if st.st_size > limit:
            raise CheckpointTooLarge(_too_large(st.st_size, limit))
        data = f.read(limit + 1)  # it may have grown since the fstat
    if len(data) > limit:
        raise CheckpointTooLarge(_too_large(len(data), limit))
    return data


def _too_large(size: int, limit: int) -> str:
    mib = 1024 * 1024
    return (f"{size / mib:.1f} MiB, larger than the {limit // mib} MiB any kubelet checkpoint stays under "
            "(they are kilobytes): not read")


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    numa: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)  # v2 only
    alloc: dict[str, Any] | None = field(default=None, hash=False)  # decoded AllocResp


@dataclass(frozen=True, slots=True)
class Checkpoint:
    format: Format
    checksum_ok: bool | None
    entries: tuple[CheckpointEntry, ...]
    registered: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    boot_id: str = ""


# ---------------------------------------------------------------- reading


def parse_checkpoint(data: bytes) -> Checkpoint:
    """Parse checkpoint bytes; raise CheckpointError when they are not a checkpoint."""
    # Go's decoder replaces invalid UTF-8 instead of failing; do the same.
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("Data"), dict):
        raise CheckpointError('not a device-manager checkpoint (no "Data" object)')
    body = doc["Data"]
    checksum = doc.get("Checksum")
    if checksum is not None and (type(checksum) is not int or not 0 <= checksum < 2**64):
        raise CheckpointError(f'"Checksum" is not an unsigned integer: {_shown(checksum)}')
    boot_id = _opt_str(doc.get("BootID"), "BootID")

    raw_entries = body.get("PodDeviceEntries")
    if raw_entries is not None and not isinstance(raw_entries, list):
        raise CheckpointError('"PodDeviceEntries" is not a list')
    raws: list[_Raw] | None = None
    unreadable = False  # an AllocResp that is not base64: its bytes, so the dump, are unknown
    if raw_entries is not None:
        raws = []
        for i, e in enumerate(raw_entries):
            raw, bad = _raw_entry(e, i)
            raws.append(raw)
            unreadable |= bad
    registered = _registered(body.get("RegisteredDevices"))

    kinds = {type(r[3]) for r in raws or () if r[3] is not None}
    if len(kinds) > 1:
        raise CheckpointError("entries mix v1 (list) and v2 (per-NUMA) DeviceIDs")
    fmt: Format = "v1" if kinds == {list} else "v2"
    checksum_ok = None if checksum is None or unreadable else checksum == _checksum(raws, registered, fmt)
    # Only null DeviceIDs: the layout cannot tell v1 from v2, the checksum can (the kubelet, too,
    # falls back to v1 when v2 fails).
    if checksum_ok is False and not kinds and raws and checksum == _checksum(raws, registered, "v1"):
        fmt, checksum_ok = "v1", True

    entries = tuple(_entry(r) for r in raws or ())
    regs = {k: tuple(v or ()) for k, v in (registered or {}).items()}
    return Checkpoint(fmt, checksum_ok, entries, regs, boot_id)


def _shown(value: object) -> str:
    """A value from the file in an error message: its repr, at most 60 characters of it."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:50]}... ({type(value).__name__})"


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _opt_str(value: object, what: str) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    raise CheckpointError(f"{what} is not a string: {_shown(value)}")


def _str_list(value: object, what: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"{what} is not a list of strings")
    return value


def _raw_entry(e: object, i: int) -> tuple[_Raw, bool]:
    if not isinstance(e, dict):
        raise CheckpointError(f"PodDeviceEntries[{i}] is not an object")
    uid, ctr, res = (_opt_str(e.get(k), f"PodDeviceEntries[{i}].{k}") for k in _ENTRY_KEYS[:3])
    ids = e.get("DeviceIDs")
    devices: _DeviceIDs
    if isinstance(ids, dict):
        devices = {}
        for key, val in ids.items():
            if not re.fullmatch(r"[+-]?[0-9]+", key) or not -(2**63) <= int(key) < 2**63:
                raise CheckpointError(
                    f"PodDeviceEntries[{i}].DeviceIDs key {_shown(key)} is not a NUMA node id")
            devices[int(key)] = _str_list(val, f"PodDeviceEntries[{i}].DeviceIDs[{key}]")
    else:
        devices = _str_list(ids, f"PodDeviceEntries[{i}].DeviceIDs")
    resp = e.get("AllocResp")
    if resp is not None and not isinstance(resp, str):
        raise CheckpointError(f"PodDeviceEntries[{i}].AllocResp is not a base64 string")
    data = _b64(resp)
    return (uid, ctr, res, devices, data), resp is not None and data is None


def _b64(value: str | None) -> bytes | None:
    if value is None:
        return None
    try:  # Go's StdEncoding: padded, newlines skipped
        return base64.b64decode(value.replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        return None


def _registered(value: object) -> dict[str, list[str] | None] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CheckpointError('"RegisteredDevices" is not an object')
    return {k: _str_list(v, f"RegisteredDevices[{k}]") for k, v in value.items()}


def _entry(r: _Raw) -> CheckpointEntry:
    uid, ctr, res, ids, resp = r
    numa: dict[str, tuple[str, ...]] = {}
    if isinstance(ids, dict):
        numa = {str(k): tuple(ids[k] or ()) for k in sorted(ids)}
        flat = [d for devs in numa.values() for d in devs]
    else:
        flat = list(ids or ())
    return CheckpointEntry(uid, ctr, res, tuple(dict.fromkeys(flat)), numa, _alloc_json(resp))


def _alloc_json(resp: bytes | None) -> dict[str, Any] | None:
    if resp is None:
        return None
    try:
        msg = api_pb2.ContainerAllocateResponse.FromString(resp)
    except (DecodeError, RecursionError, ValueError):
        return None
    return {
        "envs": dict(sorted(msg.envs.items())),
        "mounts": [
            {"container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only}
            for m in msg.mounts
        ],
        "devices": [
            {"container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions}
            for d in msg.devices
        ],
        "annotations": dict(sorted(msg.annotations.items())),
        "cdi_devices": [c.name for c in msg.cdi_devices],
    }


def checkpoint_to_json(cp: Checkpoint) -> dict[str, Any]:
    """The `periscope inspect checkpoint --json` object."""
    return {
        "format": cp.format,
        "checksum_ok": cp.checksum_ok,
        "entries": [
            {
                "pod_uid": e.pod_uid,
                "container": e.container,
                "resource": e.resource,
                "device_ids": list(e.device_ids),
                "numa": {k: list(v) for k, v in sorted(e.numa.items(), key=lambda kv: int(kv[0]))},
                "alloc": e.alloc,
            }
            for e in cp.entries
        ],
        "registered": {k: list(v) for k, v in cp.registered.items()},
        "boot_id": cp.boot_id or None,
    }


# ---------------------------------------------------------------- the kubelet's checksum


def _gostr(s: str) -> str:
    # Go strings hold what its JSON decoder made of the text: lone surrogates become U+FFFD.
    return re.sub("[\ud800-\udfff]", "\ufffd", s)


def _slice(items: list[str] | None) -> str:
    return "<nil>" if items is None else "[" + " ".join(_gostr(s) for s in items) + "]"


def _spew(raws: list[_Raw] | None, registered: Mapping[str, list[str] | None] | None, fmt: Format) -> str:
    v1 = "V1" if fmt == "v1" else ""
    out = [f"(checkpoint.checkpointData{v1}){{PodDeviceEntries:([]checkpoint.PodDevicesEntry{v1})"]
    if raws is None:
        out.append("<nil>")
    else:
        items = []
        for uid, ctr, res, ids, resp in raws:
            if fmt == "v1":
                dev = "([]string)" + _slice(ids if not isinstance(ids, dict) else None)
            elif not isinstance(ids, dict):
                dev = "(checkpoint.DevicesPerNUMA)<nil>"
            else:
                pairs = " ".join(f"{k}:{_slice(ids[k])}" for k in sorted(ids))
                dev = f"(checkpoint.DevicesPerNUMA)map[{pairs}]"
            alloc = "<nil>" if resp is None else "[" + " ".join(str(b) for b in resp) + "]"
            items.append(
                f"{{PodUID:(string){_gostr(uid)} ContainerName:(string){_gostr(ctr)} "
                f"ResourceName:(string){_gostr(res)} DeviceIDs:{dev} AllocResp:([]uint8){alloc}}}"
            )
        out.append("[" + " ".join(items) + "]")
    out.append(" RegisteredDevices:(map[string][]string)")
    if registered is None:
        out.append("<nil>")
    else:
        # spew sorts string keys bytewise (Go's <), which for UTF-8 equals code point order.
        pairs = " ".join(f"{_gostr(k)}:{_slice(registered[k])}" for k in sorted(registered))
        out.append(f"map[{pairs}]")
    out.append("}")
    dump = "".join(out)
    if v1:  # checkpointv1.go: dump the V1 types, then rename them to what k8s <= 1.19 hashed
        dump = dump.replace("checkpointDataV1", "checkpointData", 1)
        dump = dump.replace("PodDevicesEntryV1", "PodDevicesEntry")
    return dump


def _checksum(raws: list[_Raw] | None, registered: Mapping[str, list[str] | None] | None, fmt: Format) -> int:
    h = 0x811C9DC5  # FNV-32a
    for byte in _spew(raws, registered, fmt).encode("utf-8"):
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


# ---------------------------------------------------------------- writing (simulated kubelets)


def render_checkpoint(
    entries: Iterable[CheckpointEntry],
    registered: Mapping[str, Iterable[str]],
    format: Format = "v2",
    *,
    boot_id: str = "",
) -> bytes:
    """The bytes a kubelet would write for these entries, checksum included.

    v2 takes each entry's `numa` map, or puts its devices under "-1" (no topology) when it is empty.
    """
    if format not in ("v2", "v1"):
        raise ValueError(f"unknown checkpoint format {format!r}")
    raws: list[_Raw] = []
    for e in entries:
        ids: _DeviceIDs
        if format == "v1":
            ids = list(e.device_ids)
        else:
            numa = e.numa or {"-1": e.device_ids}
            ids = {int(k): list(v) for k, v in numa.items()}
        raws.append((e.pod_uid, e.container, e.resource, ids, _alloc_bytes(e.alloc)))
    regs = {k: list(v) for k, v in registered.items()}
    checksum = _checksum(raws or None, regs, format)

    def entry_json(r: _Raw) -> str:
        uid, ctr, res, ids, resp = r
        if isinstance(ids, dict):  # Go sorts map keys as strings
            dev = "{" + ",".join(f"{_gojson(str(k))}:{_gojson(ids[k])}" for k in sorted(ids, key=str)) + "}"
        else:
            dev = _gojson(ids)
        alloc = "null" if resp is None else _gojson(base64.b64encode(resp).decode())
        vals = (_gojson(uid), _gojson(ctr), _gojson(res), dev, alloc)
        return "{" + ",".join(f'"{k}":{v}' for k, v in zip(_ENTRY_KEYS, vals, strict=True)) + "}"

    pods = "[" + ",".join(entry_json(r) for r in raws) + "]" if raws else "null"
    reg = "{" + ",".join(f"{_gojson(k)}:{_gojson(regs[k])}" for k in sorted(regs)) + "}"
    tail = f',"BootID":{_gojson(boot_id)}' if boot_id and format == "v2" else ""
    doc = f'{{"Data":{{"PodDeviceEntries":{pods},"RegisteredDevices":{reg}}},"Checksum":{checksum}{tail}}}'
    return doc.encode("utf-8", errors="replace")


def _alloc_bytes(alloc: Mapping[str, Any] | None) -> bytes | None:
    if alloc is None:
        return None
    msg = api_pb2.ContainerAllocateResponse(
        envs=dict(alloc.get("envs", {})),
        mounts=[api_pb2.Mount(**m) for m in alloc.get("mounts", ())],
        devices=[api_pb2.DeviceSpec(**d) for d in alloc.get("devices", ())],
        annotations=dict(alloc.get("annotations", {})),
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in alloc.get("cdi_devices", ())],
    )
    return msg.SerializeToString(deterministic=True)


_GO_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _gojson(value: str | list[str] | None) -> str:
    """encoding/json's output: compact, HTML-safe (<, >, & escaped), other non-ASCII kept."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_gojson(v) for v in value) + "]"
    out = []
    for ch in _gostr(value):
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ord(ch) < 0x20 or ch in "<>&\u2028\u2029":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
