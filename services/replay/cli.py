"""`periscope replay`: rebuild attribution for a past range, or name who owned what at an instant.

    periscope replay --from T --to T [--pod UID] [--gpu UUID] [--node N] [--format json|table]
                     [--workers N]
    periscope replay --at T [--gpu UUID] [--node N] [--format json|table]

Reads the input topics (never committing), runs them through the same core as the live joiner and
prints the records it emits in [from, to] (JSON: {"from", "to", "items", "stats"}), or the owners at
T (JSON: {"at", "items"}). For JSON, nodes are replayed side by side in worker processes (one per CPU
unless told otherwise), started before the reading: each partition's nodes replay while the next
partition is read. The document is the same byte for byte. Warnings, the speed summary (reading;
replaying: what was left of it once reading ended; writing) and the progress bar go to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import sys
import time
from typing import Any

import click

from periscope.bus.clients import Kafka
from periscope.cli.errors import InputError, one_line
from periscope.config import load_settings
from periscope.contract.values import parse_time_ms, rfc3339
from periscope.core.duration import parse_duration_ms
from periscope.heap import paused_gc
from periscope.replay.document import json_chunks, output_json
from periscope.replay.feed import NodeFeed
from periscope.replay.owners import owners_with_stats
from periscope.replay.parallel import workers_for
from periscope.replay.plan import ReadPlan
from periscope.replay.reader import ReadError, ReadStats, read_inputs
from periscope.replay.runner import (
    ReplayConfig,
    ReplayInput,
    ReplayResult,
    input_kind,
    output_filter,
    output_time,
    replay_events,
)
from periscope.replay.timeline import Spool, into_spool, spool_feed, write_document
from periscope.settings.replay import ReplaySettings
from services.replay.tables import ProgressBar, owners_table, stdout_console, timeline_table

Json = dict[str, Any]
_WARNINGS_SHOWN = 10


class _Warnings:
    """Bad records: the first few named on stderr, all of them counted."""

    def __init__(self, quiet: bool) -> None:
        self.quiet, self.count = quiet, 0

    def __call__(self, message: str) -> None:
        self.count += 1
        if self.quiet:
            return
        if self.count <= _WARNINGS_SHOWN:
            click.echo(f"periscope: warning: {one_line(message)}", err=True)
        elif self.count == _WARNINGS_SHOWN + 1:
            click.echo("periscope: warning: more bad records; only the count is reported below", err=True)

    def failed(self, ev: ReplayInput, e: Exception) -> None:
        """An event the core raised on (skipped, counted)."""
        self(f"skipping event {input_kind(ev)} of {ev.meta.node} at {rfc3339(ev.meta.time_ms)}: "
             f"{type(e).__name__}: {e}")


def _time(flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_time_ms(text)
    except ValueError as e:
        raise InputError(f"{flag}: {e}") from None


def _duration(flag: str, text: str) -> int:
    try:
        ms = parse_duration_ms(text)
    except ValueError as e:
        raise InputError(f"{flag}: {e}") from None
    if ms < 0:
        raise InputError(f"{flag}: must not be negative")
    return ms


def _settings() -> ReplaySettings:
    return load_settings(ReplaySettings, "replay", naming="variable", error=InputError)


def _check_bootstrap(value: str) -> str:
    for part in value.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InputError(f"--bootstrap: not HOST:PORT: {value!r}")
    return value


def timeline_document(from_ms: int, to_ms: int, result: ReplayResult, stats: ReadStats,
                      filters: dict[str, str | None]) -> Json:
    """The range's document. Its items are rendered lazily (an iterator: emit the document once)."""
    # Ordered by event time; within an instant, the core's own (deterministic) emission order.
    outputs = sorted(result.outputs, key=output_time)
    return {**_document_head(from_ms, to_ms, filters), "items": map(output_json, outputs),
            "stats": _document_stats(result, stats)}


def _document_head(from_ms: int, to_ms: int, filters: dict[str, str | None]) -> Json:
    return {"from": rfc3339(from_ms), "to": rfc3339(to_ms), "filters": filters}


def _document_stats(result: ReplayResult, stats: ReadStats) -> Json:
    return {"events": result.events, "samples": result.samples, "device_samples": result.device_samples,
            "bad_records": stats.bad, "failed_events": result.failed}


def _emit(doc: Json, fmt: str, table: Any) -> None:
    if fmt == "json":
        for chunk in json_chunks(doc):
            sys.stdout.write(chunk)
        sys.stdout.write("\n")
        sys.stdout.flush()
    else:
        stdout_console(sys.stdout).print(table(doc))


def _emit_spooled(doc: Json, spool: Spool) -> None:
    sys.stdout.flush()
    out = getattr(sys.stdout, "buffer", None)
    if out is not None:
        write_document(out, doc, spool)
        return
    buf = io.BytesIO()  # a text-only stdout (an embedding program's): render, then write as text
    write_document(buf, doc, spool)
    sys.stdout.write(buf.getvalue().decode())
    sys.stdout.flush()


def _summary(quiet: bool, what: str, stats: ReadStats, result: ReplayResult | None, seconds: float,
             phases: dict[str, float]) -> None:
    if quiet:
        return
    parts = [f"replay: {what}: read {stats.records} record(s), {stats.events} event(s)"]
    if result is not None:
        speed = result.device_samples / result.seconds if result.seconds > 0 else 0.0
        parts.append(f"{result.device_samples} device sample(s) in {result.seconds:.2f}s "
                     f"({speed:.0f} device samples/s)")
    parts.append(f"{stats.bad} bad record(s) skipped; {seconds:.2f}s in all")
    if phases:
        parts.append(", ".join(f"{k} {v:.2f}s" for k, v in phases.items()))
    click.echo("; ".join(parts), err=True)


@click.command("replay")
@click.option("--bootstrap", metavar="HOST:PORT",
              help="Kafka bootstrap (default: PERISCOPE_KAFKA_BOOTSTRAP).")
@click.option("--from", "from_", metavar="T", help="Start of the range (RFC 3339 UTC).")
@click.option("--to", "to", metavar="T", help="End of the range (RFC 3339 UTC).")
@click.option("--at", "at", metavar="T", help="Instant for 'who owned what at T' (RFC 3339 UTC).")
@click.option("--pod", metavar="UID", help="Only this pod UID.")
@click.option("--gpu", metavar="UUID", help="Only this GPU (or MIG instance) UUID.")
@click.option("--node", metavar="NAME", help="Only this node (reads only its partition).")
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="table", show_default=True)
@click.option("--lookback", metavar="DURATION",
              help="How far back to read allocations and inventory (default PERISCOPE_REPLAY_LOOKBACK, 1h).")
@click.option("--window-lookback", metavar="DURATION",
              help="Telemetry read before --from to warm windows and idle state "
                   "(default PERISCOPE_REPLAY_WINDOW_LOOKBACK, 10m).")
@click.option("--workers", type=click.IntRange(min=0), metavar="N",
              help="Processes replaying nodes side by side for --format json (default "
                   "PERISCOPE_REPLAY_WORKERS, 0: one per CPU; 1: none). The output is the same.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, warnings or summary on stderr.")
def command(bootstrap: str | None, from_: str | None, to: str | None, at: str | None, pod: str | None,
            gpu: str | None, node: str | None, fmt: str, lookback: str | None, window_lookback: str | None,
            workers: int | None, quiet: bool) -> None:
    """Rebuild attribution for a past time range from the input topics (or the owners at --at T)."""
    settings = _settings()
    # aiokafka logs every failed connection attempt; the outcome is reported here, once, instead.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    from_ms, to_ms, at_ms = _time("--from", from_), _time("--to", to), _time("--at", at)
    if at_ms is not None and (from_ms is not None or to_ms is not None):
        raise InputError("--at cannot be combined with --from/--to")
    if at_ms is None and (from_ms is None or to_ms is None):
        raise InputError("give --from and --to (a range) or --at (an instant)")
    if from_ms is not None and to_ms is not None and from_ms > to_ms:
        raise InputError(f"--from {from_} is after --to {to}")
    updates: dict[str, float] = {}
    if workers is not None:
        updates["replay_workers"] = workers
    if lookback is not None:
        updates["replay_lookback"] = _duration("--lookback", lookback) / 1000
    if window_lookback is not None:
        updates["replay_window_lookback"] = _duration("--window-lookback", window_lookback) / 1000
    settings = settings.model_copy(update=updates)
    server = settings.kafka().with_bootstrap(_check_bootstrap(bootstrap or settings.kafka_bootstrap))
    warnings = _Warnings(quiet)
    started = time.perf_counter()
    spool: Spool | None = None
    feed: NodeFeed | None = None
    filters = {"pod": pod, "gpu": gpu, "node": node}
    with contextlib.ExitStack() as stack:
        if at_ms is None and fmt == "json":
            assert from_ms is not None and to_ms is not None
            spool = stack.enter_context(Spool())
            # The workers are forked now, before the progress bar and the reading start threads.
            feed = stack.enter_context(spool_feed(
                range_config(from_ms, to_ms, settings, filters), spool,
                workers=workers_for(settings.replay_workers),
                progress=lambda n: bar.update("replaying", n, feed.total if feed is not None else None),
                on_error=warnings.failed))
        bar = stack.enter_context(ProgressBar(sys.stderr, enabled=not quiet))
        try:
            if at_ms is not None:
                doc, stats = asyncio.run(owners_with_stats(
                    server, at_ms, gpu_uuid=gpu, node=node, pod_uid=pod, settings=settings, warn=warnings,
                    progress=lambda n, total: bar.update("reading", n, total)))
                result = None
            else:
                assert from_ms is not None and to_ms is not None
                if spool is not None and feed is not None:
                    doc, stats, result = _spooled(server, from_ms, to_ms, settings, bar, warnings, filters,
                                                  spool, feed)
                else:
                    doc, stats, result = _timeline(server, from_ms, to_ms, settings, bar, warnings, filters)
        except ReadError as e:
            raise click.ClickException(one_line(str(e))) from None
        replayed = time.perf_counter()
        if spool is not None:
            _emit_spooled(doc, spool)
        else:
            _emit(doc, fmt, owners_table if at_ms is not None else timeline_table)
    if warnings.count and not quiet:
        click.echo(f"periscope: warning: skipped {warnings.count} bad record(s)", err=True)
    done = time.perf_counter()
    # Where the time went: reading (connect, fetch, decode), replaying (the core, and with JSON output
    # rendering each node's records to the spool), writing the document.
    phases = {"reading": stats.seconds, "replaying": max(0.0, replayed - started - stats.seconds),
              "writing": done - replayed} if result is not None else {}
    _summary(quiet, "owners" if at_ms is not None else "range", stats, result, done - started, phases)


def range_plan(from_ms: int, to_ms: int, settings: ReplaySettings, node: str | None = None) -> ReadPlan:
    return ReadPlan(anchor_ms=from_ms - settings.ms("replay_window_lookback"), to_ms=to_ms,
                    lookback_ms=settings.ms("replay_lookback"),
                    late_slack_ms=settings.ms("replay_late_slack"), node=node)


def range_config(from_ms: int, to_ms: int, settings: ReplaySettings,
                 filters: dict[str, str | None]) -> ReplayConfig:
    keep = output_filter(pod_uid=filters.get("pod"), gpu_uuid=filters.get("gpu"), node=filters.get("node"))
    return ReplayConfig(engine=settings.engine_config(), from_ms=from_ms, to_ms=to_ms, keep=keep)


def _timeline(server: Kafka, from_ms: int, to_ms: int, settings: ReplaySettings, bar: ProgressBar,
              warnings: _Warnings, filters: dict[str, str | None]) -> tuple[Json, ReadStats, ReplayResult]:
    """Read and replay the range; the outputs are kept in the result and the document (a table)."""
    plan = range_plan(from_ms, to_ms, settings, filters["node"])
    with paused_gc():
        events, stats = asyncio.run(read_inputs(
            server, plan, warn=warnings, lazy=True,
            progress=lambda n, total: bar.update("reading", n, total)))
    total = len(events)
    result = replay_events(events, range_config(from_ms, to_ms, settings, filters),
                           progress=lambda n: bar.update("replaying", n, total),
                           on_error=warnings.failed)
    return timeline_document(from_ms, to_ms, result, stats, filters), stats, result


def _spooled(server: Kafka, from_ms: int, to_ms: int, settings: ReplaySettings, bar: ProgressBar,
             warnings: _Warnings, filters: dict[str, str | None], spool: Spool, feed: NodeFeed,
             ) -> tuple[Json, ReadStats, ReplayResult]:
    """Read and replay the range for JSON: nodes go to the feed's workers as their partitions are read
    (they replay while the rest is read), and each worker renders its nodes' items into the spool."""
    plan = range_plan(from_ms, to_ms, settings, filters["node"])
    with paused_gc():
        events, stats = asyncio.run(read_inputs(
            server, plan, warn=warnings, lazy=True, complete=feed.add,
            progress=lambda n, total: bar.update("reading", n, total)))
        feed.add(events)
        events.clear()
        result = into_spool(feed, spool)
    feed.close()  # the workers' memory goes back before the document is written
    return spooled_document(from_ms, to_ms, result, stats, filters), stats, result


def spooled_document(from_ms: int, to_ms: int, result: ReplayResult, stats: ReadStats,
                     filters: dict[str, str | None]) -> Json:
    """The range's document around a spool's items (`write_document` writes them in its place)."""
    return {**_document_head(from_ms, to_ms, filters), "items": [], "stats": _document_stats(result, stats)}
