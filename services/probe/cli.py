"""`periscope probe`: run the node probe (settings from PERISCOPE_* env, flags override)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

import click

from periscope import config, logs
from periscope.cli.errors import InputError
from periscope.cli.kafka import check_kafka
from periscope.settings.probe import ProbeSettings

# flag name -> settings field
_FIELDS = {
    "node": "node_name",
    "bootstrap": "kafka_bootstrap",
    "kubelet_root": "kubelet_root",
    "podresources_socket": "podresources_socket",
    "checkpoint": "checkpoint_path",
    "proc_root": "proc_root",
    "tick": "tick",
    "allocation_interval": "allocation_interval",
    "podresources_interval": "podresources_interval",
    "nvml_backend": "nvml_backend",
    "buffer_limit": "buffer_limit",
    "health_host": "health_host",
    "health_port": "health_port",
    "log_level": "log_level",
}


def load_settings(**flags: Any) -> ProbeSettings:
    """Env first, then the flags that were given; a bad value is one InputError line."""
    return config.load_settings(ProbeSettings, "probe", error=InputError,
                                **{_FIELDS[k]: v for k, v in flags.items()})


async def _serve(settings: ProbeSettings) -> None:
    from services.probe.service import Probe

    probe = Probe(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await probe.start()
    except OSError as e:  # the health port is taken, most likely
        await probe.stop()
        raise InputError(
            f"cannot listen on {settings.health_host}:{settings.health_port}: {e.strerror or e}"
        ) from None
    logging.getLogger("periscope.probe").info(
        "probe for node %s publishing to %s; health on %s:%d",
        settings.node_name,
        settings.kafka_bootstrap,
        settings.health_host,
        probe.health_port,
    )
    try:
        await stop.wait()
    finally:
        await probe.stop()


@click.command("probe")
@click.option(
    "--node", default=None, help="Node name (key of every event) [env PERISCOPE_NODE_NAME, default hostname]."
)
@click.option(
    "--bootstrap", default=None, metavar="HOST:PORT", help="Kafka bootstrap [env PERISCOPE_KAFKA_BOOTSTRAP]."
)
@click.option(
    "--kubelet-root", default=None, metavar="DIR", help="Kubelet root dir [default /var/lib/kubelet]."
)
@click.option(
    "--podresources-socket",
    default=None,
    metavar="PATH",
    help="PodResources socket [default <kubelet-root>/pod-resources/kubelet.sock].",
)
@click.option(
    "--checkpoint",
    default=None,
    metavar="PATH",
    help="Device-manager checkpoint [default <kubelet-root>/device-plugins/kubelet_internal_checkpoint].",
)
@click.option("--proc-root", default=None, metavar="DIR", help="Host /proc [default /proc].")
@click.option("--tick", default=None, metavar="DURATION", help="Telemetry period, e.g. 1s [default 1s].")
@click.option(
    "--allocation-interval",
    default=None,
    metavar="DURATION",
    help="Allocation snapshot period, besides on change [default 5s].",
)
@click.option(
    "--podresources-interval",
    default=None,
    metavar="DURATION",
    help="PodResources List period when the checkpoint shows no change [default 2 ticks, at most the "
    "allocation interval].",
)
@click.option(
    "--nvml-backend", default=None, metavar="pynvml|fake:PATH", help="NVML source [default pynvml]."
)
@click.option(
    "--buffer-limit",
    type=click.IntRange(2, None),
    default=None,
    help="Events kept while the broker is unreachable [default 1000].",
)
@click.option("--health-host", default=None, help="Health/metrics listen address [default 127.0.0.1].")
@click.option(
    "--health-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Health/metrics port; 0 picks a free one [default 9401].",
)
@click.option("--log-level", default=None, type=click.Choice(config.LOG_LEVELS, case_sensitive=False))
def command(**flags: Any) -> None:
    """Sample the kubelet, NVML and /proc on this node and publish allocations, telemetry, XIDs and
    inventory (key = node name)."""
    settings = load_settings(**flags)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logs.install()  # repeated failures (ours, aiokafka's) are bounded: see periscope.logs
    check_kafka("probe", settings)
    asyncio.run(_serve(settings))
