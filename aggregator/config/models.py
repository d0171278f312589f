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
"""An upstream name; always used with ``fullmatch`` (``$`` would let a trailing newline through)."""

Transport = Literal["stdio", "http", "sse"]


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

    @model_validator(mode="after")
    def _check(self) -> UpstreamConfig:
        if not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"upstream name {self.name!r} does not match ^{NAME_PATTERN.pattern}$")
        if self.transport == "stdio" and (self.command is None or self.url is not None):
            raise ValueError("a stdio upstream needs a command and no url")
        if self.transport != "stdio" and (self.url is None or self.command is not None):
            raise ValueError(f"an {self.transport} upstream needs a url and no command")
        return self

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
