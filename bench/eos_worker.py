"""The minimal Faust worker of bench/eos.py: the joiner's workload shape under a chosen processing
guarantee, and nothing of the joiner itself.

It reads the telemetry topic (the backlog, shared by every run) and a live topic of its own run in
batches (`take_events`: up to TAKE_MAX records or what arrived within
TAKE_WITHIN_S, as the joiner takes them), decodes every record, and per batch: writes one changelog
record per node seen (a compacted table, on the node's own partition, as the joiner's tables do) and
one output record (keyed by the batch's last node, carrying how many records it summed and the newest
input record time). Offsets are acknowledged as Faust does by default once a batch is handled; under
`exactly_once` Faust sends every one of these records through the transactional producer of its
partition, commits the consumed offsets in the same transaction, and reads with `read_committed`.

Run as `python -m bench.eos_worker` with its settings in EOS_* variables (see `main`); it appends one
JSON line to EOS_REPORT when 10 % and 90 % of EOS_EXPECTED records are handled (time, its own CPU, the
broker's CPU) and one when all are, and keeps running for the live phase until it is stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import faust

from periscope.bus import codec, topics
from periscope.bus.clients import Kafka
from periscope.bus.faust_transport import transport_class
from periscope.bus.profile import profile

TAKE_MAX = 2000
TAKE_WITHIN_S = 0.02


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def build(env: dict[str, str]) -> faust.App:
    kafka = Kafka(env["EOS_BOOTSTRAP"], profile=profile(env.get("EOS_PROFILE", "kafka")))
    partitions = int(env["EOS_PARTITIONS"])
    expected = int(env["EOS_EXPECTED"])
    report = env["EOS_REPORT"]
    broker_pid = int(env.get("EOS_BROKER_PID", "0"))

    class App(faust.App):
        # As the joiner's app: the broker profile's transport, and no Monitor sensor (per-record
        # bookkeeping nothing reads).
        def _new_transport(self) -> Any:
            return transport_class(kafka.profile)(self.conf.broker_consumer, self)

        def on_init_dependencies(self) -> Any:
            deps = super().on_init_dependencies()
            self.sensors.remove(self.monitor)
            return deps

        def on_rebalance_start(self) -> None:
            super().on_rebalance_start()
            if not self._rebalancing_sensor_state:
                self._rebalancing_sensor_state = {"started": True}

    app = App(
        env["EOS_APP_ID"], **kafka.faust_settings(),
        processing_guarantee=env["EOS_GUARANTEE"],
        store="memory://", datadir=env["EOS_DATA_DIR"], autodiscover=False, topic_partitions=partitions,
        topic_disable_leader=True, consumer_auto_offset_reset="earliest", web_enabled=False,
        broker_session_timeout=3.0, broker_heartbeat_interval=0.6, broker_rebalance_timeout=10.0,
        cython_optimizations=True,
    )
    table = app.Table("state", key_type=bytes, value_type=bytes, partitions=partitions)
    source = app.topic(topics.TELEMETRY.name, env["EOS_LIVE_INPUT"], key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")
    out = app.topic(env["EOS_OUTPUT"], key_type=bytes, value_type=bytes, key_serializer="raw",
                    value_serializer="raw", partitions=partitions)
    marks = [(0.1, "lo"), (0.9, "hi"), (1.0, "done")]
    state = {"handled": 0}

    def mark(name: str) -> None:
        line = {"mark": name, "handled": state["handled"], "t": time.monotonic(),
                "cpu_s": time.process_time(), "broker_cpu_s": _cpu_s(broker_pid) if broker_pid else 0.0}
        with open(report, "a") as f:
            f.write(json.dumps(line) + "\n")

    async def handle(stream: Any) -> None:
        async for events in stream.take_events(TAKE_MAX, TAKE_WITHIN_S):
            by_node: dict[bytes, tuple[int, float, int]] = {}
            newest_ms = 0
            for ev in events:
                msg = ev.message
                tel = codec.decode(topics.TELEMETRY, ev.value)
                util = sum(d.util_pct or 0.0 for d in tel.devices)
                n, total, _ = by_node.get(msg.key, (0, 0.0, msg.partition))
                by_node[msg.key] = (n + 1, total + util, msg.partition)
                newest_ms = max(newest_ms, round(msg.timestamp * 1000))
            for node, (n, total, partition) in by_node.items():
                value = json.dumps([n, total]).encode()
                table.send_changelog(partition, node, value)
                table.data[node] = value
            last = events[-1].message
            await out.send(key=last.key, value=json.dumps([len(events), newest_ms]).encode(),
                           partition=last.partition)
            state["handled"] += len(events)
            while marks and state["handled"] >= marks[0][0] * expected:
                mark(marks.pop(0)[1])

    app.agent(source, name="bench.eos.handle")(handle)
    return app


def main() -> None:
    app = build(dict(os.environ))
    sys.argv[1:] = ["worker", "--loglevel", os.environ.get("EOS_LOG_LEVEL", "warn"), "--without-web"]
    app.main()


if __name__ == "__main__":
    main()
