"""The file shapes as written: our ``upstreams:`` and the clients' ``mcpServers:``/``servers:``.

These raw models check shape and types only; expansion and cross-key checks come after
(`build`). Client-only keys: ``type``/``transportType`` (the transport), ``serverUrl`` (Windsurf's
``url``), ``envFile`` (a dotenv file), ``disabled`` (skipped), and ``autoApprove``,
``alwaysAllow``, ``timeout``, ``dev``, which are accepted and ignored.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from aggregator.config.errors import Context, KeyPath
from aggregator.config.models import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_SNAPSHOT_MAX_AGE,
    AuthKind,
    CallPath,
    Duration,
    Transport,
    UpstreamPresentation,
)

__all__ = [
    "AUTH_KEYS",
    "EXAMPLE_HINT",
    "FIX_HINTS",
    "SERVER_SECTIONS",
    "TOP_KEYS",
    "RawClientServer",
    "RawDefaults",
    "RawTimeouts",
    "RawUpstream",
    "resolve_transport",
]

SERVER_SECTIONS = ("upstreams", "mcpServers", "servers")
TOP_KEYS = (*SERVER_SECTIONS, "defaults", "own_tools")
EXAMPLE_HINT = "see config/example.yaml for every key and its form"

TRANSPORT_ALIASES: dict[str, Transport] = {
    "stdio": "stdio",
    "http": "http",
    "streamablehttp": "http",
    "sse": "sse",
}


class RawTimeouts(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    connect: float | None = Field(default=None, gt=0)
    call: float | None = Field(default=None, gt=0)


class RawDefaults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeouts: RawTimeouts = Field(default_factory=RawTimeouts)
    max_result_bytes: int = Field(default=262144, ge=1024)
    snapshots: bool = True
    snapshot_max_age: Duration = DEFAULT_SNAPSHOT_MAX_AGE
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, ge=1024)
    call_path: CallPath = "raw"


class RawUpstream(UpstreamPresentation):
    """An entry of ``upstreams:``. Numbers are read as strings (``args: [--port, 3000]``)."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    transport: str | None = None
    timeouts: RawTimeouts = Field(default_factory=RawTimeouts)
    snapshots: bool | None = None  # None: as under defaults:
    snapshot_max_age: Duration | None = None
    max_message_bytes: int | None = Field(default=None, ge=1024)
    call_path: CallPath | None = None
    auth: AuthKind | None = None
    scopes: list[str] = Field(default_factory=list)
    client_id: str | None = None
    client_secret: str | None = None
    client_metadata_url: str | None = None
    client_private_key: str | None = None
    client_signing_algorithm: str = "RS256"
    issuer: str | None = None
    idp_token_endpoint: str | None = None
    idp_id_token: str | None = None
    idp_client_id: str | None = None


AUTH_KEYS = (
    "auth",
    "scopes",
    "client_id",
    "client_secret",
    "client_metadata_url",
    "client_private_key",
    "issuer",
    "idp_token_endpoint",
    "idp_id_token",
    "idp_client_id",
)


class RawClientServer(RawUpstream):
    """An entry of a client's ``mcpServers:``/``servers:``: ours plus the client-only keys."""

    type: str | None = None
    transportType: str | None = None
    serverUrl: str | None = None
    envFile: str | None = None
    disabled: bool = False
    autoApprove: list[str] | None = None
    alwaysAllow: list[str] | None = None
    timeout: float | None = None  # ignored: milliseconds in some clients, seconds in others
    dev: dict[str, Any] | None = None  # ignored


FIX_HINTS: dict[str, str] = {
    "command": "set command to the program that starts the server, e.g. command: uvx",
    "args": "write args as a list of strings, e.g. args: [-m, my_server]; quote words YAML reads as "
    "booleans (yes, no, on, off, true, false)",
    "env": 'write env as a mapping of NAME: "value" strings; quote values YAML reads as booleans',
    "headers": 'write headers as a mapping of Name: "value" strings, e.g. Authorization: "Bearer ${TOKEN}"',
    "cwd": "set cwd to a directory path",
    "url": "set url to the server's endpoint, e.g. url: http://127.0.0.1:9000/mcp",
    "serverUrl": "set serverUrl to the server's endpoint, e.g. https://example.com/mcp",
    "transport": "use transport: stdio, http or sse",
    "type": "use type: stdio, http (or streamable-http) or sse",
    "transportType": "use transportType: stdio, http or sse",
    "description": "write description as one string",
    "capabilities": "write capabilities as a list of strings, e.g. capabilities: [git, diff]",
    "start": "use start: lazy (on first need) or start: eager (at start-up)",
    "expose": "use expose: catalog (through the catalog tools) or expose: direct (listed as NAME__tool)",
    "pin": "write pin as a list of tool names, e.g. pin: [search]",
    "prefix": "use prefix: true (NAME__tool), false (the upstream's own names) or a string such as gh_",
    "roots": "write roots as a list of directories or file:// URIs, e.g. roots: [~/projects/app]",
    "sessions": "use sessions: shared (one upstream session for every client) or sessions: per-client",
    "tools": "write tools as {allow: [glob, ...], deny: [glob, ...]}, e.g. tools: {deny: [delete_*]}",
    "timeouts": "give timeouts in seconds as positive numbers, e.g. timeouts: {connect: 10, call: 60}",
    "max_result_bytes": "give a whole number of bytes, at least 1024, e.g. max_result_bytes: 262144",
    "snapshots": "use snapshots: true (keep catalogs on disk, the default) or snapshots: false",
    "snapshot_max_age": "give a positive duration: seconds, or a number with s, m, h, d or w, e.g. 30d",
    "max_message_bytes": "give a whole number of bytes, at least 1024, e.g. max_message_bytes: 33554432",
    "call_path": "write call_path: raw (calls pass as bytes where they can) or call_path: full",
    "disabled": "use disabled: true or disabled: false",
    "auth": "use auth: oauth (sign in), client_credentials (machine to machine), identity_assertion "
    "(enterprise IdP, SEP-990) or none",
    "idp_token_endpoint": "set idp_token_endpoint to your identity provider's token endpoint URL",
    "idp_id_token": 'set idp_id_token from a variable, e.g. idp_id_token: "${IDP_ID_TOKEN}"',
    "idp_client_id": "set idp_client_id to the client id the identity provider knows you by",
    "scopes": "write scopes as a list of strings, e.g. scopes: [read, write]",
    "client_id": "set client_id to the OAuth client id the authorization server gave you",
    "client_secret": 'set client_secret from a variable, e.g. client_secret: "${MY_CLIENT_SECRET}"',
    "client_metadata_url": "set client_metadata_url to the https URL of your client ID metadata document",
    "client_private_key": 'set client_private_key to a PEM key from a variable, e.g. "${MY_CLIENT_KEY}"',
    "client_signing_algorithm": "use an algorithm name such as RS256 or ES256",
    "issuer": "set issuer to the authorization server's issuer URL",
    "envFile": "set envFile to the path of a NAME=value file",
    "autoApprove": "write autoApprove as a list of tool names (the aggregator ignores it)",
    "alwaysAllow": "write alwaysAllow as a list of tool names (the aggregator ignores it)",
    "timeout": "write timeout as a number (the aggregator ignores it; use timeouts: {connect, call})",
    "dev": "write dev as a mapping (the aggregator ignores it)",
}


def resolve_transport(raw: RawUpstream, url: str | None, path: KeyPath, ctx: Context) -> Transport:
    """The transport from ``transport``/``type``/``transportType``, or inferred from command/url.

    Without one, a client-shape ``url`` whose path ends in ``/sse`` is SSE (as clients read it),
    any other url streamable HTTP.
    """
    given: list[tuple[str, Transport]] = []
    candidates: list[tuple[str, str | None]] = [("transport", raw.transport)]
    if isinstance(raw, RawClientServer):
        candidates += [("type", raw.type), ("transportType", raw.transportType)]
    for key, value in candidates:
        if value is None:
            continue
        transport = TRANSPORT_ALIASES.get(re.sub(r"[-_\s]", "", value.lower()))
        if transport is None:
            raise ctx.entry_error((*path, key), f"unknown transport {value!r}", FIX_HINTS[key])
        given.append((key, transport))
    if len({transport for _, transport in given}) > 1:
        (key_a, a), (key_b, b) = given[0], given[1]
        raise ctx.error((*path, key_b), f"{key_a} says {a} but {key_b} says {b}", f"keep only {key_a}")
    if given:
        key, transport = given[0]
        if transport == "stdio" and raw.command is None:
            raise ctx.error((*path, key), "a stdio server needs command, not url", "add command:, or use http or sse")
        if transport != "stdio" and raw.command is not None:
            raise ctx.error((*path, key), f"an {transport} server needs url, not command", "add url:, or use stdio")
        return transport
    if raw.command is not None:
        return "stdio"
    if isinstance(raw, RawClientServer) and url is not None and looks_like_sse(url):
        return "sse"
    return "http"


def looks_like_sse(url: str) -> bool:
    """Clients read a url ending in /sse without a type as legacy SSE; so do we, in their shape."""
    return urlsplit(url).path.rstrip("/").endswith("/sse")
