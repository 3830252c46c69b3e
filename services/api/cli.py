"""`periscope api`: serve the query API over the joiner's output topics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import click

from periscope import config, logs
from periscope.cli.errors import InputError
from periscope.cli.kafka import check_kafka
from periscope.settings.api import ApiSettings


def load_settings(
    host: str | None, port: int | None, bootstrap: str | None, group_prefix: str | None
) -> ApiSettings:
    """Env (PERISCOPE_*) first, flags override; any bad value becomes one InputError line."""
    settings = config.load_settings(ApiSettings, "api", error=InputError, api_host=host, api_port=port,
                                    kafka_bootstrap=bootstrap, api_group_prefix=group_prefix)
    for name in ("api_tls_certfile", "api_tls_keyfile"):
        path = getattr(settings, name)
        if path and not os.access(path, os.R_OK):
            raise InputError(f"api settings: {name}: cannot read {path!r}")
    return settings


@click.command("api")
@click.option("--host", default=None, help="Listen address [env PERISCOPE_API_HOST, default 127.0.0.1].")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Listen port [env PERISCOPE_API_PORT, default 8080].",
)
@click.option(
    "--bootstrap",
    default=None,
    metavar="HOST:PORT",
    help="Kafka bootstrap servers [env PERISCOPE_KAFKA_BOOTSTRAP].",
)
@click.option(
    "--group-prefix",
    default=None,
    help="Consumer group prefix; a random suffix is added per replica [env PERISCOPE_API_GROUP_PREFIX].",
)
def command(host: str | None, port: int | None, bootstrap: str | None, group_prefix: str | None) -> None:
    """Serve the HTTP query API and /metrics from a view of the attribution topics."""
    from services.api.server import ApiServer

    settings = load_settings(host, port, bootstrap, group_prefix)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logs.install()  # repeated failures (ours, aiokafka's) are bounded: see periscope.logs
    check_kafka("api", settings)
    from kubernetes.config import ConfigException

    try:
        server = ApiServer(settings)
    except ConfigException as e:
        where = settings.kubeconfig or "in-cluster service account"
        raise InputError(
            f"api settings: api_auth=kubernetes: no apiserver configuration ({where}): {e}"
        ) from None
    try:
        server.bind()
    except OSError as e:
        raise InputError(
            f"cannot listen on {settings.api_host}:{settings.api_port}: {e.strerror or e}"
        ) from None
    click.echo(f"api: {server.url}")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(server.serve())
