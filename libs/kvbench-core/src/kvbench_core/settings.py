"""Settings shared by every service; each service subclasses ``ServiceSettings`` with its own prefix.

Shared values (the NATS URL, logging) are read from fixed names (``KVBENCH_NATS_URL``) whatever the
service's prefix, so one environment file configures a whole deployment.
"""

from __future__ import annotations

import sys
from typing import Literal, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ServiceSettings", "load_settings"]

S = TypeVar("S", bound=BaseSettings)


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVBENCH_", extra="ignore", frozen=True)

    nats_url: str = Field("nats://127.0.0.1:4222", validation_alias="KVBENCH_NATS_URL", description="NATS server URL")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", validation_alias="KVBENCH_LOG_LEVEL", description="Log level"
    )
    log_json: bool = Field(True, validation_alias="KVBENCH_LOG_JSON", description="Structured JSON logs")

    @field_validator("nats_url")
    @classmethod
    def _nats_scheme(cls, value: str) -> str:
        if not value.startswith(("nats://", "tls://", "ws://", "wss://")):
            raise ValueError("KVBENCH_NATS_URL must start with nats://, tls://, ws:// or wss://")
        return value


def load_settings(cls: type[S]) -> S:
    """Build settings from the environment, or exit with a message naming each bad variable."""
    try:
        return cls()
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        lines = [f"invalid configuration for {cls.__name__}:"]
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {prefix}{name.upper()}: {err['msg']}")
        sys.stderr.write("\n".join(lines) + "\n")
        raise SystemExit(2) from None
