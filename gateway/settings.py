"""Process settings, from GATEWAY_* environment variables; the one place their defaults live.

Routing behaviour lives in the policy file (router_policies/schema.py); these are the knobs
of the process itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    """Loopback unless an operator opens it up (0.0.0.0 in a container)."""
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    policy: Path | None = None
    max_body_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    retries: Annotated[int, Field(ge=0, le=10)] = 1
    """Extra attempts on another replica when one refuses or fails before the first byte."""
    connect_timeout_s: Annotated[float, Field(gt=0)] = 3.0
    first_byte_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    """Long prefills of long prompts are legitimate; this only catches a replica that hangs."""
    health_interval_s: Annotated[float, Field(gt=0)] = 1.0
    health_timeout_s: Annotated[float, Field(gt=0)] = 1.0
    unhealthy_after: Annotated[int, Field(ge=1)] = 2
    healthy_after: Annotated[int, Field(ge=1)] = 2
    scrape_interval_s: Annotated[float, Field(gt=0)] = 1.0
    policy_watch_interval_s: Annotated[float, Field(gt=0)] = 1.0
    """How often the policy file is checked for changes (it is also reloaded on SIGHUP)."""
    admin_token: SecretStr | None = None
    """Bearer token for /admin/*; with none set, the admin endpoints are disabled."""
    log_level: str = "INFO"
