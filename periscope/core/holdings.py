"""Per-sample lookups derived from a node's holdings, built once per holdings list.

A node's state caches its holdings while allocations, pods and inventory stay the same (for most
samples: periscope.core.state), and with them this index, so the groupings every sample needs (holders
per measured unit, per GPU, the owners of each GPU) are built once per holdings list, not per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from periscope.core.allocation import Holding
from periscope.core.model import Owner


def owner_of(h: Holding) -> Owner:
    return Owner(h.pod_uid, h.namespace, h.pod, h.container, h.device.device_id)


def owners_of(hs: Sequence[Holding]) -> tuple[Owner, ...]:
    return tuple(sorted((owner_of(h) for h in hs), key=lambda o: (o.device_id, o.pod_uid, o.container)))


def _same_or(known: tuple[Holding, ...] | None, hs: tuple[Holding, ...]) -> tuple[Holding, ...]:
    return known if known == hs else hs


@dataclass(slots=True)
class HoldingIndex:
    holdings: list[Holding]  # the list indexed
    # Identified holders of a resolved device, per measured unit (GPU or MIG instance), with row keys.
    # (Tuples, not the lists they are built in: a list grown by append holds room for 4.)
    by_instance: dict[str, tuple[tuple[Holding, ...], tuple[tuple[str, str, str], ...]]] = field(
        default_factory=dict)
    ambiguous: tuple[Holding, ...] = ()  # holders not identified unambiguously
    unresolved: tuple[Holding, ...] = ()  # identified holders of a device no known GPU stands for
    by_gpu: dict[str, tuple[Holding, ...]] = field(default_factory=dict)  # every holding, per physical GPU
    held_rows: int = 0  # how many distinct row keys `by_instance` holds (their set: `held_keys`)
    held_pods: tuple[str, ...] = ()  # and their pods, each once (a tuple: a set of them costs ~6x)
    _owners: dict[str, tuple[Owner, ...]] = field(default_factory=dict)
    _held_keys: frozenset[tuple[str, str, str]] | None = None

    @classmethod
    def build(cls, holdings: list[Holding]) -> HoldingIndex:
        ix = cls(holdings)
        by_gpu: dict[str, list[Holding]] = {}
        ambiguous: list[Holding] = []
        unresolved: list[Holding] = []
        by_instance: dict[str, tuple[list[Holding], list[tuple[str, str, str]]]] = {}
        for h in holdings:
            by_gpu.setdefault(h.device.gpu_uuid, []).append(h)
            if not h.pod_uid:
                ambiguous.append(h)
            elif h.device.gpu_uuid:
                hs, keys = by_instance.setdefault(h.device.instance, ([], []))
                hs.append(h)
                keys.append(h.key)
            else:
                unresolved.append(h)
        ix.ambiguous = tuple(ambiguous)
        ix.unresolved = tuple(unresolved)
        ix.by_instance = {i: (tuple(hs), tuple(keys)) for i, (hs, keys) in by_instance.items()}
        # A whole GPU's holders are usually its instance's too: the same tuple then serves both.
        same = {g: hs for g, (hs, _) in ix.by_instance.items()}
        ix.by_gpu = {g: _same_or(same.get(g), tuple(hs)) for g, hs in by_gpu.items()}
        held = {k: None for _, keys in ix.by_instance.values() for k in keys}  # distinct, in order
        held.update((h.key, None) for h in unresolved)
        ix.held_rows = len(held)
        ix.held_pods = tuple({k[0]: None for k in held})
        return ix

    def held_keys(self) -> frozenset[tuple[str, str, str]]:
        """The row keys of `by_instance`, built when first asked for (only while the node keeps rows
        nobody holds: most of the time every row is held, and the set would only cost memory)."""
        got = self._held_keys
        if got is None:
            held = [k for _, keys in self.by_instance.values() for k in keys]
            got = self._held_keys = frozenset([*held, *(h.key for h in self.unresolved)])
        return got

    def owners(self, gpu_uuid: str) -> tuple[Owner, ...]:
        """The owners of a whole GPU, sorted as GpuState shows them."""
        got = self._owners.get(gpu_uuid)
        if got is None:
            got = self._owners[gpu_uuid] = owners_of(self.by_gpu.get(gpu_uuid, ()))
        return got
