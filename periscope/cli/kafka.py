"""The start-up check every service runs before its first Kafka client: a TLS or SASL problem
(untrusted certificate, host name mismatch, refused credentials, plaintext client at a TLS listener)
ends the process with status 1 and one line naming it, instead of a client that retries forever.
A broker that is merely not up yet passes: the services wait for it as before."""

from __future__ import annotations

import asyncio
import logging
from typing import IO, Any

import click

from periscope.bus.diagnosis import check_connection
from periscope.bus.security import KafkaSecurityError
from periscope.bus.settings import ServiceSettings
from periscope.cli.errors import report

KAFKA_SETUP_EXIT = 1


class KafkaSetupError(click.ClickException):
    """The service cannot talk to Kafka with its security settings: exit 1, one line."""

    exit_code = KAFKA_SETUP_EXIT

    def show(self, file: IO[Any] | None = None) -> None:
        report(self.format_message(), file)


def check_kafka(service: str, settings: ServiceSettings, timeout_s: float = 20.0) -> None:
    """Raise KafkaSetupError when the bootstrap servers refuse the settings' TLS/SASL configuration."""
    try:
        kafka = settings.kafka()
        security = kafka.security
        asyncio.run(check_connection(kafka.bootstrap, security, timeout_s))
    except KafkaSecurityError as e:
        where = settings.kafka_bootstrap
        raise KafkaSetupError(f"{service}: cannot connect to Kafka at {where}: {e}") from None
    logging.getLogger("periscope.kafka").debug("%s: Kafka security %s", service, security.describe())
