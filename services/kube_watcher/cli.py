"""`periscope watch`: list/watch the apiserver and publish pods, nodes and GPU Operator policy."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Any

import click
import yaml

from periscope import config, logs
from periscope.cli.kafka import check_kafka
from periscope.settings.watcher import WatcherSettings

try:
    from periscope.cli.errors import InputError
except ImportError:  # the shared CLI package is optional for running this command on its own

    class InputError(click.ClickException):  # type: ignore[no-redef]
        exit_code = 2


log = logging.getLogger("periscope.watch")


def load_settings(**flags: Any) -> WatcherSettings:
    """Env (PERISCOPE_*) first, flags override; any bad value becomes one InputError line."""
    settings = config.load_settings(WatcherSettings, "watch", error=InputError, **flags)
    if settings.kubeconfig is not None and not Path(settings.kubeconfig).is_file():
        raise InputError(f"kubeconfig {settings.kubeconfig}: no such file")
    return settings


def _clock(setting: str) -> Any:
    from periscope.clock import clock_from_setting

    try:
        return clock_from_setting(setting).now_ms
    except ValueError as e:
        raise InputError(str(e)) from None


async def serve(settings: WatcherSettings, clock: Any) -> None:
    from kubernetes.config.config_exception import ConfigException

    from periscope.bus.producer import Publisher
    from periscope.bus.retry import Backoff
    from services.kube_watcher.health import HealthServer
    from services.kube_watcher.leader import run_elected
    from services.kube_watcher.service import KubeWatcher, api_client

    try:
        client = api_client(settings)
    except (ConfigException, ValueError, TypeError, AttributeError, yaml.YAMLError) as e:
        # A malformed kubeconfig surfaces as any of these from the client's loader.
        if settings.kubeconfig is None:
            raise InputError(f"no kubeconfig given and no in-cluster config ({e})") from None
        raise InputError(f"kubeconfig {settings.kubeconfig}: {e}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    backoff = Backoff()
    while not stop.is_set():  # the broker may come up after us
        publisher = Publisher(settings.kafka(), client_id="periscope-kube-watcher")
        try:
            await publisher.start()
            break
        except Exception as e:
            log.warning("broker %s not reachable (%s); retrying", settings.kafka_bootstrap, e)
            with contextlib.suppress(Exception):
                await publisher.stop()
            await backoff.sleep(stop)
    watcher = KubeWatcher(settings, publisher, client=client, clock=clock)
    health = HealthServer(
        settings.health_host,
        settings.health_port,
        live=watcher.live,
        ready=watcher.ready,
        metrics=watcher.metrics,
    )
    port = await health.start()
    log.info("watching; health on http://%s:%d", settings.health_host, port)
    try:
        if settings.leader_election:
            await run_elected(settings, client, watcher, stop)
        else:
            await watcher.run(stop)
    finally:
        await health.stop()
        with contextlib.suppress(Exception):
            await publisher.stop()


@click.command("watch")
@click.option(
    "--kubeconfig", default=None, help="Kubeconfig file [env PERISCOPE_KUBECONFIG; default in-cluster]."
)
@click.option(
    "--bootstrap", default=None, metavar="HOST:PORT", help="Kafka bootstrap [env PERISCOPE_KAFKA_BOOTSTRAP]."
)
@click.option(
    "--operator-namespace", default=None, help="GPU Operator namespace [env PERISCOPE_OPERATOR_NAMESPACE]."
)
@click.option(
    "--leader-election/--no-leader-election",
    default=None,
    help="Publish only while holding a coordination.k8s.io Lease [env PERISCOPE_LEADER_ELECTION].",
)
@click.option(
    "--lease-namespace", default=None, help="Namespace of the Lease [env PERISCOPE_LEASE_NAMESPACE]."
)
@click.option("--health-host", default=None, help="Health/metrics address [env PERISCOPE_HEALTH_HOST].")
@click.option(
    "--health-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Health port [env PERISCOPE_HEALTH_PORT].",
)
def command(**flags: Any) -> None:
    """Watch pods, nodes, ClusterPolicy, operand DaemonSets and ResourceClaims; publish to the bus."""
    settings = load_settings(kafka_bootstrap=flags.pop("bootstrap"), **flags)
    clock = _clock(settings.clock)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logs.install()  # repeated failures (ours, aiokafka's) are bounded: see periscope.logs
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)  # retries are logged by us
    with contextlib.suppress(KeyboardInterrupt):
        check_kafka("watch", settings)
        asyncio.run(serve(settings, clock))
