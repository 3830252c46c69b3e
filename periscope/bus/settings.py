"""The PERISCOPE_KAFKA_* settings every Kafka client of ours is built from (one class, mixed into each
service's settings through periscope.config.ServiceSettings).

`kafka()` resolves them into the `Kafka` connection (periscope.bus.clients) that builds producers,
consumers, admin clients and the joiner's Faust broker configuration.
"""

from __future__ import annotations

from periscope.bus.clients import Kafka
from periscope.bus.profile import ProfileName, profile
from periscope.bus.security import KafkaSecuritySettings


class KafkaSettings(KafkaSecuritySettings):
    kafka_bootstrap: str = "127.0.0.1:9092"
    # `kafka` (Apache Kafka: production) or `embedded` (the development kit's broker, whose quirks
    # periscope.bus.profile works around); `periscope up` sets it for the services it starts.
    kafka_profile: ProfileName = "kafka"

    def kafka(self) -> Kafka:
        return Kafka(self.kafka_bootstrap, self.kafka_security(), profile(self.kafka_profile))
