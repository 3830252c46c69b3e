"""The PERISCOPE_KAFKA_* settings every Kafka client of ours is built from, and `ServiceSettings`, the base
of every service's settings class (periscope.settings): the Kafka connection and the log level.

`kafka()` resolves them into the `Kafka` connection (periscope.bus.clients) that builds producers,
consumers, admin clients and the joiner's Faust broker configuration.
"""

from __future__ import annotations

from pydantic import Field

from periscope.bus.clients import Kafka
from periscope.bus.profile import ProfileName, profile
from periscope.bus.security import KafkaSecuritySettings
from periscope.config import LOG_LEVELS, MODEL_CONFIG


class KafkaSettings(KafkaSecuritySettings):
    kafka_bootstrap: str = Field(default="127.0.0.1:9092", description=(
        "Kafka bootstrap servers, HOST:PORT[,...]"))
    kafka_profile: ProfileName = Field(default="kafka", description=(
        "`kafka` (Apache Kafka: production) or `embedded` (the development kit's broker, whose quirks "
        "periscope.bus.profile works around); `periscope up` sets it for the services it starts"))

    def kafka(self) -> Kafka:
        return Kafka(self.kafka_bootstrap, self.kafka_security(), profile(self.kafka_profile))


class ServiceSettings(KafkaSettings):
    """What every service reads: the PERISCOPE_KAFKA_* connection (`kafka()` gives the connection every
    Kafka client is built from) and its log level."""

    model_config = MODEL_CONFIG

    log_level: str = Field(default="INFO",
                           description="log level: " + ", ".join(x.upper() for x in LOG_LEVELS))
