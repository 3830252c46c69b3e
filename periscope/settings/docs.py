"""docs/settings.md, generated from the settings classes: every PERISCOPE_* variable, its default and
what it does. `python -m periscope.settings.docs` rewrites the page; a test fails when it is stale."""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr
from pydantic_settings import BaseSettings

from periscope.bus.settings import ServiceSettings
from periscope.config import PARSE_DURATION, PREFIX
from periscope.core.duration import format_duration_ms
from periscope.settings.catalog import CATALOG

PAGE = Path(__file__).resolve().parents[2] / "docs" / "settings.md"

HEAD = """# Settings

Every setting is an environment variable `PERISCOPE_<NAME>`; a command's flags, where it has them, win
over the environment. Durations accept `500ms`, `90s`, `10m`, `2h`, `1d` and combinations, or plain
seconds. A bad value stops the command at start with one line naming the variable (exit 2); `periscope
up` checks the settings it gives each service with that service's own class, so a misspelt one fails
there, not silently in the child.

This page is generated from the settings classes (`periscope/settings/`, `periscope/bus/settings.py`,
`periscope/bus/admin.py`) by `python -m periscope.settings.docs`; a test fails when it is out of date.
"""


def _durations(cls: type[BaseSettings]) -> set[str]:
    """Fields of a duration type (periscope.config), or read through a `mode="before"` validator: in
    these classes, the duration parsers."""
    out = {name for name, field in cls.model_fields.items() if PARSE_DURATION in field.metadata}
    for dec in cls.__pydantic_decorators__.field_validators.values():
        if dec.info.mode == "before":
            out |= set(dec.info.fields)
    return out


def _type(annotation: Any, duration: bool) -> str:
    if duration:
        return "duration"
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if args and len(args) < len(typing.get_args(annotation)):
        return _type(args[0], False)
    if annotation is SecretStr:
        return "secret"
    return getattr(annotation, "__name__", str(annotation))


def _default(value: Any, duration: bool) -> str:
    if value is None:
        return "unset"
    if isinstance(value, SecretStr) or value == "":
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if duration and isinstance(value, int | float):
        return f"`{format_duration_ms(round(value * 1000))}`"
    return f"`{value}`"


def _rows(cls: type[BaseSettings], skip: set[str]) -> list[str]:
    durations = _durations(cls)
    rows = []
    for name, field in cls.model_fields.items():
        if name in skip:
            continue
        d = name in durations
        text = (field.description or "").replace("|", "\\|").replace("\n", " ")
        kind, default = _type(field.annotation, d), _default(field.default, d)
        rows.append(f"| `{PREFIX}{name.upper()}` | {kind} | {default} | {text} |")
    return rows


def render() -> str:
    parts = [HEAD]
    common = set(ServiceSettings.model_fields)
    for command, cls in CATALOG:
        skip = set() if cls is ServiceSettings else common
        rows = _rows(cls, skip)
        if not rows:
            continue
        title = command if cls is ServiceSettings else f"`{command}`"
        parts.append(f"\n## {title} ({cls.__name__})\n\n| variable | type | default | |\n|---|---|---|---|\n"
                     + "\n".join(rows) + "\n")
    return "".join(parts)


def main() -> int:
    PAGE.write_text(render())
    print(f"wrote {PAGE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
