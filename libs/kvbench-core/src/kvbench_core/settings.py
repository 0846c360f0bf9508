"""Settings shared by every service; each service subclasses ``ServiceSettings`` with its own prefix.

Shared values (the NATS URL, logging) are read from fixed names (``KVBENCH_NATS_URL``) whatever the
service's prefix, so one environment file configures a whole deployment.
"""

from __future__ import annotations

import base64
import functools
import sys
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvbench_core.bus import NatsAuth, nats_servers
from kvbench_core.sealing import SealingError, SecretsKey

__all__ = ["ApiTokenSettings", "SecretsKeySettings", "ServiceSettings", "load_settings", "read_secret_file"]

S = TypeVar("S", bound=BaseSettings)


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVBENCH_", extra="ignore", frozen=True)

    nats_url: str = Field(
        "nats://127.0.0.1:4222",
        validation_alias="KVBENCH_NATS_URL",
        description="NATS server URL, or a cluster's URLs separated by commas (the client fails over between them)",
    )
    nats_replicas: int = Field(
        1,
        ge=1,
        le=5,
        validation_alias="KVBENCH_NATS_REPLICAS",
        description="Copies of each JetStream stream and KV bucket (3 on a three-server cluster: one server may die)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", validation_alias="KVBENCH_LOG_LEVEL", description="Log level"
    )
    log_json: bool = Field(True, validation_alias="KVBENCH_LOG_JSON", description="Structured JSON logs")
    nats_token: SecretStr | None = Field(
        None, validation_alias="KVBENCH_NATS_TOKEN", description="The bus's shared token (kvbench up sets it)"
    )
    nats_token_file: str | None = Field(
        None,
        validation_alias="KVBENCH_NATS_TOKEN_FILE",
        description="A file (mode 600) holding the bus's token: what `kvbench up` writes and agents are given",
    )
    nats_creds: str | None = Field(
        None, validation_alias="KVBENCH_NATS_CREDS", description="A NATS credentials file (nkey and JWT) for the bus"
    )
    nats_user: str | None = Field(
        None,
        validation_alias="KVBENCH_NATS_USER",
        description="This service's own NATS user, with subject permissions (kvbench up makes one per service and "
        "per machine; kvbench agent-credentials NODE for a GPU machine's agent)",
    )
    nats_ca_file: str | None = Field(
        None,
        validation_alias="KVBENCH_NATS_CA_FILE",
        description="A bus with TLS (tls:// URLs): the certificate authority to check its certificate against "
        "(`kvbench up --nats-tls` makes .kvbench/secrets/tls/ca.pem)",
    )
    nats_password_file: str | None = Field(
        None,
        validation_alias="KVBENCH_NATS_PASSWORD_FILE",
        description="A file (mode 600) holding that user's password",
    )

    @field_validator("nats_token_file")
    @classmethod
    def _token_file(cls, value: str | None) -> str | None:
        if value is not None and not _readable(Path(value)):
            raise ValueError(f"cannot read the bus token file {value}; copy it from the control machine (mode 600)")
        return value

    @field_validator("nats_ca_file")
    @classmethod
    def _ca_file(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_file():
            raise ValueError(f"KVBENCH_NATS_CA_FILE: no certificate at {value}; copy the control machine's ca.pem")
        return value

    @field_validator("nats_password_file")
    @classmethod
    def _password_file(cls, value: str | None) -> str | None:
        if value is not None and not _readable(Path(value)):
            raise ValueError(
                f"KVBENCH_NATS_PASSWORD_FILE: cannot read {value}; copy the agent's credentials (mode 600)"
            )
        return value

    @field_validator("nats_creds")
    @classmethod
    def _creds_file(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_file():
            raise ValueError(f"KVBENCH_NATS_CREDS: no credentials file at {value}; give the path of a .creds file")
        return value

    @field_validator("nats_url")
    @classmethod
    def _nats_scheme(cls, value: str) -> str:
        servers = nats_servers(value)
        if not servers or not all(s.startswith(("nats://", "tls://", "ws://", "wss://")) for s in servers):
            raise ValueError(
                "KVBENCH_NATS_URL must be URLs starting with nats://, tls://, ws:// or wss://, separated by commas"
            )
        return value

    def nats_auth(self) -> NatsAuth:
        token = self.nats_token.get_secret_value() if self.nats_token else None
        if token is None and self.nats_token_file:
            token = read_secret_file(Path(self.nats_token_file))
        password = read_secret_file(Path(self.nats_password_file)) if self.nats_password_file else None
        return NatsAuth(token, self.nats_creds, self.nats_user, password, self.nats_ca_file)


class ApiTokenSettings(ServiceSettings):
    """The HTTP API's bearer token, for the services that serve one (planner, reporter): one variable for both and
    for the CLI (KVBENCH_API_TOKEN), or a file holding it (KVBENCH_API_TOKEN_FILE, what `kvbench up --listen` sets)."""

    # one name for the token on both sides: the CLI sends KVBENCH_API_TOKEN (the planner's own name still works)
    api_token: SecretStr | None = Field(  # type: ignore[pydantic-alias]  # two env names, read by pydantic-settings
        default=None,
        validation_alias=AliasChoices("KVBENCH_API_TOKEN", "KVBENCH_PLANNER_API_TOKEN"),
        description="Bearer token for mutating endpoints; unset = no auth",
    )
    api_token_file: str | None = Field(  # type: ignore[pydantic-alias]  # two env names, as api_token
        default=None,
        validation_alias=AliasChoices("KVBENCH_API_TOKEN_FILE", "KVBENCH_PLANNER_API_TOKEN_FILE"),
        description="A file (mode 600) holding the bearer token (kvbench up --listen writes one)",
    )

    @field_validator("api_token")
    @classmethod
    def _no_placeholder(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and value.get_secret_value() in ("", "changethis", "changeme"):
            raise ValueError("KVBENCH_API_TOKEN is a placeholder; set a real token or leave it unset")
        return value

    @field_validator("api_token_file")
    @classmethod
    def _token_file(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                read_secret_file(Path(value))
            except OSError as exc:
                raise ValueError(f"KVBENCH_API_TOKEN_FILE: cannot read {value} ({exc.strerror})") from None
        return value

    def bearer_token(self) -> str | None:
        """The token requests must carry, or None when the API is open (a file is read once, not per request)."""
        if self.api_token is not None:
            return self.api_token.get_secret_value()
        return _token_in(self.api_token_file) if self.api_token_file else None


class SecretsKeySettings(ServiceSettings):
    """The key stored secrets are encrypted with (kvbench_core.sealing), for the services that read them: the planner
    and the switch poller. A file (KVBENCH_SECRETS_KEY_FILE, mode 600; what `kvbench up` writes) or the key itself
    (KVBENCH_SECRETS_KEY, base64 of 32 bytes: `openssl rand -base64 32`, from a Kubernetes Secret)."""

    secrets_key: SecretStr | None = Field(
        None, validation_alias="KVBENCH_SECRETS_KEY", description="Base64 of the 32-byte key for stored secrets"
    )
    secrets_key_file: str | None = Field(
        None, validation_alias="KVBENCH_SECRETS_KEY_FILE", description="A file (mode 600) holding that key"
    )

    @field_validator("secrets_key_file")
    @classmethod
    def _key_file(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                SecretsKey.load(Path(value))
            except OSError as exc:
                raise ValueError(f"KVBENCH_SECRETS_KEY_FILE: cannot read {value} ({exc.strerror})") from None
            except SealingError as exc:
                raise ValueError(f"KVBENCH_SECRETS_KEY_FILE: {exc}; make one with `openssl rand -base64 32`") from None
        return value

    @field_validator("secrets_key")
    @classmethod
    def _key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            try:
                SecretsKey(base64.b64decode(value.get_secret_value(), validate=True))
            except (ValueError, SealingError):
                raise ValueError("KVBENCH_SECRETS_KEY is not base64 of 32 bytes; make one with `openssl rand -base64 "
                                 "32`") from None  # fmt: skip
        return value

    def stored_secrets_key(self) -> SecretsKey | None:
        """The key, or None when none is set (then no secret can be stored)."""
        if self.secrets_key is not None:
            return SecretsKey(base64.b64decode(self.secrets_key.get_secret_value()))
        return SecretsKey.load(Path(self.secrets_key_file)) if self.secrets_key_file else None


@functools.cache
def _token_in(path: str) -> str:
    return read_secret_file(Path(path))


def read_secret_file(path: Path) -> str:
    """A secret kept in a file (a token), without its trailing newline."""
    return path.read_text(encoding="utf-8").strip()


def _readable(path: Path) -> bool:
    try:
        return bool(read_secret_file(path))
    except OSError:
        return False


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
