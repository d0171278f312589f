"""Process settings from ``AGGREGATOR_*`` environment variables.

The config file says *what* to aggregate; these settings say where things are and how the
process behaves. Command-line flags, where the CLI has them, win over these.

Read as pydantic-settings reads them with ``env_prefix="AGGREGATOR_"``, ``env_ignore_empty`` and
case-insensitive names (every field is a scalar, so each value is one string, validated in lax mode),
by a plain pydantic model: pydantic-settings itself costs `serve` 1.2 MB RSS and 50 ms of start-up
(issue 24), for the few lines of `_from_environment`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from aggregator.config import ConfigError

__all__ = ["LOG_LEVELS", "Settings", "data_dir_of", "load_settings", "resolve_data_dir"]

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


ENV_PREFIX = "AGGREGATOR_"


class Settings(BaseModel):
    """``AGGREGATOR_CONFIG``, ``AGGREGATOR_DATA_DIR``, ``AGGREGATOR_LOG_LEVEL``, ... (empty = unset).

    Keyword arguments win over the environment (as with pydantic-settings)."""

    model_config = ConfigDict(extra="ignore")

    def __init__(self, **values: Any) -> None:
        super().__init__(**{**_from_environment(type(self).model_fields), **values})

    config: Path | None = None
    data_dir: Path | None = None
    log_level: str = "warning"
    log_file: Path | None = None
    token: SecretStr | None = None  # bearer token required by the HTTP server mode
    max_result_bytes: int | None = Field(default=None, ge=1024)  # overrides the config file's
    # Serving limits (README "Failure behaviour"): per stdio session, per HTTP server, per search.
    max_in_flight: int = Field(default=64, ge=1)  # requests of one session being worked on at once
    drain_seconds: float = Field(default=10.0, ge=0, le=3600)  # after stdin closes, for requests still running
    http_max_sessions: int = Field(default=1000, ge=1)  # open HTTP sessions; past it the least busy is evicted
    http_max_sessions_per_client: int = Field(default=200, ge=1)  # per client address
    http_session_idle_seconds: float = Field(default=900.0, gt=0)  # an HTTP session with no request is closed
    http_header_timeout: float = Field(default=10.0, gt=0)  # to receive a request's line and headers
    http_body_timeout: float = Field(default=30.0, gt=0)  # to receive a request's body once its headers came
    search_max_k: int = Field(default=1000, ge=1)  # search_index's largest k
    browser: str | None = None  # a command that receives an OAuth sign-in URL (tests, scripted setups)
    token_store: Literal["auto", "file", "keyring"] = "auto"  # where OAuth tokens are kept (docs/oauth.md)
    service_idle_seconds: float = Field(default=300.0, ge=0)  # after the last client leaves; 0: never stop

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.strip().lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return level


def _from_environment(fields: dict[str, Any]) -> dict[str, str]:
    """Each field's ``AGGREGATOR_<NAME>`` variable, any case, if set and not empty."""
    wanted = {ENV_PREFIX.lower() + name: name for name in fields}
    return {wanted[key.lower()]: value for key, value in os.environ.items() if key.lower() in wanted and value}


def load_settings() -> Settings:
    """Read the settings from the environment; a bad value becomes a `ConfigError` (exit 2)."""
    try:
        return Settings()
    except ValidationError as exc:
        err = exc.errors(include_url=False, include_input=False)[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        variable = f"AGGREGATOR_{field.upper()}" if field else "AGGREGATOR_*"
        message = str(err["msg"])
        raise ConfigError(
            "<environment>",
            variable,
            message[:1].lower() + message[1:],
            f"correct or unset {variable}",
        ) from None


def resolve_data_dir(explicit: Path | None, settings: Settings) -> Path:
    """The data directory: ``--data-dir`` > ``AGGREGATOR_DATA_DIR`` > the user data dir.

    Returned absolute (``~`` expanded); it is not created here.
    """
    chosen = explicit or settings.data_dir or Path(platformdirs.user_data_dir("aggregator"))
    return chosen.expanduser().absolute()


def data_dir_of(args: object, settings: Settings) -> Path:
    """`resolve_data_dir` for a parsed command line, whose command may have no ``--data-dir``."""
    return resolve_data_dir(getattr(args, "data_dir", None), settings)
