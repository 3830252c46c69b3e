"""`periscope replay`'s terminal output: the timeline and owners tables, and the stderr progress bar."""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

Json = dict[str, Any]


# ---------------------------------------------------------------- tables


def stdout_console(file: IO[str]) -> Console:
    # Piped output keeps full UUIDs on one line instead of folding them at 80 columns.
    return Console(file=file, width=None if file.isatty() else 240, soft_wrap=False)


def _pct(x: Any) -> str:
    return "-" if x is None else f"{x:g}%"


def _name(o: Json) -> str:
    """namespace/pod, `?` for what is unknown (null)."""
    return f"{o.get('namespace') or '?'}/{o.get('pod') or '?'}"


def _who(o: Json) -> str:
    name = _name(o) if o.get("pod") else "?"
    return f"{name} ({o['pod_uid'] or 'ambiguous'})"


def _detail(item: Json) -> str:
    if item["kind"] == "attribution":
        rows = [f"{r['container']}@{r['device_id']} util {_pct(r['util_pct'])} fb {r['fb_used_mib']} MiB"
                + (" idle" if r["idle"] else "") + ("" if r["active"] else " released") for r in item["rows"]]
        return f"{_name(item)}: " + "; ".join(rows)
    if item["kind"] == "gpu":
        owners = ", ".join(_who(o) for o in item["owners"]) or "no owner"
        return f"{item['sharing']} util {_pct(item['util_pct'])} fb {item['fb_used_mib']} MiB; {owners}"
    state = "" if item["active"] else " (cleared)"
    return f"{item['finding']}{state}: {item['message']}"


def timeline_table(doc: Json) -> Table:
    table = Table()
    for col in ("at", "kind", "node", "key", "detail"):
        table.add_column(col, overflow="fold")
    for item in doc["items"]:
        table.add_row(item["at"], item["kind"], item["node"], item["key"], _detail(item))
    return table


def owners_table(doc: Json) -> Table:
    table = Table()
    cols = ("node", "gpu_uuid", "device_id", "mig", "pod_uid", "namespace", "pod", "container")
    for col in cols:
        table.add_column(col, overflow="fold")
    for item in doc["items"]:
        mig = item["mig"]
        cells = {**item, "mig": f"{mig['profile'] or 'mig'} gi{mig['gi']}/ci{mig['ci']}" if mig else "-"}
        table.add_row(*("-" if cells[c] is None else str(cells[c]) for c in cols))
    return table


# ---------------------------------------------------------------- progress


class ProgressBar:
    """A progress bar on stderr for long replays; draws nothing when stderr is not a terminal."""

    def __init__(self, stderr: IO[str], enabled: bool) -> None:
        on = enabled and stderr.isatty()
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(file=stderr), transient=True, disable=not on,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, name: str, advance: int, total: int | None = None) -> None:
        task = self._tasks.get(name)
        if task is None:
            task = self._tasks[name] = self._progress.add_task(name, total=total)
        self._progress.update(task, advance=advance, total=total)
