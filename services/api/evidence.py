"""What the API refuses to believe: records that cannot be true, whoever wrote them to the broker.

The joiner's outputs are the API's data, but a record on an output topic proves only that someone
could write there. Two checks need no trust in that someone:

- time: a record's event time may be at most `max_skew_ms` ahead of the API's own event-time clock
  (the wall clock; the simulated clock under `periscope up`). Neither the newest time the view holds
  (made of outputs: a forger walks it forward a step at a time) nor the broker's record timestamp (the
  producer sets it) is independent of the writer; the API's clock is. Such a record is refused.
- existence: a GPU state, or a finding about a GPU, must name a GPU (or MIG instance) that some probe's
  DeviceInventory on periscope.node.inventory.v1 reported. Inventories are written by the probes (their
  own Kafka principal), and every probe republishes its inventory at least hourly, so any live GPU is
  on that topic within its retention. A record naming a GPU not (yet) reported is held, the newest
  per key, and applied as soon as an inventory names its GPU: the topics are read side by side, so an
  output may arrive just before the inventory it rests on. Attribution rows are not checked: they come
  from the kubelet's allocations, which name devices even where NVML cannot see them.

Pure bookkeeping: the consumer decodes, asks `verdict`, and applies what it is given back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from periscope.core.model import DeviceInventory, Finding, GpuState, NodeEvent, PodAttribution, PolicyEvent

FUTURE = "future"
UNKNOWN_GPU = "unknown-gpu"
REASONS = (FUTURE, UNKNOWN_GPU)


def event_time_ms(obj: object) -> int | None:
    if isinstance(obj, (PodAttribution, GpuState)):
        return obj.as_of_ms
    if isinstance(obj, Finding):
        return obj.at_ms
    if isinstance(obj, (NodeEvent, PolicyEvent)):
        return obj.meta.time_ms
    return None


def _gpu_of(obj: object) -> str:
    if isinstance(obj, GpuState) or (isinstance(obj, Finding) and obj.gpu_uuid):
        return obj.gpu_uuid
    return ""


def _key(obj: Any) -> tuple[str, str]:
    if isinstance(obj, GpuState):
        return "gpu", obj.gpu_uuid
    return "finding", str(getattr(obj, "id", ""))


@dataclass(slots=True)
class Evidence:
    clock_ms: Callable[[], int]
    max_skew_ms: int
    require_inventory: bool = True
    max_held: int = 10_000
    known: set[str] = field(default_factory=set)  # GPU and MIG UUIDs some inventory reported
    held: OrderedDict[tuple[str, str], Any] = field(default_factory=OrderedDict)
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    last_refusal: str = ""
    # Until the inventory's history is read (at start), a GPU not yet reported is only not yet read:
    # such records are held without being counted; those still held then are counted at once.
    inventory_read: bool = False

    def caught_up(self) -> None:
        """The inventory topic has been read up to where it ended at start."""
        if not self.inventory_read:
            self.inventory_read = True
            if self.held:
                self.refused[UNKNOWN_GPU] += len(self.held)
                self.last_refusal = f"{_gpu_of(next(reversed(self.held.values())))} was never reported by " \
                                    "a probe's inventory"

    def learn(self, inventory: DeviceInventory) -> list[Any]:
        """Take the GPUs an inventory reports; returns the held records it makes believable."""
        for g in inventory.gpus:
            self.known.add(g.uuid)
            self.known.update(m.uuid for m in g.mig_devices)
        ready = [k for k, obj in self.held.items() if _gpu_of(obj) in self.known]
        return [self.held.pop(k) for k in ready]

    def verdict(self, obj: object) -> bool:
        """True: apply `obj` now. False: refused, or held until an inventory names its GPU."""
        t = event_time_ms(obj)
        if t is not None and t > self.clock_ms() + self.max_skew_ms:
            self._refuse(FUTURE, f"event time {t} is more than {self.max_skew_ms} ms ahead of the clock")
            return False
        gpu = _gpu_of(obj)
        if not self.require_inventory or not gpu or gpu in self.known:
            return True
        if self.inventory_read:
            self._refuse(UNKNOWN_GPU, f"{gpu} was never reported by a probe's inventory")
        key = _key(obj)
        held = self.held.pop(key, None)
        newer = held is None or (event_time_ms(held) or 0) <= (event_time_ms(obj) or 0)
        self.held[key] = obj if newer else held
        while len(self.held) > self.max_held:
            self.held.popitem(last=False)
        return False

    def _refuse(self, reason: str, why: str) -> None:
        self.refused[reason] += 1
        self.last_refusal = why
