"""Field coverage: no codec drops a field of a domain type, no renderer ignores one.

Every bus message, with every field (nested ones too) set to a value other than its default, must come
back from the protobuf codec equal, and from the API's packed form too; every renderer of the output
contract must render something different when any one field changes, unless the contract names the
field as one that rendering leaves to another (`FLAT_ROW_LEAVES`, `WINDOW_LEAVES`, `NOT_AN_XID`,
`ITEM_LEAVES`). A field
added to a domain type and forgotten by a codec or a renderer fails here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from periscope.bus import codec, topics
from periscope.contract import attribution, finding, gpu, owners, values, xid
from periscope.core import model as m
from periscope.core.allocation import Holding
from periscope.replay.document import output_json
from services.api import compact
from tests.unit.fields import changes, full, left_out

MESSAGES = [
    (topics.ALLOCATIONS, m.AllocationSnapshot), (topics.TELEMETRY, m.NodeTelemetry), (topics.XID, m.XidEvent),
    (topics.INVENTORY, m.DeviceInventory), (topics.PODS, m.PodEvent), (topics.NODES, m.NodeEvent),
    (topics.POLICY, m.PolicyEvent), (topics.ATTRIBUTION, m.PodAttribution), (topics.GPUS, m.GpuState),
    (topics.FINDINGS, m.Finding),
]


def test_every_domain_message_is_covered() -> None:
    assert {t.name for t, _ in MESSAGES} == {t.name for t in topics.ALL} - {topics.DEADLETTER.name}


@pytest.mark.parametrize(("topic", "cls"), MESSAGES, ids=[c.__name__ for _, c in MESSAGES])
def test_the_bus_codec_keeps_every_field(topic: topics.Topic, cls: type) -> None:
    obj = full(cls)
    assert codec.decode(topic, codec.encode(obj)) == obj


@pytest.mark.parametrize(("topic", "cls"), MESSAGES, ids=[c.__name__ for _, c in MESSAGES])
def test_the_bus_codec_tells_every_field_apart(topic: topics.Topic, cls: type) -> None:
    """A field the encoder writes but the decoder reads from elsewhere (or the other way) shows here."""
    for path, changed in changes(full(cls)):
        assert codec.decode(topic, codec.encode(changed)) == changed, path


def test_the_apis_packed_records_keep_every_field() -> None:
    """The API view packs each pod's and GPU's latest state; rows are packed without their windows (the
    view keeps those merged apart)."""
    pod = full(m.PodAttribution)
    pod = dataclasses.replace(pod, rows=tuple(dataclasses.replace(r, windows=()) for r in pod.rows))
    assert compact.unpack_pod(compact.pod(pod)) == pod
    g = full(m.GpuState)
    assert compact.unpack_gpu(compact.gpu(g)) == g
    for path, changed in changes(g):
        assert compact.unpack_gpu(compact.gpu(changed)) == changed, path


def _flat_rows(pod: m.PodAttribution) -> list[Any]:
    return [attribution.pod_row_json(pod, r) for r in pod.rows]


RENDERERS: list[tuple[str, type, Callable[[Any], Any], frozenset[str]]] = [
    ("attribution.row_json", m.AttributionRow, attribution.row_json, attribution.ROW_LEAVES),
    ("attribution.pod_json", m.PodAttribution, attribution.pod_json, attribution.POD_LEAVES),
    ("attribution.pod_row_json", m.PodAttribution, _flat_rows, attribution.FLAT_ROW_LEAVES),
    ("attribution.window_json", m.WindowStat, attribution.window_json, attribution.WINDOW_LEAVES),
    ("gpu.gpu_json", m.GpuState, gpu.gpu_json, frozenset()),
    ("finding.finding_json", m.Finding, finding.finding_json, frozenset()),
    ("xid.xid_json", m.Finding, xid.xid_json, xid.NOT_AN_XID),
    ("owners.owner_item", Holding, lambda h: owners.owner_item("node-a", h), owners.ITEM_LEAVES),
    ("values.owner_json", m.Owner, values.owner_json, frozenset()),
    ("values.mig_json", m.MigRef, values.mig_json, frozenset()),
    ("replay item (attribution)", m.PodAttribution, output_json, attribution.POD_LEAVES),
    ("replay item (gpu)", m.GpuState, output_json, frozenset()),
    ("replay item (finding)", m.Finding, output_json, frozenset()),
]


def _text(x: Any) -> str:
    return json.dumps(x, sort_keys=True)


@pytest.mark.parametrize(("name", "cls", "render", "leaves"), RENDERERS, ids=[r[0] for r in RENDERERS])
def test_every_renderer_renders_every_field(name: str, cls: type, render: Callable[[Any], Any],
                                            leaves: frozenset[str]) -> None:
    obj = full(cls)
    base = _text(render(obj))
    missed = [path for path, changed in changes(obj)
              if not left_out(path, leaves) and _text(render(changed)) == base]
    assert missed == [], f"{name} renders nothing of {missed}"


@pytest.mark.parametrize(("name", "cls", "render", "leaves"), RENDERERS, ids=[r[0] for r in RENDERERS])
def test_what_a_renderer_leaves_out_names_real_fields(name: str, cls: type, render: Callable[[Any], Any],
                                                      leaves: frozenset[str]) -> None:
    """A stale entry (a field since renamed) would excuse nothing, silently."""
    paths = {path for path, _ in changes(full(cls))}
    assert leaves <= paths


def test_the_field_coverage_check_fails_when_a_renderer_drops_a_field() -> None:
    """The check itself: a renderer that forgets `gpu_fraction` is caught."""

    def forgetful(r: m.AttributionRow) -> Any:
        out = attribution.row_json(r)
        del out["gpu_fraction"]
        return out

    obj = full(m.AttributionRow)
    base = _text(forgetful(obj))
    missed = [p for p, changed in changes(obj)
              if not left_out(p, attribution.ROW_LEAVES) and _text(forgetful(changed)) == base]
    assert missed == ["gpu_fraction"]


def test_docs_name_every_field_users_read() -> None:
    """docs/api.md describes the contract's shapes: every field of every output kind is named there."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    named = {w for span in re.findall(r"`([^`]*)`", text) for w in re.findall(r"[a-z_]+", span)}
    models = [attribution.PodRow, attribution.PodDetail, attribution.Row, attribution.Window, gpu.Gpu,
              gpu.MigDevice, finding.FindingRow, xid.XidRow, owners.OwnerItem, owners.Owners,
              values.OwnerRef, values.Mig]
    missing = sorted({f"{mdl.__name__}.{name}" for mdl in models for name in mdl.model_fields
                      if name not in named})
    assert missing == []
