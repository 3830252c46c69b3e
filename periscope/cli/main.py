"""`periscope`: one entry point; each subcommand's module is imported only when that command runs.

Lazy loading keeps `periscope --help` fast and lets the tool work when an optional part (the
simulator, a service) is absent: naming such a command gives one clear line and exit status 2.
Every failure leaves as one `periscope: …` line on stderr, never a traceback (unless --debug).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from periscope.cli.errors import InputError, report

# name -> (module, attribute, one-line help shown by `periscope --help` without importing anything)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "up": ("periscope.sim.cli", "up", "Run the embedded stack against a simulated cluster."),
    "report": ("periscope.sim.cli", "report", "Report on a simulated run."),
    "probe": ("services.probe.cli", "command", "Run the node probe (kubelet, NVML, /proc) against a broker."),
    "watch": ("services.kube_watcher.cli", "command", "Watch the apiserver (pods, nodes, ClusterPolicy)."),
    "join": ("services.joiner.cli", "command", "Run the joiner: attribute GPU use to pods."),
    "api": ("services.api.cli", "command", "Serve the HTTP query API over the joiner's outputs."),
    "replay": ("services.replay.cli", "command", "Rebuild attribution for a past time range."),
    "usage": ("services.replay.usage_cli", "command", "GPU-hours accounting for a past period."),
    "inspect": ("periscope.cli.inspect", "inspect", "Parse a kubelet checkpoint, cgroup file or device ID."),
    "doctor": ("services.probe.doctor_cli", "command", "Check every source the probe needs on this node."),
    "top": ("periscope.cli.top", "command", "A live table of GPUs and the pods holding them, from the API."),
}

_debug = False


def load_command(name: str) -> click.Command:
    """Import the module behind `name`; InputError (exit 2) when it is missing or broken."""
    module_name, attr, _ = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        if module_name == missing or module_name.startswith(missing + "."):
            why = f"module {module_name} is missing"
        elif missing:
            why = f"{module_name} needs module {missing}, which is not installed"
        else:
            why = f"{module_name} cannot be imported ({exc})"
        raise InputError(f"command '{name}' is not available: {why}") from None
    command = getattr(module, attr, None)
    if not isinstance(command, click.Command):
        raise InputError(f"command '{name}' is not available: {module_name} has no click command '{attr}'")
    return command


class LazyGroup(click.Group):
    """A click group whose subcommands come from COMMANDS, imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *(n for n in self.commands if n not in COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name not in COMMANDS:
            return None  # click reports "No such command"
        command = load_command(cmd_name)
        self.commands[cmd_name] = command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help must not import every command (some may be absent): use the static summaries.
        rows = [(name, COMMANDS[name][2]) for name in COMMANDS]
        rows += [(n, c.get_short_help_str()) for n, c in self.commands.items() if n not in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    "periscope",
    cls=LazyGroup,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
)
@click.option("--debug", is_flag=True, help="Show a traceback for unexpected errors.")
@click.version_option(package_name="periscope", prog_name="periscope")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Which pod is using this GPU right now, and what is it doing?

    GPU-to-pod attribution for Kubernetes: probes, watcher, joiner, API, replay and tools.
    """
    global _debug
    _debug = debug
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


def _usage_line(exc: click.UsageError) -> str:
    hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return exc.format_message().rstrip(".") + hint


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Console entry point: run the CLI and turn every failure into one line and an exit status."""
    code = 0
    try:
        rv: Any = cli.main(
            args=list(argv) if argv is not None else None, prog_name="periscope", standalone_mode=False
        )
        if isinstance(rv, int) and not isinstance(rv, bool):
            code = rv
    except InputError as exc:
        exc.show()
        code = exc.exit_code
    except click.exceptions.NoArgsIsHelpError as exc:
        # A command group named without a subcommand: show what it offers.
        click.echo(exc.ctx.get_help() if exc.ctx is not None else exc.format_message())
    except click.UsageError as exc:
        report(_usage_line(exc))
        code = 2
    except click.ClickException as exc:
        report(exc.format_message())
        code = exc.exit_code
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        report("interrupted")
        code = 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python from complaining
        # about the unflushable stdout on exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    except Exception as exc:
        if _debug:
            raise
        report(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)")
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
