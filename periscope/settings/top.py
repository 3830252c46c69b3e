"""What `periscope top` reads from the environment: the API's bearer token."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings

from periscope.config import MODEL_CONFIG


class TopSettings(BaseSettings):
    """What `periscope top` reads from the environment: the API's bearer token (PERISCOPE_API_TOKEN)."""

    model_config = MODEL_CONFIG

    api_token: SecretStr = Field(default=SecretStr(""), description=(
        "bearer token `periscope top` sends to an API with access control on (never printed)"))
