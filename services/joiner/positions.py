"""Where the worker stands on each input partition: the one place for the fact that catch-up, event-time
alignment, the lag metric and the stall watch all read (the worker writes it per batch; the progress
watch sets where each partition was positioned at an assignment)."""

from __future__ import annotations


class Positions:
    __slots__ = ("processed", "start")

    def __init__(self, processed: dict[tuple[str, int], int] | None = None) -> None:
        # (topic, partition) -> the last offset the worker handled.
        self.processed: dict[tuple[str, int], int] = {} if processed is None else processed
        # (topic, partition) -> where it was positioned at the last assignment (a committed offset or
        # the partition's start).
        self.start: dict[tuple[str, int], int] = {}

    def next(self, topic: str, partition: int) -> int | None:
        """The next offset of the partition the worker will handle: the one after the last it handled,
        else where the partition was positioned; None where neither is known."""
        done = self.processed.get((topic, partition))
        return done + 1 if done is not None else self.start.get((topic, partition))
