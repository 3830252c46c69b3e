"""A range's timeline as streamed JSON: replayed node by node, spooled, merged by event time.

The core replays one node at a time (or several side by side in worker processes), but the timeline
lists every node's records by event time (within an instant: node name order, then the core's emission
order). Holding every output of an hour of a large cluster until the end takes gigabytes, so each
node's kept outputs are rendered to one compact JSON item each as soon as that node is done, sorted by
event time (stably) and appended to a spool file as one run; the runs are then merged by time into the
document. With worker processes, each worker renders its nodes and appends their runs to a file of its
own. An item is spooled as it is written in the document (after the separator that precedes it), and
a run is cut into blocks of the items of one instant: merging moves whole blocks, so writing the
document copies bytes, one block at a time, instead of handling every item in Python. What stays in
memory is the time and end of each block and one read buffer.
"""

from __future__ import annotations

import heapq
import json
import os
import shutil
import tempfile
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from periscope.core.model import Output
from periscope.heap import paused_gc
from periscope.replay.document import output_json
from periscope.replay.feed import NodeFeed
from periscope.replay.runner import NodeReplay, OnError, ReplayConfig, ReplayInput, ReplayResult, output_time

Json = dict[str, Any]
SEP = b",\n    "  # what precedes an item in the document; the first item's leading comma is dropped
_BLOCK = 1 << 20  # bytes copied at a time while merging


@dataclass(slots=True)
class Run:
    """One node's items in a spool file: [start, ends[-1]), in blocks of one event time each."""

    path: str  # the spool file holding it
    start: int
    times: array[int] = field(default_factory=lambda: array("q"))  # event time of each block
    ends: array[int] = field(default_factory=lambda: array("q"))  # file offset where each block ends
    items: int = 0


def render_run(outputs: list[Output]) -> tuple[list[bytes], array[int], array[int], int]:
    """A node's outputs (in emission order) as spooled: the items sorted by event time (stably), each
    preceded by SEP; the time of each block of one instant and its end relative to the run's start.
    The items stay apart (`append_run` writes them one after another): an hour of a node is some 75 MB
    of them, and a joined copy that size is a fresh mapping each time (past glibc's mmap threshold)."""
    timed = sorted((output_time(o), i) for i, o in enumerate(outputs))  # stable: ties by index
    dumps = orjson.dumps
    parts = [SEP + dumps(output_json(outputs[i])) for _, i in timed]
    times, ends = array("q"), array("q")
    pos, last = 0, None
    for (t, _), part in zip(timed, parts, strict=True):
        if t != last and last is not None:
            times.append(last)
            ends.append(pos)
        pos += len(part)
        last = t
    if last is not None:
        times.append(last)
        ends.append(pos)
    return parts, times, ends, len(parts)


def append_run(out: IO[bytes], path: str, outputs: list[Output]) -> Run | None:
    """Render `outputs` and append them to `out` (the spool file at `path`) as one run."""
    if not outputs:
        return None
    parts, times, rel, items = render_run(outputs)
    start = out.seek(0, os.SEEK_END)
    out.writelines(parts)
    out.flush()
    return Run(path, start, times, array("q", (start + e for e in rel)), items)


class Spool:
    """Runs of JSON items (one per node), each sorted by event time, in files of a private folder."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="periscope-replay-")
        self._path = os.path.join(self.dir, "main")
        self._file: IO[bytes] = open(self._path, "w+b", buffering=_BLOCK)  # noqa: SIM115  (closed by close())
        self._runs: list[Run] = []
        self.items = 0

    def close(self) -> None:
        self._file.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_run(self, outputs: list[Output]) -> None:
        """One node's outputs, in emission order (runs are merged in the order they are added)."""
        self.add(self.write_run(outputs))

    def write_run(self, outputs: list[Output]) -> Run | None:
        """One node's outputs written to this spool's own file, to be added later (`add`)."""
        return append_run(self._file, self._path, outputs)

    def add(self, run: Run | None) -> None:
        """A run written elsewhere (a worker's file in this spool's folder)."""
        if run is not None:
            self._runs.append(run)
            self.items += run.items

    def _blocks(self) -> Iterator[tuple[int, int, int, int]]:
        """(time, run, start, end) of every block, by time; equal times keep run order."""
        def blocks(k: int, run: Run) -> Iterator[tuple[int, int, int, int]]:
            start = run.start
            for t, end in zip(run.times, run.ends, strict=True):
                yield t, k, start, end
                start = end
        return heapq.merge(*(blocks(k, r) for k, r in enumerate(self._runs)), key=lambda b: b[0])

    def chunks(self) -> Iterator[bytes]:
        """The document's items, merged by event time, as written there (SEP before each item, but
        none before the first): consecutive blocks of one run are read in one piece."""
        fds: dict[str, int] = {}
        self._file.flush()
        try:
            for path in {r.path for r in self._runs}:
                fds[path] = os.open(path, os.O_RDONLY)
            first = True
            run, lo, hi = -1, 0, 0
            for _, k, start, end in self._blocks():
                if k == run and start == hi and end - lo <= _BLOCK:
                    hi = end
                    continue
                if run >= 0:
                    yield self._read(fds, run, lo, hi, first)
                    first = False
                run, lo, hi = k, start, end
            if run >= 0:
                yield self._read(fds, run, lo, hi, first)
        finally:
            for fd in fds.values():
                os.close(fd)

    def _read(self, fds: dict[str, int], run: int, lo: int, hi: int, first: bool) -> bytes:
        data = os.pread(fds[self._runs[run].path], hi - lo, lo)
        if len(data) != hi - lo:
            raise OSError("the replay spool file ended early")
        return data[1:] if first else data  # the document's first item follows no comma

    def merged(self) -> Iterator[bytes]:
        """Every item (its JSON text alone), by event time; equal times keep run order, then item order."""
        first = True
        for chunk in self.chunks():
            parts = (b"," + chunk if first else chunk).split(SEP)
            yield from parts[1:]
            first = False


def spool_feed(config: ReplayConfig, spool: Spool, *, workers: int = 1,
               progress: Callable[[int], None] | None = None, on_error: OnError | None = None) -> NodeFeed:
    """A feed whose workers (or this process, with one) render each node's items into a file of
    `spool`'s folder of their own; `into_spool` then adds the runs in node-name order."""
    here = os.getpid()
    out: list[IO[bytes]] = []  # a worker's file, opened on first use

    def render(res: NodeReplay) -> NodeReplay:
        if os.getpid() == here:
            res.rendered = spool.write_run(res.kept)
        else:
            if not out:
                path = os.path.join(spool.dir, f"worker-{os.getpid()}")
                out.append(open(path, "ab", buffering=_BLOCK))  # noqa: SIM115  (closed when the worker exits)
            res.rendered = append_run(out[0], out[0].name, res.kept)
        res.kept = []
        return res

    return NodeFeed(config, workers=workers, finish=render, progress=progress, on_error=on_error)


def into_spool(feed: NodeFeed, spool: Spool) -> ReplayResult:
    """Every node the feed was handed, replayed and its run added to `spool`, in node-name order."""
    result = ReplayResult()
    for res in feed.results(result):
        spool.add(res.rendered)  # type: ignore[arg-type]
    return result


def replay_to_spool(events: list[ReplayInput], config: ReplayConfig, spool: Spool, *,
                    progress: Callable[[int], None] | None = None,
                    on_error: OnError | None = None, workers: int = 1) -> ReplayResult:
    """Replay `events` (the list is emptied) into `spool`, with `workers` processes."""
    feed = spool_feed(config, spool, workers=workers, progress=progress, on_error=on_error)
    with paused_gc(), feed:
        feed.add(events)
        events.clear()
        return into_spool(feed, spool)


def write_document(out: IO[bytes], doc: Json, items: Iterator[bytes] | Spool, stream: str = "items") -> None:
    """`doc` as `json.dumps(indent=2)` lays it out, except that `doc[stream]` is written from `items`
    (JSON texts, or a spool's merged items), one compact item per line: the layout of
    `periscope.replay.document.json_chunks`."""
    text = json.dumps({**doc, stream: []}, indent=2)
    marker = f"\n  {json.dumps(stream)}: ["
    head, found, tail = text.partition(marker + "]")
    assert found, "dumps writes every top-level key on its own line"
    buf = bytearray((head + marker).encode())
    chunks = items.chunks() if isinstance(items, Spool) else _separated(items)
    empty = True
    for chunk in chunks:
        buf += chunk
        empty = False
        if len(buf) >= 1 << 20:
            out.write(buf)
            buf.clear()
    buf += (("]" if empty else "\n  ]") + tail + "\n").encode()
    out.write(buf)
    out.flush()


def _separated(items: Iterator[bytes]) -> Iterator[bytes]:
    sep = SEP[1:]
    for item in items:
        yield sep + item
        sep = SEP
