"""Live and replay agree: the Faust joiner (`periscope join`, a subprocess) and `periscope replay` over the
same input topics publish/print the same attribution records (same keys, same event times, same
content) for a window in the middle of the run.

The test has its own broker (the joiner reads every input record there is). Events are published in
event-time order, each once the joiner has taken the previous one, as probes publish in real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from periscope.bus import codec
from periscope.bus import topics as t
from periscope.bus.admin import ensure_topics, partition_counts
from periscope.bus.clients import Kafka
from periscope.bus.producer import Publisher
from periscope.cli.main import main
from periscope.contract.values import rfc3339
from periscope.core.model import NodeInput, NodeTelemetry, XidEvent
from periscope.devkit.brokers import KINDS, LocalBroker
from periscope.replay.document import output_json
from periscope.replay.reader import read_inputs
from periscope.replay.runner import output_time, replay_events
from periscope.settings.replay import ReplaySettings
from services.replay.cli import range_config, range_plan
from tests.integration.test_replay import topic_of
from tests.kafka_tier import kafka_missing
from tests.unit.test_replay_owners import reuse_scenario

REPO = Path(__file__).resolve().parents[2]
BASE = 1_790_000_000_000
S = 1000
NODES = ("gpu-live-a", "gpu-live-b")
WINDOW = (BASE + 20 * S, BASE + 100 * S)  # the scenario runs from BASE to BASE + 117 s


@pytest.fixture(params=KINDS)
async def bootstrap(request: pytest.FixtureRequest, tmp_path: Path,
                    monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Kafka]:
    """A broker of its own, of each kind in turn (`periscope replay` here reads the profile from the
    environment, as a user's does)."""
    if request.param == "kafka" and kafka_missing():
        pytest.skip(kafka_missing())
    monkeypatch.setenv("PERISCOPE_KAFKA_PROFILE", request.param)
    broker = LocalBroker(request.param, tmp_path / "broker")
    await asyncio.to_thread(broker.start)
    try:
        await ensure_topics(broker.client())
        yield broker.client()
    finally:
        await asyncio.to_thread(broker.stop)


class Joiner:
    """`periscope join` in its own process group, output in a log file."""

    def __init__(self, kafka: Kafka, tmp: Path, app_id: str) -> None:
        self.log_path = tmp / "joiner.log"
        env = {**os.environ, "PERISCOPE_KAFKA_BOOTSTRAP": kafka.bootstrap,
               "PERISCOPE_KAFKA_PROFILE": kafka.profile.name, "PERISCOPE_APP_ID": app_id,
               "PERISCOPE_SESSION_TIMEOUT": "3s", "PERISCOPE_DATA_DIR": str(tmp / "joiner-data"),
               "PERISCOPE_WEB_PORT": "0", "PERISCOPE_LOG_LEVEL": "info"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "periscope.cli.main", "join"], cwd=REPO,
                                         env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.url = ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""
        except OSError:
            return 0, ""

    async def ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"joiner exited with {self.proc.returncode}:\n{self.log()}"
            if not self.url and (m := re.search(r"^joiner: (http://\S+)$", self.log(), re.M)):
                self.url = m.group(1)
            if self.url and self.get("/readyz")[0] == 200:
                return
            assert time.monotonic() < deadline, f"joiner not ready after {timeout}s:\n{self.log()}"
            await asyncio.sleep(0.2)

    def events_in(self) -> int:
        status, text = self.get("/metrics")
        assert status == 200
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("periscope_joiner_events_in_total")))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


async def publish_like_a_cluster(bootstrap: Kafka, joiner: Joiner, events: list[NodeInput]) -> None:
    """State-based events first (the core indexes them by event time, so knowing them early changes
    nothing); then samples and XIDs in event-time order, each once the joiner has taken the one before,
    as probes publish them: a tick a second, never several seconds of a node at once (a joiner that gets
    a batch spanning several seconds of a node is catching up, and publishes only the newest output per
    key of it), and an XID never after later samples were processed."""
    state = [e for e in events if not isinstance(e, NodeTelemetry | XidEvent)]
    stream = [e for e in events if isinstance(e, NodeTelemetry | XidEvent)]
    chunks: list[list[NodeInput]] = [state, *([e] for e in stream)]
    sent = 0
    async with Publisher(bootstrap, "live-probe") as pub:
        for chunk in chunks:
            for ev in chunk:
                await pub.send(topic_of(ev), ev.meta.node, ev)
            sent += len(chunk)
            deadline = time.monotonic() + 30
            while joiner.events_in() < sent:
                assert time.monotonic() < deadline, f"the joiner did not take {sent} events:\n{joiner.log()}"
                await asyncio.sleep(0.05)


async def live_outputs(kafka: Kafka, want: set[Identity], timeout: float = 30) -> list[Any]:
    """Every output record the joiner published, once those named in `want` are there."""
    parts = await partition_counts(kafka, (tp.name for tp in t.OUTPUTS))
    consumer = kafka.consumer(client_id="test-live-outputs")
    await consumer.start()
    seen: list[Any] = []
    try:
        consumer.assign([TopicPartition(name, p) for name, n in parts.items() for p in range(n)])
        for tp in consumer.assignment():
            consumer.seek(tp, 0)
        deadline = time.monotonic() + timeout
        while not want <= set(by_identity([output_json(o) for o in seen])):
            assert time.monotonic() < deadline, "the joiner did not publish every record replay names"
            for tp, recs in (await consumer.getmany(timeout_ms=200)).items():
                seen += [codec.decode(t.BY_NAME[tp.topic], r.value or b"") for r in recs]
        await asyncio.sleep(1.0)  # anything published late (and unexpected) is collected too
        for tp, recs in (await consumer.getmany(timeout_ms=500)).items():
            seen += [codec.decode(t.BY_NAME[tp.topic], r.value or b"") for r in recs]
    finally:
        await consumer.stop()
    return seen


def replay_json(bootstrap: Kafka, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--bootstrap", bootstrap.bootstrap, "--from", rfc3339(WINDOW[0]),
              "--to", rfc3339(WINDOW[1]),
              "--window-lookback", "1h", "--format", "json", "--quiet"])
    assert exc.value.code == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


Identity = tuple[str, str, str, str]


def by_identity(items: list[dict[str, Any]]) -> dict[Identity, dict[str, Any]]:
    """Records by (node, kind, bus key, event time); the two nodes reuse the same IDs."""
    out: dict[Identity, dict[str, Any]] = {}
    for i in items:
        ident = (i["node"], i["kind"], i["key"], i["at"])
        assert out.get(ident, i) == i, f"two different records for {ident}"
        out[ident] = i
    return out


async def test_live_joiner_and_replay_emit_identical_records(bootstrap: Kafka, tmp_path: Path, unique: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    events = sorted((ev for node in NODES for ev in reuse_scenario(node, BASE)),
                    key=lambda e: (e.meta.time_ms, e.meta.node))
    joiner = Joiner(bootstrap, tmp_path, f"joiner-live-{unique}")
    try:
        await joiner.ready()
        await publish_like_a_cluster(bootstrap, joiner, events)
        # Replay first (it must not disturb the live consumer group), then collect what the joiner sent.
        doc = await asyncio.to_thread(replay_json, bootstrap, capsys)
        replayed = by_identity(doc["items"])
        assert {k[1] for k in replayed} == {"attribution", "gpu", "finding"}
        assert {k[0] for k in replayed} == set(NODES)
        live = await live_outputs(bootstrap, set(replayed))
        # The same replay as library calls, for the records themselves (window stats included).
        settings = ReplaySettings(replay_window_lookback=3600)
        read, _ = await read_inputs(bootstrap, range_plan(*WINDOW, settings))
        result = replay_events(read, range_config(*WINDOW, settings, {}))
    finally:
        joiner.stop()
    in_window = [o for o in live if WINDOW[0] <= output_time(o) <= WINDOW[1]]
    live_items = by_identity([output_json(o) for o in in_window])
    assert sorted(live_items) == sorted(replayed)  # same keys and event times
    assert live_items == replayed  # and the same records
    assert doc["stats"]["bad_records"] == 0 and doc["stats"]["failed_events"] == 0
    # Byte for byte on the wire, as subscribers get them.
    assert sorted(codec.encode(o) for o in in_window) == sorted(codec.encode(o) for o in result.outputs)
