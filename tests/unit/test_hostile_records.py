"""Red-team cases without a broker: every dead letter fits, whatever it copies; the API believes no
record that cannot be true."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from periscope.bus import codec
from periscope.bus.deadletter import MAX_LETTER_BYTES, letter
from periscope.core.model import DeviceInventory, GpuInfo, Meta, MigDeviceInfo
from services.api.evidence import FUTURE, UNKNOWN_GPU, Evidence
from tests.unit.test_api_samples import MIN, gpu, pod, row, xid

MiB = 1 << 20


@settings(max_examples=60, deadline=None)
@given(
    key_size=st.integers(0, 2 * MiB),
    value_size=st.integers(0, 3 * MiB),
    error=st.text(max_size=10_000),
    topic=st.text(min_size=1, max_size=300),
)
def test_a_dead_letter_always_fits_and_describes_what_it_cut(key_size: int, value_size: int, error: str,
                                                             topic: str) -> None:
    key, value = b"k" * key_size, bytes(range(256)) * (value_size // 256) + b"v" * (value_size % 256)
    out = letter(topic, 3, 42, key, value, error, "joiner", 1)
    data = codec.encode(out)
    assert len(data) <= MAX_LETTER_BYTES
    back = codec.decode_dead_letter(data)
    assert back == out
    assert value.startswith(back.value) and key.startswith(back.key or b"")
    assert back.value_size == value_size and back.key_size == key_size
    assert back.value_sha256 == hashlib.sha256(value).digest()
    assert back.truncated == (len(back.value) < value_size or len(back.key or b"") < key_size)


def test_a_letter_that_fits_is_a_whole_copy() -> None:
    value = b"\xff" * (MAX_LETTER_BYTES - 4096)
    out = letter("periscope.node.telemetry.v1", 0, 7, b"gpu-a", value, "not a NodeTelemetry", "api", 1)
    assert out.value == value and out.key == b"gpu-a" and not out.truncated
    cut = letter("periscope.node.telemetry.v1", 0, 7, b"gpu-a", value + b"\xff" * 8192, "bad", "api", 1)
    assert cut.truncated and len(codec.encode(cut)) <= MAX_LETTER_BYTES


# ---------------------------------------------------------------- forged outputs (services.api.evidence)

NOW = 1_795_320_306_789
GPU_REAL = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
GPU_PHANTOM = "GPU-feedface-0000-4000-8000-000000000000"
MIG_REAL = "MIG-aaaaaaaa-0000-4000-8000-00000000000a"


def evidence() -> Evidence:
    ev = Evidence(lambda: NOW, 10 * MIN)
    ev.caught_up()
    gpus = (GpuInfo(GPU_REAL, 0, "A100", mig_devices=(MigDeviceInfo(MIG_REAL, "1g.10gb", 1, 0),)),)
    assert ev.learn(DeviceInventory(Meta("gpu-a", "probe/gpu-a", 1, 1, NOW), gpus)) == []
    return ev


def test_a_record_far_ahead_of_the_clock_is_refused_and_counted() -> None:
    ev = evidence()
    assert ev.verdict(gpu(GPU_REAL, as_of=NOW + 10 * MIN))  # within the skew
    ten_years = NOW + 10 * 365 * 24 * 60 * MIN
    for obj in (gpu(GPU_REAL, as_of=ten_years), pod("u1", as_of=ten_years),
                xid(GPU_REAL, ten_years), pod("u2", as_of=NOW + 11 * MIN)):
        assert not ev.verdict(obj)
    assert ev.refused == {FUTURE: 4, UNKNOWN_GPU: 0} and "ahead of the clock" in ev.last_refusal
    assert not ev.held  # not held: nothing will make it true


def test_a_gpu_no_inventory_reported_is_held_until_one_does() -> None:
    ev = evidence()
    assert ev.verdict(gpu(GPU_REAL)) and ev.verdict(xid(GPU_REAL, NOW)) and ev.verdict(xid(MIG_REAL, NOW))
    assert ev.verdict(pod("u1", "ml", "p", "gpu-a", row(GPU_PHANTOM)))  # allocations are not checked
    older, newer = gpu(GPU_PHANTOM, as_of=NOW - 1000), gpu(GPU_PHANTOM, as_of=NOW)
    assert not ev.verdict(newer) and not ev.verdict(older) and not ev.verdict(xid(GPU_PHANTOM, NOW))
    assert ev.refused[UNKNOWN_GPU] == 3 and len(ev.held) == 2 and GPU_PHANTOM in ev.last_refusal
    later = DeviceInventory(Meta("gpu-b", "probe/gpu-b", 1, 1, NOW), (GpuInfo(GPU_PHANTOM, 0),))
    released = ev.learn(later)
    assert released == [newer, xid(GPU_PHANTOM, NOW)] and not ev.held
    assert ev.verdict(gpu(GPU_PHANTOM, as_of=NOW + 1))


def test_records_read_before_the_inventorys_history_are_held_but_not_counted_until_it_is() -> None:
    ev = Evidence(lambda: NOW, 10 * MIN)
    assert not ev.verdict(gpu(GPU_REAL)) and not ev.verdict(gpu(GPU_PHANTOM))
    assert ev.refused[UNKNOWN_GPU] == 0 and len(ev.held) == 2  # perhaps just not read yet
    inv = DeviceInventory(Meta("gpu-a", "probe/gpu-a", 1, 1, NOW), (GpuInfo(GPU_REAL, 0),))
    assert ev.learn(inv) == [gpu(GPU_REAL)]
    ev.caught_up()  # the whole history read: what is still held names a GPU nobody reported
    assert ev.refused[UNKNOWN_GPU] == 1 and GPU_PHANTOM in ev.last_refusal
    ev.caught_up()
    assert ev.refused[UNKNOWN_GPU] == 1


def test_held_records_are_bounded() -> None:
    ev = evidence()
    ev.max_held = 100
    for i in range(1000):
        assert not ev.verdict(gpu(f"GPU-phantom-{i}"))
    assert len(ev.held) == 100 and ev.refused[UNKNOWN_GPU] == 1000
