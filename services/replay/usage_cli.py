"""`periscope usage`: GPU-hours per namespace, workload, pod, node, GPU model or label for a past period.

    periscope usage --from T --to T [--by namespace|workload|pod|node|gpu-model|label:KEY]
                    [--format table|json|csv] [--price-file FILE] [--bootstrap HOST:PORT]

Replays the input topics over the period (periscope.replay.accounting) and prints, per group, the
allocated, used, idle and unmeasured GPU-hours, efficiency, memory GiB-hours, energy, the request x
hours baseline and, with a price file, the cost; then the cluster total, which is the sum of the groups.
The period is counted in whole windows (PERISCOPE_WINDOW, 1m): a window counts when it starts in
[from, to). The progress bar and the summary go to stderr; bad input is one line and exit status 2.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

import click
import yaml

from periscope.cli.errors import InputError, one_line, read_input_file
from periscope.contract.values import rfc3339
from periscope.core.gpuhours import check_grouping, document, group, price_of, unpriced
from periscope.replay.accounting import account_period
from periscope.replay.reader import ReadError
from services.replay.cli import _check_bootstrap, _settings, _summary, _time, _Warnings
from services.replay.tables import ProgressBar, stdout_console

Json = dict[str, Any]
COLUMNS = ("allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours", "unmeasured_gpu_hours", "efficiency",
           "memory_gib_hours", "energy_wh", "request_gpu_hours", "cost")


def read_prices(path: str) -> tuple[dict[str, float], str]:
    """A price file: a YAML mapping of GPU model (as NVML names it) to the price of one GPU-hour, with
    optional `default` (every model not named) and `currency` (a label for the cost column)."""
    what = "price file"
    try:
        doc = yaml.safe_load(read_input_file(path, what, limit=1024 * 1024))
    except yaml.YAMLError as e:
        raise InputError(f"{what} {path}: not YAML ({one_line(str(e))})") from None
    if not isinstance(doc, dict) or not doc:
        raise InputError(f"{what} {path}: not a mapping of GPU model to price per GPU-hour")
    currency = doc.pop("currency", "")
    if not isinstance(currency, str):
        raise InputError(f"{what} {path}: currency: not a string")
    prices: dict[str, float] = {}
    for model, price in doc.items():
        ok = isinstance(price, int | float) and not isinstance(price, bool) and math.isfinite(price)
        if not isinstance(model, str) or not ok or price < 0:
            raise InputError(f"{what} {path}: {model}: not a price (a number of at least 0)")
        prices[model] = float(price)
    if not prices:
        raise InputError(f"{what} {path}: no prices")
    return prices, currency


def _grouping(by: str) -> str:
    try:
        return check_grouping(by)
    except ValueError as e:
        raise InputError(f"--by: {e}") from None


def report(rows: list[Any], from_ms: int, to_ms: int, by: str, prices: Mapping[str, float] | None,
           currency: str, window_ms: int) -> Json:
    """The document for `rows` ((Subject, Account) per row): groups, total, and how it was counted."""
    items = [(s, a.priced(price_of(prices, s.gpu_model))) for s, a in rows]
    extra: Json = {"window_ms": window_ms}
    if currency:
        extra["currency"] = currency
    return document(rfc3339(from_ms), rfc3339(to_ms), by, group(items, by), prices is not None, **extra)


def _h(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def table(doc: Json) -> Any:
    from rich.table import Table

    priced = doc["total"]["cost"] is not None
    title = f"GPU-hours {doc['from']} .. {doc['to']} by {doc['by']}"
    t = Table(title=title, title_justify="left", box=None, pad_edge=False)
    heads = ["GROUP", "PODS", "ALLOCATED", "USED", "IDLE", "UNMEASURED", "EFFICIENCY", "MEM GiB-h",
             "ENERGY Wh", "REQUEST x H"]
    if priced:
        heads.append(f"COST {doc.get('currency', '')}".rstrip())
    for i, h in enumerate(heads):
        t.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)

    def cells(key: str, g: Json) -> list[str]:
        eff = "-" if g["efficiency"] is None else f"{100 * g['efficiency']:.1f}%"
        out = [key, str(g["pods"]), _h(g["allocated_gpu_hours"], 4), _h(g["used_gpu_hours"], 4),
               _h(g["idle_gpu_hours"], 4), _h(g["unmeasured_gpu_hours"], 4), eff, _h(g["memory_gib_hours"]),
               _h(g["energy_wh"], 1), _h(g["request_gpu_hours"], 4)]
        return [*out, _h(g["cost"], 2)] if priced else out

    for g in doc["groups"]:
        key = g["key"] or "(none)"
        if doc["by"] == "pod":
            key = f"{g['namespace']}/{g['pod']} {g['key'][:8]}"
        t.add_row(*cells(key, g))
    t.add_section()
    t.add_row(*cells("TOTAL (cluster)", doc["total"]))
    return t


def csv_text(doc: Json) -> str:
    """A header row and one line per group (a spreadsheet sums the total itself)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    extra = ["namespace", "pod"] if doc["by"] == "pod" else []
    w.writerow(["key", *extra, "pods", *COLUMNS])
    for g in doc["groups"]:
        values = ("" if g[c] is None else g[c] for c in COLUMNS)
        w.writerow([g["key"] or "", *(g[k] for k in extra), g["pods"], *values])
    return buf.getvalue()


@click.command("usage")
@click.option("--bootstrap", metavar="HOST:PORT",
              help="Kafka bootstrap (default: PERISCOPE_KAFKA_BOOTSTRAP).")
@click.option("--from", "from_", metavar="T", required=True, help="Start of the period (RFC 3339 UTC).")
@click.option("--to", "to", metavar="T", required=True, help="End of the period (RFC 3339 UTC).")
@click.option("--by", default="namespace", show_default=True, metavar="GROUPING",
              help="namespace | workload | pod | node | gpu-model | label:KEY")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table",
              show_default=True)
@click.option("--price-file", metavar="FILE", help="YAML: GPU model -> price of a GPU-hour (optional "
                                                  "`default`, `currency`); adds the cost.")
@click.option("--workers", type=click.IntRange(min=0), metavar="N",
              help="Processes replaying nodes side by side (default PERISCOPE_REPLAY_WORKERS, 0: one "
                   "per CPU).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, warnings or summary on stderr.")
def command(bootstrap: str | None, from_: str, to: str, by: str, fmt: str, price_file: str | None,
            workers: int | None, quiet: bool) -> None:
    """GPU-hours accounting per group for a past period, from the input topics."""
    settings = _settings()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    from_ms, to_ms = _time("--from", from_), _time("--to", to)
    assert from_ms is not None and to_ms is not None
    if from_ms >= to_ms:
        raise InputError(f"--from {from_} is not before --to {to}")
    by = _grouping(by)
    prices, currency = read_prices(price_file) if price_file is not None else (None, "")
    if workers is not None:
        settings = settings.model_copy(update={"replay_workers": workers})
    server = settings.kafka().with_bootstrap(_check_bootstrap(bootstrap or settings.kafka_bootstrap))
    warnings = _Warnings(quiet)
    started = time.perf_counter()

    with ProgressBar(sys.stderr, enabled=not quiet) as bar:
        try:
            got = account_period(server, from_ms, to_ms, settings, warn=warnings,
                                 reading=lambda n, total: bar.update("reading", n, total),
                                 replaying=lambda n, total: bar.update("replaying", n, total),
                                 on_error=warnings.failed)
        except ReadError as e:
            raise click.ClickException(one_line(str(e))) from None
    missing = unpriced(prices, {s.gpu_model for s, _ in got.rows})
    if missing:
        raise InputError(f"price file {price_file}: no price for GPU model {missing[0]!r} "
                         f"(name it, or give a `default`)")
    doc = report(got.rows, from_ms, to_ms, by, prices, currency, settings.engine_config().rows.window_ms)
    if fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    elif fmt == "csv":
        sys.stdout.write(csv_text(doc))
    else:
        console = stdout_console(sys.stdout)
        if not sys.stdout.isatty():
            console.width = 1000  # piped: one line per group, however long its key (a table is no wider)
        console.print(table(doc))
    sys.stdout.flush()
    if warnings.count and not quiet:
        click.echo(f"periscope: warning: skipped {warnings.count} bad record(s)", err=True)
    _summary(quiet, "usage", got.stats, got.result, time.perf_counter() - started, {})
