"""Settings of the query API service (env prefix PERISCOPE_, e.g. PERISCOPE_API_PORT)."""

from __future__ import annotations

from pydantic import Field

from periscope.config import ServiceSettings


class ApiSettings(ServiceSettings):
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=0, le=65535)
    # Each replica joins its own consumer group (prefix + random suffix) and reads every output topic
    # from the beginning without committing, so replicas stay stateless and identical.
    api_group_prefix: str = "periscope-api-"
