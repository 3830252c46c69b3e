"""How every `periscope` command reports bad input: one line on stderr, exit status 2.

Raise `InputError("<the input>: <the problem>")` anywhere under a command. It is a ClickException,
so click prints it the same way even when a command runs outside `periscope.cli.main` (tests, a
service's own entry point). `report` is the one place that writes such a line.
"""

from __future__ import annotations

import sys
from typing import IO, Any

import click

INPUT_ERROR_EXIT = 2


def one_line(message: str) -> str:
    """Collapse a message onto one line: the contract is one line per error."""
    return " ".join(str(message).split()) or "error"


def report(message: str, file: IO[Any] | None = None) -> None:
    """Write `periscope: <message>` as a single line on stderr."""
    print(f"periscope: {one_line(message)}", file=file if file is not None else sys.stderr, flush=True)


class InputError(click.ClickException):
    """Bad input from the user (a path, a file's content, a flag value): exit 2, one line."""

    exit_code = INPUT_ERROR_EXIT

    def show(self, file: IO[Any] | None = None) -> None:
        report(self.format_message(), file)


def read_input_file(path: str, what: str, limit: int = 64 * 1024 * 1024) -> bytes:
    """Read a user-named file, turning every way it can fail into an InputError naming it."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise InputError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{what} {path}: is a directory, not a file") from None
    except PermissionError:
        raise InputError(f"{what} {path}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise InputError(f"{what} {path}: larger than {limit // (1024 * 1024)} MiB, not a {what}")
    return data
