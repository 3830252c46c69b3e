"""How settings are read: the PERISCOPE_ environment, durations, the one loader every command uses, and
the environment a launcher gives a child service.

Every service has exactly one pydantic-settings class (periscope.settings; the Kafka connection's in
periscope.bus.settings), with the prefix PERISCOPE_ (e.g. PERISCOPE_KAFKA_BOOTSTRAP) and defaults valid
for the embedded mode. No other module reads os.environ. `load_settings` is how every command loads its
class: any bad value becomes one `SettingsError` line naming the setting. `env_for` is how a launcher
(`periscope up`) builds a child's settings: with the child's own class, so a misspelt or bad one fails
in the launcher, not silently in the child.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BeforeValidator, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from periscope.core.duration import parse_duration_ms

PREFIX = "PERISCOPE_"
MODEL_CONFIG = SettingsConfigDict(env_prefix=PREFIX, extra="ignore")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


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


def positive(value: float) -> float:
    """A duration that must be longer than zero (a field validator's body)."""
    if value <= 0:
        raise ValueError("must be longer than 0s")
    return value


def not_negative(value: float) -> float:
    if value < 0:
        raise ValueError("must not be negative")
    return value


# The types of duration settings: a field declared with one of them reads the project's duration strings
# and is checked, with no validator of its own (docs.py lists them as durations).
PARSE_DURATION = BeforeValidator(seconds)
PositiveDuration = Annotated[float, PARSE_DURATION, AfterValidator(positive)]
NonNegativeDuration = Annotated[float, PARSE_DURATION, AfterValidator(not_negative)]
Duration = Annotated[float, PARSE_DURATION]  # checked by the class (a bound of its own)


class SettingsError(ValueError):
    """A setting has a bad value; the message is one line naming it."""


S = TypeVar("S", bound=BaseSettings)
B = TypeVar("B", bound=BaseSettings)


def load_settings(cls: type[S], what: str, *, naming: Literal["field", "variable"] = "field",
                  error: type[Exception] = SettingsError, **overrides: Any) -> S:
    """`cls` from the environment, `overrides` (flags) winning. A bad value raises `error` with one line:
    `<what> settings: <field>: <problem>` (the field is the variable without PERISCOPE_, lower-case), or
    with `naming="variable"`, `PERISCOPE_<FIELD>: <problem>`. A service's log level must be one of
    LOG_LEVELS and its Kafka bootstrap must not be empty."""
    def bad(loc: list[str], msg: str) -> Exception:
        if naming == "variable":
            return error(f"{PREFIX + loc[0].upper() if loc else 'settings'}: {msg}")
        return error(f"{what} settings: {'.'.join(loc) or 'settings'}: {msg}")

    try:
        settings = cls(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        err = e.errors()[0]
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        raise bad([str(x) for x in err.get("loc", ())], msg) from None
    level = getattr(settings, "log_level", None)
    if isinstance(level, str) and level.lower() not in LOG_LEVELS:
        raise bad(["log_level"], f"{level!r} is not one of {', '.join(LOG_LEVELS)}")
    bootstrap = getattr(settings, "kafka_bootstrap", None)
    if isinstance(bootstrap, str) and not bootstrap.strip():
        if naming == "variable":
            raise bad(["kafka_bootstrap"], "is empty")
        raise error(f"{what} settings: kafka_bootstrap is empty")
    return settings


def env_for(cls: type[BaseSettings], **values: Any) -> dict[str, str]:
    """The settings to start a child service with, as PERISCOPE_* values (lower-case, without the prefix),
    checked with the child's own class: a name it does not have, or a value it refuses, raises
    SettingsError. Durations (float seconds) are written as seconds."""
    unknown = sorted(set(values) - set(cls.model_fields))
    if unknown:
        raise SettingsError(f"{cls.__name__} has no setting {unknown[0]!r}")
    try:
        _without_environment(cls).model_validate(values)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "settings"
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        raise SettingsError(f"{cls.__name__}: {where}: {msg}") from None
    return {k: _text(v) for k, v in values.items()}


@functools.cache
def _without_environment(cls: type[B]) -> type[B]:
    """`cls` reading only what it is given: a child's settings are checked without the launcher's own
    PERISCOPE_* environment, which is not the child's."""

    class Given(cls):  # type: ignore[valid-type,misc]
        @classmethod
        def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: Any,
                                       *others: Any, **more: Any) -> tuple[Any, ...]:
            return (init_settings,)

    Given.__name__ = cls.__name__
    return Given  # type: ignore[no-any-return]


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.6f}".rstrip("0").rstrip(".") or "0"
    return str(v)
