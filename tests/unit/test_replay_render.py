"""Replay output: RFC 3339 times both ways, the JSON of each record kind, and the tables."""

from __future__ import annotations

import io
import json

import pytest

from periscope.contract.owners import owners_document
from periscope.contract.values import mig_json, parse_time_ms, rfc3339
from periscope.core.model import Finding, GpuState, MigRef, PodAttribution
from periscope.replay.document import json_chunks, output_json
from periscope.replay.owners import owner_items
from periscope.replay.runner import replay_events
from services.replay.tables import ProgressBar, owners_table, stdout_console, timeline_table
from tests.unit.core_builders import gpu, uid
from tests.unit.test_replay_owners import reuse_scenario

T = 1_795_000_000_123  # 2026-11-20T...


@pytest.mark.parametrize("text,ms", [
    ("1970-01-01T00:00:00Z", 0),
    ("2026-11-22T04:05:06Z", 1_795_320_306_000),
    ("2026-11-22T04:05:06.789Z", 1_795_320_306_789),
    ("2026-11-22T06:05:06.789+02:00", 1_795_320_306_789),
    ("2026-11-22T04:05:06.789", 1_795_320_306_789),  # no zone: UTC
    (" 2026-11-22T04:05:06Z ", 1_795_320_306_000),
])
def test_parse_time(text: str, ms: int) -> None:
    assert parse_time_ms(text) == ms


@pytest.mark.parametrize("text", ["", "yesterday", "2026-13-01T00:00:00Z", "1795320306", "2026-11-22 25:00"])
def test_parse_time_rejects_what_is_not_rfc3339(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time_ms(text)


def test_rfc3339_round_trips_to_the_millisecond() -> None:
    assert rfc3339(T).endswith("Z") and parse_time_ms(rfc3339(T)) == T
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"


def test_mig_json() -> None:
    assert mig_json(MigRef("MIG-x", "1g.10gb", 2, 0)) == {"uuid": "MIG-x", "profile": "1g.10gb", "gi": 2,
                                                          "ci": 0}
    assert mig_json(None) is None


def _outputs() -> list[PodAttribution | GpuState | Finding]:
    return replay_events(reuse_scenario()).outputs


def test_attribution_item_carries_key_time_identity_and_rows() -> None:
    att = next(o for o in _outputs() if isinstance(o, PodAttribution) and o.pod_uid == uid(1))
    item = output_json(att)
    assert (item["kind"], item["key"], item["pod_uid"], item["namespace"], item["pod"]) == (
        "attribution", uid(1), uid(1), "ml", "train-0")
    assert item["at"] == rfc3339(att.as_of_ms) and item["node"] == att.node
    [row] = item["rows"]
    assert row["gpu_uuid"] == gpu(0) and row["mig"] is None and row["util_pct"] == 50.0
    assert row["sources"] == ["checkpoint", "podresources"] and row["first_seen"].endswith("Z")
    json.dumps(item)  # plain JSON


def test_gpu_and_finding_items() -> None:
    outs = _outputs()
    gpu_item = output_json(next(o for o in outs if isinstance(o, GpuState)))
    assert gpu_item["kind"] == "gpu" and gpu_item["key"] == gpu_item["gpu_uuid"]
    assert gpu_item["owners"][0].keys() == {"pod_uid", "namespace", "pod", "container", "device_id"}
    xid = output_json(next(o for o in outs if isinstance(o, Finding) and o.kind == "xid-owner"))
    assert (xid["kind"], xid["finding"], xid["key"], xid["xid_code"]) == ("finding", "xid-owner", gpu(0), 79)
    assert [o["pod_uid"] for o in xid["owners"]] == [uid(1)]


def test_json_is_written_item_by_item_as_one_document_would_be() -> None:
    items = [output_json(o) for o in _outputs()]
    stats = {"events": 3, "nested": {"items": [], "more": [1, {"items": [2]}]}}
    for some in (items, items[:1], []):
        doc = {"from": rfc3339(0), "to": rfc3339(T), "filters": {"pod": None, "note": "a\n  \"items\": []"},
               "items": some, "stats": stats}
        pieces = list(json_chunks({**doc, "items": iter(some)}))  # consumed once, lazily
        text = "".join(pieces)
        assert json.loads(text) == json.loads(json.dumps(doc))
        assert len(pieces) == len(some) + 2
        # One item per line (greppable), everything else laid out as json.dumps(indent=2) would.
        lines = text.splitlines()
        assert [json.loads(line.strip().rstrip(",")) for line in lines if line.startswith("    {")] == some
        assert text.startswith(json.dumps(doc, indent=2).split('"items"')[0])


def test_tables_render_every_item() -> None:
    outs = _outputs()
    doc = {"from": rfc3339(0), "to": rfc3339(T), "items": [output_json(o) for o in outs]}
    buf = io.StringIO()
    stdout_console(buf).print(timeline_table(doc))
    text = buf.getvalue()
    assert text.count("\n") >= len(outs) and "xid-owner" in text and uid(3) in text
    states = replay_events(reuse_scenario()).states
    owners = owners_document(30_000, owner_items(states, 30_000))
    buf = io.StringIO()
    stdout_console(buf).print(owners_table(owners))
    assert uid(1) in buf.getvalue() and gpu(1) in buf.getvalue()  # full UUIDs, not folded


def test_progress_bar_draws_nothing_when_stderr_is_not_a_terminal() -> None:
    err = io.StringIO()
    with ProgressBar(err, enabled=True) as bar:
        bar.update("reading", 5, 10)
        bar.update("reading", 5, 10)
    assert err.getvalue() == ""
