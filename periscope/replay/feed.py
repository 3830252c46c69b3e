"""Nodes replayed as their inputs become complete, in worker processes started before the reading.

The replay CLI reads the telemetry partition by partition; once a partition is read, every node whose
records it holds has all its inputs, and replaying those nodes need not wait for the rest of the read.
A `NodeFeed` forks its workers first (before the reading starts any thread), takes nodes as they become
complete, and sends each node's events to a worker (records kept as bytes travel as bytes: pickling the
decoded classes would cost more than replaying them). Results come back in node-name order, as the
serial replay gives them, so whatever is made of them is the same byte for byte. With one worker (or
where `fork` is not available) nodes are only collected, and replayed here when the results are asked
for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future

from periscope.replay.parallel import NodePool, can_fork, portable
from periscope.replay.runner import (
    NodeReplay,
    OnError,
    ReplayConfig,
    ReplayInput,
    ReplayResult,
    WireInput,
    by_node,
    packed,
    replay_node,
    tally,
)

Finish = Callable[[NodeReplay], NodeReplay]


class NodeFeed:
    """Replay nodes handed over with `add`, in `workers` processes forked when it is made."""

    def __init__(self, config: ReplayConfig, *, workers: int, finish: Finish | None = None,
                 progress: Callable[[int], None] | None = None, on_error: OnError | None = None) -> None:
        self.config, self.finish, self.progress, self.on_error = config, finish, progress, on_error
        self._events: dict[str, list[ReplayInput]] = {}
        self._futures: dict[str, Future[NodeReplay]] = {}
        self._unreported: dict[Future[NodeReplay], None] = {}
        self._started: float | None = None
        self.total = 0  # events handed over (a node handed over again: its latest list)
        self._pool: NodePool[WireInput, NodeReplay] | None = None
        if workers > 1 and can_fork():
            self._pool = NodePool(self._in_worker, workers)

    def __enter__(self) -> NodeFeed:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(cancel=exc_type is not None)

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.close(cancel)
            self._pool = None

    def _in_worker(self, node: str, events: list[WireInput]) -> NodeReplay:
        res = replay_node(node, events, self.config, keep_state=False)
        res.errors = [(i, portable(e)) for i, e in res.errors]  # it travels back pickled
        return self.finish(res) if self.finish is not None else res

    def add(self, events: Iterable[ReplayInput]) -> None:
        """Every input of some nodes (any order). A node handed over again (more of its records turned
        up: a record under another node's key) is replayed again, from what it was handed this time."""
        if self._started is None:
            self._started = time.perf_counter()
        for node, evs in by_node(events, self.config.to_ms).items():
            self.total += len(evs) - len(self._events.get(node, ()))
            self._events[node] = evs
            if self._pool is None:
                continue
            old = self._futures.pop(node, None)
            if old is not None:
                old.cancel()
                self._unreported.pop(old, None)
            future = self._pool.submit(node, packed(evs))
            self._futures[node] = future
            self._unreported[future] = None
        self._report()

    def _report(self) -> None:
        """Progress for the nodes the workers are done with."""
        for future in list(self._unreported):
            if not future.done():
                continue
            del self._unreported[future]
            if self.progress is not None and not future.cancelled() and future.exception() is None:
                res = future.result()
                self.progress(res.events + len(res.errors))

    def results(self, result: ReplayResult) -> Iterator[NodeReplay]:
        """Each node's result in node-name order (waiting for the workers), counted into `result`. Its
        `seconds`: with workers, the wall time from the first node handed over to the last one back;
        here, the time spent in the core."""
        for node in sorted(self._events):
            events = self._events.pop(node)
            if self._pool is None:
                res = replay_node(node, events, self.config, keep_state=False, progress=self.progress)
                result.seconds += res.seconds
                if self.finish is not None:
                    res = self.finish(res)
            else:
                res = self._futures.pop(node).result()
                self._report()
                result.seconds = time.perf_counter() - (self._started or 0.0)
            tally(result, res, events, self.on_error)
            yield res
