"""Settings base: every service has exactly one pydantic-settings class deriving from this one.

Environment variables use the prefix PERISCOPE_ (e.g. PERISCOPE_KAFKA_BOOTSTRAP); defaults are valid
for the embedded mode. No other module reads os.environ.
"""

from __future__ import annotations

from typing import Any

from pydantic_settings import SettingsConfigDict

from periscope.bus.security import KafkaSecuritySettings
from periscope.core.duration import parse_duration_ms


def seconds(value: Any) -> Any:
    """A duration setting: '90s', '10m', '500ms' or plain seconds ('1.5') -> float seconds. Anything
    else is left for pydantic to judge. Used as a `mode="before"` field validator."""
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            return parse_duration_ms(text) / 1000.0
    return value


class ServiceSettings(KafkaSecuritySettings):
    # The PERISCOPE_KAFKA_* TLS/SASL variables come from KafkaSecuritySettings; `kafka_security()`
    # gives the resolved settings every Kafka client takes.
    model_config = SettingsConfigDict(env_prefix="PERISCOPE_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    log_level: str = "INFO"
