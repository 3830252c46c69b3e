"""Drop policy of the probe's outgoing buffer while the broker is unreachable."""

from __future__ import annotations

from periscope.bus import topics
from services.probe.buffer import Kind, OutBuffer, Outgoing

_TOPIC = {
    Kind.TELEMETRY: topics.TELEMETRY,
    Kind.ALLOCATION: topics.ALLOCATIONS,
    Kind.INVENTORY: topics.INVENTORY,
    Kind.XID: topics.XID,
}


def msg(kind: Kind, n: int) -> Outgoing:
    return Outgoing(kind, _TOPIC[kind], "node-a", f"{kind.value}-{n}")


def values(buf: OutBuffer) -> list[object]:
    out = []
    while buf.peek() is not None:
        out.append(buf.pop().value)
    return out


def test_fifo_below_the_limit() -> None:
    buf = OutBuffer(5)
    for m in (msg(Kind.INVENTORY, 1), msg(Kind.TELEMETRY, 1), msg(Kind.XID, 1), msg(Kind.ALLOCATION, 1)):
        assert buf.push(m) is None
    assert values(buf) == ["inventory-1", "telemetry-1", "xid-1", "allocation-1"]
    assert not buf.dropped


def test_oldest_telemetry_goes_first() -> None:
    buf = OutBuffer(3)
    buf.push(msg(Kind.XID, 1))
    buf.push(msg(Kind.TELEMETRY, 1))
    buf.push(msg(Kind.TELEMETRY, 2))
    victim = buf.push(msg(Kind.ALLOCATION, 1))
    assert victim is not None and victim.value == "telemetry-1"
    assert values(buf) == ["xid-1", "telemetry-2", "allocation-1"]
    assert buf.dropped == {"telemetry": 1}


def test_superseded_snapshots_go_before_xids_and_the_latest_snapshot_stays() -> None:
    buf = OutBuffer(4)
    for m in (msg(Kind.ALLOCATION, 1), msg(Kind.XID, 1), msg(Kind.ALLOCATION, 2), msg(Kind.XID, 2)):
        buf.push(m)
    buf.push(msg(Kind.ALLOCATION, 3))  # allocation-1 is superseded
    buf.push(msg(Kind.XID, 3))  # allocation-2 is superseded
    assert values(buf) == ["xid-1", "xid-2", "allocation-3", "xid-3"]
    assert buf.dropped == {"allocation": 2}


def test_xids_dropped_oldest_first_only_when_nothing_else_can_go() -> None:
    buf = OutBuffer(3)
    buf.push(msg(Kind.ALLOCATION, 1))
    buf.push(msg(Kind.INVENTORY, 1))
    buf.push(msg(Kind.XID, 1))
    buf.push(msg(Kind.XID, 2))
    buf.push(msg(Kind.TELEMETRY, 1))
    assert values(buf) == ["allocation-1", "inventory-1", "xid-2"]
    assert buf.dropped == {"xid": 1, "telemetry": 1}


def test_latest_allocation_and_inventory_survive_a_flood() -> None:
    buf = OutBuffer(10)
    buf.push(msg(Kind.ALLOCATION, 1))
    buf.push(msg(Kind.INVENTORY, 1))
    for i in range(100):
        buf.push(msg(Kind.TELEMETRY, i))
        buf.push(msg(Kind.XID, i))
    kept = values(buf)
    assert len(kept) == 10
    assert "allocation-1" in kept and "inventory-1" in kept
    assert [v for v in kept if str(v).startswith("xid")] == [f"xid-{i}" for i in range(92, 100)]
    assert buf.dropped["telemetry"] == 100 and buf.dropped["xid"] == 92


def test_discard_removes_a_sent_message_wherever_it_is() -> None:
    buf = OutBuffer(4)
    a, b = msg(Kind.XID, 1), msg(Kind.XID, 1)  # equal values, still two messages
    buf.push(a)
    buf.push(b)
    buf.discard(b)
    assert len(buf) == 1 and buf.peek() is a
    buf.discard(b)  # already gone: no error
    assert len(buf) == 1
