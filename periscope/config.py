"""Settings base: every service has exactly one pydantic-settings class deriving from this one.

Environment variables use the prefix PERISCOPE_ (e.g. PERISCOPE_KAFKA_BOOTSTRAP); defaults are valid
for the embedded mode. No other module reads os.environ.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PERISCOPE_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    log_level: str = "INFO"
