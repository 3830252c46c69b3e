"""Kubelet device IDs -> what hardware they name.

The kubelet only ever sees opaque device IDs (PodResources `device_ids`, the device-manager
checkpoint). Which physical GPU or MIG slice an ID names depends on the plugin that advertised it:

- NVIDIA k8s-device-plugin: the NVML UUID, `GPU-<uuid>` or `MIG-<uuid>`; time-slicing/MPS replicas
  append `::<n>` (`GPU-<uuid>::3`).
- Drivers R450/R460 named MIG devices `MIG-GPU-<gpu-uuid>/<gi>/<ci>`: the parent is in the name.
- HAMi's device plugin splits each card into virtual devices `GPU-<uuid>-<n>` (`%v-%v` of the card's
  UUID and a slot number): shared like a time-slicing replica. The kubelet picks the slot, HAMi's
  scheduler the card, so the card named here can differ from the one the container got (the AllocResp's
  NVIDIA_VISIBLE_DEVICES says which; periscope.core.allocation prefers it).
- GKE's own plugin: `nvidia<minor>`, `nvidia<minor>/gi<gi>` (MIG) and `/vgpu<n>` (time-sharing). The
  number is the device minor (`/dev/nvidia<minor>`, nvmlDeviceGetMinorNumber), not the NVML index: the
  plugin formats `nvidia%d` from the minor and finds MIG devices under `capabilities/gpu<minor>/mig/gi<G>`.

UUIDs must have the canonical 8-4-4-4-12 hex shape NVML prints; anything else is rejected rather than
guessed at, because a wrong parse would attribute a GPU to the wrong pod.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

DeviceKind = Literal["gpu", "mig", "gke-gpu", "gke-mig"]

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_NUM = r"(?:0|[1-9][0-9]*)"
_REPLICA = re.compile(rf"^(?P<base>.*)::(?P<replica>{_NUM})$")
_GPU = re.compile(rf"^GPU-{_UUID}$")
_MIG = re.compile(rf"^MIG-{_UUID}$")
_MIG_OLD = re.compile(rf"^MIG-(?P<parent>GPU-{_UUID})/(?P<gi>{_NUM})/(?P<ci>{_NUM})$")
_HAMI = re.compile(rf"^(?P<base>GPU-{_UUID})-(?P<replica>{_NUM})$")
_GKE = re.compile(rf"^nvidia(?P<minor>{_NUM})(?:/gi(?P<gi>{_NUM}))?(?:/vgpu(?P<vgpu>{_NUM}))?$")


@dataclass(frozen=True, slots=True)
class DeviceId:
    """One parsed kubelet device ID. `uuid` is the NVML UUID (with its `GPU-`/`MIG-` prefix)."""

    raw: str
    kind: DeviceKind
    uuid: str | None = None
    replica: int | None = None
    parent_uuid: str | None = None
    gi: int | None = None
    ci: int | None = None
    minor: int | None = None  # device minor (GKE IDs)

    @property
    def base(self) -> str:
        """The ID without its sharing replica (`::N`, HAMi's `-N`, GKE's `/vgpuN`): the device itself."""
        if self.replica is None:
            return self.raw
        if self.kind in ("gke-gpu", "gke-mig"):
            return self.raw.rsplit("/vgpu", 1)[0]
        if self.hami:
            return self.raw.rsplit("-", 1)[0]
        return self.raw.rsplit("::", 1)[0]

    @property
    def hami(self) -> bool:
        """A HAMi virtual device (`GPU-<uuid>-<n>`)."""
        return self.kind == "gpu" and self.replica is not None and "::" not in self.raw

    @property
    def gpu_uuid(self) -> str | None:
        """The physical GPU's UUID when the ID alone tells it (whole GPUs and old-style MIG names)."""
        return self.parent_uuid if self.kind == "mig" else self.uuid

    def to_json(self) -> dict[str, str | int | None]:
        """The `periscope inspect device-id` object."""
        return {
            "kind": self.kind,
            "uuid": self.uuid,
            "replica": self.replica,
            "parent_uuid": self.parent_uuid,
            "gi": self.gi,
            "ci": self.ci,
            # GKE's N, under the name the JSON always had: it is the device minor, as `minor` says
            "index": self.minor,
            "minor": self.minor,
        }


def parse_device_id(raw: str) -> DeviceId:
    """Parse one kubelet device ID; raise ValueError (with the reason) when it is none we know."""
    if not isinstance(raw, str):
        raise ValueError(f"device ID must be a string, not {type(raw).__name__}")
    if not raw or raw != raw.strip():
        raise ValueError(f"not a device ID: {raw!r} (empty or surrounded by whitespace)")

    if raw.startswith("nvidia"):
        m = _GKE.match(raw)
        if m is None:
            raise ValueError(f"not a GKE device ID: {raw!r} (expected nvidiaN, nvidiaN/giG or nvidiaN/vgpuR)")
        gi, vgpu = m.group("gi"), m.group("vgpu")
        return DeviceId(
            raw=raw,
            kind="gke-mig" if gi is not None else "gke-gpu",
            minor=int(m.group("minor")),
            gi=int(gi) if gi is not None else None,
            replica=int(vgpu) if vgpu is not None else None,
        )

    base, replica = raw, None
    rm = _REPLICA.match(raw)
    if rm is not None:
        base, replica = rm.group("base"), int(rm.group("replica"))
    elif "::" in raw:
        raise ValueError(f"bad replica suffix in device ID {raw!r} (expected ::N with N a number)")

    if _GPU.match(base):
        return DeviceId(raw=raw, kind="gpu", uuid=base, replica=replica)
    hami = _HAMI.match(raw)
    if hami is not None:
        return DeviceId(raw=raw, kind="gpu", uuid=hami.group("base"), replica=int(hami.group("replica")))
    if _MIG.match(base):
        return DeviceId(raw=raw, kind="mig", uuid=base, replica=replica)
    old = _MIG_OLD.match(base)
    if old is not None:
        return DeviceId(
            raw=raw,
            kind="mig",
            uuid=base,
            replica=replica,
            parent_uuid=old.group("parent"),
            gi=int(old.group("gi")),
            ci=int(old.group("ci")),
        )
    if base.startswith(("GPU-", "MIG-")):
        raise ValueError(f"malformed UUID in device ID {raw!r} (expected GPU-/MIG- and 8-4-4-4-12 hex)")
    raise ValueError(
        f"not a device ID: {raw!r} (expected GPU-..., GPU-...-N, MIG-..., MIG-GPU-.../gi/ci or nvidiaN...)"
    )
