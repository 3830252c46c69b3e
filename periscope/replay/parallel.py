"""Replay nodes side by side in worker processes, results handed back in node-name order.

Replay is per node: a node's events go through its own engine state and nothing else, so nodes can
run in separate processes and the results, taken in node-name order as the serial replay produces
them, are the same. Workers are forked from the process that holds the events (the `fork` start
method), so no node's events are copied through a pipe: a worker reads them from the memory it shares
with its parent (pages are copied only as the worker touches them). Only each node's result comes
back, pickled. Where `fork` is not available, or one worker is asked for, everything runs in this
process, through the same function. A `NodePool` is the other way round: workers forked first, each
node's events sent to them pickled as they become available (while the rest is still being read).

Fork only from the main thread of a process that runs no other threads (the replay CLI after its
reading is done): a worker holds none of the parent's threads, so a lock another thread held at the
fork stays held in the worker. Workers do nothing but compute and return their results.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

NodeFn = Callable[[str, list[T]], R]


def cores() -> int:
    """The CPUs this process may run on (the default number of workers)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def workers_for(setting: int) -> int:
    """A workers setting: 0 means one per core, anything else is taken as given (at least 1)."""
    return cores() if setting <= 0 else setting


def can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


class _Job(Generic[T, R]):
    """What the forked workers find in their copy of this module: the function and every node's events."""

    def __init__(self, fn: NodeFn[T, R], groups: dict[str, list[T]]) -> None:
        self.fn, self.groups = fn, groups


_job: _Job[Any, Any] | None = None


def _run_node(node: str) -> Any:
    assert _job is not None, "a replay worker was started without its job"
    return _job.fn(node, _job.groups[node])


def _run_sent(node: str, events: list[Any]) -> Any:
    assert _job is not None, "a replay worker was started without its job"
    return _job.fn(node, events)


def _started() -> int:
    return os.getpid()


def _leave_interrupts_to_the_parent() -> None:
    # Ctrl-C reaches the whole process group: the parent stops the pool, and a worker waiting for its
    # next node would otherwise print a KeyboardInterrupt traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class NodePool(Generic[T, R]):
    """`fn(node, events)` in `workers` processes forked now, for nodes whose events arrive later (the
    replay CLI reads partition by partition and hands each node over once its inputs are read). The
    events travel pickled, so send what pickles fast (bytes, not decoded events). Fork it before the
    process starts threads (an event loop's resolver, a progress bar); `close` it when done."""

    def __init__(self, fn: NodeFn[T, R], workers: int) -> None:
        global _job
        if _job is not None:
            raise RuntimeError("one parallel replay at a time per process")
        _job = _Job(fn, {})
        try:
            self._pool = ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("fork"),
                initializer=_leave_interrupts_to_the_parent)
            # With fork, the first submit starts every worker, before the executor's own threads.
            self._pool.submit(_started).result()
        except BaseException:
            _job = None
            raise

    def submit(self, node: str, events: list[Any]) -> Future[R]:
        return self._pool.submit(_run_sent, node, events)

    def close(self, cancel: bool = False) -> None:
        global _job
        try:
            self._pool.shutdown(wait=not cancel, cancel_futures=cancel)
        finally:
            _job = None


def map_nodes(fn: NodeFn[T, R], groups: dict[str, list[T]], workers: int) -> Iterator[tuple[str, R]]:
    """`fn(node, events)` for every node of `groups`, yielded in node-name order; with more than one
    worker, in that many forked processes (the results must pickle). A node's events stay in `groups`
    until its result is yielded; then the caller may drop them."""
    nodes = sorted(groups)
    if workers <= 1 or len(nodes) <= 1 or not can_fork():
        for node in nodes:
            yield node, fn(node, groups[node])
        return
    global _job
    if _job is not None:
        raise RuntimeError("one parallel replay at a time per process")
    _job = _Job(fn, groups)
    # The fork context starts every worker before the executor's own threads start.
    pool = ProcessPoolExecutor(max_workers=min(workers, len(nodes)),
                               mp_context=multiprocessing.get_context("fork"))
    try:
        yield from zip(nodes, pool.map(_run_node, nodes), strict=True)
    except BaseException:  # interrupted, or the consumer stopped early: start no other node
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    else:
        pool.shutdown()
    finally:
        _job = None


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling (to travel back from a worker), else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
