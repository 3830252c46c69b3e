"""Settings base: every service has exactly one pydantic-settings class deriving from this one.

Environment variables use the prefix PERISCOPE_ (e.g. PERISCOPE_KAFKA_BOOTSTRAP); defaults are valid
for the embedded mode. No other module reads os.environ. `load_settings` is how every command loads
its class: any bad value becomes one `SettingsError` line naming the variable.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from periscope.bus.settings import KafkaSettings
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


class ServiceSettings(KafkaSettings):
    # The PERISCOPE_KAFKA_* variables (bootstrap, profile, TLS/SASL) come from KafkaSettings;
    # `kafka()` gives the connection every Kafka client is built from.
    model_config = SettingsConfigDict(env_prefix="PERISCOPE_", extra="ignore")

    log_level: str = "INFO"


class SettingsError(ValueError):
    """A setting has a bad value; the message is one line naming it."""


S = TypeVar("S", bound=ServiceSettings)


def load_settings(cls: type[S], what: str, **overrides: Any) -> S:
    """`cls` from the environment, `overrides` (flags) winning; a bad value raises SettingsError
    `<what> settings: <field>: <problem>` (the field is the variable without PERISCOPE_, lower-case)."""
    try:
        return cls(**overrides)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "settings"
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        raise SettingsError(f"{what} settings: {where}: {msg}") from None
