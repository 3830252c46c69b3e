"""Ground truth of a simulated run as JSON lines: who held which device at each tick, and what it used.

One object per line, each with a `kind`:
- `meta` (first line): scenario name, seed, tick, the simulated time of scenario start (`start_ms`),
  speed, idle window/threshold, the expected `/v1/policy` component statuses;
- `holder`: one per tick x kubelet device: `tick`, `at`/`at_ms`, `node`, `device_id`, `gpu_uuid`,
  `mig` (null | {uuid, profile, gi, ci}), `sharing`, the holder `pod_uid`/`namespace`/`pod`/`container`
  (all null when the device is free), its true `util_pct` (share of the GPU's SM time after the 100 %
  cap; `util_observable` is false on MIG, where NVML cannot report it, unless the run serves each
  node's dcgm-exporter, whose per-instance graphics-engine activity shows it), `fb_used_mib`,
  `gpu_util_pct` (the whole GPU's util) and `idle` (null when it cannot be known); for GPU-hours
  accounting (docs/accounting.md), `alloc_share` (the device-equivalents the holder held: 1 for a whole
  GPU, a MIG slice's compute slices of the parent's, on a shared GPU its true use plus an equal part
  of the time nobody used) and `used_share` (its true use, in the same units); 0 when free;
- `xid`: an XID as it fires, with the owners at that moment; `fault`: a fault as it fires;
- `tick`: when the simulator had tick `tick`'s state in place (`applied_ms`, after its kubelet, /proc,
  checkpoint and NVML state were all written). On a loaded machine it can fall behind: until then the
  fake hardware still shows an older tick, and `periscope report` checks a sample taken then only where
  the truth was the same at both ticks.
Times are simulated Unix ms plus RFC 3339 strings, the same clock every service of the run uses.
`TruthWriter` writes the file as the run goes; `read_truth` reads it back and `Truth` indexes it by tick
and device for `periscope report`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from periscope.contract.values import rfc3339
from periscope.sim.cluster.kube_objects import operands
from periscope.sim.cluster.model import ClusterModel, Holding
from periscope.sim.scenario import XidSpec

Row = dict[str, Any]  # one line of the file


def _at(ms: int) -> dict[str, Any]:
    return {"at_ms": ms, "at": rfc3339(ms)}


def _holder(h: Holding) -> dict[str, str | None]:
    """Who holds the device (all None when it is free)."""
    pod, c = h.pod, h.container
    return {
        "pod_uid": pod.uid if pod else None,
        "namespace": pod.namespace if pod else None,
        "pod": pod.name if pod else None,
        "container": c.name if c else None,
    }


class TruthWriter:
    """Appends the truth of each tick as the run reaches it (a cut-short run keeps what happened)."""

    def __init__(
        self,
        path: str | Path,
        model: ClusterModel,
        start_ms: int,
        speed: float,
        idle_window_ms: int,
        idle_threshold: float,
        prestart_ms: int = 0,
        extra_meta: dict[str, Any] | None = None,
        mig_observable: bool = False,
    ) -> None:
        self.model, self.start_ms, self.prestart_ms = model, start_ms, prestart_ms
        self.mig_observable = mig_observable  # a dcgm-exporter shows each MIG instance's activity
        self.window_ms, self.threshold = idle_window_ms, idle_threshold
        self._f: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        s = model.scenario
        self._emit(
            {
                "kind": "meta",
                "scenario": s.name,
                "source": s.source,
                "seed": s.seed,
                "tick_ms": s.tick_ms,
                "duration_ms": s.duration_ms,
                "start_ms": start_ms,
                "start": rfc3339(start_ms),
                "speed": speed,
                "idle_window_ms": idle_window_ms,
                "idle_threshold_pct": idle_threshold,
                "nodes": {n: [g.uuid for g in gpus] for n, gpus in model.gpus.items()},
                "policy": None
                if s.policy is None
                else {
                    "name": s.policy.name,
                    "state": s.policy.state,
                    "components": {o.component: o.expected_status for o in operands(s)},
                },
                "prestart_ms": prestart_ms,
                "mig_util_observable": mig_observable,
                **(extra_meta or {}),
            }
        )
        self._done = -1
        self._util = functools.cache(model.util_of)  # each idle window re-reads the ticks before it

    def _emit(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(row, separators=(",", ":")) + "\n")

    def write_tick(self, tick: int, applied_ms: int | None = None) -> None:
        """Write tick `tick` (and every XID/fault since the last written tick); `applied_ms`: when the
        simulator had its state in place."""
        if tick <= self._done:
            return
        tick_ms = self.model.scenario.tick_ms
        lo, hi = (self._done + 1) * tick_ms, (tick + 1) * tick_ms
        for x in self.model.scenario.xids:
            if lo <= x.at_ms < hi:
                self._emit(self._xid_row(x))
        for f in self.model.scenario.faults:
            if lo <= f.at_ms < hi:
                at = self.start_ms + f.at_ms
                self._emit(
                    {
                        "kind": "fault",
                        **_at(at),
                        "fault": f.fault,
                        "node": f.node,
                        "duration_ms": f.duration_ms,
                        "end_ms": at + f.duration_ms,
                    }
                )
        for k in range(self._done + 1, tick + 1):
            self._write_holders(k)
        if applied_ms is not None:
            self._emit({"kind": "tick", "tick": tick, **_at(self.start_ms + tick * tick_ms),
                        "applied_ms": applied_ms})
        self._done = tick
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def _write_holders(self, tick: int) -> None:
        model = self.model
        t = tick * model.scenario.tick_ms
        gpu_util = {u.gpu.uuid: u.util_pct for n in model.gpus for u in model.usage(n, t)}
        holdings = model.holdings(t)
        shares = account_shares(holdings)
        for h in holdings:
            d = h.device
            alloc, used = shares.get(d.id, (0.0, 0.0))
            self._emit(
                {
                    "kind": "holder",
                    "tick": tick,
                    **_at(self.start_ms + t),
                    "node": d.gpu.node,
                    "device_id": d.id,
                    "resource": d.resource,
                    "gpu_uuid": d.gpu.uuid,
                    "mig": None
                    if d.mig is None
                    else {"uuid": d.mig.uuid, "profile": d.mig.profile, "gi": d.mig.gi, "ci": d.mig.ci},
                    "sharing": d.sharing,
                    **_holder(h),
                    "util_pct": None if h.util_pct is None else round(h.util_pct, 3),
                    "util_observable": d.mig is None or self.mig_observable,
                    "fb_used_mib": h.fb_used_mib,
                    "gpu_util_pct": gpu_util.get(d.gpu.uuid),
                    "idle": self._idle(h, t),
                    "alloc_share": round(alloc, 6),
                    "used_share": round(used, 6),
                }
            )

    def _idle(self, h: Holding, t_ms: int) -> bool | None:
        """Allocated-but-idle as a perfect observer sees it: held for a whole window with mean util below
        the threshold. None where the hardware cannot show utilization (MIG without a dcgm-exporter) or
        nobody holds the device.
        Pods of time 0 already existed for `prestart_ms` while the cluster waited, frozen, for the start."""
        if h.pod is None or (h.device.mig is not None and not self.mig_observable):
            return None
        start = h.pod.spec.start_ms or -self.prestart_ms
        if t_ms - start < self.window_ms:
            return False
        tick = self.model.scenario.tick_ms
        times = [t for t in range(t_ms, t_ms - self.window_ms, -tick) if t >= start]
        return sum(self._util(h.device.id, max(0, t)) for t in times) / len(times) < self.threshold

    def _xid_row(self, x: XidSpec) -> dict[str, Any]:
        gpu = self.model.gpus[x.node][x.gpu]
        inst = gpu.mig[x.mig] if x.mig is not None else None
        return {
            "kind": "xid",
            **_at(self.start_ms + x.at_ms),
            "node": x.node,
            "gpu_uuid": gpu.uuid,
            "code": x.code,
            "mig": None if inst is None else {"uuid": inst.uuid, "gi": inst.gi, "ci": inst.ci},
            "owners": [{**_holder(h), "device_id": h.device.id} for h in self.model.xid_owners(x)],
        }


def _parent_slices(model: str) -> int:
    return 4 if "A30" in model else 7  # compute slices of a whole GPU in MIG mode (the A30 has 4)


def account_shares(holdings: list[Holding]) -> dict[str, tuple[float, float]]:
    """Device ID -> (allocated, used) device-equivalents of its holder at one instant, from the true
    usage: the definitions of docs/accounting.md applied to what really ran. On a time-sliced or MPS
    GPU with n = max(replicas, holders) and true shares u_i summing to U (percent): u_i/100 plus
    (1 - U/100)/n each, or u_i/U once U reaches 100."""
    out: dict[str, tuple[float, float]] = {}
    shared: dict[str, list[Holding]] = {}
    for h in holdings:
        d = h.device
        if h.pod is None:
            continue
        u = (h.util_pct or 0.0) / 100.0
        if d.mig is not None:
            part = d.mig.slices / _parent_slices(d.gpu.model)
            out[d.id] = (part, part * u)
        elif d.sharing in ("time-slicing", "mps"):
            shared.setdefault(d.gpu.uuid, []).append(h)
        else:
            out[d.id] = (1.0, min(u, 1.0))
    for held in shared.values():
        n = max(held[0].device.gpu.replicas, len(held))
        total = sum((h.util_pct or 0.0) / 100.0 for h in held)
        for h in held:
            u = (h.util_pct or 0.0) / 100.0
            alloc = u / total if total >= 1.0 else u + (1.0 - total) / n
            out[h.device.id] = (alloc, min(u, alloc))
    return out


def read_truth(path: str | Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {n}: not JSON ({e.msg})") from None


class Truth:
    """The truth file, indexed by tick and device."""

    def __init__(self, rows: Iterable[Row]) -> None:
        self.meta: Row = {}
        self.ticks: dict[int, dict[str, Row]] = {}
        self.xids: list[Row] = []
        self.faults: list[Row] = []
        self.applied: dict[int, int] = {}  # tick -> when its state was in place (older files: none)
        listed = {"xid": self.xids, "fault": self.faults}
        for n, r in enumerate(rows, 1):
            kind = r.get("kind")
            if kind == "meta":
                self.meta = r
            elif kind in ("xid", "fault"):  # a tuple: a kind of any JSON type is only compared
                listed[kind].append(r)
            elif kind in ("holder", "tick"):
                try:
                    if kind == "holder":
                        self.ticks.setdefault(int(r["tick"]), {})[str(r["device_id"])] = r
                    else:
                        self.applied[int(r["tick"])] = int(r["applied_ms"])
                except (KeyError, TypeError, ValueError) as e:
                    raise ValueError(f"line {n}: {kind} without a valid {e}") from None
        if not self.meta:
            raise ValueError("no meta line: not a truth file written by `periscope up --truth`")
        self.tick_ms = int(self.meta["tick_ms"])
        self.devices: dict[str, str] = {}  # device ID -> node
        self.gpu_devices: dict[str, list[str]] = {}  # GPU UUID -> its kubelet device IDs
        self.first_uid: dict[tuple[str, str], str] = {}  # a later pod of the same name is a reused name
        for k in sorted(self.ticks):
            for d, r in self.ticks[k].items():
                if d not in self.devices:
                    self.devices[d] = r["node"]
                    self.gpu_devices.setdefault(r["gpu_uuid"], []).append(d)
                if r["pod_uid"]:
                    self.first_uid.setdefault((r["namespace"], r["pod"]), r["pod_uid"])
        self.start_ms = int(self.meta["start_ms"])
        self.last = max(self.ticks, default=-1)

    def tick_at(self, at_ms: int) -> int:
        return min(self.last, max(0, (at_ms - self.start_ms) // self.tick_ms))

    def behind(self, at_ms: int) -> int:
        """How many ticks the simulated hardware showed at `at_ms` lagged the tick of that time: 0 unless
        the simulator, behind the clock, had not yet put that tick's state in place (a sample then shows
        an older tick; its answers are checked only where the truth did not change in between)."""
        tick = shown = self.tick_at(at_ms)
        while shown > 0 and self.applied.get(shown, at_ms) > at_ms:
            shown -= 1
        return tick - shown

    def visible_ms(self, at_ms: int) -> int:
        """When an event of scenario time `at_ms` reached the simulated hardware: it fires with the first
        tick at or after it, and shows once that tick's state is in place."""
        tick = -(-(at_ms - self.start_ms) // self.tick_ms)
        return max(at_ms, self.applied.get(tick, at_ms))

    def late_ms(self) -> list[int]:
        """How far behind its scenario time each tick's state was put in place."""
        return [a - (self.start_ms + k * self.tick_ms) for k, a in sorted(self.applied.items())]

    def rows_at(self, tick: int) -> dict[str, Row]:
        return self.ticks.get(max(0, min(tick, self.last)), {})

    def row(self, tick: int, device: str) -> Row | None:
        return self.rows_at(tick).get(device)

    def stable(self, tick: int, device: str, allowance: int, *keys: str) -> bool:
        """Whether the truth for `device` did not change over the `allowance` ticks before `tick`."""
        now = self.row(tick, device)
        if now is None:
            return False
        before = (self.row(k, device) for k in range(tick - allowance, tick))
        return all(b is not None and all(b.get(x) == now.get(x) for x in keys) for b in before)

    def settled_owner(self, tick: int, device: str, allowance: int) -> Row | None:
        """The truth an owner answer is checked against; None while it was still changing."""
        return self.row(tick, device) if self.stable(tick, device, allowance, "pod_uid") else None

    def current_uid(self, tick: int, namespace: str, pod: str) -> str | None:
        named = (r for r in self.rows_at(tick).values() if (r["namespace"], r["pod"]) == (namespace, pod))
        return next((str(r["pod_uid"]) for r in named), None)
