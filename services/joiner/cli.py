"""`periscope join`: run one joiner worker until SIGINT/SIGTERM.

Settings come from PERISCOPE_* environment variables; the flags override them. Several workers with
the same APP_ID form one consumer group and split the nodes between them.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from typing import Any

import click

from periscope import config
from periscope.cli.errors import InputError
from periscope.cli.kafka import check_kafka
from periscope.settings.joiner import JoinerSettings


def load_settings(bootstrap: str | None = None, web_port: int | None = None, idle_window: str | None = None,
                  idle_threshold: float | None = None) -> JoinerSettings:
    """Env first, flags override; any bad value becomes one InputError line (exit 2)."""
    return config.load_settings(JoinerSettings, "joiner", error=InputError, kafka_bootstrap=bootstrap,
                                web_port=web_port, idle_window=idle_window, idle_threshold=idle_threshold)


STOP_GRACE_S = 20.0  # after SIGINT/SIGTERM, leave even if Faust hangs on a broker that is gone


def _watchdog(grace_s: float) -> None:
    def expire() -> None:
        print(f"periscope: joiner did not stop within {grace_s:g}s of the signal; exiting", file=sys.stderr,
              flush=True)
        os._exit(1)

    timer = threading.Timer(grace_s, expire)
    timer.daemon = True
    timer.start()


def _restart(data_dir: str | None) -> None:
    """Replace this process with a fresh copy of itself (same command line, environment, process id)."""
    if data_dir is not None:
        shutil.rmtree(data_dir, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


async def _input_partitions(settings: JoinerSettings) -> int:
    """Wait until the input topics exist (the topics job creates them) and return their partition count,
    which the tables' changelogs must share."""
    from periscope.bus.admin import TopicError, input_partitions
    from periscope.bus.retry import Backoff

    backoff, kafka, told = Backoff(), settings.kafka(), False
    while True:
        try:
            count = await input_partitions(kafka)
        except TopicError as e:
            raise InputError(f"joiner: {e}") from None
        except Exception as e:  # the broker is not up yet
            count, why = None, f"broker {kafka.bootstrap} not reachable ({e or type(e).__name__})"
        else:
            why = "waiting for the input topics (python -m periscope.bus.admin creates them)"
        if count is not None:
            return count
        if not told:
            print(f"periscope: joiner: {why}", file=sys.stderr, flush=True)
            told = True
        await backoff.sleep()


def run(settings: JoinerSettings) -> None:
    """Run one worker in this process; returns when it has stopped (SIGINT/SIGTERM or a crash)."""
    import asyncio

    import faust

    from periscope import heap
    from services.joiner.app import create_app

    partitions = asyncio.run(_input_partitions(settings))

    class Worker(faust.Worker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Faust's terminal spinner lowers the root logger to DEBUG and formats every record to
            # spin once per message: CPU spent on nothing, and escape codes in piped output.
            self.spinner = None

        def on_setup_root_logger(self, logger: Any, level: int) -> None:
            super().on_setup_root_logger(logger, level)
            from periscope import logs

            logs.install()  # on the handlers Faust just set up: bounds Faust's and aiokafka's repeats

        async def _sentinel_task(self) -> None:
            # mode runs this one-second sleep as the very last step before closing the loop, after
            # every service stopped (state persisted, offsets committed): a restart comes back that much
            # later, for nothing.
            await asyncio.sleep(0)

        def _schedule_shutdown(self, signal: Any) -> None:
            if not self._signal_stop_time:
                _watchdog(STOP_GRACE_S)
            super()._schedule_shutdown(signal)

    # Table data lives in memory and in the changelogs; Faust only wants a directory of its own.
    data_dir = settings.data_dir or tempfile.mkdtemp(prefix="periscope-joiner-")
    own_dir = None if settings.data_dir else data_dir
    try:
        app = create_app(settings, announce=lambda line: print(line, flush=True), data_dir=data_dir,
                         on_stall=lambda: _restart(own_dir), partitions=partitions)
        worker = Worker(app, loglevel=settings.log_level.lower(), quiet=True, redirect_stdouts=False)
        heap.settle()
        worker.execute_from_commandline()
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    finally:
        if not settings.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)


@click.command("join")
@click.option("--bootstrap", default=None, metavar="HOST:PORT",
              help="Kafka bootstrap servers [env PERISCOPE_KAFKA_BOOTSTRAP].")
@click.option("--web-port", type=click.IntRange(0, 65535), default=None,
              help="Port of /metrics, /healthz, /readyz; 0 = any free port [env PERISCOPE_WEB_PORT, 9403].")
@click.option("--idle-window", default=None, metavar="DURATION",
              help="Span over which an allocation must stay below the threshold to be idle "
                   "[env PERISCOPE_IDLE_WINDOW, 10m].")
@click.option("--idle-threshold", type=float, default=None, metavar="PCT",
              help="Average utilization (percent) below which an allocation is idle "
                   "[env PERISCOPE_IDLE_THRESHOLD, 5].")
def command(bootstrap: str | None, web_port: int | None, idle_window: str | None,
            idle_threshold: float | None) -> None:
    """Join node events into pod-UID-keyed GPU attribution (one Faust worker)."""
    settings = load_settings(bootstrap, web_port, idle_window, idle_threshold)
    check_kafka("joiner", settings)
    run(settings)
    sys.stdout.flush()
