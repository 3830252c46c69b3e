"""Every settings class, by the command that reads it: what docs/settings.md lists (periscope.settings.docs)
and what a deployment file may set (tests/unit/test_deploy.py)."""

from __future__ import annotations

from pydantic_settings import BaseSettings

from periscope.bus.admin import TopicSettings
from periscope.bus.settings import ServiceSettings
from periscope.settings.api import ApiSettings
from periscope.settings.joiner import JoinerSettings
from periscope.settings.probe import ProbeSettings
from periscope.settings.replay import ReplaySettings
from periscope.settings.top import TopSettings
from periscope.settings.watcher import WatcherSettings

# (command, its settings class); ServiceSettings first: the variables every service reads.
CATALOG: tuple[tuple[str, type[BaseSettings]], ...] = (
    ("every service", ServiceSettings),
    ("periscope probe", ProbeSettings),
    ("periscope watch", WatcherSettings),
    ("periscope join", JoinerSettings),
    ("periscope api", ApiSettings),
    ("periscope replay", ReplaySettings),
    ("periscope top", TopSettings),
    ("python -m periscope.bus.admin (the topics job)", TopicSettings),
)


def variables() -> set[str]:
    """Every PERISCOPE_* variable some command reads."""
    return {"PERISCOPE_" + name.upper() for _, cls in CATALOG for name in cls.model_fields}
