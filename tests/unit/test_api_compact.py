"""Packed records: the view keeps each pod's and GPU's latest state as bytes; unpacking gives it back."""

from __future__ import annotations

import math
from dataclasses import replace

from periscope.bus import codec, topics
from periscope.core.model import MigRef, MigState, PodAttribution, XidRef
from services.api import compact
from services.api.view import View
from tests.unit.test_api_samples import GPU_A0, GPU_B0, MIG_B0, MIN, T0, gpu, idle_windows, owner, pod, row


def _rich_pod() -> PodAttribution:
    return pod(
        "uid-1",
        "infer",
        "serve-0",
        "gpu-b",
        row(
            MIG_B0,
            gpu_uuid=GPU_B0,
            sharing="mig",
            util_pct=None,
            fb_used_mib=1024.125,
            mig=MigRef(MIG_B0, "1g.10gb", 2, 0),
            gpu_fraction=1 / 7,
            sources=("checkpoint", "process"),
            first_seen_ms=2**62,
            wasted_gpu_hours=math.inf,
            windows=idle_windows(1.0, n=3),
        ),
        row(GPU_A0, container="side", active=False, avg_util_pct=-0.0),
        phase="Succeeded",
        deleted_ms=T0 - 40 * MIN,
        as_of=T0,
    )


def test_a_pod_unpacks_to_what_was_packed_less_its_windows() -> None:
    p = _rich_pod()
    packed = compact.pod(p)
    got = compact.unpack_pod(packed)
    assert got == replace(p, rows=tuple(replace(r, windows=()) for r in p.rows))
    assert compact.as_of_ms(packed) == T0
    a = got.rows[1].avg_util_pct
    assert a is not None and math.copysign(1.0, a) == -1.0  # the float's very bits


def test_a_gpu_with_mig_owners_and_an_xid_unpacks_to_what_was_packed() -> None:
    g = gpu(
        GPU_B0,
        "gpu-b",
        3,
        owner("uid-2"),
        sharing="mig",
        last_xid=XidRef(79, T0 - MIN),
        mig_devices=(
            MigState(MIG_B0, "1g.10gb", 2, 0, 512.0, 9856.0, (owner("uid-1", "infer", "serve-0", MIG_B0),)),
        ),
        util_pct=math.nan,
        as_of=T0 - 5,
    )
    got = compact.unpack_gpu(compact.gpu(g))
    assert math.isnan(got.util_pct or 0.0) and replace(got, util_pct=None) == replace(g, util_pct=None)
    assert compact.as_of_ms(compact.gpu(g)) == T0 - 5 and compact.gpu_index(compact.gpu(g)) == 3


def test_the_same_state_decoded_again_is_no_change() -> None:
    """At-least-once delivery: a redelivered record is decoded into new objects; the view must see the
    same state, not a change, so packing depends on values alone."""
    p, g = _rich_pod(), gpu(GPU_A0, "gpu-a", 0, owner("uid-1"), as_of=T0)
    v = View()
    assert v.apply(p) and v.apply(g)
    again_p = codec.decode(topics.ATTRIBUTION, codec.encode(p))
    again_g = codec.decode(topics.GPUS, codec.encode(g))
    assert again_p is not p and not v.apply(again_p) and not v.apply(again_g)
    assert v.pods["uid-1"] == replace(again_p, rows=tuple(replace(r, windows=()) for r in again_p.rows))
