"""The streamed timeline: spooled per node, merged by event time, the same document as sorting in memory."""

from __future__ import annotations

import io
import json
from typing import Any

from periscope.bus import codec
from periscope.bus.topics import TELEMETRY
from periscope.core.model import NodeInput, NodeTelemetry
from periscope.devkit.workload import ClusterSpec, generate
from periscope.replay.document import json_chunks, output_json
from periscope.replay.runner import Pending, ReplayConfig, output_time, replay_events
from periscope.replay.timeline import Spool, replay_to_spool, write_document
from tests.unit.test_replay_owners import reuse_scenario

S = 1000


def spooled_document(events: list[NodeInput], config: ReplayConfig) -> tuple[dict[str, Any], int]:
    with Spool() as spool:
        result = replay_to_spool(list(events), config, spool)
        out = io.BytesIO()
        write_document(out, {"from": "a", "items": [], "stats": {"events": result.events}}, spool.merged())
        return json.loads(out.getvalue()), spool.items


def test_spooled_timeline_equals_the_in_memory_sort() -> None:
    # Three nodes with identical event times: ties must keep node order, then emission order.
    events = [ev for node in ("node-b", "node-a", "node-c") for ev in reuse_scenario(node, 0)]
    events += list(generate(ClusterSpec(nodes=2, gpus_per_node=2, duration_ms=30_000, start_ms=10 * S)))
    config = ReplayConfig(from_ms=20 * S)
    expected = replay_events(events, config)
    doc, items = spooled_document(events, config)
    assert items == len(expected.outputs) > 0
    assert doc["items"] == [output_json(o) for o in sorted(expected.outputs, key=output_time)]
    assert doc["stats"] == {"events": expected.events} and doc["from"] == "a"


def test_the_layout_matches_json_chunks() -> None:
    # One item per line, the rest as json.dumps(indent=2): readers that scan the file line by line rely on it.
    events = reuse_scenario()
    result = replay_events(events)
    doc = {"from": "a", "items": [], "stats": {"n": 1}}
    with Spool() as spool:
        replay_to_spool(list(events), ReplayConfig(), spool)
        out = io.BytesIO()
        write_document(out, doc, spool.merged())
    new = out.getvalue().decode().splitlines()
    old = "".join(json_chunks({**doc, "items": map(output_json, sorted(result.outputs, key=output_time))}))

    def split(lines: list[str]) -> tuple[list[str], list[object]]:
        items = [json.loads(x.strip().rstrip(",")) for x in lines if x.startswith("    {")]
        return [x for x in lines if not x.startswith("    {")], items

    assert split(new) == split(old.splitlines())
    assert len(split(new)[1]) == len(result.outputs) > 0


def test_an_empty_timeline() -> None:
    with Spool() as spool:
        out = io.BytesIO()
        write_document(out, {"from": "a", "items": [], "stats": {}}, spool.merged())
    assert json.loads(out.getvalue()) == {"from": "a", "items": [], "stats": {}}


def test_pending_telemetry_replays_like_decoded_telemetry() -> None:
    events = reuse_scenario()
    pending = [Pending(e.meta, codec.encode(e)) if isinstance(e, NodeTelemetry) else e
               for e in events]
    assert any(isinstance(e, Pending) for e in pending)
    assert replay_events(pending).outputs == replay_events(events).outputs
    # Bytes whose header checks out but whose body does not convert: one failed event, not a lost replay.
    tel = next(e for e in events if isinstance(e, NodeTelemetry))
    broken = Pending(tel.meta, b"\x12\x03\x0a\x01")  # a device sample cut short
    failed: list[object] = []
    result = replay_events([*events, broken], on_error=lambda ev, e: failed.append(ev))
    assert result.failed == 1 and failed == [broken]
    assert codec.decode_meta(TELEMETRY, codec.encode(tel)) == tel.meta
