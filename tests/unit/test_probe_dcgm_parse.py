"""The probe parses the exporter's profiling series by hand (prometheus_client's parser cost ~40 ms for a
MIG node). prometheus_client is the reference here: on the conformance fixture, on the benchmark's
8-GPU and MIG expositions and on generated text with awkward label values, both give the same readings;
a profiling line that is not a series of the text format is `corrupt`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from bench.dcgm_scrape import node
from services.probe.dcgm import FIELDS, ExporterError, Reading, parse

CORPUS = Path(__file__).parent / "data" / "corpus" / "dcgm"


def reference(text: str) -> list[Reading]:
    """The readings prometheus_client's parser gives for the profiling lines of `text`."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(tuple(FIELDS))]
    out = []
    for fam in text_string_to_metric_families("\n".join(lines) + "\n"):
        for s in fam.samples:
            attr = FIELDS.get(s.name)
            uuid = s.labels.get("UUID") or s.labels.get("uuid") or ""
            gi = s.labels.get("GPU_I_ID", "")
            if attr is None or not uuid or (gi and not gi.isdigit()):
                continue
            if math.isfinite(s.value) and 0.0 <= s.value <= 1.0:
                out.append(Reading(attr, uuid, int(gi) if gi else None, round(s.value * 100.0, 3)))
    return out


@pytest.mark.parametrize("name", ["fixture", "gpus", "mig"])
def test_same_readings_as_prometheus_client(name: str) -> None:
    text = (CORPUS / "a100-mig-k8s.prom").read_text() if name == "fixture" else node(name == "mig").text
    readings, series = parse(text)
    assert readings == reference(text) and readings
    assert series == sum(1 for ln in text.splitlines() if ln.startswith("DCGM_"))


def test_bench_expositions_hold_the_series_they_claim() -> None:
    gpus, mig = node(mig=False), node(mig=True)
    assert (gpus.series, mig.series) == (8 * 27, 56 * 23)
    assert len(parse(gpus.text)[0]) == 8 * 5 and len(parse(mig.text)[0]) == 56 * 5


_label_value = st.text(st.sampled_from(list('ab ,{}="\\\n=#x')), max_size=12)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@settings(max_examples=200, deadline=None)
@given(
    field=st.sampled_from(sorted(FIELDS)),
    before=st.lists(st.tuples(st.sampled_from(["gpu", "device", "modelName", "pod"]), _label_value),
                    max_size=3, unique_by=lambda kv: kv[0]),
    uuid=_label_value.filter(bool),
    gi=st.one_of(st.none(), st.integers(0, 14).map(str)),
    value=st.sampled_from(["0", "0.5", "1", "1.000000", "0.25e0", "NaN", "+Inf", "2", "-0.1"]),
    timestamp=st.sampled_from(["", " 1700000000000"]),
    sep=st.sampled_from([",", ", "]),
    trailing_comma=st.booleans(),
)
def test_generated_series_agree(field: str, before: list[tuple[str, str]], uuid: str, gi: str | None,
                                 value: str, timestamp: str, sep: str, trailing_comma: bool) -> None:
    pairs = [*before, ("UUID", uuid), *([("GPU_I_ID", gi)] if gi is not None else [])]
    labels = sep.join(f'{k}="{_escape(v)}"' for k, v in pairs) + ("," if trailing_comma else "")
    text = f"# TYPE {field} gauge\n{field}{{{labels}}} {value}{timestamp}\n"
    got, series = parse(text)
    assert got == reference(text) and series == 1
    if got:
        assert got[0].uuid == uuid


@pytest.mark.parametrize(
    "line",
    [
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-x" 0.5',  # no closing brace
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-x} 0.5',  # unterminated value
        'DCGM_FI_PROF_SM_ACTIVE{UUID=GPU-x} 0.5',  # unquoted value
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-x"}',  # no value
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-x"} zero',
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-x"} 0_5',  # float() would take it
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-x"} 0.5 later',  # timestamp not a number
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-x" gpu="0"} 0.5',  # no comma between labels
        'DCGM_FI_PROF_SM_ACTIVE{1gpu="0",UUID="GPU-x"} 0.5',  # label name
    ],
)
def test_a_broken_profiling_line_is_corrupt(line: str) -> None:
    with pytest.raises(ExporterError) as e:
        parse(line + "\n")
    assert e.value.state == "corrupt"
