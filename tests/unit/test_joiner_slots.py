"""Which node's state a record belongs to: the record key, checked against what the payload says."""

from __future__ import annotations

from dataclasses import replace

import pytest

from periscope.core.model import PodEvent
from services.joiner.slots import Rejected, node_of
from tests.unit.core_builders import NODE, dev, gpu, node_labels, pod, tel


def test_a_node_keyed_record_belongs_to_its_key() -> None:
    assert node_of(NODE.encode(), tel(1000, dev(gpu(0), 50.0))) == NODE
    assert node_of(NODE.encode(), node_labels(0)) == NODE
    assert node_of(NODE.encode(), pod(1, "a", 0)) == NODE


def test_a_key_that_contradicts_the_payload_is_rejected() -> None:
    with pytest.raises(Rejected, match="not the event's node"):
        node_of(b"other", tel(1000, dev(gpu(0), 50.0)))
    with pytest.raises(Rejected, match="not the event's node"):
        node_of(b"other", node_labels(0))
    with pytest.raises(Rejected, match="not the pod's node"):
        node_of(b"other", pod(1, "a", 0))
    with pytest.raises(Rejected, match="no key"):
        node_of(None, tel(1000, dev(gpu(0), 50.0)))


def test_an_unscheduled_pod_has_nothing_to_join() -> None:
    ev = pod(1, "pending", 0)
    unscheduled = PodEvent(ev.meta, replace(ev.pod, node=""))
    assert node_of(b"", unscheduled) is None and node_of(None, ev) is None
    assert node_of(NODE.encode(), unscheduled) == NODE  # the watcher knows better than a cleared field
