"""Configuration: YAML (or a client's JSON) → validated pydantic models.

Two file shapes are accepted:

* the aggregator's own: ``upstreams: {NAME: {...}}`` plus optional ``defaults:``;
* a client's: ``mcpServers: {NAME: {...}}`` (Claude Desktop, Claude Code, Cursor, Cline, Windsurf)
  or VS Code's ``servers:``, so an existing client file works as it is.

Client-only keys seen in real client files are handled this way (mcpServers/servers shape only):

* ``type`` / ``transportType``: the transport; ``streamable-http``/``streamableHttp`` mean ``http``.
  Without one, a ``url`` whose path ends in ``/sse`` is read as SSE (as clients do), any other url
  as streamable HTTP.
* ``serverUrl`` (Windsurf): the same as ``url``.
* ``disabled: true`` (Cline, Roo, Kilo, Windsurf): the server is skipped (listed in ``disabled``).
* ``envFile`` (VS Code, Cursor): a dotenv file (``NAME=value`` lines) loaded under ``env``; keys in
  ``env`` win; a relative path is relative to the config file; its values are not expanded.
* ``autoApprove``, ``alwaysAllow`` (approval lists), ``timeout`` (its unit differs between clients:
  use ``timeouts``) and ``dev`` (VS Code's debug options): accepted and ignored.
* In a client file, unknown *top-level* keys are the client's own settings and are ignored, unless
  they look like a misspelt key of ours (``defualts``).

Expansion, in ``command``, ``args``, ``env``, ``cwd``, ``url``, ``headers`` (and ``envFile``):
``${VAR}``, ``${VAR:-default}`` (default when VAR is unset *or empty*, as in the shell; the default
is literal text), ``${env:VAR}`` (Cursor's spelling of ``${VAR}``) and ``$$`` for a literal ``$``.
A bare ``$VAR`` is left alone. ``${AGGREGATOR_PYTHON}`` is the running interpreter unless set in
the environment. ``~`` is expanded only at the start of ``command`` and ``cwd`` (a client passes
args to the server verbatim, and so do we). A relative ``cwd`` is relative to the config file.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from importlib import resources
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import platformdirs
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = [
    "BUILTIN_SOURCE",
    "RESERVED_NAME",
    "AggregatorConfig",
    "ConfigError",
    "Timeouts",
    "ToolFilter",
    "UpstreamConfig",
    "find_config_path",
    "load_config",
    "parse_config",
    "user_config_file",
]

RESERVED_NAME = "aggregator"
BUILTIN_SOURCE = "<built-in default>"
CONFIG_FILE_NAME = "aggregator.yaml"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EXAMPLE_HINT = "see config/example.yaml for every key and its form"

Transport = Literal["stdio", "http", "sse"]
_TRANSPORT_ALIASES: dict[str, Transport] = {
    "stdio": "stdio",
    "http": "http",
    "streamablehttp": "http",
    "sse": "sse",
}


# --------------------------------------------------------------------------------------------
# Errors


class ConfigError(Exception):
    """A broken configuration: one line naming the file, the key and the fix.

    ``str(e)`` is ``FILE[:LINE]: KEY: problem. Fix: ...``. The CLI prints it and exits with code 2.
    Messages never contain environment or header values.
    """

    def __init__(self, file: str, key: str | None, problem: str, fix: str, *, line: int | None = None) -> None:
        self.file = file
        self.key = key
        self.problem = _one_line(problem).rstrip(".")
        self.fix = _one_line(fix).rstrip(".")
        self.line = line
        super().__init__(self.message)

    @property
    def message(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        key = f" {self.key}:" if self.key else ""
        end = "" if self.fix.endswith(("?", "!")) else "."
        return f"{where}:{key} {self.problem}. Fix: {self.fix}{end}"

    def __str__(self) -> str:
        return self.message


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------
# Public models


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


_DEFAULT_TIMEOUTS = Timeouts()


class UpstreamConfig(BaseModel):
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
    description: str = ""
    capabilities: list[str] = Field(default_factory=list)
    start: Literal["lazy", "eager"] = "lazy"
    expose: Literal["catalog", "direct"] = "catalog"
    pin: list[str] = Field(default_factory=list)
    tools: ToolFilter = Field(default_factory=ToolFilter)
    timeouts: Timeouts = Field(default_factory=Timeouts)

    @model_validator(mode="after")
    def _check(self) -> UpstreamConfig:
        if not NAME_PATTERN.match(self.name):
            raise ValueError(f"upstream name {self.name!r} does not match {NAME_PATTERN.pattern}")
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


# --------------------------------------------------------------------------------------------
# Raw (as written) models: validate shape and types; expansion and checks come after.


class _RawTimeouts(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    connect: float | None = Field(default=None, gt=0)
    call: float | None = Field(default=None, gt=0)


class _RawDefaults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeouts: _RawTimeouts = Field(default_factory=_RawTimeouts)
    max_result_bytes: int = Field(default=262144, ge=1024)


class _RawUpstream(BaseModel):
    """An entry of ``upstreams:``. Numbers are read as strings (``args: [--port, 3000]``)."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    transport: str | None = None
    description: str = ""
    capabilities: list[str] = Field(default_factory=list)
    start: Literal["lazy", "eager"] = "lazy"
    expose: Literal["catalog", "direct"] = "catalog"
    pin: list[str] = Field(default_factory=list)
    tools: ToolFilter = Field(default_factory=ToolFilter)
    timeouts: _RawTimeouts = Field(default_factory=_RawTimeouts)


class _RawClientServer(_RawUpstream):
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


_SERVER_SECTIONS = ("upstreams", "mcpServers", "servers")
_TOP_KEYS = (*_SERVER_SECTIONS, "defaults")

_FIX_HINTS: dict[str, str] = {
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
    "tools": "write tools as {allow: [glob, ...], deny: [glob, ...]}, e.g. tools: {deny: [delete_*]}",
    "timeouts": "give timeouts in seconds as positive numbers, e.g. timeouts: {connect: 10, call: 60}",
    "max_result_bytes": "give a whole number of bytes, at least 1024, e.g. max_result_bytes: 262144",
    "disabled": "use disabled: true or disabled: false",
    "envFile": "set envFile to the path of a NAME=value file",
    "autoApprove": "write autoApprove as a list of tool names (the aggregator ignores it)",
    "alwaysAllow": "write alwaysAllow as a list of tool names (the aggregator ignores it)",
    "timeout": "write timeout as a number (the aggregator ignores it; use timeouts: {connect, call})",
    "dev": "write dev as a mapping (the aggregator ignores it)",
}


# --------------------------------------------------------------------------------------------
# Reading files


def user_config_file() -> Path:
    """The per-user config file: ``user_config_dir("aggregator")/aggregator.yaml``."""
    return Path(platformdirs.user_config_dir("aggregator")) / CONFIG_FILE_NAME


def find_config_path(explicit: str | os.PathLike[str] | None, environ: Mapping[str, str], cwd: Path) -> Path | None:
    """The config file to use: ``--config`` > ``AGGREGATOR_CONFIG`` > ./aggregator.yaml > user dir.

    None means the built-in default. A path given explicitly (flag or variable) must exist: it
    is an error, not a reason to fall back. ``~`` is expanded there, since clients start the
    aggregator without a shell.
    """
    if explicit is not None and str(explicit) != "":
        return _require_file(_absolute(explicit, cwd), "the path given with --config")
    from_env = environ.get("AGGREGATOR_CONFIG", "")
    if from_env:
        return _require_file(_absolute(from_env, cwd), "the AGGREGATOR_CONFIG environment variable")
    for candidate in (cwd / CONFIG_FILE_NAME, user_config_file()):
        if candidate.is_file():
            return candidate
    return None


def _absolute(path: str | os.PathLike[str], cwd: Path) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else cwd / candidate


def _require_file(path: Path, origin: str) -> Path:
    if path.is_dir():
        raise ConfigError(str(path), None, "this is a directory, not a config file", f"correct {origin}")
    if not path.is_file():
        raise ConfigError(str(path), None, "config file not found", f"create the file, or correct {origin}")
    return path


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> AggregatorConfig:
    """Find, read and parse the configuration (see `find_config_path` for the lookup order)."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    found = find_config_path(path, environ, cwd)
    if found is None:
        text = resources.files("aggregator").joinpath("default_config.yaml").read_text(encoding="utf-8")
        return parse_config(text, BUILTIN_SOURCE, environ=environ)
    return parse_config(_read_text(found), str(found), environ=environ)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(str(path), None, "the file is not UTF-8 text", "save it as UTF-8") from None
    except FileNotFoundError:
        raise ConfigError(str(path), None, "config file not found", "create the file") from None
    except OSError as exc:
        problem = f"cannot read the file ({exc.strerror or type(exc).__name__})"
        raise ConfigError(str(path), None, problem, "check the path and its permissions") from None


# --------------------------------------------------------------------------------------------
# Parsing text


class _DuplicateKeyError(Exception):
    def __init__(self, key: str, line: int) -> None:
        super().__init__(key)
        self.key = key
        self.line = line


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise _DuplicateKeyError(key_node.value, key_node.start_mark.line + 1)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


_Lines = dict[tuple[Any, ...], int]


def _parse_yaml(text: str, source: str) -> tuple[Any, _Lines]:
    """YAML → Python data, and the line of every key path (for messages)."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except _DuplicateKeyError as exc:
        raise ConfigError(
            source,
            None,
            f"the key {exc.key!r} appears twice in one mapping",
            "keep one of them (server names must be unique)",
            line=exc.line,
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "cannot parse"
        raise ConfigError(
            source,
            None,
            f"invalid YAML: {problem}",
            "correct the YAML syntax there (indent with spaces, not tabs; quote values containing ': ' or ' #')",
            line=line,
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, None, f"invalid YAML ({type(exc).__name__})", "correct the YAML") from None
    finally:
        loader.dispose()
    lines: _Lines = {}
    if node is not None:
        _collect_lines(node, (), lines)
    return data, lines


def _collect_lines(node: Node, path: tuple[Any, ...], lines: _Lines) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode):
                child = (*path, key_node.value)
                lines.setdefault(child, key_node.start_mark.line + 1)
                _collect_lines(value_node, child, lines)
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            _collect_lines(item, (*path, index), lines)


def _parse_json(text: str, source: str) -> Any:
    """JSON (with VS Code's JSONC comments and trailing commas) → Python data."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise ConfigError(
                    source,
                    None,
                    f"the key {key!r} appears twice in one mapping",
                    "keep one of them (server names must be unique)",
                )
            result[key] = value
        return result

    try:
        return json.loads(_strip_jsonc(text), object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            source,
            None,
            f"invalid JSON: {exc.msg} (column {exc.colno})",
            "correct the JSON syntax there",
            line=exc.lineno,
        ) from None


def _strip_jsonc(text: str) -> str:
    """Drop // and /* */ comments (newlines kept, so line numbers stay) and trailing commas."""
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        char = text[i]
        if in_string:
            out.append(char)
            if char == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
            out.append(char)
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            stop = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, stop))
            i = stop
            continue
        elif char in "}]":
            _drop_trailing_comma(out)
            out.append(char)
        else:
            out.append(char)
        i += 1
    return "".join(out)


def _drop_trailing_comma(out: list[str]) -> None:
    j = len(out) - 1
    while j >= 0 and out[j].isspace():
        j -= 1
    if j >= 0 and out[j] == ",":
        del out[j]


def parse_config(text: str, source: str, *, environ: Mapping[str, str] | None = None) -> AggregatorConfig:
    """Parse one config text. ``source`` names it in messages; a ``.json`` source is read as JSON."""
    environ = os.environ if environ is None else environ
    lines: _Lines = {}
    if source.lower().endswith(".json"):
        data = _parse_json(text, source)
    else:
        data, lines = _parse_yaml(text, source)
    ctx = _Context(source=source, lines=lines, environ=environ, base_dir=_base_dir(source))
    return _build_config(data, ctx)


def _base_dir(source: str) -> Path | None:
    if source.startswith("<"):
        return None
    return Path(source).expanduser().absolute().parent


# --------------------------------------------------------------------------------------------
# Building the config


@dataclass(frozen=True)
class _Context:
    source: str
    lines: _Lines
    environ: Mapping[str, str]
    base_dir: Path | None

    def error(self, path: tuple[Any, ...], problem: str, fix: str) -> ConfigError:
        return ConfigError(self.source, _dotted(path) or None, problem, fix, line=self._line(path))

    def _line(self, path: tuple[Any, ...]) -> int | None:
        for end in range(len(path), 0, -1):
            line = self.lines.get(tuple(str(p) if not isinstance(p, int) else p for p in path[:end]))
            if line is not None:
                return line
        return None


def _dotted(path: tuple[Any, ...]) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _build_config(data: Any, ctx: _Context) -> AggregatorConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ctx.error((), "the top level is not a mapping", "start the file with upstreams: (or mcpServers:)")
    section = _server_section(data, ctx)
    client_shape = section != "upstreams"
    _check_top_keys(data, client_shape, ctx)
    timeouts, max_result_bytes = _build_defaults(data.get("defaults"), ctx)
    servers = data.get(section)
    if servers is None:
        servers = {}
    if not isinstance(servers, dict):
        raise ctx.error(
            (section,), "must be a mapping of server names to settings", f"write {section}: {{NAME: {{...}}}}"
        )
    upstreams: dict[str, UpstreamConfig] = {}
    disabled: list[str] = []
    seen: dict[str, str] = {}
    for raw_name, entry in servers.items():
        name = _check_name(raw_name, section, seen, ctx)
        path = (section, name)
        model = _validate_entry(entry, path, _RawClientServer if client_shape else _RawUpstream, ctx)
        if isinstance(model, _RawClientServer) and model.disabled:
            disabled.append(name)
            continue
        upstreams[name] = _build_upstream(name, model, path, timeouts, ctx)
    return AggregatorConfig(
        upstreams=upstreams,
        timeouts=timeouts,
        max_result_bytes=max_result_bytes,
        source=ctx.source,
        disabled=sorted(disabled),
    )


def _server_section(data: dict[Any, Any], ctx: _Context) -> str:
    present = [key for key in _SERVER_SECTIONS if key in data]
    if len(present) > 1:
        first, second = present[0], present[1]
        raise ctx.error(
            (second,),
            f"both {first}: and {second}: are given",
            f"keep one of them, with every server under {first}:",
        )
    return present[0] if present else "upstreams"


def _check_top_keys(data: dict[Any, Any], client_shape: bool, ctx: _Context) -> None:
    for key in data:
        if key in _TOP_KEYS:
            continue
        suggestion = _closest(str(key), _TOP_KEYS, cutoff=0.75 if client_shape else 0.6)
        if client_shape and suggestion is None:
            continue  # the client's own settings (globalShortcut, inputs, ...)
        raise ctx.error((str(key),), "unknown key", _unknown_key_fix(suggestion, _TOP_KEYS))


def _closest(key: str, valid: Iterable[str], cutoff: float = 0.6) -> str | None:
    options = list(valid)
    for option in options:
        if option.lower() == key.lower():
            return option
    matches = difflib.get_close_matches(key, options, n=1, cutoff=cutoff)
    return matches[0] if matches else None


def _unknown_key_fix(suggestion: str | None, valid: Iterable[str]) -> str:
    if suggestion is not None:
        return f"did you mean {suggestion!r}?"
    return "remove it; valid keys here: " + ", ".join(sorted(valid))


def _build_defaults(raw: Any, ctx: _Context) -> tuple[Timeouts, int]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ctx.error(("defaults",), "must be a mapping", "write defaults: {timeouts: {connect: 10, call: 60}}")
    model = _validate(_RawDefaults, raw, ("defaults",), ctx)
    assert isinstance(model, _RawDefaults)
    timeouts = Timeouts(
        connect=model.timeouts.connect if model.timeouts.connect is not None else _DEFAULT_TIMEOUTS.connect,
        call=model.timeouts.call if model.timeouts.call is not None else _DEFAULT_TIMEOUTS.call,
    )
    return timeouts, model.max_result_bytes


def _check_name(raw_name: Any, section: str, seen: dict[str, str], ctx: _Context) -> str:
    """Validate an upstream name; ``seen`` maps case-folded names to the first spelling."""
    if isinstance(raw_name, bool) or not isinstance(raw_name, str | int):
        raise ctx.error((section,), f"the server name {raw_name!r} is not a string", "use a name like my_server")
    name = str(raw_name)
    path = (section, name)
    if not NAME_PATTERN.match(name):
        fixed = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "my_server"
        raise ctx.error(
            path,
            "the name may use only letters, digits, '_' and '-'",
            f"rename it, e.g. to {fixed!r}",
        )
    if name.casefold() == RESERVED_NAME:
        raise ctx.error(
            path,
            f"the name {RESERVED_NAME!r} is reserved for the aggregator's own tools",
            "rename it; if this entry starts the aggregator itself, remove it",
        )
    folded = name.casefold()
    if folded in seen:
        raise ctx.error(
            path,
            f"the names {seen[folded]!r} and {name!r} differ only in case",
            "give every server a name that differs from the others ignoring case",
        )
    seen[folded] = name
    return name


def _validate_entry(entry: Any, path: tuple[Any, ...], model: type[_RawUpstream], ctx: _Context) -> _RawUpstream:
    if entry is None:
        raise ctx.error(path, "the server has no settings", "give it command: (a local server) or url: (a remote one)")
    if not isinstance(entry, dict):
        raise ctx.error(path, "must be a mapping of settings", "write NAME: {command: ..., args: [...]}")
    validated = _validate(model, entry, path, ctx)
    assert isinstance(validated, _RawUpstream)
    return validated


def _validate(model: type[BaseModel], data: dict[Any, Any], path: tuple[Any, ...], ctx: _Context) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _from_validation_error(exc, model, path, ctx) from None


def _from_validation_error(
    exc: ValidationError, model: type[BaseModel], path: tuple[Any, ...], ctx: _Context
) -> ConfigError:
    """The first problem (unknown keys first: a typo often explains the rest) as a ConfigError."""
    errors = sorted(
        exc.errors(include_url=False, include_input=False, include_context=False),
        key=lambda err: err["type"] != "extra_forbidden",
    )
    err = errors[0]
    loc = tuple(err["loc"])
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    if err["type"] == "extra_forbidden":
        valid = _valid_keys(model, loc[:-1])
        suggestion = _closest(str(loc[-1]), valid)
        return ctx.error((*path, *loc), f"unknown key{more}", _unknown_key_fix(suggestion, valid))
    message = str(err["msg"])
    problem = message[:1].lower() + message[1:] + more
    hint = next((_FIX_HINTS[p] for p in loc if isinstance(p, str) and p in _FIX_HINTS), _EXAMPLE_HINT)
    return ctx.error((*path, *loc), problem, hint)


def _valid_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the (nested) model found at ``loc`` inside ``model``."""
    current: type[BaseModel] = model
    for part in loc:
        field = current.model_fields.get(str(part))
        nested = _model_in(field.annotation) if field is not None else None
        if nested is None:
            return []
        current = nested
    return list(current.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _build_upstream(
    name: str, raw: _RawUpstream, path: tuple[Any, ...], timeouts: Timeouts, ctx: _Context
) -> UpstreamConfig:
    client = raw if isinstance(raw, _RawClientServer) else None
    url_key = "url"
    url = raw.url
    if client is not None and client.serverUrl is not None:
        if raw.url is not None:
            raise ctx.error((*path, "serverUrl"), "both url and serverUrl are given", "keep one of them")
        url, url_key = client.serverUrl, "serverUrl"
    _check_endpoint(raw, url, url_key, path, ctx)
    transport = _resolve_transport(raw, url, path, ctx)
    expand = _Expander(ctx, path)
    env = dict(raw.env)
    if client is not None and client.envFile is not None:
        env_path = expand.value(client.envFile, ("envFile",))
        env = _read_env_file(env_path, (*path, "envFile"), ctx) | env
    resolved_cwd = expand.optional(raw.cwd, ("cwd",))
    pin = list(dict.fromkeys(raw.pin))
    for index, tool in enumerate(pin):
        if not raw.tools.allows(tool):
            raise ctx.error(
                (*path, "pin", index),
                f"the pinned tool {tool!r} is hidden by tools.allow/deny",
                "unpin it, or change the filter so that it allows the tool",
            )
    return UpstreamConfig(
        name=name,
        transport=transport,
        command=_home(expand.optional(raw.command, ("command",)), ctx),
        args=[expand.value(arg, ("args", i)) for i, arg in enumerate(raw.args)],
        env={key: expand.value(value, ("env", key)) for key, value in env.items()},
        cwd=_resolve_cwd(_home(resolved_cwd, ctx), ctx),
        url=expand.optional(url, (url_key,)),
        headers={key: expand.value(value, ("headers", key)) for key, value in raw.headers.items()},
        description=raw.description.strip(),
        capabilities=list(dict.fromkeys(raw.capabilities)),
        start=raw.start,
        expose=raw.expose,
        pin=pin,
        tools=raw.tools,
        timeouts=Timeouts(
            connect=raw.timeouts.connect if raw.timeouts.connect is not None else timeouts.connect,
            call=raw.timeouts.call if raw.timeouts.call is not None else timeouts.call,
        ),
    )


def _check_endpoint(raw: _RawUpstream, url: str | None, url_key: str, path: tuple[Any, ...], ctx: _Context) -> None:
    """Exactly one of command/url, and no settings that belong to the other kind."""
    if raw.command is not None and url is not None:
        raise ctx.error(
            path,
            f"both command and {url_key} are given",
            f"keep command for a local (stdio) server, or {url_key} for a remote (http/sse) one",
        )
    if raw.command is None and url is None:
        raise ctx.error(
            path,
            "neither command nor url is given",
            "add command: (and args:) to start a local server, or url: to reach a remote one",
        )
    if url is not None:
        for key in ("args", "env", "cwd"):
            if getattr(raw, key):
                raise ctx.error(
                    (*path, key),
                    f"{key} applies only to a server started with command",
                    f"remove {key}, or start the server with command:",
                )
    if raw.command is not None and raw.headers:
        raise ctx.error(
            (*path, "headers"),
            "headers apply only to a remote server (url)",
            "remove headers, or pass the values through env:",
        )


def _resolve_transport(raw: _RawUpstream, url: str | None, path: tuple[Any, ...], ctx: _Context) -> Transport:
    given: list[tuple[str, Transport]] = []
    candidates: list[tuple[str, str | None]] = [("transport", raw.transport)]
    if isinstance(raw, _RawClientServer):
        candidates += [("type", raw.type), ("transportType", raw.transportType)]
    for key, value in candidates:
        if value is None:
            continue
        transport = _TRANSPORT_ALIASES.get(re.sub(r"[-_\s]", "", value.lower()))
        if transport is None:
            raise ctx.error((*path, key), f"unknown transport {value!r}", _FIX_HINTS[key])
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
    if isinstance(raw, _RawClientServer) and url is not None and _looks_like_sse(url):
        return "sse"
    return "http"


def _looks_like_sse(url: str) -> bool:
    """Clients read a url ending in /sse without a type as legacy SSE; so do we, in their shape."""
    return urlsplit(url).path.rstrip("/").endswith("/sse")


def _home(value: str | None, ctx: _Context) -> str | None:
    """Expand a leading ``~`` or ``~/`` (not ``~user``), with HOME from the given environment."""
    if value is None or not (value == "~" or value.startswith("~/")):
        return value
    home = ctx.environ.get("HOME") or str(Path.home())
    return home + value[1:]


def _resolve_cwd(cwd: str | None, ctx: _Context) -> str | None:
    if cwd is None or ctx.base_dir is None or Path(cwd).is_absolute():
        return cwd
    return str(ctx.base_dir / cwd)


def _read_env_file(path_text: str, path: tuple[Any, ...], ctx: _Context) -> dict[str, str]:
    """A dotenv file: ``NAME=value`` lines, ``#`` comments, optional ``export`` and quotes."""
    env_path = Path(path_text).expanduser()
    if not env_path.is_absolute() and ctx.base_dir is not None:
        env_path = ctx.base_dir / env_path
    if not env_path.is_file():
        raise ctx.error(path, f"the env file {str(env_path)!r} was not found", "create it or correct envFile")
    result: dict[str, str] = {}
    for number, line in enumerate(_read_text(env_path).splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        stripped = stripped.removeprefix("export ").lstrip()
        key, sep, value = stripped.partition("=")
        key = key.strip()
        if not sep or not _VAR_NAME.match(key):
            raise ConfigError(str(env_path), None, "not a NAME=value line", "write NAME=value", line=number)
        result[key] = _dotenv_value(value.strip())
    return result


def _dotenv_value(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    comment = value.find(" #")
    return value[:comment].rstrip() if comment >= 0 else value


# --------------------------------------------------------------------------------------------
# ${VAR} expansion


class _Expander:
    """Expands ``${VAR}``-style references in one upstream's values; errors name the key."""

    def __init__(self, ctx: _Context, path: tuple[Any, ...]) -> None:
        self._ctx = ctx
        self._path = path

    def optional(self, value: str | None, key: tuple[Any, ...]) -> str | None:
        return None if value is None else self.value(value, key)

    def value(self, value: str, key: tuple[Any, ...]) -> str:
        try:
            return _expand(value, self._lookup)
        except _ExpansionError as exc:
            raise self._ctx.error((*self._path, *key), exc.problem, exc.fix) from None

    def _lookup(self, name: str) -> str | None:
        found = self._ctx.environ.get(name)
        if found is None and name == "AGGREGATOR_PYTHON":
            return sys.executable
        return found


class _ExpansionError(Exception):
    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def _expand(value: str, lookup: Callable[[str], str | None]) -> str:
    """Expand ``${VAR}``, ``${VAR:-default}``, ``${env:VAR}`` and ``$$`` in ``value``.

    Raises ``_ExpansionError`` (without the value in its text: it may hold a secret).
    """
    out: list[str] = []
    i, n = 0, len(value)
    while i < n:
        char = value[i]
        if char != "$":
            out.append(char)
            i += 1
            continue
        following = value[i + 1 : i + 2]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "{":
            end = value.find("}", i + 2)
            if end < 0:
                raise _ExpansionError(
                    "a '${' is not closed by '}'", "close it with '}', or write '$$' for a literal '$'"
                )
            out.append(_resolve_reference(value[i + 2 : end], lookup))
            i = end + 1
        else:
            out.append("$")
            i += 1
    return "".join(out)


def _resolve_reference(body: str, lookup: Callable[[str], str | None]) -> str:
    name, has_default, default = body.partition(":-")
    name = name.removeprefix("env:")
    if not _VAR_NAME.match(name):
        if name.startswith("input:"):
            raise _ExpansionError(
                "VS Code '${input:...}' prompts are not supported",
                "put the value in an environment variable and write ${NAME}",
            )
        raise _ExpansionError(
            "a '${...}' reference does not hold a valid variable name",
            "write ${NAME} or ${NAME:-default} (NAME: letters, digits, '_'), or '$$' for a literal '$'",
        )
    found = lookup(name)
    if has_default:
        return found if found else default
    if found is None:
        raise _ExpansionError(
            f"the environment variable {name} is not set",
            f"set {name} in the aggregator's environment, or write ${{{name}:-default}} to give a default",
        )
    return found
