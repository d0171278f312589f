"""The validated configuration models every other module uses (resolved: no ``${VAR}`` left)."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "BUILTIN_SOURCE",
    "DEFAULT_SNAPSHOT_MAX_AGE",
    "NAME_PATTERN",
    "RESERVED_NAME",
    "AggregatorConfig",
    "Duration",
    "OwnTools",
    "Timeouts",
    "ToolFilter",
    "Transport",
    "UpstreamConfig",
    "UpstreamPresentation",
]

RESERVED_NAME = "aggregator"
BUILTIN_SOURCE = "<built-in default>"
DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024  # one JSON-RPC message from an upstream
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
PREFIX_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,32}")
"""A `prefix:` string (exposed names stay within ``^[A-Za-z0-9_-]{1,64}$``)."""
"""An upstream name; always used with ``fullmatch`` (``$`` would let a trailing newline through)."""

Transport = Literal["stdio", "http", "sse"]
AuthKind = Literal["oauth", "client_credentials", "identity_assertion", "none"]
CallPath = Literal["raw", "full"]  # how a call reaches a stdio upstream (docs/performance.md, "The raw path")


class Timeouts(BaseModel):
    """Seconds allowed for the connect/handshake phase and for one tool call."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    connect: float = Field(default=10.0, gt=0)
    call: float = Field(default=60.0, gt=0)


class ToolFilter(BaseModel):
    """Which upstream tools are exposed: fnmatch globs, case-sensitive; ``deny`` wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)

    def allows(self, tool_name: str) -> bool:
        """True if the tool is exposed. ``allow`` None allows all; ``allow: []`` allows none."""
        if any(fnmatchcase(tool_name, pattern) for pattern in self.deny):
            return False
        return self.allow is None or any(fnmatchcase(tool_name, pattern) for pattern in self.allow)


DEFAULT_TIMEOUTS = Timeouts()

DEFAULT_SNAPSHOT_MAX_AGE = 30 * 86400.0
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(value: Any) -> Any:
    """Seconds from a number or a string such as ``90s``, ``12h``, ``30d``, ``2w``; other input is left to pydantic."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like 30d, not a boolean")
    if isinstance(value, str) and (match := _DURATION.fullmatch(value)):
        return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    return value


Duration = Annotated[float, BeforeValidator(_duration), Field(gt=0, allow_inf_nan=False)]
"""Seconds, written as a number or as ``30d``, ``12h``, ``90m``, ``45s``, ``2w``."""


class UpstreamPresentation(BaseModel):
    """Settings that read the same as written and resolved: what a server is, how its tools show."""

    description: str = ""
    capabilities: list[str] = Field(default_factory=list)
    start: Literal["lazy", "eager"] = "lazy"
    expose: Literal["catalog", "direct"] = "catalog"
    pin: list[str] = Field(default_factory=list)
    tools: ToolFilter = Field(default_factory=ToolFilter)
    roots: list[str] = Field(default_factory=list)  # directories or URIs: roots/list when no client can say
    # one upstream session for all clients, or one per client (docs/isolation.md); None: per-client for
    # http/sse upstreams (another MCP session), shared for stdio (per-client there is one process per client)
    sessions: Literal["shared", "per-client"] | None = None
    prefix: bool | str = True  # exposed tool/prompt names: true <server>__name, false the name, or "<prefix>name"

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: bool | str) -> bool | str:
        if isinstance(value, str) and not PREFIX_PATTERN.fullmatch(value):
            raise ValueError(f"prefix {value!r} is not 1 to 32 of A-Z a-z 0-9 _ -")
        return value


class UpstreamConfig(UpstreamPresentation):
    """One upstream server, fully resolved (variables expanded, timeouts merged)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    transport: Transport
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, repr=False)  # secrets: kept out of repr
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict, repr=False)  # secrets: kept out of repr
    timeouts: Timeouts = Field(default_factory=Timeouts)
    snapshots: bool = True  # keep the catalog on disk and serve it before the upstream starts
    snapshot_max_age: Duration = DEFAULT_SNAPSHOT_MAX_AGE  # seconds; older snapshots are ignored
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, ge=1024)  # one message from it, any transport
    call_path: CallPath = "raw"  # raw: calls pass as bytes where they can (docs/performance.md); full: always the SDK
    # OAuth (remote upstreams; upstream/oauth_providers.py). auth None: OAuth when the server answers 401.
    auth: AuthKind | None = None
    scopes: list[str] = Field(default_factory=list)
    client_id: str | None = None
    client_secret: str | None = Field(default=None, repr=False)  # secrets: kept out of repr
    client_metadata_url: str | None = None
    client_private_key: str | None = Field(default=None, repr=False)  # PEM: private_key_jwt
    client_signing_algorithm: str = "RS256"
    issuer: str | None = None  # the authorization server the client credentials belong to
    idp_token_endpoint: str | None = None  # identity_assertion: the enterprise IdP's token endpoint ...
    idp_id_token: str | None = Field(default=None, repr=False)  # ... the user's ID token there (a secret) ...
    idp_client_id: str | None = None  # ... and our client id at the IdP

    @model_validator(mode="after")
    def _check(self) -> UpstreamConfig:
        if not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"upstream name {self.name!r} does not match ^{NAME_PATTERN.pattern}$")
        if self.transport == "stdio" and (self.command is None or self.url is not None):
            raise ValueError("a stdio upstream needs a command and no url")
        if self.transport != "stdio" and (self.url is None or self.command is not None):
            raise ValueError(f"an {self.transport} upstream needs a url and no command")
        if self.transport == "stdio" and self.auth not in (None, "none"):
            raise ValueError("auth applies only to a remote upstream (url)")
        return self

    @property
    def per_client_sessions(self) -> bool:
        """True if each client's requests go on an upstream session of its own (docs/isolation.md)."""
        return self.sessions == "per-client" or (self.sessions is None and self.transport != "stdio")

    @property
    def name_prefix(self) -> str:
        """What goes before an exposed tool or prompt name: ``<server>__`` by default, else `prefix:`."""
        if self.prefix is True:
            return f"{self.name}__"
        return self.prefix or ""

    def is_direct(self, tool_name: str) -> bool:
        """True if the tool is listed directly as ``<server>__<tool>`` (``expose: direct`` or pinned)."""
        return self.expose == "direct" or tool_name in self.pin


class OwnTools(BaseModel):
    """Which families of the aggregator's own tools clients see (`own_tools:`); the catalog tools always.

    Read at start: a change takes effect when the aggregator restarts.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    introspection: bool = True  # apropos-search, who-references (~1.9 KB of tools/list)
    text_index: bool = True  # search_create_index, search_add_document, search_index (~3.1 KB)


class AggregatorConfig(BaseModel):
    """The whole configuration. ``upstreams`` iterates in name order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    upstreams: dict[str, UpstreamConfig] = Field(default_factory=dict)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    max_result_bytes: int = Field(default=262144, ge=1024)
    source: str = BUILTIN_SOURCE
    own_tools: OwnTools = Field(default_factory=OwnTools)
    broken: dict[str, str] = Field(default_factory=dict)  # name → why its entry is unusable here (EntryError)
    disabled: list[str] = Field(default_factory=list)  # client entries skipped by `disabled: true`

    @field_validator("upstreams")
    @classmethod
    def _sorted(cls, upstreams: dict[str, UpstreamConfig]) -> dict[str, UpstreamConfig]:
        return {name: upstreams[name] for name in sorted(upstreams)}
