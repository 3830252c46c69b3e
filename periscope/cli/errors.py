"""How every `periscope` command reports bad input: one line on stderr, exit status 2.

Raise `InputError("<the input>: <the problem>")` anywhere under a command. It is a ClickException,
so click prints it the same way even when a command runs outside `periscope.cli.main` (tests, a
service's own entry point). `report` is the one place that writes such a line.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

import click

from periscope.cli.terminal import printable

INPUT_ERROR_EXIT = 2


MAX_LINE = 380  # characters after `periscope: `
_LONGEST_WORD = 200  # characters of one word (a quoted value, a path) a message carries whole


def _clipped(word: str) -> str:
    if len(word) <= _LONGEST_WORD:
        return word
    close = word[-1] if word[-1] in "'\")]:," else ""
    return f"{word[:150]}...({len(word)} characters){close}"


def one_line(message: str) -> str:
    """Collapse a message onto one line (the contract is one line per error), without the escape
    sequences or control characters a value from outside may have brought into it, with any word
    longer than 200 characters (a 400-digit value, echoed by click or by us) cut short, and the whole
    line kept under MAX_LINE characters (a value of many words quoted whole)."""
    line = " ".join(_clipped(w) for w in printable(" ".join(str(message).split())).split()) or "error"
    if len(line) > MAX_LINE:
        line = f"{line[: MAX_LINE - 60]}... (cut: {len(line)} characters in all)"
    return line


def report(message: str, file: IO[Any] | None = None) -> None:
    """Write `periscope: <message>` as a single line on stderr."""
    print(f"periscope: {one_line(message)}", file=file if file is not None else sys.stderr, flush=True)


class InputError(click.ClickException):
    """Bad input from the user (a path, a file's content, a flag value): exit 2, one line."""

    exit_code = INPUT_ERROR_EXIT

    def show(self, file: IO[Any] | None = None) -> None:
        report(self.format_message(), file)


def read_input_file(path: str, what: str, limit: int = 64 * 1024 * 1024) -> bytes:
    """Read at most `limit` bytes of a user-named file, turning every way it can fail into an InputError
    naming it. A FIFO nobody writes to reads as empty instead of hanging (opened without blocking, then
    read blocking, so a pipe such as `<(cat f)` still works)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            os.set_blocking(fd, True)
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
