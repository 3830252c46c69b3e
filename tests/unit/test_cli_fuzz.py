"""Every command-line input parser under fuzzing (hypothesis): durations, times, device IDs, scenario
files, the checkpoint and cgroup files of `periscope inspect`, and the flags of `up`, `replay`,
`inspect`, `doctor` and `top`. Whatever the input, a parser either accepts it or says why in one
`ValueError`; a command either works or exits 2 with one clean line: no traceback, no "internal error".

Nothing is started: `up` stops where it would start the stack and `replay` where it would read the broker.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from periscope.cli.errors import InputError
from periscope.cli.top import _api_base
from periscope.contract.values import MAX_TIME_MS, MIN_TIME_MS, parse_time_ms, rfc3339
from periscope.core.duration import MAX_DURATION_MS, parse_duration_ms
from periscope.replay.reader import ReadError
from tests.unit.test_hostile_cli import cli, one_line

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
# Values of every JSON/YAML type, nested a little: what a careless or hostile file holds.
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
           | st.sampled_from(["10s", "0:1", "1.5", "-1", "GPU-0", "nvidia.com/gpu", "9" * 400, "2021-13-45"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)


def bad_or_ok(code: int, out: str, err: str, ok: tuple[int, ...] = (0,)) -> None:
    """Either it worked (a status in `ok`, no "internal error") or it is one clean line, exit 2."""
    if code == 2:
        one_line(code, out, err, 2)
    else:
        assert code in ok, (code, out[-300:], err[-500:])
        assert "internal error" not in err and "Traceback" not in err, err[-1000:]


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fuzz-") as d:
        yield Path(d)


@pytest.fixture
def no_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("periscope.sim.cli.run_up", lambda opts, model: 0)


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ReadError("fuzzing reads no broker")

    monkeypatch.setattr("services.replay.cli._timeline", refuse)
    monkeypatch.setattr("services.replay.cli.owners_with_stats", refuse)


# ---------------------------------------------------------------- the parsers themselves


@FUZZ
@given(st.text() | st.from_regex(r"\A(\d{1,70}(\.\d{1,5})?(ms|s|m|h|d)){1,4}\Z"))
def test_durations_parse_within_bounds_or_say_why(text: str) -> None:
    try:
        ms = parse_duration_ms(text)
    except ValueError as e:
        assert str(e) and len(str(e)) < 200
    else:
        assert 0 <= ms <= MAX_DURATION_MS


def test_a_duration_of_escaped_characters_is_quoted_short() -> None:
    # Found by the fuzzer: repr writes each of these as ten characters, so 40 of them made a 460-character
    # message out of a quote meant to be short.
    text = "0" * 10 + "\x1f\ud7fc" + "\U0001005e" * 28
    with pytest.raises(ValueError) as e:
        parse_duration_ms(text)
    assert len(str(e.value)) < 120 and "(40 characters)" in str(e.value)


TIMES = (st.text()
         | st.from_regex(r"\A\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})?\Z")
         | st.datetimes(timezones=st.timezones()).map(lambda t: t.isoformat()))


@FUZZ
@given(TIMES)
def test_times_parse_to_what_can_be_written_back_or_say_why(text: str) -> None:
    try:
        ms = parse_time_ms(text)
    except ValueError as e:
        assert str(e) and len(str(e)) < 200
    else:
        assert MIN_TIME_MS <= ms <= MAX_TIME_MS
        written = rfc3339(ms)
        assert len(written) == 24 and parse_time_ms(written) == ms


@FUZZ
@given(st.text(max_size=300))
def test_api_urls_are_taken_or_refused_in_one_line(url: str) -> None:
    try:
        _api_base(url)
    except InputError as e:
        assert "\n" not in e.format_message()


# ---------------------------------------------------------------- inspect


@FUZZ
@given(st.text() | st.from_regex(r"\A(GPU|MIG)-[0-9a-f-]{0,40}(::\d{0,12})?(/\d{0,5}/\d{0,5})?\Z"))
def test_inspect_device_id(text: str) -> None:
    code, out, err = cli("inspect", "device-id", "--", text)
    bad_or_ok(code, out, err)
    if code == 0:
        assert json.loads(out)["kind"] in ("gpu", "mig", "gke-gpu", "gke-mig")


@FUZZ
@given(st.binary(max_size=2000) | st.lists(
    st.from_regex(r"\A\d{1,3}:[a-z_,=]{0,20}:/[\w./:-]{0,120}\Z"), max_size=6).map(
    lambda lines: "\n".join(lines).encode()))
def test_inspect_cgroup_file(scratch: Path, content: bytes) -> None:
    path = scratch / "cgroup"
    path.write_bytes(content)
    bad_or_ok(*cli("inspect", "cgroup", path))


CHECKPOINTS = st.binary(max_size=3000) | st.fixed_dictionaries(
    {"Data": st.fixed_dictionaries({}, optional={
        "PodDeviceEntries": st.none() | st.lists(VALUES | st.fixed_dictionaries({}, optional={
            k: VALUES for k in ("PodUID", "ContainerName", "ResourceName", "DeviceIDs", "AllocResp")}),
            max_size=3),
        "RegisteredDevices": VALUES}) | VALUES},
    optional={"Checksum": VALUES, "BootID": VALUES},
).map(lambda doc: json.dumps(doc).encode())


@FUZZ
@given(CHECKPOINTS, st.booleans())
def test_inspect_checkpoint_file(scratch: Path, content: bytes, as_json: bool) -> None:
    path = scratch / "kubelet_internal_checkpoint"
    path.write_bytes(content)
    code, out, err = cli("inspect", "checkpoint", path, *(["--json"] if as_json else []))
    bad_or_ok(code, out, err)
    if code == 0 and as_json:
        assert json.loads(out)["format"] in ("v1", "v2")


# ---------------------------------------------------------------- scenario files and the flags of up

SCENARIOS = st.fixed_dictionaries(
    {"nodes": st.lists(st.fixed_dictionaries(
        {"name": st.sampled_from(["a", "b"]) | VALUES,
         "gpus": st.lists(st.fixed_dictionaries(
             {"model": st.just("T4") | VALUES, "memory_mib": st.just(15360) | VALUES},
             optional={"mig": VALUES, "uuid": VALUES}), max_size=2) | VALUES},
        optional={"sharing": VALUES, "checkpoint": VALUES}), max_size=2)},
    optional={"duration": st.just("30s") | VALUES, "tick": VALUES, "name": VALUES, "seed": VALUES,
              "pods": st.lists(st.fixed_dictionaries(
                  {"name": st.just("p") | VALUES, "node": st.just("a") | VALUES,
                   "containers": st.lists(st.fixed_dictionaries({"name": st.just("c") | VALUES}, optional={
                       k: VALUES for k in ("resource", "count", "util_pct", "memory_mib", "devices")}),
                       max_size=2)},
                  optional={"start": VALUES, "stop": VALUES, "uid": VALUES, "owner": VALUES}), max_size=2),
              "events": VALUES, "users": VALUES, "policy": VALUES},
).map(lambda doc: yaml.safe_dump(doc, allow_unicode=True)) | st.text(max_size=500)


@FUZZ
@given(SCENARIOS)
def test_up_with_any_scenario_file(scratch: Path, no_start: None, text: str) -> None:
    path = scratch / "scenario.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    bad_or_ok(*cli("up", "--scenario", path, "--api-port", "0", "--broker-port", "0"))


UP_FLAGS = ["--idle-window", "--idle-threshold", "--speed", "--api-port", "--broker-port", "--broker",
            "--apiserver", "--log-level", "--max-nodes", "--max-gpus", "--max-pods", "--scenario"]
FLAG_VALUES = (st.text(max_size=40) | st.integers().map(str) | st.floats().map(str)
               | st.sampled_from(["0", "-1", "9" * 400, "9" * 400 + "s", "1e400", "nan", "inf", "65536"]))


@FUZZ
@given(st.sampled_from(UP_FLAGS), FLAG_VALUES)
def test_up_with_any_flag_value(no_start: None, flag: str, value: str) -> None:
    if value in ("kafka", "kube") or (flag == "--scenario" and os.path.exists(value)):
        return  # a real toolchain or a real file: not what this test is about
    ports = [] if flag in ("--api-port", "--broker-port") else ["--api-port", "0", "--broker-port", "0"]
    bad_or_ok(*cli("up", *ports, flag, value))


# ---------------------------------------------------------------- replay, doctor


@FUZZ
@given(st.sampled_from([["--from", "{}", "--to", "2026-01-01T00:00:00Z"], ["--at", "{}"],
                        ["--from", "2026-01-01T00:00:00Z", "--to", "{}"],
                        ["--at", "2026-01-01T00:00:00Z", "--lookback", "{}"],
                        ["--from", "2025-01-01T00:00:00Z", "--to", "2026-01-01T00:00:00Z",
                         "--window-lookback", "{}"],
                        ["--at", "2026-01-01T00:00:00Z", "--bootstrap", "{}"],
                        ["--at", "2026-01-01T00:00:00Z", "--format", "{}"]]), TIMES | FLAG_VALUES)
def test_replay_with_any_flag_value(no_broker: None, template: list[str], value: str) -> None:
    args = [value if a == "{}" else a for a in template]
    code, out, err = cli("replay", "--bootstrap", "127.0.0.1:9", "-q", *args)
    if code == 1:  # valid input: it got as far as the broker, which fuzzing does not read
        assert err == "periscope: fuzzing reads no broker\n", err
    else:
        bad_or_ok(code, out, err)


@FUZZ
@given(st.sampled_from(["--root", "--nvml-backend", "--timeout"]), FLAG_VALUES)
def test_doctor_with_any_flag_value(flag: str, value: str) -> None:
    if flag == "--root" and os.path.exists(value):
        return  # a real directory would be checked for real
    args = [flag, value] if flag == "--root" else ["--root", "/nonexistent-root", flag, value]
    one_line(*cli("doctor", *args), 2)
