"""A feed of nodes: workers forked first, nodes handed over in pieces and in any order, some again; the
results are the serial replay's, in node-name order, and errors come back with this process's events."""

from __future__ import annotations

import os
import signal

import pytest

from periscope.bus import codec
from periscope.bus import topics as t
from periscope.core.model import NodeInput, NodeTelemetry
from periscope.replay import runner
from periscope.replay.feed import NodeFeed
from periscope.replay.parallel import NodePool, can_fork
from periscope.replay.runner import NodeReplay, Pending, ReplayConfig, ReplayInput, ReplayResult, node_of
from tests.unit.test_replay_parallel import cluster

needs_fork = pytest.mark.skipif(not can_fork(), reason="no fork start method on this platform")


TOPIC = {topic.message: topic for topic in t.NODE_INPUTS}


def as_read(events: list[NodeInput]) -> list[ReplayInput]:
    """As the CLI's reader keeps them: every record but pods and nodes as bytes."""
    return [ev if (topic := TOPIC[type(ev).__name__]) in (t.PODS, t.NODES)
            else Pending(ev.meta, codec.encode(ev), topic) for ev in events]


def tagged(res: NodeReplay) -> NodeReplay:
    res.rendered = os.getpid()  # where the node was replayed
    return res


def run(feed: NodeFeed) -> tuple[ReplayResult, list[NodeReplay]]:
    result = ReplayResult()
    return result, list(feed.results(result))


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=needs_fork), pytest.param(3, marks=needs_fork)])
def test_nodes_handed_over_in_pieces_give_the_serial_replay(workers: int) -> None:
    events = as_read(cluster())
    serial = runner.replay_events(events)
    nodes = sorted({node_of(ev) for ev in events} - {""})
    assert len(nodes) >= 6
    with NodeFeed(ReplayConfig(), workers=workers, finish=tagged) as feed:
        # Nodes come in three pieces, the last first; one node comes early with a third of its
        # events, and again with all of them (a record of it turned up in a later partition).
        early = nodes[0]
        feed.add([ev for ev in events if node_of(ev) == early][::3])
        for piece in (nodes[4:], nodes[2:4], nodes[:2]):
            feed.add(ev for ev in events if node_of(ev) in piece)
        assert feed.total == sum(1 for ev in events if node_of(ev))
        result, got = run(feed)
    assert [r.node for r in got] == nodes
    assert [o for r in got for o in r.kept] == serial.outputs and serial.outputs
    assert (result.events, result.samples, result.device_samples, result.emitted, result.failed) == \
           (serial.events, serial.samples, serial.device_samples, serial.emitted, serial.failed)
    pids = {r.rendered for r in got}
    assert (os.getpid() in pids) == (workers == 1) and len(pids) <= workers


@needs_fork
def test_what_the_core_raises_on_comes_back_with_this_process_events(monkeypatch: pytest.MonkeyPatch) -> None:
    events = as_read(cluster())
    samples = [ev for ev in events if isinstance(ev, Pending) and ev.topic is t.TELEMETRY]
    bad = {(ev.meta.node, ev.meta.time_ms) for ev in samples[::50]}
    real = runner.apply

    def apply(state, ev, config):  # type: ignore[no-untyped-def]
        if isinstance(ev, NodeTelemetry) and (ev.meta.node, ev.meta.time_ms) in bad:
            raise ValueError("bad sample")
        return real(state, ev, config)

    monkeypatch.setattr(runner, "apply", apply)  # before the workers are forked: they have it too
    failed: list[tuple[int, str]] = []
    with NodeFeed(ReplayConfig(), workers=2, on_error=lambda ev, e: failed.append((id(ev), str(e)))) as feed:
        feed.add(events)
        result, _ = run(feed)
    mine = {id(ev) for ev in samples if (ev.meta.node, ev.meta.time_ms) in bad}
    assert result.failed == len(bad) == len(failed) > 3
    assert {f[0] for f in failed} == mine and {f[1] for f in failed} == {"bad sample"}


@needs_fork
def test_progress_counts_every_event_once() -> None:
    events = cluster()
    done: list[int] = []
    with NodeFeed(ReplayConfig(), workers=2, progress=done.append) as feed:
        feed.add(events)
        run(feed)
    assert sum(done) == feed.total == sum(1 for ev in events if node_of(ev))


@needs_fork
def test_workers_leave_ctrl_c_to_this_process() -> None:
    def handler(node: str, events: list[int]) -> object:
        return signal.getsignal(signal.SIGINT)

    # As in a terminal (a background run may ignore SIGINT already, and the workers would inherit that).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        pool = NodePool(handler, workers=2)
        try:
            assert pool.submit("a", []).result() == signal.SIG_IGN
        finally:
            pool.close()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # this process's is left
    finally:
        signal.signal(signal.SIGINT, before)
