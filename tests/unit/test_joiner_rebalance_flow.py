"""The end of a rebalance in the joiner's Faust app: Faust resumes and seeks the stream partitions, and
only then resumes its flow control, which empties every stream's queue. A record its conductor receives
in between (the flow ran already, to read the changelogs) must reach the stream, not be emptied out:
its read offset has passed and no seek follows, so it would never be read again.

Run with Faust's own conductor and flow control on the joiner's app (nothing is started)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from faust.types import TP, Message

from periscope.bus.topics import TELEMETRY
from periscope.settings.joiner import JoinerSettings
from services.joiner.app import create_app


async def test_a_record_received_before_fausts_last_resume_reaches_the_stream(tmp_path: Path) -> None:
    app = create_app(JoinerSettings(kafka_bootstrap="127.0.0.1:1", data_dir=str(tmp_path)),
                     announce=lambda _line: None, partitions=4)
    tp = TP(TELEMETRY.name, 0)
    stream = app.topic(TELEMETRY.name, key_type=bytes, value_type=bytes, key_serializer="raw",
                       value_serializer="raw")
    conductor = app.topics
    conductor.add(stream)
    await conductor._update_indices()
    await conductor.on_partitions_assigned({tp})
    deliver = conductor._compile_message_handler()

    app.flow_control.resume()  # as while the changelogs were read
    await app.on_rebalance_complete.send()  # (no consumer runs: positioning is skipped with a warning)
    record = Message(tp.topic, tp.partition, 7, 0.0, 0, [], b"gpu-node-0", b"v", None, tp=tp)
    delivery = asyncio.ensure_future(deliver(record))
    await asyncio.sleep(0.05)
    app.flow_control.resume()  # Faust's last step of the rebalance
    await asyncio.wait_for(delivery, 2)

    assert stream.queue.qsize() == 1
    assert stream.queue.get_nowait().message.offset == 7
