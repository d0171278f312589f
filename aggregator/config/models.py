"""The validated configuration models every other module uses (resolved: no ``${VAR}`` left)."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "BUILTIN_SOURCE",
    "NAME_PATTERN",
    "RESERVED_NAME",
    "AggregatorConfig",
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


class UpstreamPresentation(BaseModel):
    """Settings that read the same as written and resolved: what a server is, how its tools show."""

    description: str = ""
    capabilities: list[str] = Field(default_factory=list)
    start: Literal["lazy", "eager"] = "lazy"
    expose: Literal["catalog", "direct"] = "catalog"
    pin: list[str] = Field(default_factory=list)
    tools: ToolFilter = Field(default_factory=ToolFilter)


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


class AggregatorConfig(BaseModel):
    """The whole configuration. ``upstreams`` iterates in name order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    upstreams: dict[str, UpstreamConfig] = Field(default_factory=dict)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    max_result_bytes: int = Field(default=262144, ge=1024)
    source: str = BUILTIN_SOURCE
    disabled: list[str] = Field(default_factory=list)  # client entries skipped by `disabled: true`

    @field_validator("upstreams")
    @classmethod
    def _sorted(cls, upstreams: dict[str, UpstreamConfig]) -> dict[str, UpstreamConfig]:
        return {name: upstreams[name] for name in sorted(upstreams)}
