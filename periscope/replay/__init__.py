"""Replay: rebuild attribution for a past time range from the input topics, with the same pure core
the live joiner runs (periscope.core.engine), offline and without committing anything to the broker."""
