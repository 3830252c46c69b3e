"""The `periscope replay` range document: its items, and its layout when written from memory.

Each item is one record the core emitted, as the output contract renders it (periscope.contract), under
a head that places it on the timeline: `at` (event time), `node`, `kind` (`attribution` | `gpu` |
`finding`) and `key` (the record's bus key). A finding's own kind is under `finding`.
A document's "items" may be any iterable: `json_chunks` writes them one at a time, so the JSON of a long
range (an hour of a large cluster is gigabytes of it) is never held in memory all at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from periscope.contract.attribution import pod_json
from periscope.contract.finding import finding_json
from periscope.contract.gpu import gpu_json
from periscope.contract.values import rfc3339
from periscope.core.model import Finding, GpuState, PodAttribution

Json = dict[str, Any]


def output_json(o: PodAttribution | GpuState | Finding) -> Json:
    """One timeline item: the record the core emitted, with its event time and bus key."""
    if isinstance(o, PodAttribution):
        return {"at": rfc3339(o.as_of_ms), "node": o.node, "kind": "attribution", "key": o.pod_uid,
                **pod_json(o)}
    if isinstance(o, GpuState):
        return {"at": rfc3339(o.as_of_ms), "node": o.node, "kind": "gpu", "key": o.gpu_uuid, **gpu_json(o)}
    body = finding_json(o)
    del body["kind"]  # the item's kind is "finding"; the finding's own is under "finding"
    return {"at": rfc3339(o.at_ms), "node": o.node, "kind": "finding", "key": o.key, "finding": o.kind,
            **body}


def json_chunks(doc: Json, stream: str = "items") -> Iterator[str]:
    """`doc` as indented JSON in pieces, except that each item of `doc[stream]` (any iterable of JSON
    values, consumed once) is one compact line: an hour of a cluster is millions of items, and the
    indenting encoder is pure Python (several times slower than the C one, most of a replay's time)."""
    text = json.dumps({**doc, stream: []}, indent=2)
    marker = f"\n  {json.dumps(stream)}: ["  # top level: deeper keys are indented further
    head, found, tail = text.partition(marker + "]")
    assert found, "dumps writes every top-level key on its own line"
    yield head + marker
    empty = True
    for item in doc[stream]:
        yield ("\n    " if empty else ",\n    ") + json.dumps(item, separators=(", ", ": "))
        empty = False
    yield ("]" if empty else "\n  ]") + tail
