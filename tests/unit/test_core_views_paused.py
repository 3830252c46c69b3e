"""Views paused while a host catches up (engine.pause_views / refresh_views / resume_views): the core steps
samples without building attributions and GPU states, and a refresh gives the views the samples would
have ended with. For subscribers nothing differs from stepping with views: the same findings in the same
order, every closed window once, the same newest attribution and GPU state per key; and every output
after the resume is the one the core computes with views throughout."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from periscope.core.changes import without_windows
from periscope.core.engine import apply, new_state, output_key, pause_views, refresh_views, resume_views
from periscope.core.model import Finding, GpuState, NodeInput, NodeTelemetry, Output, PodAttribution, XidEvent
from tests.unit.core_builders import NODE, tel
from tests.unit.test_joiner_newest import CONFIG, _feed, _windows


def _eager(feed: list[NodeInput]) -> list[list[Output]]:
    state = new_state(NODE)
    return [apply(state, ev, CONFIG) for ev in feed]


def _paused(feed: list[NodeInput], pause_at: int, resume_at: int) -> list[list[Output]]:
    """Outputs per event, views paused before event `pause_at` and resumed before `resume_at` (the
    resume's outputs counted with that event's)."""
    state, out = new_state(NODE), []
    for i, ev in enumerate(feed):
        got: list[Output] = []
        if i == pause_at:
            pause_views(state)
        if i == resume_at:
            got += resume_views(state, CONFIG)
        out.append(got + apply(state, ev, CONFIG))
    out[-1] += resume_views(state, CONFIG)
    return out


def _latest_bare(outs: list[Output]) -> dict[str, Output]:
    return {output_key(o): without_windows(o) for o in outs if not isinstance(o, Finding)}


def _check(feed: list[NodeInput], pause_at: int, resume_at: int) -> None:
    eager, paused = _eager(feed), _paused(feed, pause_at, resume_at)
    flat_e = [o for step in eager for o in step]
    flat_p = [o for step in paused for o in step]
    assert [o for o in flat_p if isinstance(o, Finding)] == [o for o in flat_e if isinstance(o, Finding)]
    assert _windows(flat_p) == _windows(flat_e)  # every closed window, once
    assert _latest_bare(flat_p) == _latest_bare(flat_e)
    computed = [without_windows(o) for o in flat_e]
    assert all(without_windows(o) in computed for o in flat_p)  # nothing made up
    # After the resume, exactly what the core computes with views throughout.
    assert paused[resume_at + 1:] == eager[resume_at + 1:]


def test_a_paused_span_builds_no_views_and_its_refresh_leaves_subscribers_where_views_would() -> None:
    feed = _feed(40)
    first_tick = next(i for i, ev in enumerate(feed) if type(ev).__name__ == "NodeTelemetry")
    paused = _paused(feed, first_tick + 3, first_tick + 30)
    # Findings only, but at the XID: the views of the samples before it first (a GPU's state names its
    # last XID, so they are built before it counts).
    xid_ms = next(ev.meta.time_ms for ev in feed if isinstance(ev, XidEvent))
    views = [[o for o in paused[i] if isinstance(o, PodAttribution | GpuState)]
             for i in range(first_tick + 4, first_tick + 30)]
    assert len([v for v in views if v]) == 1  # the step that released the XID
    assert max(o.as_of_ms for v in views for o in v) == xid_ms - 1  # the sample before it
    assert any(isinstance(o, Finding) for step in paused[first_tick + 4:first_tick + 30] for o in step)
    resumed = paused[first_tick + 30]
    assert {type(o) for o in resumed} >= {PodAttribution, GpuState}
    # The windows closed while paused ride on the refreshed attributions.
    assert any(r.windows for o in resumed if isinstance(o, PodAttribution) for r in o.rows)
    _check(feed, first_tick + 3, first_tick + 30)


def test_refresh_without_paused_steps_gives_nothing_and_keeps_views_paused() -> None:
    state = new_state(NODE)
    feed = _feed(12)
    for ev in feed[:8]:
        apply(state, ev, CONFIG)
    pause_views(state)
    assert refresh_views(state, CONFIG) == []
    for ev in feed[8:]:
        apply(state, ev, CONFIG)
    assert refresh_views(state, CONFIG)  # samples were stepped paused: their views
    assert refresh_views(state, CONFIG) == []  # and only once
    assert state.views_paused


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_paused_span_ends_where_views_throughout_would(data: st.DataObject) -> None:
    feed = _feed(data.draw(st.integers(8, 60), label="ticks"))
    pause_at = data.draw(st.integers(0, len(feed) - 1), label="pause_at")
    resume_at = data.draw(st.integers(pause_at, len(feed) - 1), label="resume_at")
    _check(feed, pause_at, resume_at)


def test_a_gpu_gone_from_the_samples_while_paused_keeps_its_last_view() -> None:
    """Eager stepping publishes a GPU's state with each sample that holds it; paused, the GPU's last
    sample is not the node's last, so its views are built before the first sample without it."""
    feed = _feed(30)
    cut = next(i for i, ev in enumerate(feed) if isinstance(ev, NodeTelemetry) and ev.meta.time_ms == 20_000)
    # From 20 s on the node reports its first GPU only (the second gone: lost from NVML, say).
    feed = feed[:cut] + [tel(ev.meta.time_ms, ev.devices[0]) if isinstance(ev, NodeTelemetry) else ev
                         for ev in feed[cut:]]
    before = feed[cut - 1]
    assert isinstance(before, NodeTelemetry)
    gone = before.devices[1].uuid
    paused = _paused(feed, cut - 8, len(feed) - 1)
    last = {o.as_of_ms for step in paused for o in step if isinstance(o, GpuState) and o.gpu_uuid == gone}
    assert max(last) == 19_000  # its last sample's state, published
    _check(feed, cut - 8, len(feed) - 1)
