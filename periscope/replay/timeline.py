"""A range's timeline as streamed JSON: replayed node by node, spooled, merged by event time.

The core replays one node at a time, but the timeline lists every node's records by event time (within
an instant: node name order, then the core's emission order). Holding every output of an hour of a
large cluster until the end takes gigabytes, so each node's kept outputs are rendered to one compact
JSON line each as soon as that node is done, sorted by event time (stably) and appended to a temporary
file as one run; the runs are then merged by time into the document. What stays in memory is the
event time of each line (8 bytes) and one read buffer per node.
"""

from __future__ import annotations

import heapq
import json
import os
import tempfile
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from periscope.core.model import Output
from periscope.replay.render import output_json
from periscope.replay.runner import (
    OnError,
    ReplayConfig,
    ReplayInput,
    ReplayResult,
    by_node,
    output_time,
    paused_gc,
    replay_nodes,
)

Json = dict[str, Any]
_BLOCK = 1 << 16  # bytes read at a time from one run while merging


@dataclass(slots=True)
class _Run:
    start: int  # offset of the run's first line in the spool
    end: int
    times: array[int] = field(default_factory=lambda: array("q"))  # event time of each line


class Spool:
    """JSON lines of outputs in runs (one per node), each sorted by event time; merged on reading."""

    def __init__(self) -> None:
        # Owned by the spool, closed by close() / the with-block.
        self._file: IO[bytes] = tempfile.TemporaryFile(prefix="periscope-replay-")  # noqa: SIM115
        self._runs: list[_Run] = []
        self._end = 0
        self.items = 0

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_run(self, outputs: list[Output]) -> None:
        """One node's outputs, in emission order."""
        if not outputs:
            return
        timed = sorted(((output_time(o), i) for i, o in enumerate(outputs)))  # stable: ties by index
        dumps = orjson.dumps
        data = b"".join(dumps(output_json(outputs[i])) + b"\n" for _, i in timed)
        self._file.write(data)
        run = _Run(self._end, self._end + len(data), array("q", (t for t, _ in timed)))
        self._end = run.end
        self._runs.append(run)
        self.items += len(timed)

    def _lines(self, run: _Run) -> Iterator[tuple[int, bytes]]:
        fd, pos, rest, n = self._file.fileno(), run.start, b"", 0
        while pos < run.end:
            chunk = os.pread(fd, min(_BLOCK, run.end - pos), pos)
            if not chunk:
                raise OSError("the replay spool file ended early")
            pos += len(chunk)
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                yield run.times[n], line
                n += 1

    def merged(self) -> Iterator[bytes]:
        """Every line (without its newline), by event time; equal times keep run order, then line order."""
        self._file.flush()
        runs = [self._lines(r) for r in self._runs]
        for _, line in heapq.merge(*runs, key=lambda x: x[0]):
            yield line


def replay_to_spool(events: list[ReplayInput], config: ReplayConfig, spool: Spool, *,
                    progress: Callable[[int], None] | None = None,
                    on_error: OnError | None = None) -> ReplayResult:
    """Replay `events` (the list is emptied: its events are freed node by node) into `spool`."""
    result = ReplayResult()
    with paused_gc():
        groups = by_node(events, config.to_ms)
        events.clear()
        for _, outs in replay_nodes(groups, config, result, progress=progress, on_error=on_error,
                                    keep_states=False):
            spool.add_run(outs)
    return result


def write_document(out: IO[bytes], doc: Json, items: Iterator[bytes], stream: str = "items") -> None:
    """`doc` as `json.dumps(indent=2)` lays it out, except that `doc[stream]` is written from `items`
    (JSON texts), one compact item per line: the same layout as `render.json_chunks`."""
    text = json.dumps({**doc, stream: []}, indent=2)
    marker = f"\n  {json.dumps(stream)}: ["
    head, found, tail = text.partition(marker + "]")
    assert found, "dumps writes every top-level key on its own line"
    buf = bytearray((head + marker).encode())
    sep = b"\n    "
    empty = True
    for item in items:
        buf += sep
        buf += item
        sep = b",\n    "
        empty = False
        if len(buf) >= 1 << 20:
            out.write(buf)
            buf.clear()
    buf += (("]" if empty else "\n  ]") + tail + "\n").encode()
    out.write(buf)
    out.flush()
